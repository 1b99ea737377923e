"""Decode-worker step scheduling: window admission under a token budget, decode never starved."""

from .config import MAX_DRAFT_TOKENS, AdmitPolicy, SchedulerConfig
from .plan import AdmissionDecision, AdmitReason, StepPlan, StepShape, plan_step
from .request_views import InvalidRequestError, RunningRequest, WaitingRequest
from .scheduler import QueueFullError, Scheduler, UnknownRequestError

__all__ = [
    "MAX_DRAFT_TOKENS",
    "AdmissionDecision",
    "AdmitPolicy",
    "AdmitReason",
    "InvalidRequestError",
    "QueueFullError",
    "RunningRequest",
    "Scheduler",
    "SchedulerConfig",
    "StepPlan",
    "StepShape",
    "UnknownRequestError",
    "WaitingRequest",
    "plan_step",
]
