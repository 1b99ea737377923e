"""The first output token's logprobs on the decode role: D samples it in its window step, not P.

In SGLang's symmetric PD the prefill worker samples the first token, and the decode worker's commit
(`DecodeTransferQueue._commit_transfer_to_req`) appends the logprob entries P computed for it to the
request's `req.logprob` lists; every later token's entries come from SGLang's decode result processing.
In the asymmetric modes P's token is a placeholder: the commit hook (window_step.py) drops it and the
entries the commit appended for it, and the window step that completes the window samples the real first
token with SGLang's own sampler, which, for a batch with `return_logprob`, writes that row's logprobs into
the LogitsProcessorOutput it sampled from (`Sampler.forward` -> `compute_logprobs`). `record` appends them
where the commit would have put P's, in the shapes the commit and SGLang's decode path use, so SGLang's
output streamer returns one entry per output token, the first included.
Nothing here imports SGLang: the request and the output are duck-typed on the fields named above.
"""

from __future__ import annotations

from typing import Any


def _row(values: Any, i: int) -> list:
    """Row i of a per-request field (a tensor or a list of tensors/lists) as a Python list."""
    row = values[i]
    return row.tolist() if hasattr(row, "tolist") else list(row)


def record(req: Any, output: Any, i: int, token: int) -> None:
    """Appends to `req.logprob` the entries of `token`, sampled from row `i` of `output` (a
    LogitsProcessorOutput the sampler wrote its logprobs into). The top-logprob lists get an entry for every
    token, empty when none were asked, as the commit gives P's token; the requested-token lists get the
    sampler's values (the commit has none from P and reserves an empty row)."""
    if not req.return_logprob:
        return
    if output.next_token_logprobs is None:
        raise RuntimeError(f"request {req.rid}: the window step's sampler computed no logprobs for its first token")
    logprob = req.logprob
    logprob.output_token_logprobs_val.append(float(output.next_token_logprobs[i]))
    logprob.output_token_logprobs_idx.append(int(token))
    top = logprob.top_logprobs_num
    asked = top > 0 and output.next_token_top_logprobs_val is not None
    logprob.output_top_logprobs_val.append(_row(output.next_token_top_logprobs_val, i)[:top] if asked else [])
    logprob.output_top_logprobs_idx.append(_row(output.next_token_top_logprobs_idx, i)[:top] if asked else [])
    if logprob.token_ids_logprob is not None:
        values = output.next_token_token_ids_logprobs_val
        logprob.output_token_ids_logprobs_val.append([] if values is None else _row(values, i))
        ids = output.next_token_token_ids_logprobs_idx
        logprob.output_token_ids_logprobs_idx.append([] if ids is None else _row(ids, i))
