"""A row pool: one contiguous uint8 tensor of `num_slots` rows of `row_bytes` bytes.

Pools are registered with the engine ONCE, as a whole (registering per page would blow
the Mooncake handshake's 1 MiB limit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class RowPool:
    name: str
    tensor: torch.Tensor

    def __post_init__(self) -> None:
        t = self.tensor
        if t.dtype != torch.uint8 or t.dim() != 2 or not t.is_contiguous():
            raise ValueError(f"RowPool {self.name!r} needs a contiguous 2-D uint8 tensor, "
                             f"got {t.dtype} shape {tuple(t.shape)}")
        if t.device.type != "cpu":
            # Checksums read rows on the host; a device pool needs a device-side checksum first.
            raise ValueError(f"RowPool {self.name!r}: only CPU tensors are supported, got {t.device}")
        if t.shape[0] == 0 or t.shape[1] == 0:
            raise ValueError(f"RowPool {self.name!r} is empty: shape {tuple(t.shape)}")

    @classmethod
    def zeros(cls, name: str, num_slots: int, row_bytes: int) -> "RowPool":
        return cls(name, torch.zeros((num_slots, row_bytes), dtype=torch.uint8))

    @property
    def num_slots(self) -> int:
        return int(self.tensor.shape[0])

    @property
    def row_bytes(self) -> int:
        return int(self.tensor.shape[1])

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.row_bytes

    @property
    def base_ptr(self) -> int:
        return int(self.tensor.data_ptr())

    @property
    def array(self) -> np.ndarray:
        """A numpy view sharing the pool's memory."""
        return self.tensor.numpy()

    def check_slots(self, slots: np.ndarray, what: str) -> None:
        if len(slots) and (int(slots.min()) < 0 or int(slots.max()) >= self.num_slots):
            raise ValueError(f"{what}: slot out of range for pool {self.name!r} "
                             f"(min {int(slots.min())}, max {int(slots.max())}, pool has {self.num_slots})")
