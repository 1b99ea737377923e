"""Step-time doubles for the simulator tests: every step and every prefill chunk costs a known, fixed time."""

from __future__ import annotations

from typing import Sequence

from sglang_asym.plan.steptime import Role, StepTimeModel


class FixedSteps(StepTimeModel):
    """A decode step costs `step_s` plus `per_window_row_s` per window row; prefill costs `per_token_s` per token."""

    name = "fixed"

    def __init__(self, step_s: float = 1.0, per_window_row_s: float = 0.0, per_token_s: float = 0.01) -> None:
        self.step_s, self.per_window_row_s, self.per_token_s = step_s, per_window_row_s, per_token_s

    def decode_step_s(self, decode_contexts: Sequence[int], window_chunks: Sequence[int] = ()) -> float:
        if not decode_contexts and not window_chunks:
            return 0.0
        return self.step_s + self.per_window_row_s * sum(window_chunks)

    def prefill_s(self, tokens: int, role: Role, context: int = 0) -> float:
        return self.per_token_s * tokens
