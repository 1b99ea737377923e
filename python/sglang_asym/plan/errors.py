"""The planner's input error: bad workload, rate, SLO, GPU or layout input, with a message that says what is wrong."""

from __future__ import annotations


class PlanInputError(ValueError):
    """Input the planner cannot plan for; the message names the field and what would be accepted."""
