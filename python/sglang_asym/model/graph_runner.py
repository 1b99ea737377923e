"""Model runner of the decode worker: one step's rows of several requests -> logits, with the graph
shape that `sched.graphs` chooses.

A step is a list of StepRows (a request's cache and the tokens it runs now: 1 + k decode rows, or a
window chunk). The runner lays the rows out at the chosen shape and returns each request's logits as
`V41Model.forward` would.

  FULL (uniform decode)   request b occupies rows [b*(1+k), b*(1+k) + q_len) of a (batch bucket x
                          (1+k)) block; padding rows fill short verifies and empty batch slots;
  ROW_BUCKET (window)     rows packed, padded up to the 128-row bucket;
  BREAKABLE (mixed)       rows packed, padded up to the mixed row bucket;
  EAGER                   rows packed, unpadded.
On the graph backends ('cuda_graph' on CUDA; 'emulated_graph', which keeps the graph path's static
buffers and replay semantics on any device and runs every graph under `capture_guard.no_host_sync`,
so CPU tests check the graph path) a FULL choice runs as ONE whole-forward graph per (batch bucket,
1 + k, context capacity) (`decode_graph`): before the replay the host reserves the cache rows the
step writes and fills static page tables, slots, positions and masks (`decode_plan`); attention is
static-shape tensor work inside the graph; afterwards the host commits row ends, window drops,
compressor tails and positions. A ROW_BUCKET window choice whose padded rows hold one 128-row slot
per request (always a single window, from a transferred prefix or not) runs as the same kind of
whole-forward graph at (slots, 128, context). Other ROW_BUCKET and BREAKABLE choices replay one graph per (segment,
padded rows) (mHC mixing, norms, MoE, head: `model.segments`) with each request's attention run
eagerly on its own paged cache between them (its caches grow and free pages on the host); EAGER
choices call the same segment functions directly. Inside the decode graph the cache quantizer runs
without its host-side refusals of NaN/inf rows (`Quantizer.capture_safe`); instead the host checks each
request's logits after the replay and fails the step before committing anything. Backend 'eager' (CPU, or for
comparison) runs every choice's segment functions UNPADDED, since padding only serves graph replay;
the choice still counts under its kind. `stats()` counts forwards by shape, captures, replays and
eager calls.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Callable, Sequence

import torch

from ..cache import CacheSet, RequestCache
from ..cache.request import ROLLBACK_MARGIN_ROWS
from ..sched import (
    ForwardKind,
    GraphChoice,
    GraphKind,
    SchedulerConfig,
    choose_decode_graph,
    choose_mixed_graph,
    choose_window_graph,
)
from ..sched.graphs import smallest_bucket_at_least
from .batch import ChunkState, RowBatch, Segment
from .decode_graph import DecodeForward, DecodeShape, context_capacity
from .decode_plan import PAD_TOKEN, DecodeRequest, DecodeStep, context_rows
from .model import V41Model
from .segment_exec import CudaGraphExecutor, EagerExecutor, EmulatedGraphExecutor, SegmentCounters
from .segments import SegmentProgram

LOGITS_MODES = ("all", "last", "none")


class RowKind(str, Enum):
    DECODE = "decode"  # a running request's last token and its draft tokens (q_len <= 1 + k)
    WINDOW = "window"  # a new request's window rows (or a chunk of them)


class Backend(str, Enum):
    EAGER = "eager"
    CUDA_GRAPH = "cuda_graph"
    EMULATED_GRAPH = "emulated_graph"  # static buffers replayed like CUDA graphs, on any device (checks)


@dataclass(frozen=True)
class StepRows:
    """One request's part of a step. logits: 'all' -> [q, V], 'last' -> [V], 'none' -> None;
    by default 'all' for decode rows (verification reads every row) and 'last' for a window."""

    cache: RequestCache
    tokens: torch.Tensor
    kind: RowKind = RowKind.DECODE
    logits: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", RowKind(self.kind))
        except ValueError:
            raise ValueError(f"row kind must be one of {[k.value for k in RowKind]}, got {self.kind!r}") from None
        if self.logits is None:
            object.__setattr__(self, "logits", "all" if self.kind is RowKind.DECODE else "last")
        if self.logits not in LOGITS_MODES:
            raise ValueError(f"logits must be one of {LOGITS_MODES}, got {self.logits!r}")

    @property
    def num_rows(self) -> int:
        return int(self.tokens.numel())


def forward_kind(rows: Sequence[StepRows]) -> ForwardKind:
    """What a forward over these rows is: decode-only, window-only or mixed."""
    kinds = {r.kind for r in rows}
    if len(kinds) > 1:
        return ForwardKind.MIXED
    return ForwardKind.DECODE if kinds == {RowKind.DECODE} else ForwardKind.WINDOW


@dataclass(frozen=True)
class RowLayout:
    """Where each request's rows sit among the forward's `rows` (padded) rows."""

    rows: int
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    @classmethod
    def for_choice(cls, choice: GraphChoice, lengths: Sequence[int]) -> "RowLayout":
        lengths = tuple(lengths)
        if choice.kind is GraphKind.FULL:
            batch, width = choice.padded_shape
            if len(lengths) > batch or max(lengths) > width:
                raise ValueError(f"{len(lengths)} requests of up to {max(lengths)} rows do not fit the full-graph "
                                 f"shape {choice.padded_shape}")
            return cls(batch * width, tuple(b * width for b in range(len(lengths))), lengths)
        return cls.packed(lengths, choice.padded_rows)

    @classmethod
    def packed(cls, lengths: Sequence[int], rows: int | None = None) -> "RowLayout":
        """Requests back to back from row 0, in `rows` rows (default: unpadded)."""
        lengths = tuple(lengths)
        starts, at = [], 0
        for n in lengths:
            starts.append(at)
            at += n
        return cls(at if rows is None else rows, tuple(starts), lengths)

    def real_rows(self, device: torch.device) -> slice | torch.Tensor:
        """Index of the real rows in request order: a slice when they are packed from row 0."""
        at = 0
        for start, n in zip(self.starts, self.lengths):
            if start != at:
                return torch.cat([torch.arange(s, s + n) for s, n in zip(self.starts, self.lengths)]).to(device)
            at += n
        return slice(0, at)


@dataclass(frozen=True)
class StepOutput:
    logits: tuple[torch.Tensor | None, ...]  # per request, in the order of the step's rows
    choice: GraphChoice
    # layer id -> per request [rows, hidden]: the layer's input streams averaged (drafter features)
    features: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class RunnerStats:
    forwards: dict[str, int]  # by graph kind chosen
    graph_forwards: int  # forwards whose segments were graph replays (CUDA, or emulated)
    eager_forwards: int  # forwards whose segments ran eagerly (CPU, backend 'eager', or an EAGER choice)
    eager_fallbacks: int  # forwards the shape choice sent to EAGER (no captured shape fits)
    graph_captures: int
    graph_replays: int
    eager_segment_calls: int
    actual_rows: int
    padded_rows: int
    captured_shapes: int  # distinct (segment, rows) graphs held

    def as_dict(self) -> dict:
        return asdict(self)


class StepFailed(RuntimeError):
    """A step raised part-way. Every request whose rows could be undone was rolled back to where it
    started (`rolled_back`); the others hold a partly extended cache and must be released."""

    def __init__(self, layer: int | None, cause: BaseException, rolled_back: tuple[int, ...],
                 unrecoverable: tuple[int, ...]) -> None:
        where = "before any attention" if layer is None else f"at layer {layer}'s attention or later"
        super().__init__(f"step failed {where}: {cause!r}; rolled back requests {list(rolled_back)}, "
                         f"must release {list(unrecoverable)}")
        self.layer, self.cause = layer, cause
        self.rolled_back, self.unrecoverable = rolled_back, unrecoverable


def _check_finite(logits: torch.Tensor, q_lens: Sequence[int], width: int) -> None:
    """After a decode-graph replay: every real row's logits must be finite. The graph quantized the
    caches without refusing NaN/inf rows (no host sync inside it), so a request whose values went bad
    is refused here, as the eager path's quantizer would have refused its rows."""
    finite = torch.isfinite(logits).all(dim=-1).view(-1, width).cpu()
    bad = [b for b, n in enumerate(q_lens) if not bool(finite[b, :n].all())]
    if bad:
        raise ValueError(f"request(s) {bad} of the decode step produced NaN or inf logits (a non-finite value "
                         f"reached their cache rows); nothing of the step was committed")


def _logit_rows_bucket(rows: int, limit: int) -> int:
    """Logit rows are padded to a power of two (at most the forward's rows): few head graphs."""
    return min(1 << max(rows - 1, 0).bit_length(), limit)


class GraphRunner:
    """backend: 'auto' (CUDA graphs on a CUDA model, else eager), 'eager', 'cuda_graph', 'emulated_graph'.
    moe: 'static' (capture-safe, row-wise; needed by the graph backends), 'routed' (the reference MoE:
    experts only over the rows routed to them, much cheaper on CPU at window sizes; eager only) or
    'auto' (static with a graph backend, routed with the eager one)."""

    def __init__(self, model: V41Model, config: SchedulerConfig = SchedulerConfig(), backend: str = "auto",
                 moe: str = "auto") -> None:
        if not isinstance(config, SchedulerConfig):
            raise TypeError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        self.model, self.config = model, config
        self.device = model.embed.weight.device
        if backend == "auto":
            backend = Backend.CUDA_GRAPH if self.device.type == "cuda" else Backend.EAGER
        try:
            self.backend = Backend(backend)
        except ValueError:
            raise ValueError(f"backend must be 'auto' or one of {[b.value for b in Backend]}, got {backend!r}") from None
        if moe not in ("auto", "static", "routed"):
            raise ValueError(f"moe must be 'auto', 'static' or 'routed', got {moe!r}")
        if moe == "auto":
            moe = "routed" if self.backend is Backend.EAGER else "static"
        if self.backend is not Backend.EAGER and moe != "static":
            raise ValueError("graph backends need the capture-safe MoE: moe='static'")
        self.program = SegmentProgram(model, moe=moe)
        self._counters = SegmentCounters()
        self._eager = EagerExecutor(self._counters)
        self._graphs: CudaGraphExecutor | EmulatedGraphExecutor | None = None
        if self.backend is Backend.CUDA_GRAPH:
            self._graphs = CudaGraphExecutor(self._counters, self.device)
        elif self.backend is Backend.EMULATED_GRAPH:
            self._graphs = EmulatedGraphExecutor(self._counters)
        self._forwards = {kind.value: 0 for kind in GraphKind}
        self._decode_fns: dict[tuple, DecodeForward] = {}
        self.whole_decode_graphs = self._graphs is not None  # FULL choices as one whole-forward graph
        self._graph_forwards = self._eager_forwards = 0
        self._actual_rows = self._padded_rows = 0

    # ---- shape choice --------------------------------------------------------------------------
    def choose(self, rows: Sequence[StepRows]) -> GraphChoice:
        """The shape `sched.graphs` picks for these rows (decode-only, window-only or mixed)."""
        if not rows:
            raise ValueError("a step needs at least one request's rows")
        forward, graphs = forward_kind(rows), self.config.graphs
        if forward is ForwardKind.DECODE:
            return choose_decode_graph([r.num_rows for r in rows], self.config.verify_width, graphs)
        if forward is ForwardKind.WINDOW:
            return choose_window_graph([r.num_rows for r in rows], graphs)
        return choose_mixed_graph(len(rows), sum(r.num_rows for r in rows), graphs)

    def _check_choice(self, choice: GraphChoice, rows: Sequence[StepRows]) -> None:
        expected = forward_kind(rows)
        if choice.forward is not expected:
            raise ValueError(f"graph choice is for a {choice.forward.value} forward, the rows make a {expected.value} one")
        total = sum(r.num_rows for r in rows)
        if (choice.num_requests, choice.actual_rows) != (len(rows), total):
            raise ValueError(f"graph choice holds {choice.num_requests} requests / {choice.actual_rows} rows, the step "
                             f"has {len(rows)} / {total}")

    # ---- execution -----------------------------------------------------------------------------
    def _executor(self, choice: GraphChoice):
        if self._graphs is not None and choice.kind is not GraphKind.EAGER:
            return self._graphs
        return self._eager

    def _validate(self, rows: Sequence[StepRows]) -> None:
        if not rows:
            raise ValueError("a step needs at least one request's rows")
        seen: set[int] = set()
        for i, r in enumerate(rows):
            cache = r.cache
            if id(cache) in seen:
                raise ValueError(f"request {i}'s cache appears twice in one step (one forward per request per step)")
            seen.add(id(cache))
            if cache.released:
                raise RuntimeError(f"request {i}'s cache was released")
            if cache.set.role != "full":
                raise ValueError(f"request {i}: a {cache.set.role}-role cache cannot serve the full model")
            pool = next(iter(cache.set.pools.values()))
            if pool.storage.device != self.device:
                raise ValueError(f"request {i}'s cache lives on {pool.storage.device}, the model on {self.device}")
            self.model.validate_tokens(r.tokens, cache.pos)

    def _chain(self, executor, rows: int, logit_rows: torch.Tensor | None, tokens: torch.Tensor,
               attend: Callable[[int, torch.Tensor, torch.Tensor], None],
               on_layer_input: Callable[[int, torch.Tensor], None]) -> torch.Tensor | None:
        """Run the segments of a `rows`-row forward; `attend(i, x, out)` fills layer i's attention output."""
        program = self.program
        carry = executor.call(("first", rows), program.first, (tokens,))
        attn_out = torch.zeros(rows, self.model.cfg.hidden_size, dtype=self.model.dtype, device=self.device)
        for i in range(program.num_layers):
            streams, mix_pre, mix_post, mix_comb, x = carry
            on_layer_input(i, streams)
            attend(i, x, attn_out)
            inputs = (streams, mix_pre, mix_post, mix_comb, attn_out)
            if i + 1 < program.num_layers:
                carry = executor.call(("between", i, rows), program.between(i), inputs)
            else:
                (hidden,) = executor.call(("last", rows), program.last, inputs)
        if logit_rows is None:
            return None
        (logits,) = executor.call(("head", rows, logit_rows.numel()), program.head, (hidden, logit_rows))
        return logits.clone()  # a graph's output buffer is overwritten by the next replay

    @torch.no_grad()
    def run(self, rows: Sequence[StepRows], choice: GraphChoice | None = None,
            capture_layers: Sequence[int] = ()) -> StepOutput:
        """Run one forward of the step's rows (each request at its cache's position) and advance the caches."""
        rows = list(rows)
        self._validate(rows)
        if choice is None:
            choice = self.choose(rows)
        else:
            self._check_choice(choice, rows)
        self.program.check_weights()
        slots = self._whole_graph_slots(choice, rows)
        if slots is not None:
            return self._run_decode_graph(rows, choice, slots, tuple(capture_layers))
        lengths = [r.num_rows for r in rows]
        # Padding only serves graph replay: the eager backend runs the chosen shape unpadded.
        padded = choice.kind is not GraphKind.EAGER and self.backend is not Backend.EAGER
        layout = RowLayout.for_choice(choice, lengths)  # checks the rows fit the choice
        if not padded:
            layout = RowLayout.packed(lengths)
        executor = self._executor(choice)

        tokens = torch.full((layout.rows,), PAD_TOKEN, dtype=torch.long)
        picks: list[int] = []
        for r, start in zip(rows, layout.starts):
            tokens[start : start + r.num_rows] = r.tokens.to("cpu", torch.long)
            if r.logits == "all":
                picks.extend(range(start, start + r.num_rows))
            elif r.logits == "last":
                picks.append(start + r.num_rows - 1)
        logit_rows = None
        if picks:
            bucket = _logit_rows_bucket(len(picks), layout.rows) if padded else len(picks)
            logit_rows = torch.tensor(picks + [0] * (bucket - len(picks)), device=self.device)

        starts_pos = [r.cache.pos for r in rows]
        batch = self._row_batch(rows, starts_pos)
        real = layout.real_rows(self.device)
        capture = set(capture_layers)
        features: dict[int, list[torch.Tensor]] = {}
        blocks = self.program.blocks
        attention_ran: list[int | None] = [None]  # the layer whose attention may have extended caches

        def attend(i: int, x: torch.Tensor, out: torch.Tensor) -> None:
            # One batched attention call over the real rows: projections over all of them, the
            # window/compressed/index work per request on its own cache. Padding rows stay zero.
            attention_ran[0] = blocks[i].info.index
            out[real] = blocks[i].attn(x[real], batch, self.model.quant)

        def on_layer_input(i: int, streams: torch.Tensor) -> None:
            if blocks[i].info.index in capture:
                features[blocks[i].info.index] = [
                    streams[s : s + r.num_rows].float().mean(dim=1).to(streams.dtype)
                    for r, s in zip(rows, layout.starts)]

        try:
            logits = self._chain(executor, layout.rows, logit_rows, tokens.to(self.device), attend, on_layer_input)
        except Exception as exc:
            raise self._roll_back(rows, starts_pos, attention_ran[0], exc) from exc
        for r, p in zip(rows, starts_pos):
            r.cache.pos = p + r.num_rows
        self._count(choice, layout, executor)
        return StepOutput(self._split_logits(rows, logits), choice,
                          {layer: tuple(v) for layer, v in features.items()})

    def _decode_forward(self, cache_set: CacheSet, shape: DecodeShape, capture: tuple[int, ...]):
        """(executor key, function) of the whole-forward decode graph of this shape over these pools."""
        key = ("decode", id(cache_set), shape.batch, shape.width, shape.context, capture)
        fn = self._decode_fns.get(key)
        if fn is None:
            # the function holds the cache set (its pools): the id in the key is never reused meanwhile
            fn = self._decode_fns[key] = DecodeForward(self.program, cache_set, shape, capture)
        return key, fn

    def _whole_graph_slots(self, choice: GraphChoice, rows: Sequence[StepRows]) -> tuple[int, int] | None:
        """(slots, rows per slot) when this forward runs as one whole-forward graph, else None.
        FULL decode: its (batch bucket, 1 + k). ROW_BUCKET window: one 128-row slot per request when
        the bucket's padded rows hold a slot for each (always for a single window); windows sharing a
        bucket, mixed and eager forwards keep the segment path."""
        if not self.whole_decode_graphs:
            return None
        if choice.kind is GraphKind.FULL:
            return choice.padded_shape
        if choice.kind is GraphKind.ROW_BUCKET:
            width = self.config.graphs.window_row_bucket
            slots = choice.padded_rows // width
            if len(rows) <= slots and all(r.num_rows <= width for r in rows):
                return slots, width
        return None

    def _run_decode_graph(self, rows: list[StepRows], choice: GraphChoice, slots: tuple[int, int],
                          capture: tuple[int, ...]) -> StepOutput:
        """A FULL decode choice, or a window-only one with a slot per request, as one whole-forward graph
        replay (see `decode_graph`): request b in rows [b * width, b * width + its rows)."""
        cache_set = rows[0].cache.set
        if any(r.cache.set is not cache_set for r in rows):
            raise ValueError("a whole-graph step needs every request's cache in one cache set")
        batch, width = slots
        if len(rows) > batch or max(r.num_rows for r in rows) > width:
            raise ValueError(f"{len(rows)} requests of up to {max(r.num_rows for r in rows)} rows do not fit the "
                             f"whole-graph shape {slots}")
        capture = tuple(sorted(set(capture) & {b.info.index for b in self.program.blocks}))
        context = context_capacity(max(context_rows(self.program, r.cache.pos + r.num_rows) for r in rows))
        shape = DecodeShape(batch, width, context)
        step = DecodeStep(self.program, [DecodeRequest(r.cache, r.tokens) for r in rows], shape)
        key, fn = self._decode_forward(cache_set, shape, capture)
        try:
            inputs = step.prepare(self.device)
            outputs = self._graphs.call(key, fn, inputs)
            _check_finite(outputs[0], [r.num_rows for r in rows], width)
        except Exception as exc:
            step.abandon()  # no row was advanced: every request is where it started
            raise StepFailed(None, exc, tuple(range(len(rows))), ()) from exc
        step.commit(outputs, 1 + len(capture))
        logits, out, features = outputs[0], [], {}
        for b, r in enumerate(rows):
            at = b * width
            if r.logits == "all":
                out.append(logits[at : at + r.num_rows].clone())
            elif r.logits == "last":
                out.append(logits[at + r.num_rows - 1].clone())
            else:
                out.append(None)
        for j, layer in enumerate(capture):
            features[layer] = tuple(outputs[1 + j][b * width : b * width + r.num_rows].clone()
                                    for b, r in enumerate(rows))
        self._forwards[choice.kind.value] += 1
        self._graph_forwards += 1
        self._actual_rows += choice.actual_rows
        self._padded_rows += shape.rows
        return StepOutput(tuple(out), choice, features)

    def _split_logits(self, rows: Sequence[StepRows], logits: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        out, at = [], 0
        for r in rows:
            if r.logits == "all":
                out.append(logits[at : at + r.num_rows])
                at += r.num_rows
            elif r.logits == "last":
                out.append(logits[at])
                at += 1
            else:
                out.append(None)
        return tuple(out)

    def _row_batch(self, rows: Sequence[StepRows], starts_pos: Sequence[int]) -> RowBatch:
        """The attention's view of the real rows, packed in request order (padding left out)."""
        segments, positions, at = [], [], 0
        for r, p in zip(rows, starts_pos):
            pos = torch.arange(p, p + r.num_rows, device=self.device)
            positions.append(pos)
            segments.append(Segment(slice(at, at + r.num_rows), r.cache, ChunkState(positions=pos)))
            at += r.num_rows
        return RowBatch(torch.cat(positions), segments)

    @staticmethod
    def _roll_back(rows: Sequence[StepRows], starts_pos: Sequence[int], layer: int | None,
                   cause: Exception) -> StepFailed:
        if layer is None:  # no attention ran: no cache was extended
            return StepFailed(None, cause, tuple(range(len(rows))), ())
        rolled, lost = [], []
        for j, (r, p) in enumerate(zip(rows, starts_pos)):
            # Undoing needs the window rows this step's drop_before released: kept for <= margin rows.
            if r.num_rows <= ROLLBACK_MARGIN_ROWS:
                try:
                    r.cache.pos = p + r.num_rows
                    r.cache.truncate(p)
                    rolled.append(j)
                    continue
                except Exception:  # noqa: BLE001 - reported as unrecoverable below
                    r.cache.pos = p
            lost.append(j)
        return StepFailed(layer, cause, tuple(rolled), tuple(lost))

    def _count(self, choice: GraphChoice, layout: RowLayout, executor) -> None:
        self._forwards[choice.kind.value] += 1
        if executor is self._graphs:
            self._graph_forwards += 1
        else:
            self._eager_forwards += 1
        self._actual_rows += choice.actual_rows
        self._padded_rows += layout.rows

    # ---- warm-up and stats -----------------------------------------------------------------------
    @torch.no_grad()
    def prepare(self, choice: GraphChoice, logit_rows: int, cache_set: CacheSet | None = None, context: int = 0,
                capture_layers: Sequence[int] = ()) -> None:
        """Run (and on CUDA capture) the segments of `choice`'s shape with no request: pad tokens, zero
        attention outputs, `logit_rows` logit rows. Caches are not touched; counters count it.
        With `cache_set`, a FULL (or ROW_BUCKET) choice on a graph backend instead captures the
        whole-forward graph over that cache set's pools for requests holding up to `context` compressed
        rows (every row is padding: no stored row changes); `logit_rows` is then unused (it computes
        every row's)."""
        slots = self._whole_graph_slots(choice, []) if cache_set is not None else None
        if slots is not None:
            batch, width = slots
            shape = DecodeShape(batch, width, context_capacity(context))
            capture = tuple(sorted(set(capture_layers) & {b.info.index for b in self.program.blocks}))
            key, fn = self._decode_forward(cache_set, shape, capture)
            self._graphs.call(key, fn, DecodeStep(self.program, [], shape).prepare(self.device))
            return
        rows = choice.padded_rows
        executor = self._executor(choice)
        picks = None
        if logit_rows:
            bucket = _logit_rows_bucket(logit_rows, rows) if choice.kind is not GraphKind.EAGER else logit_rows
            picks = torch.zeros(bucket, dtype=torch.long, device=self.device)
        tokens = torch.full((rows,), PAD_TOKEN, dtype=torch.long, device=self.device)
        self._chain(executor, rows, picks, tokens, lambda i, x, out: None, lambda i, s: None)

    @torch.no_grad()
    def warm_up(self, cache_set: CacheSet, max_running: int, capture_layers: Sequence[int] = ()) -> int:
        """Capture before serving the whole-forward graphs steps replay, as SGLang captures its decode
        graphs at start: every decode batch bucket up to the one holding `max_running` requests at the
        verify width, and the single-window shape (1 slot x 128 rows), each at every context capacity
        the cache set's requests can reach (64, 128, ... up to its max_tokens). Segment graphs (several
        windows in one bucket, mixed steps) are still captured on first use. Returns how many graphs
        were captured; none without the whole-graph path. No stored row changes."""
        if not self.whole_decode_graphs:
            return 0
        graphs = self.config.graphs
        top = smallest_bucket_at_least(max_running, graphs.decode_batch_sizes) or graphs.decode_batch_sizes[-1]
        choices = [GraphChoice(ForwardKind.DECODE, GraphKind.FULL, 1, 1, (b, self.config.verify_width))
                   for b in graphs.decode_batch_sizes if b <= top]
        choices.append(GraphChoice(ForwardKind.WINDOW, GraphKind.ROW_BUCKET, 1, 1, (graphs.window_row_bucket,)))
        most = context_capacity(context_rows(self.program, cache_set.sizing.max_tokens))
        contexts = [c for c in (context_capacity(0) << i for i in range(32)) if c <= most]
        before = self._counters.graph_captures
        for choice in choices:
            for context in contexts:
                self.prepare(choice, 0, cache_set=cache_set, context=context, capture_layers=capture_layers)
        return self._counters.graph_captures - before

    def stats(self) -> RunnerStats:
        c = self._counters
        captured = len(self._graphs.captured_keys) if self._graphs is not None else 0
        return RunnerStats(dict(self._forwards), self._graph_forwards, self._eager_forwards,
                           self._forwards[GraphKind.EAGER.value], c.graph_captures, c.graph_replays, c.eager_calls,
                           self._actual_rows, self._padded_rows, captured)
