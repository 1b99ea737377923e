"""What both asymmetric roles refuse before any bootstrap: the same request, the same 400, on P and on D.

The router sends each request to P and to D at once. A request only one side refuses leaves the other
holding it: D waits for a transfer P never starts, or P for a handshake D never sends, and the client
waits with them. What the pair cannot serve is therefore refused here, in the tokenizer manager of both
roles' launcher processes (hooked on `TokenizerManager._init_req_state`, which SGLang calls on the
normalized request before it creates any state for it or sends anything to its scheduler), with a
ValueError: SGLang's HTTP front answers it with a 400 (an error event on a stream), on both sides alike.

Refused:
- prompt logprobs (`logprob_start_len` >= 0 below the prompt's length; an OpenAI completion with `echo` and
  `logprobs`): no worker computes them, P has no output head and D computes only the last W prompt rows.
  A text prompt's length is not known before tokenization, so any explicit start is refused for it. Output
  logprobs (`return_logprob` with the default start -1; OpenAI `logprobs` / `top_logprobs`) are served: D
  computes every output token (decode/first_token_logprobs.py);
- more top logprobs than SGLang's PD metadata buffer carries from P to D (its capacity, 128 per token): P's
  scheduler would raise when it fills the buffer;
- parallel sampling (`n > 1`): SGLang's tokenizer expands it into a zero-token prefix request plus n
  copies under rids the router never gave bootstrap rooms, so P and D would not pair them up;
- invalid sampling parameters (SGLang's own `SamplingParams.verify`, which each role's intake runs again
  later): asked by the admission gate before it decides the room (`refusal_of` with the vocabulary size),
  since a room P decided and then ended on its own intake's refusal reads to D's admission question as a
  closed room, a 503 instead of the same 400.
Refusals that depend on one side's state (P's pool, SGLang's intake checks on P) are relayed to D through
the bootstrap channel instead (prefill/refusal.py).
"""

from __future__ import annotations

from typing import Any, Callable

from ..cpu_platform.cpu_patch import register_missing

INIT_REQ_STATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager._init_req_state"
PROMPT_LOGPROBS_MESSAGE = ("sglang-asym: prompt logprobs (logprob_start_len >= 0, or an OpenAI completion with echo "
                           "and logprobs) are not available in the asymmetric modes: the prefill role computes "
                           "the prompt without an output head and the decode role only its last W rows; output "
                           "logprobs are served (leave logprob_start_len unset)")
TOP_LOGPROBS_LIMIT = 128  # SGLang's MetadataBuffers(max_top_logprobs_num=128): what P's buffer carries to D
TOP_LOGPROBS_MESSAGE = ("sglang-asym: top_logprobs_num = {n} exceeds the " + str(TOP_LOGPROBS_LIMIT) +
                        " top logprobs per token that SGLang's disaggregation metadata carries")
PARALLEL_SAMPLING_MESSAGE = ("sglang-asym: parallel sampling (n = {n}) is not available in the asymmetric modes: "
                             "send n separate requests (each with its own seed)")


class AsymAdmissionError(ValueError):
    """SGLang's HTTP front turns a ValueError into an error response with its `status_code`."""

    status_code = 400


def _requested_n(sampling_params: Any) -> int:
    """`n` as the client sent it (SGLang copies it into parallel_sample_num only when it normalizes)."""
    first = sampling_params[0] if isinstance(sampling_params, (list, tuple)) and sampling_params else sampling_params
    return int(first.get("n", 1) or 1) if isinstance(first, dict) else 1


def _items(value: Any, count: int) -> list[Any]:
    """A per-item field of a GenerateReqInput (one value for all, or a list of one per prompt) as a list."""
    if isinstance(value, (list, tuple)):
        return list(value) if value else [None] * count
    return [value] * count


def _prompt_lengths(obj: Any, count: int) -> list[int | None]:
    """Each prompt's token count where the request carries token ids; None for text (not tokenized yet)."""
    ids = getattr(obj, "input_ids", None)
    if not ids:
        return [None] * count
    if isinstance(ids[0], int):
        return [len(ids)] * count
    return [len(item) if isinstance(item, (list, tuple)) else None for item in ids] + [None] * (count - len(ids))


def _item_count(obj: Any) -> int:
    for name in ("return_logprob", "logprob_start_len", "top_logprobs_num", "input_ids", "text"):
        value = getattr(obj, name, None)
        if isinstance(value, (list, tuple)) and value and not (name == "input_ids" and isinstance(value[0], int)):
            return len(value)
    return 1


def asks_prompt_logprobs(return_logprob: Any, logprob_start_len: Any, prompt_len: int | None) -> bool:
    """SGLang's meaning of the fields: -1 (or unset) is output logprobs only; a start at or past the prompt's
    end asks for no prompt token either."""
    if not return_logprob or logprob_start_len is None or int(logprob_start_len) < 0:
        return False
    return prompt_len is None or int(logprob_start_len) < prompt_len


def logprobs_refusal(obj: Any) -> str | None:
    """Why the pair cannot return the logprobs a GenerateReqInput asks for, None when it can."""
    count = _item_count(obj)
    asked = _items(getattr(obj, "return_logprob", False), count)
    starts = _items(getattr(obj, "logprob_start_len", None), count)
    tops = _items(getattr(obj, "top_logprobs_num", 0), count)
    for return_logprob, start, top, prompt_len in zip(asked, starts, tops, _prompt_lengths(obj, count)):
        if asks_prompt_logprobs(return_logprob, start, prompt_len):
            return PROMPT_LOGPROBS_MESSAGE
        if return_logprob and top is not None and int(top) > TOP_LOGPROBS_LIMIT:
            return TOP_LOGPROBS_MESSAGE.format(n=int(top))
    return None


def sampling_refusal(sampling_params: Any, vocab_size: int) -> str | None:
    """SGLang's own words for invalid sampling parameters (its SamplingParams, verified), None when each
    item's are valid; fields SGLang does not know are left to its intake."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    items = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params]
    for params in items:
        if not isinstance(params, dict):
            continue
        try:
            checked = SamplingParams(**params)
        except TypeError:
            continue
        try:  # verify reads no field normalize sets (normalize wants the tokenizer, for stop strings)
            checked.verify(vocab_size)
        except ValueError as exc:
            return str(exc)
    return None


def refusal_of(obj: Any, vocab_size: int | None = None) -> str | None:
    """Why the asymmetric pair cannot serve a GenerateReqInput (normalized or as it arrived), None when it can.
    Asked twice: by the admission gate (admission.py) before it decides the room, so that a request both
    sides refuse never takes a room on P that D's admission question would find closed, with the model's
    `vocab_size` (its sampling parameters checked too); and here."""
    refusal = logprobs_refusal(obj)
    if refusal is not None:
        return refusal
    n = max(getattr(obj, "parallel_sample_num", 1) or 1, _requested_n(getattr(obj, "sampling_params", None)))
    if n > 1:
        return PARALLEL_SAMPLING_MESSAGE.format(n=n)
    if vocab_size is not None:
        return sampling_refusal(getattr(obj, "sampling_params", None), vocab_size)
    return None


def around_init_req_state(original: Callable, manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.managers.io_struct import GenerateReqInput

    if isinstance(obj, GenerateReqInput):
        refusal = refusal_of(obj)
        if refusal is not None:
            raise AsymAdmissionError(refusal)
    return original(manager, obj, *args, **kwargs)


def install_admission_check() -> None:
    register_missing(((INIT_REQ_STATE, around_init_req_state, "AROUND"),), apply=True)
