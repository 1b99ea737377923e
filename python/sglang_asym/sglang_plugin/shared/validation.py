"""Refuses asymmetric servers that cannot work, with an error naming the offending flag.

Checked on the parsed SGLang namespace, before SGLang builds its ServerArgs:
- the checkpoint is DeepSeek-V4.1 (its config.json passes `V41Config`), read from a local path;
- the window is the model's sliding window: `SplitPlan` admits 1 <= W <= sliding_window, but SGLang's pools
  and the decode role's SWA slots are sized by the model's window, and only W = sliding_window is tested
  end to end (the window chunk may be any 1 <= chunk <= W: AsymSettings checks it);
- the KV transfer runs over Mooncake (the backend the asymmetric payload is written for);
- no flag whose SGLang feature assumes both roles hold the same model or the same KV prefix.
"""

from __future__ import annotations

import argparse

from ...config import ConfigError, V41Config
from ...split import Semantics, SplitError, SplitPlan
from .settings import ASYM_DECODE

MOONCAKE_BACKENDS = ("mooncake", "mooncake_tcp")


class AsymArgumentError(ValueError):
    """A command line that cannot run an asymmetric server."""


def validate_asym_args(args: argparse.Namespace, mode: str, window: int, semantics: str) -> V41Config:
    """Raises AsymArgumentError for the first problem found; returns the checkpoint's config."""
    flag = f"--disaggregation-mode {mode}"
    if not args.model_path:
        raise AsymArgumentError(f"{flag} needs --model-path pointing at a DeepSeek-V4.1 checkpoint directory")
    try:
        config = V41Config.from_json_file(args.model_path)
    except ConfigError as exc:
        raise AsymArgumentError(f"{flag} serves DeepSeek-V4.1 checkpoints only: {exc}") from None
    try:
        SplitPlan(config, prompt_len=1, window=window, semantics=Semantics.parse(semantics))
    except SplitError as exc:
        raise AsymArgumentError(f"--asym-window {window}: {exc}") from None
    if window != config.sliding_window:
        raise AsymArgumentError(f"--asym-window {window}: must be the model's sliding_window, "
                                f"{config.sliding_window} (a smaller W is not served)")

    backend = args.disaggregation_transfer_backend
    if backend not in MOONCAKE_BACKENDS:
        raise AsymArgumentError(
            f"{flag} transfers its prefix state over Mooncake; "
            f"--disaggregation-transfer-backend {backend} is not supported"
        )
    if args.enable_pd_role_switch:
        raise AsymArgumentError(
            f"--enable-pd-role-switch cannot be combined with {flag}: "
            "the asymmetric prefill and decode roles hold different parts of the model"
        )
    if mode == ASYM_DECODE and args.disaggregation_decode_enable_radix_cache:
        raise AsymArgumentError(
            f"--disaggregation-decode-enable-radix-cache is not supported with {flag} yet: "
            "a decode-side prefix hit would move the boundary B = N - W the prefill role computes to"
        )
    if mode == ASYM_DECODE and args.enable_decoder_swa_bounded_replay is False:
        raise AsymArgumentError(
            f"--no-enable-decoder-swa-bounded-replay cannot be combined with {flag}: the decode role "
            "never has the decoder layers' window rows below B = N - W, so those layers must replay from B"
        )
    return config
