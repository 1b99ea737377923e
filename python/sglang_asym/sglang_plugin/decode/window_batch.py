"""An EXTEND batch over rows D already holds: a chunk [start, end) of each request's window, run by
SGLang's own model worker, sampled by SGLang's own sampler.

D's prealloc queue allocated every prompt row of a request (slots of [0, N) in `req_to_token`) before
the transfer; P's payload filled the prefix [0, B). A window chunk therefore needs no allocation:
`window_batch` builds the ScheduleBatch with SGLang's `prepare_for_extend` (input ids, positions,
sampling info, extend lengths) while its `alloc_for_extend` is replaced, for this call only, by the
request's resident slots. The request fields `prepare_for_extend` reads and writes (prefix length,
extend end, cached-token counters) are restored afterwards, so the request leaves the window exactly
as SGLang's commit left it and continues on SGLang's prebuilt path (see window_step.py).
The batch either runs as a forward of its own (`run_window_chunks`), or is only turned into a
ForwardBatch (`window_forward_batch`) whose rows the CPU route's layers run beside the next decode
forward's rows, its logits then sampled by SGLang's sampler (`sample_window`). Either way the answer is a
WindowSamples: each chunk's sampled token and the LogitsProcessorOutput it was sampled from, into which
SGLang's sampler wrote the logprobs a request with `return_logprob` asks for (first_token_logprobs.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

# Req fields prepare_for_extend reads or writes; restored once the batch is built and run.
_REQ_FIELDS = ("prefix_len", "extend_end", "cached_tokens", "cached_tokens_device", "cached_tokens_host",
               "cached_tokens_storage", "already_computed", "_cache_breakdown_computed")


@dataclass(frozen=True)
class WindowChunk:
    """Rows [start, end) of one request's tokens (its prompt, then its output tokens for a rebootstrapped
    request), computed on top of the rows below start."""

    req: Any
    start: int
    end: int

    def __post_init__(self) -> None:
        tokens = len(self.req.origin_input_ids) + len(self.req.output_ids)
        if not 0 <= self.start < self.end <= tokens:
            raise ValueError(f"request {self.req.rid}: window chunk [{self.start}, {self.end}) is not inside its "
                             f"{tokens} tokens")


@dataclass(frozen=True)
class WindowSamples:
    """Each chunk's sampled next token (meaningful for a chunk that ends its request's window), in chunk order,
    and the sampler's LogitsProcessorOutput: row i holds chunk i's logprobs when its batch returns them."""

    tokens: tuple[int, ...]
    output: Any


@contextlib.contextmanager
def _resident_slots(req_to_token: torch.Tensor, chunks: Sequence[WindowChunk]) -> Iterator[None]:
    """`alloc_for_extend` answers with the chunks' own slots while the batch is built."""
    from sglang.srt.managers import schedule_batch

    def resident(batch: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        slots = [int(c.req.kv.req_pool_idx) for c in chunks]
        locs = torch.cat([req_to_token[s, c.start:c.end] for s, c in zip(slots, chunks)]).to(torch.int64)
        cpu = torch.tensor(slots, dtype=torch.int64)
        return locs.to(batch.device), cpu.to(batch.device), cpu

    original = schedule_batch.alloc_for_extend
    schedule_batch.alloc_for_extend = resident
    try:
        yield
    finally:
        schedule_batch.alloc_for_extend = original


@contextlib.contextmanager
def _window_batch(scheduler: Any, chunks: Sequence[WindowChunk]) -> Iterator[Any]:
    """The chunks' EXTEND ScheduleBatch over their resident slots; the request fields it touched are
    restored when the block ends."""
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    reqs = [c.req for c in chunks]
    saved = [{name: getattr(req, name) for name in _REQ_FIELDS if hasattr(req, name)} for req in reqs]
    try:
        for chunk in chunks:
            chunk.req.refresh_fill_ids()
            chunk.req.prefix_len, chunk.req.extend_end = chunk.start, chunk.end
        batch = ScheduleBatch.init_new(reqs, scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator,
                                       scheduler.tree_cache, scheduler.model_config, scheduler.enable_overlap,
                                       scheduler.spec_algorithm)
        with _resident_slots(scheduler.req_to_token_pool.req_to_token, chunks):
            batch.prepare_for_extend()
        resolve_forward_inputs(batch, scheduler.future_map)
        yield batch
    finally:
        for req, fields in zip(reqs, saved):
            for name, value in fields.items():
                setattr(req, name, value)


def run_window_chunks(scheduler: Any, chunks: Sequence[WindowChunk]) -> WindowSamples:
    """Runs the chunks as one EXTEND forward on `scheduler`'s model worker (through the speculative worker
    when there is one); returns what its sampler gave."""
    with _window_batch(scheduler, chunks) as batch:
        result = scheduler.model_worker.forward_batch_generation(batch)
        if result.next_token_ids is None and result.delay_sample_func is not None:
            # SGLang's overlap scheduler delays sampling a batch with grammars until the previous batch's
            # tokens are accepted; a window's first token follows no output token of its own: sample now
            result.delay_sample_func()
            result.delay_sample_func = None
        return WindowSamples(tuple(int(t) for t in result.next_token_ids.tolist()), result.logits_output)


def window_forward_batch(scheduler: Any, chunks: Sequence[WindowChunk]) -> Any:
    """The chunks' ForwardBatch (input ids, positions, sampling info), for a forward that runs them
    beside the running batch's decode rows (a mixed step, reference_forward.ride_next_decode)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    with _window_batch(scheduler, chunks) as batch:
        return ForwardBatch.init_new(batch, scheduler.model_worker.model_runner, return_hidden_states_before_norm=False)


def sample_window(scheduler: Any, forward_batch: Any, logits: torch.Tensor) -> WindowSamples:
    """SGLang's sampler over the chunks' last-row logits, with their requests' sampling parameters (and their
    logprob requests: the ForwardBatch carries return_logprob and top_logprobs_nums from the requests)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    output = LogitsProcessorOutput(next_token_logits=logits.float())
    tokens = scheduler.model_worker.model_runner.sample(output, forward_batch)
    return WindowSamples(tuple(int(t) for t in tokens.tolist()), output)
