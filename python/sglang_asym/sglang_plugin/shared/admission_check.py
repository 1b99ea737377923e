"""What both asymmetric roles refuse before any bootstrap: the same request, the same 400, on P and on D.

The router sends each request to P and to D at once. A request only one side refuses leaves the other
holding it: D waits for a transfer P never starts, or P for a handshake D never sends, and the client
waits with them. What the pair cannot serve is therefore refused here, in the tokenizer manager of both
roles' launcher processes (hooked on `TokenizerManager._init_req_state`, which SGLang calls on the
normalized request before it creates any state for it or sends anything to its scheduler), with a
ValueError: SGLang's HTTP front answers it with a 400 (an error event on a stream), on both sides alike.

Refused:
- logprobs (`return_logprob`, OpenAI `logprobs` / `top_logprobs`): the decode role's window step samples
  the first output token without recording its logprob, and prompt logprobs exist on neither role (P has
  no head; D computes only the last W prompt rows);
- parallel sampling (`n > 1`): SGLang's tokenizer expands it into a zero-token prefix request plus n
  copies under rids the router never gave bootstrap rooms, so P and D would not pair them up.
Refusals that depend on one side's state (P's pool, SGLang's intake checks on P) are relayed to D through
the bootstrap channel instead (prefill/refusal.py).
"""

from __future__ import annotations

from typing import Any, Callable

INIT_REQ_STATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._init_req_state"
LOGPROBS_MESSAGE = ("sglang-asym: logprobs are not available in the asymmetric modes: the decode role's window "
                    "step samples the first output token without recording its logprob, and prompt logprobs "
                    "are computed by neither role (the prefill role has no output head)")
PARALLEL_SAMPLING_MESSAGE = ("sglang-asym: parallel sampling (n = {n}) is not available in the asymmetric modes: "
                             "send n separate requests (each with its own seed)")


class AsymAdmissionError(ValueError):
    """SGLang's HTTP front turns a ValueError into an error response with its `status_code`."""

    status_code = 400


def _any(value: Any) -> bool:
    return any(bool(v) for v in value) if isinstance(value, (list, tuple)) else bool(value)


def _requested_n(sampling_params: Any) -> int:
    """`n` as the client sent it (SGLang copies it into parallel_sample_num only when it normalizes)."""
    first = sampling_params[0] if isinstance(sampling_params, (list, tuple)) and sampling_params else sampling_params
    return int(first.get("n", 1) or 1) if isinstance(first, dict) else 1


def refusal_of(obj: Any) -> str | None:
    """Why the asymmetric pair cannot serve a GenerateReqInput (normalized or as it arrived), None when it can.
    Asked twice: by the admission gate (admission.py) before it decides the room, so that a request both
    sides refuse never takes a room on P that D's admission question would find closed; and here."""
    if _any(getattr(obj, "return_logprob", False)):
        return LOGPROBS_MESSAGE
    n = max(getattr(obj, "parallel_sample_num", 1) or 1, _requested_n(getattr(obj, "sampling_params", None)))
    if n > 1:
        return PARALLEL_SAMPLING_MESSAGE.format(n=n)
    return None


def around_init_req_state(original: Callable, manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.managers.io_struct import GenerateReqInput

    if isinstance(obj, GenerateReqInput):
        refusal = refusal_of(obj)
        if refusal is not None:
            raise AsymAdmissionError(refusal)
    return original(manager, obj, *args, **kwargs)


def install_admission_check() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if INIT_REQ_STATE not in HookRegistry._patched:
        HookRegistry.register(INIT_REQ_STATE, around_init_req_state, HookType.AROUND)
        HookRegistry.apply_hooks()
