"""The one error type of the checkpoint package: always names the file and the tensor."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint directory, shard or tensor that cannot be used for this config or role."""
