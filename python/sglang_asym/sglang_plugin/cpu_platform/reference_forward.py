"""DeepSeek-V4.1's forward inside SGLang's engine on CPU: the project's reference model over SGLang's pool.

`install_reference_forward` runs once the model runner has loaded SGLang's DeepseekV4ForCausalLM
(the CPU platform's `post_load_model`, on every server but an asym-prefill one, whose forward is SGLang's own
model loop with the reference model's blocks as its layers: reference_layer.py): it builds the reference model from SGLang's loaded
parameters (reference_weights.py) and replaces the instance's `forward`. Each call then:
1. cuts the ForwardBatch into one segment per request (its tokens, first position, req slot, and
   its prompt length N, which `ForwardBatch.init_new` records from the ScheduleBatch's requests);
2. applies SGLang's default semantics, decoder-side replay: with B = N - W > 0, rows [B, N) see the
   window of layers >= the last KV source only from B on (SGLang's bounded replay, which it turns
   off on CPU; the floors of SplitPlan). A segment that crosses B runs [start, B) without floors,
   then [B, end) with them on the grid of the decode worker's window chunks (`pieces`; W and the chunk
   are the server's settings, `WindowSplit`), so a prompt's window computes exactly as D's steps compute it;
   a full model's rows before B then run only the layers before the last KV source and that layer's KV path,
   SGLang's bounded replay (replay_mode.py; SGLANG_ASYM_FULL_COMPUTE=1 runs them through every layer);
3. per phase, reads each request's rows from SGLang's pool into a throwaway reference cache (window
   rows from max(0, start - W + 1, the layer's floor), every compressed row and index key, the pending compressor
   token), runs `V41Model.forward_batch`, and writes the new rows back to the pool at the
   request's own slots. The pool's bytes are the only request state; nothing survives a call.
Returns SGLang's LogitsProcessorOutput with each request's last-row logits (every row's in a speculative
verify batch). A forward SGLang runs with CaptureHiddenMode.FULL (the speculative worker's extend and verify
forwards, dspark_worker.py) also returns, as `hidden_states`, the drafter's features of every row: the inputs
of the checkpoint's `dspark_target_layer_ids`, concatenated ([rows, layers * hidden], in batch row order).
A decode forward also runs
the rows of any extend batch queued to ride along (`ride_next_decode`: D's window chunks in a mixed
step) and hands their logits to the rider.
With SGLang's --enable-deterministic-inference (deterministic.py) step 3 runs every request's piece as
a forward of its own, so a request's logits do not depend on what else is in the batch, and a verify
batch's rows one row per forward: a forward of 1 + k rows rounds otherwise than 1 + k one-row decode steps
(bf16 matmuls of another shape), which can flip an argmax, so only this way do speculative greedy tokens
equal the same server's without speculation.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ...cache import CacheSet, CacheSizing, RequestCache
from ...config import V41Config
from ...model.model import SegmentInput, SegmentOutput, V41Model
from ...sched.config import chunk_rows_for
from ...split import Semantics, SplitPlan
from ..shared.pool_dump import dump, dump_dir, log_forward, transferred_extent
from .kv_layout import cpu_kv_layout_name
from .replay_mode import ReplayMode
from ..shared.kv_pool import row_format_of_layout
from ..shared.pool_rows import PoolRows
from ..prefill.cut import prompt_len_of
from . import pool_cache
from .reference_weights import reference_model_from_sglang

log = logging.getLogger(__name__)

DEFAULT_SEMANTICS = Semantics.DECODER_REPLAY  # SGLang 0.5.23's default for V4.1 (bounded replay on)


@dataclass(frozen=True)
class WindowSplit:
    """The window W whose floors a prompt's rows from B = N - W on get, and the chunk grid those rows run on:
    the server's --asym-window / --asym-window-chunk (the decode role's window steps read the same settings),
    or for a symmetric server the model's sliding window and the default chunk."""

    window: int
    chunk: int

    def __post_init__(self) -> None:
        if not 1 <= self.chunk <= self.window:
            raise ValueError(f"WindowSplit.chunk must be in [1, window={self.window}], got {self.chunk}")

    @classmethod
    def of(cls, settings: Any, cfg: V41Config) -> "WindowSplit":
        """From an AsymSettings record (None: a symmetric server). A chunk of 0 means whole windows."""
        if settings is None:
            return cls(cfg.sliding_window, chunk_rows_for(cfg.sliding_window, None))
        return cls(settings.window, settings.chunk_rows or settings.window)


@dataclass(frozen=True)
class RequestRecord:
    """One occupied req slot as the reference forward needs it: the prompt length N whose floors apply (an
    asym-prefill request was cut to B = N - W tokens: its floors are those of N) and its PD bootstrap room."""

    prompt_len: int
    room: int | None = None


class ScheduleRecords:
    """What ForwardBatch does not carry, handed over by the init_new hook (patches.py) in this scheduler
    process: the model runner's pools, this server's role, a RequestRecord per occupied req slot, and the
    extend rows queued to ride in the next decode forward (`ride_next_decode`)."""

    def __init__(self) -> None:
        self.kv_pool: Any = None
        self.req_to_token: torch.Tensor | None = None
        self.role = "null"  # SGLang's disaggregation mode of this server
        self.requests: dict[int, RequestRecord] = {}
        self.riders: list[Rider] = []

    def note(self, batch: Any, model_runner: Any) -> None:
        if self.kv_pool is None and getattr(model_runner, "token_to_kv_pool", None) is not None:
            from sglang.srt.runtime_context import get_server_args

            self.kv_pool = model_runner.token_to_kv_pool
            self.req_to_token = model_runner.req_to_token_pool.req_to_token
            mode = get_server_args().disaggregation_mode
            self.role = str(getattr(mode, "value", mode))
        reqs, slots = getattr(batch, "reqs", None), getattr(batch, "req_pool_indices", None)
        if reqs and slots is not None:
            for req, slot in zip(reqs, slots.tolist()):
                self.requests[int(slot)] = RequestRecord(prompt_len_of(req) or len(req.origin_input_ids),
                                                         getattr(req, "bootstrap_room", None))

    def room(self, slot: int) -> int | None:
        record = self.requests.get(slot)
        return None if record is None else record.room

    def take_riders(self) -> list["Rider"]:
        left, self.riders = self.riders, []
        return left


RECORDS = ScheduleRecords()  # this scheduler process's (SGLang runs one model runner per scheduler process)


def note_schedule_batch(batch: Any, model_runner: Any) -> None:
    """Called by the init_new hook for every ScheduleBatch this scheduler turns into a forward."""
    RECORDS.note(batch, model_runner)


@dataclass(frozen=True)
class RequestRows:
    """One request's rows in a forward: tokens at [start, start + len(tokens))."""

    req: int  # SGLang req_pool_idx
    start: int
    tokens: torch.Tensor
    prompt_len: int | None  # None: no floors can apply (decode and verify rows)
    verify: bool = False  # speculative verify rows: logits of every row, a pending pair kept for every accept end

    @property
    def end(self) -> int:
        return self.start + self.tokens.numel()


@dataclass
class _RowsOutput:
    """What one request's pieces of a forward give: the last piece's logits count (every piece's, in order,
    for verify rows), and each piece's captured layer inputs, concatenated per row."""

    last: torch.Tensor | None = None
    verify: list[torch.Tensor] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)

    def add(self, r: RequestRows, logits: torch.Tensor | None, captured: list[torch.Tensor]) -> None:
        self.last = logits
        if r.verify and logits is not None:
            self.verify.append(logits)
        if captured:
            self.features.append(torch.cat(captured, dim=-1))

    def logits(self) -> torch.Tensor | None:
        return torch.cat(self.verify) if self.verify else self.last


@functools.lru_cache(maxsize=4096)
def _floors(cfg: V41Config, prompt_len: int, window: int, semantics: Semantics) -> tuple[int, tuple[tuple[int, int], ...]]:
    split = SplitPlan(cfg, prompt_len, window, semantics)
    return split.boundary, tuple(sorted(split.swa_floors().items()))


def pieces(r: RequestRows, cfg: V41Config, window: int, semantics: Semantics, window_chunk: int,
           verify_by_row: bool = False) -> list[tuple[RequestRows, dict[int, int]]]:
    """One request's rows as (rows, floors) forwards: rows before B = max(N - W, 0) in one piece without
    floors, rows from B on with the floors in pieces on the grid B + k * window_chunk, the chunks the
    decode worker's window steps use, so a window computes exactly as those steps compute it.
    With `verify_by_row`, verify rows run one row per forward (as one-row decode steps compute them)."""
    if r.verify and verify_by_row:
        return [(RequestRows(r.req, r.start + j, r.tokens[j:j + 1], None, verify=True), {})
                for j in range(r.tokens.numel())]
    if r.prompt_len is None:  # decode and verify rows
        return [(r, {})]
    boundary, floors = _floors(cfg, r.prompt_len, window, semantics)
    if r.end <= boundary:
        return [(r, {})]
    floors = dict(floors)  # empty when N <= W: the whole prompt is the window, with no floor
    cuts = [c for c in range(boundary, r.end, window_chunk) if c > r.start] + [r.end]
    out, at = [], r.start
    for cut in cuts:
        out.append((RequestRows(r.req, at, r.tokens[at - r.start:cut - r.start], r.prompt_len),
                    floors if at >= boundary else {}))
        at = cut
    return out


def phases(rows: Sequence[RequestRows], cfg: V41Config, window: int, semantics: Semantics,
           window_chunk: int, verify_by_row: bool = False
           ) -> list[list[tuple[int, RequestRows, dict[int, int]]]]:
    """(index, rows, floors) per forward: phase k runs the k-th piece of every request that has one."""
    split = [pieces(r, cfg, window, semantics, window_chunk, verify_by_row) for r in rows]
    depth = max(len(p) for p in split)
    return [[(i, *p[k]) for i, p in enumerate(split) if k < len(p)] for k in range(depth)]


@dataclass(frozen=True)
class Rider:
    """Extend rows that run inside the next decode forward (a mixed step: one forward holds the running
    batch's decode rows and these window rows); `on_logits` gets each request's last-row logits."""

    rows: tuple[RequestRows, ...]
    on_logits: Callable[[torch.Tensor], None]
    work: Any = None  # the caller's record of what the rows are (to run them another way if no decode came)


def ride_next_decode(forward_batch: Any, on_logits: Callable[[torch.Tensor], None], work: Any = None) -> Rider:
    """Queues an extend ForwardBatch's rows for the next decode forward of this scheduler process."""
    rider = Rider(tuple(ReferenceForward.request_rows(forward_batch.input_ids, forward_batch.positions,
                                                      forward_batch)), on_logits, work)
    RECORDS.riders.append(rider)
    return rider


def take_unridden() -> list[Rider]:
    """Riders no decode forward took (the caller runs them another way)."""
    return RECORDS.take_riders()


def _captures_every_row(forward_batch: Any) -> bool:
    """Whether SGLang runs this forward with CaptureHiddenMode.FULL (a speculative worker's forwards)."""
    mode = getattr(forward_batch, "capture_hidden_mode", None)
    return mode is not None and bool(mode.is_full())


class ReferenceForward:
    """The forward that replaces DeepseekV4ForCausalLM.forward on the CPU platform."""

    def __init__(self, model: V41Model, rows: PoolRows, semantics: Semantics, deterministic: bool = False,
                 split: WindowSplit | None = None, replay: ReplayMode = ReplayMode()) -> None:
        """`rows`: the pool's row access (PoolRows, or anything with its read/write methods); `split`: the
        server's window and chunk (default: a symmetric server's, WindowSplit.of(None, cfg)); `replay`: whether
        a full model's prompt rows before B stop at the last KV source (SGLang's bounded replay, the default)."""
        self.model, self.cfg = model, model.cfg
        self.split = WindowSplit.of(None, self.cfg) if split is None else split
        self.window = self.cfg.sliding_window  # the attention window: rows each query reads back
        self.semantics = semantics
        self.deterministic = deterministic
        self.rows = rows
        # the prefill role keeps window rows of the encoder layers only (layer 20 runs its KV path)
        plan = model.new_cache_set(CacheSizing(max_requests=1, max_tokens=1)).plan
        self.swa_layers = tuple(plan.encoder_layers if model.role == "prefill" else range(self.cfg.num_hidden_layers))
        self.replay = replay if model.role == "full" else ReplayMode(bounded=False)
        self.late_layers = range(plan.last_kv_source, self.cfg.num_hidden_layers)
        self.forwards = 0
        self.last_pieces: list[tuple[tuple[int, ...], list[RequestRows]]] = []  # run_rows': each forward's layers, rows

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                 **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        rows = self.request_rows(input_ids, positions, forward_batch)
        if not rows:
            return LogitsProcessorOutput(next_token_logits=torch.empty(0, self.cfg.vocab_size))
        decoding = forward_batch.forward_mode.is_decode()
        verifying = rows[0].verify
        capture = self.feature_layers if _captures_every_row(forward_batch) else ()
        riders = take_unridden() if decoding and not capture else []
        ridden = [r for rider in riders for r in rider.rows]
        started = time.perf_counter()
        logits, layers, features = self.run_rows(rows + ridden, capture)
        self.forwards += 1
        mode = "mixed" if riders else "decode" if decoding else "verify" if verifying else "extend"
        log_forward(RECORDS.role, mode, sorted(layers),
                    [(RECORDS.room(r.req), r.start, r.end) for r in rows + ridden], time.perf_counter() - started,
                    decode_rows=len(rows) if decoding else 0,
                    pieces=[(ran, [(RECORDS.room(r.req), r.start, r.end) for r in done]) for ran, done in self.last_pieces])
        if self.model.role == "prefill":  # no head: the prefill role's placeholder token is never used
            return LogitsProcessorOutput(next_token_logits=torch.zeros(len(rows), self.cfg.vocab_size))
        # an extend chunk that ends before B ran no head (bounded replay): SGLang discards a chunked prompt's sample
        logits = [torch.zeros(self.cfg.vocab_size) if out is None else out for out in logits]
        hidden = torch.cat(features[:len(rows)]) if capture else None
        if verifying:  # every row's logits, request after request: [sum of rows, V]
            return LogitsProcessorOutput(next_token_logits=torch.cat(logits).float(), hidden_states=hidden)
        at = len(rows)
        for rider in riders:
            rider.on_logits(torch.stack(logits[at:at + len(rider.rows)]))
            at += len(rider.rows)
        return LogitsProcessorOutput(next_token_logits=torch.stack(logits[:len(rows)]).float(), hidden_states=hidden)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The layers whose inputs the DSpark drafter reads (the checkpoint's dspark_target_layer_ids)."""
        return tuple(self.cfg.dspark_target_layer_ids)

    def run_rows(self, rows: Sequence[RequestRows], capture: tuple[int, ...] = ()
                 ) -> tuple[list[torch.Tensor | None], set[int], list[torch.Tensor]]:
        """Runs the requests' rows over the pool: each request's last-row logits (every row's, [rows, V], for
        verify rows; None in the prefill role), the layers that ran, and with `capture` each request's
        captured layer inputs, concatenated per row ([rows, len(capture) * hidden]; [] without capture)."""
        outs = [_RowsOutput() for _ in rows]
        layers: set[int] = set()
        self.last_pieces = []
        for phase in phases(rows, self.cfg, self.split.window, self.semantics, self.split.chunk,
                            verify_by_row=self.deterministic):
            for group in self.forward_groups(phase, capture):
                for (i, r, _), (logits, features) in zip(group, self._run(group, capture)):
                    outs[i].add(r, logits, [features[layer] for layer in capture])
                layers.update(self.model.layers_run)
                self.last_pieces.append((tuple(self.model.layers_run), [r for _, r, _ in group]))
        features = [torch.cat(out.features) for out in outs] if capture else []
        return [out.logits() for out in outs], layers, features

    def forward_groups(self, phase: list[tuple[int, RequestRows, dict[int, int]]], capture: tuple[int, ...] = ()
                       ) -> list[list[tuple[int, RequestRows, dict[int, int]]]]:
        """The forwards of one phase: all its pieces together, or (deterministic) each piece alone, with a
        cache set sized for it alone (nothing of the batch reaches its arithmetic); with bounded replay, the
        pieces that stop at the last KV source in a forward of their own."""
        groups = [[item] for item in phase] if self.deterministic else [phase]
        split = [[[item for item in group if self.to_kv_source_only(item[1], capture) == short] for short in (True, False)]
                 for group in groups]
        return [part for parts in split for part in parts if part]

    def to_kv_source_only(self, r: RequestRows, capture: tuple[int, ...] = ()) -> bool:
        """Whether `r` are prompt rows before B that bounded replay runs only up to the last KV source (never
        verify or decode rows, nor a forward whose late-layer inputs a speculative drafter reads)."""
        if r.prompt_len is None or r.verify or capture or not self.replay.bounded:
            return False
        boundary, floors = _floors(self.cfg, r.prompt_len, self.split.window, self.semantics)
        return self.replay.to_kv_source_only(r.end, boundary, dict(floors), self.late_layers)

    @staticmethod
    def request_rows(input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> list[RequestRows]:
        mode = forward_batch.forward_mode
        if mode.is_idle() or forward_batch.batch_size == 0:
            return []
        reqs = [int(r) for r in forward_batch.req_pool_indices.tolist()]
        if mode.is_decode():
            return [RequestRows(req, int(p), input_ids[i:i + 1], None)
                    for i, (req, p) in enumerate(zip(reqs, positions.tolist()))]
        if mode.is_target_verify():  # the same number of rows per request: the bonus token and the drafts
            q = int(forward_batch.spec_info.draft_token_num)
            if input_ids.numel() != q * len(reqs):
                raise RuntimeError(f"a verify batch of {len(reqs)} requests x {q} rows holds {input_ids.numel()} tokens")
            return [RequestRows(req, int(positions[i * q]), input_ids[i * q:(i + 1) * q], None, verify=True)
                    for i, req in enumerate(reqs)]
        if not mode.is_extend():
            raise NotImplementedError(f"the reference forward runs extend, decode and verify batches, not {mode}")
        missing = [req for req in reqs if req not in RECORDS.requests]
        if missing:
            raise RuntimeError(f"no prompt length for req slots {missing} (the init_new hook did not see them)")
        out, at = [], 0
        for req, n in zip(reqs, forward_batch.extend_seq_lens_cpu):
            out.append(RequestRows(req, int(positions[at]), input_ids[at:at + n], RECORDS.requests[req].prompt_len))
            at += n
        return out

    def _run(self, phase: list[tuple[int, RequestRows, dict[int, int]]], capture: tuple[int, ...] = ()
             ) -> list[tuple[torch.Tensor | None, dict[int, torch.Tensor]]]:
        longest = max(r.end for _, r, _ in phase)
        sizing = CacheSizing(max_requests=len(phase), max_tokens=longest + 1, page_rows=64,
                             max_chunk_tokens=max(r.tokens.numel() for _, r, _ in phase))
        caches = self.model.new_cache_set(sizing)
        short = self.to_kv_source_only(phase[0][1], capture)  # forward_groups keeps such pieces apart
        inputs = [SegmentInput(r.tokens, self._load(caches, r, floors, short), "all" if r.verify else "last", capture)
                  for _, r, floors in phase]
        try:
            if short:
                self.model.forward_batch_to_kv_source(inputs)
                outputs = [SegmentOutput(None) for _ in inputs]
            else:
                outputs = self.model.forward_batch(inputs)
            for (_, r, _), item in zip(phase, inputs):
                self._store(item.cache, r, short)
                if dump_dir() is not None and r.prompt_len is not None:  # test aid (shared/pool_dump.py)
                    extent = transferred_extent(self.cfg, r.prompt_len)
                    if r.end == extent.num_tokens:
                        dump(self.rows, RECORDS.role, RECORDS.room(r.req), r.req, extent)
        finally:
            for item in inputs:
                item.cache.release()
        return [(o.logits, o.captured) for o in outputs]

    def _load(self, caches: CacheSet, r: RequestRows, floors: dict[int, int], short: bool = False) -> RequestCache:
        """A throwaway reference cache holding what the pool holds for `r` before its rows."""
        dtype, rows = self.model.dtype, self.rows
        cache = caches.new_request()
        for layer in self.swa_layers:
            if layer not in self._window_layers(short):  # bounded replay's prefix rows: no window there
                cache.start_swa_at(layer, r.start)
                continue
            # rows below a floor are never read (and bounded replay never wrote them)
            pool_cache.load_window(rows, cache, layer, r.req, r.start, self.window, dtype, floors.get(layer, 0))
        for owner in rows.ratio:
            pool_cache.load_compressed(rows, cache, owner, r.req, r.start, dtype)
        cache.swa_floor.update(floors)
        cache.pos = r.start
        return cache

    def _window_layers(self, short: bool) -> tuple[int, ...]:
        """The layers whose window rows a piece reads from the pool and writes back (`short`: bounded replay's
        rows before B, which touch none from the last KV source on: no later row reads them)."""
        if short:
            return tuple(layer for layer in self.swa_layers if layer not in self.late_layers)
        return self.swa_layers

    def _store(self, cache: RequestCache, r: RequestRows, short: bool = False) -> None:
        """The rows the forward added for `r`, written to the pool at the request's slots."""
        for layer in self._window_layers(short):
            pool_cache.store_window(self.rows, cache, layer, r.req, r.start, r.end)
        for owner in self.rows.ratio:
            pool_cache.store_compressed(self.rows, cache, owner, r.req, r.start, r.end, r.verify)


@dataclass(frozen=True)
class ReferenceSetup:
    """The reference model built from SGLang's loaded V4.1 model, and how this server runs it."""

    model: V41Model
    semantics: Semantics
    deterministic: bool
    split: WindowSplit
    replay: ReplayMode


def reference_setup(sglang_model: torch.nn.Module) -> ReferenceSetup | None:
    """The reference model of this server's role (the prefill role's for SGLang's truncated asym-prefill model)
    from SGLang's loaded parameters, with the server's semantics, determinism and window split; None for
    another architecture."""
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM
    from sglang.srt.runtime_context import get_server_args

    if not isinstance(sglang_model, DeepseekV4ForCausalLM):
        return None
    from ..prefill.model import role_of
    from ..shared.settings import settings_of

    server_args = get_server_args()
    model_path = server_args.model_path
    cfg = V41Config.from_json_file(model_path)
    role = "prefill" if role_of(sglang_model) is not None else "full"
    # the caches are quantized as the pool stores them: V4.1's formats in v41, SGLang's V4 row in v4
    cache_quant = row_format_of_layout(cpu_kv_layout_name())
    reference = reference_model_from_sglang(sglang_model, cfg, model_path, cache_quant=cache_quant, role=role)
    settings = settings_of(server_args)
    semantics = DEFAULT_SEMANTICS if settings is None else Semantics.parse(settings.semantics)
    replay = ReplayMode.from_environment() if role == "full" else ReplayMode(bounded=False)
    return ReferenceSetup(reference, semantics, bool(server_args.enable_deterministic_inference),
                          WindowSplit.of(settings, cfg), replay)


def install_reference_forward(sglang_model: torch.nn.Module) -> None:
    """Builds the reference model from SGLang's loaded V4.1 model and makes it the model's forward.
    Other architectures are left alone."""
    setup = reference_setup(sglang_model)
    if setup is None:
        return
    sglang_model.forward = _LazyPoolBinding(setup.model, setup.semantics, setup.deterministic, setup.split,
                                            setup.replay)
    log.info("sglang-asym: DeepSeek-V4.1 (%s role, %s%s, %s caches, W %d in %d-row chunks, %s) runs the reference "
             "forward over SGLang's pool on CPU", setup.model.role, setup.semantics.value,
             ", deterministic" if setup.deterministic else "", setup.model.quant.mode, setup.split.window,
             setup.split.chunk, setup.replay.label)


class _LazyPoolBinding:
    """The model runner builds its KV pool after loading the model: bind it on the first call."""

    def __init__(self, reference: V41Model, semantics: Semantics, deterministic: bool, split: WindowSplit,
                 replay: ReplayMode = ReplayMode()) -> None:
        self.reference, self.semantics, self.deterministic, self.split = reference, semantics, deterministic, split
        self.replay = replay
        self.bound: ReferenceForward | None = None

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                 **kwargs: Any) -> Any:
        if self.bound is None:
            if RECORDS.kv_pool is None:
                raise RuntimeError("the model runner's pools were never seen (the init_new hook did not run)")
            rows = PoolRows(RECORDS.kv_pool, RECORDS.req_to_token, self.reference.cfg)
            if rows.row_format != self.reference.quant.mode:
                raise RuntimeError(f"SGLang's pool holds {rows.row_format} rows, the reference model quantizes its "
                                   f"caches as {self.reference.quant.mode}")
            self.bound = ReferenceForward(self.reference, rows, self.semantics, self.deterministic, self.split,
                                          self.replay)
        with torch.no_grad():
            return self.bound(input_ids, positions, forward_batch, *args, **kwargs)
