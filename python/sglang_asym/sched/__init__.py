"""Decode-worker step scheduling: window admission under a token budget, decode never starved, graph shapes."""

from .bounds import max_admission_delay_steps, max_rows_per_step, min_chunk_rows
from .config import MAX_DRAFT_TOKENS, AdmitPolicy, GraphConfig, MixedBackend, SchedulerConfig, StepMode
from .counters import SchedulerCounters
from .graphs import (
    ForwardKind,
    GraphChoice,
    GraphKind,
    choose_decode_graph,
    choose_graphs,
    choose_mixed_graph,
    choose_window_graph,
)
from .plan import AdmissionDecision, AdmitReason, StepPlan, StepShape, plan_step
from .request_views import InvalidRequestError, RunningRequest, WaitingRequest
from .scheduler import QueueFullError, RequestState, ScheduledStep, Scheduler, UnknownRequestError, WaitTimeout

__all__ = [
    "MAX_DRAFT_TOKENS",
    "AdmissionDecision",
    "AdmitPolicy",
    "AdmitReason",
    "ForwardKind",
    "GraphChoice",
    "GraphConfig",
    "GraphKind",
    "InvalidRequestError",
    "MixedBackend",
    "QueueFullError",
    "RequestState",
    "RunningRequest",
    "ScheduledStep",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerCounters",
    "StepMode",
    "StepPlan",
    "StepShape",
    "UnknownRequestError",
    "WaitTimeout",
    "WaitingRequest",
    "choose_decode_graph",
    "choose_graphs",
    "choose_mixed_graph",
    "choose_window_graph",
    "max_admission_delay_steps",
    "max_rows_per_step",
    "min_chunk_rows",
    "plan_step",
]
