"""SGLang's own DeepSeek-V4.1 model loop on CPU, the reference model computing each decoder layer over SGLang's pool.

What is substituted is each decoder layer's `forward_hc_pre_from_prev` (SGLang's NonCudaDecoderMixin: TileLang mix
statistics, JIT-CUDA rope and MoE clamp), by the reference model's block (`LayerLoop.run_layer`): on every server but
an asym-prefill one every layer, plus the logits op, whose logits the reference head computed when the last layer ran
(`ReferenceHead`; SGLang's final combine and norm run unused), `install_full_layers`; on asym-prefill layers 0..L-1
inside P's cut, reference_layer.py. SGLang's `HcState(residual, pre)` is the reference's (streams, pre); the loop's
first state has no pre, the reference's first is one-hot on stream 0 (the same collapse).
A forward's rows run in the passes of reference_forward.ForwardPlan, each layer running its passes in turn: a pass
reads that layer's rows of each request from the pool into its throwaway reference caches (which carry what flows
between layers: index selections, candidate blocks, an owner's new compressed rows) and writes its new rows back,
where the next pass of the layer reads them. So each block call has the rows and inputs of the whole-forward order
(the tests' oracle, test/sglang_plugin/whole_forward.py). Window rows riding in a decode forward (`ride_next_decode`)
run as rows after SGLang's own, their streams carried between layers here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ...cache import CacheSet
from ...model.batch import ChunkState, RowBatch, Segment
from ...model.mhc import collapse
from ..shared.pool_dump import dump, dump_dir, log_forward, transferred_extent
from ..shared.pool_rows import PoolRows
from . import pool_cache
from .reference_forward import (RECORDS, ForwardPlan, ReferenceSetup, RequestRows, Rider, RowsOutput,
                                captures_every_row, phases, pieces, take_unridden)

log = logging.getLogger(__name__)


class LayerLoopError(RuntimeError):
    """A forward the per-layer substitution cannot run (names what and why)."""


@dataclass
class _Pass:
    """Pieces of requests' rows that one block call of each layer runs together (one forward of the whole-forward
    reference): each piece's rows in the forward's row order, its floors, and its cache for this forward."""

    pieces: list[tuple[int, RequestRows, dict[int, int]]]
    short: bool  # bounded replay's rows before B: layers up to the last KV source, that source's KV path only
    at: torch.Tensor  # the pass's rows in the forward's row order
    batch: RowBatch
    caches: CacheSet


@dataclass
class _Forward:
    """One SGLang forward's reference state, from its layer 0 to its last layer."""

    forward_batch: Any
    requests: list[RequestRows]  # SGLang's requests, then the riders' rows
    own: int  # how many of `requests` are SGLang's (the rest ride)
    riders: list[Rider]
    capture: tuple[int, ...]
    passes: list[_Pass]
    extra: tuple[torch.Tensor, torch.Tensor] | None  # the riders' streams and pre between layers
    captured: dict[int, torch.Tensor] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def release(self) -> None:
        for p in self.passes:
            for segment in p.batch.segments:
                segment.cache.release()


class LayerLoop:
    """The reference model's blocks as SGLang's decoder layers up to `last_layer` over SGLang's pool; in the full
    role, its head's logits after the last."""

    def __init__(self, setup: ReferenceSetup, last_layer: int) -> None:
        self.setup, self.last_layer = setup, last_layer
        self.model, self.cfg = setup.model, setup.model.cfg
        self.full = setup.model.role == "full"
        self.plan: ForwardPlan | None = None  # the whole-forward's planning, bound with the pool
        self.current: _Forward | None = None
        self.output: Any = None  # the last forward's LogitsProcessorOutput, handed out by the logits op

    def planner(self) -> ForwardPlan:
        """The model runner builds its KV pool after loading the model: bound on the first forward."""
        if self.plan is None:
            if RECORDS.kv_pool is None:
                raise LayerLoopError("the model runner's pools were never seen (the init_new hook did not run)")
            rows = PoolRows(RECORDS.kv_pool, RECORDS.req_to_token, self.cfg)
            if rows.row_format != self.model.quant.mode:
                raise LayerLoopError(f"SGLang's pool holds {rows.row_format} rows, the reference model quantizes "
                                     f"its caches as {self.model.quant.mode}")
            s = self.setup
            self.plan = ForwardPlan(self.model, rows, s.semantics, s.deterministic, s.split, s.replay)
        return self.plan

    # -- one forward --------------------------------------------------------------------------------------------

    def _begin(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> _Forward:
        self._end()
        plan = self.planner()
        requests = ForwardPlan.request_rows(input_ids, positions, forward_batch)
        if not self.full:
            self._check_prefix_rows(requests, forward_batch)
        capture = plan.feature_layers if captures_every_row(forward_batch) else ()
        riders = take_unridden() if self.full and forward_batch.forward_mode.is_decode() and not capture else []
        own = len(requests)
        requests = requests + [r for rider in riders for r in rider.rows]
        offsets, at = [], 0
        for r in requests:
            offsets.append(at)
            at += r.tokens.numel()
        passes = []
        for phase in phases(requests, self.cfg, plan.split.window, plan.semantics, plan.split.chunk,
                            verify_by_row=self.setup.deterministic):
            for group in plan.forward_groups(phase, capture):
                passes.append(self._pass(group, requests, offsets, plan.to_kv_source_only(group[0][1], capture)))
        extra = None
        if riders:
            tokens = torch.cat([r.tokens for r in requests[own:]]).long()
            streams = self.model.embed(tokens).unsqueeze(1).expand(-1, self.cfg.hc_mult, -1)
            extra = (streams, _first_pre(tokens.numel(), self.cfg.hc_mult))
        self.current = _Forward(forward_batch, requests, own, riders, capture, passes, extra)
        return self.current

    def _check_prefix_rows(self, requests: list[RequestRows], forward_batch: Any) -> None:
        """The prefill role computes prompt rows [0, B) of extend batches only: no replay floor reaches them."""
        mode = forward_batch.forward_mode
        if not mode.is_extend() or mode.is_target_verify():
            raise LayerLoopError(f"the asym-prefill role runs extend batches only, not {mode}")
        plan = self.planner()
        for r in requests:
            split = pieces(r, self.cfg, plan.split.window, plan.semantics, plan.split.chunk)
            if len(split) != 1 or split[0][1]:
                raise LayerLoopError(f"rows [{r.start}, {r.end}) of a prompt of {r.prompt_len} tokens reach past its "
                                     f"prefix: the asym-prefill role computes [0, N - W) only")

    def _pass(self, group: list[tuple[int, RequestRows, dict[int, int]]], requests: list[RequestRows],
              offsets: list[int], short: bool) -> _Pass:
        caches = self.model.new_cache_set()
        segments, at, row = [], [], 0
        for i, r, floors in group:
            cache = caches.new_request()
            cache.pos = r.start
            cache.swa_floor.update(floors)
            n = r.tokens.numel()
            first = offsets[i] + r.start - requests[i].start
            at.append(torch.arange(first, first + n))
            positions = torch.arange(r.start, r.end)
            segments.append(Segment(slice(row, row + n), cache, ChunkState(positions)))
            row += n
        return _Pass(group, short, torch.cat(at), RowBatch(torch.cat([s.state.positions for s in segments]), segments),
                     caches)

    def run_layer(self, index: int, state: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                  forward_batch: Any, hc_cfg: Any) -> Any:
        """Layer `index` of SGLang's loop: the reference block over each pass's rows in turn, its rows to the pool;
        after the last layer, the head's logits."""
        from sglang.srt.models import deepseek_v4_mhc as mhc

        current = self.current
        if index == 0 or current is None or current.forward_batch is not forward_batch:
            current = self._begin(input_ids, positions, forward_batch)
        try:
            state = state.materialized(hc_cfg)
            streams, pre = state.residual, state.pre
            if pre is None:  # the loop's first state: the combine reads stream 0
                pre = _first_pre(streams.shape[0], streams.shape[1]).to(streams.device)
            own_rows = streams.shape[0]
            if current.extra is not None:
                streams, pre = torch.cat([streams, current.extra[0]]), torch.cat([pre, current.extra[1]])
            if index in current.capture:
                current.captured[index] = streams.float().mean(dim=1).to(streams.dtype)
            streams, pre = self._layer(index, current, streams, pre)
            if index == self.last_layer:
                self._finish(current, streams, pre)
            elif current.extra is not None:
                current.extra = (streams[own_rows:], pre[own_rows:])
        except BaseException:
            self._end()
            raise
        return mhc.HcState(streams[:own_rows], pre[:own_rows])

    def _layer(self, index: int, current: _Forward, streams: torch.Tensor, pre: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        plan, rows, dtype = self.planner(), self.planner().rows, self.model.dtype
        block, info = self.model.layers[index], self.model.plan.layers[index]
        last_source = self.model.plan.last_kv_source
        streams, pre = streams.clone(), pre.clone()
        for p in current.passes:
            if p.short and index > last_source:
                continue
            window = index in plan.swa_layers and index in plan.window_layers(p.short)
            for (_, r, floors), segment in zip(p.pieces, p.batch.segments):
                cache = segment.cache
                if window:
                    pool_cache.load_window(rows, cache, index, r.req, r.start, plan.window, dtype,
                                           floors.get(index, 0))
                elif index in plan.swa_layers:  # bounded replay's prefix rows: no window there
                    cache.start_swa_at(index, r.start)
                if info.owns_kv:
                    pool_cache.load_compressed(rows, cache, index, r.req, r.start, dtype)
            if p.short and index == last_source:
                block.write_kv_source_rows(streams[p.at], pre[p.at], p.batch, self.model.quant)
            else:
                out_streams, out_pre = block(streams[p.at], pre[p.at], p.batch, self.model.quant)
                streams[p.at], pre[p.at] = out_streams, out_pre
            for (_, r, _), segment in zip(p.pieces, p.batch.segments):
                if window:
                    pool_cache.store_window(rows, segment.cache, index, r.req, r.start, r.end)
                if info.owns_kv:
                    pool_cache.store_compressed(rows, segment.cache, index, r.req, r.start, r.end, r.verify)
        return streams, pre

    def _finish(self, current: _Forward, streams: torch.Tensor, pre: torch.Tensor) -> None:
        """The head's logits per pass (as the whole-forward computes them), the riders' handed over, the forward
        logged; the LogitsProcessorOutput waits for the logits op."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        if not self.full:  # P's cut runs layer L's KV path next (then PrefillForward dumps), and never the head
            self._end()
            return
        self.dump_completed([r for p in current.passes for _, r, _ in p.pieces])
        outs = [RowsOutput() for _ in current.requests]
        capture = current.capture
        features = torch.cat([current.captured[layer] for layer in capture], dim=-1) if capture else None
        for p in current.passes:
            logits = [None] * len(p.pieces) if p.short else self._head(p, streams, pre)
            for (i, r, _), segment, piece_logits in zip(p.pieces, p.batch.segments, logits):
                rows_at = p.at[segment.rows]
                outs[i].add(r, piece_logits, [features[rows_at]] if capture else [])
        logits = [torch.zeros(self.cfg.vocab_size) if out.logits() is None else out.logits() for out in outs]
        own = current.own
        hidden = torch.cat([torch.cat(out.features) for out in outs[:own]]) if capture else None
        at = own
        for rider in current.riders:  # never in a verify forward
            rider.on_logits(torch.stack(logits[at:at + len(rider.rows)]))
            at += len(rider.rows)
        join = torch.cat if current.requests[0].verify else torch.stack  # verify: every row's logits, [rows, V]
        self.output = LogitsProcessorOutput(next_token_logits=join(logits[:own]).float(), hidden_states=hidden)
        self._log(current)
        self._end()

    def _head(self, p: _Pass, streams: torch.Tensor, pre: torch.Tensor) -> list[torch.Tensor]:
        """Each piece's logits ([V] for its last row, [rows, V] for verify rows), in one head call per pass."""
        picked = [torch.arange(s.rows.start, s.rows.stop) if r.verify else torch.tensor([s.rows.stop - 1])
                  for (_, r, _), s in zip(p.pieces, p.batch.segments)]
        rows = p.at[torch.cat(picked)]
        head_out = torch.nn.functional.linear(self.model.norm(collapse(streams[rows], pre[rows])).float(),
                                              self.model.head.weight)
        bounds = torch.tensor([0] + [len(i) for i in picked]).cumsum(0).tolist()
        return [head_out[a:b] if r.verify else head_out[a] for (_, r, _), a, b in zip(p.pieces, bounds, bounds[1:])]

    def dump_completed(self, requests: list[RequestRows]) -> None:
        """The pool-dump test aid (shared/pool_dump.py: off unless its directory is set) for each request whose
        transferred extent these rows completed."""
        if dump_dir() is None:
            return
        for r in requests:
            extent = None if r.prompt_len is None else transferred_extent(self.cfg, r.prompt_len)
            if extent is not None and r.end == extent.num_tokens:
                dump(self.planner().rows, RECORDS.role, RECORDS.room(r.req), r.req, extent)

    def _log(self, current: _Forward) -> None:
        last, every = self.model.plan.last_kv_source, range(self.cfg.num_hidden_layers)
        ran = [(tuple(range(last + 1)) if p.short else tuple(every), [r for _, r, _ in p.pieces])
               for p in current.passes]
        mode, rows = current.forward_batch.forward_mode, current.requests
        kind = "mixed" if current.riders else "decode" if mode.is_decode() else "verify" if rows[0].verify else "extend"
        log_forward(RECORDS.role, kind, sorted({layer for layers, _ in ran for layer in layers}),
                    [(RECORDS.room(r.req), r.start, r.end) for r in rows], time.perf_counter() - current.started,
                    decode_rows=current.own if mode.is_decode() else 0,
                    pieces=[(layers, [(RECORDS.room(r.req), r.start, r.end) for r in done]) for layers, done in ran])

    def take_output(self) -> Any:
        output, self.output = self.output, None
        if output is None:
            raise LayerLoopError("the logits op ran before the model's last layer (SGLang's loop changed?)")
        return output

    def _end(self) -> None:
        if self.current is not None:
            self.current.release()
            self.current = None


def _first_pre(rows: int, hc: int) -> torch.Tensor:
    """The reference's first pre-mix, one-hot on stream 0 (whose collapse is stream 0 exactly)."""
    pre = torch.zeros(rows, hc, dtype=torch.float32)
    pre[:, 0] = 1
    return pre


class LayerForward:
    """Layer `index`'s `forward_hc_pre_from_prev`, as SGLang's loop calls it."""

    def __init__(self, loop: LayerLoop, index: int, hc_cfg: Any) -> None:
        self.loop, self.index, self.hc_cfg = loop, index, hc_cfg

    def __call__(self, positions: torch.Tensor, state: Any, input_ids: torch.Tensor, forward_batch: Any,
                 input_ids_global: torch.Tensor) -> Any:
        with torch.no_grad():
            return self.loop.run_layer(self.index, state, input_ids, positions, forward_batch, self.hc_cfg)


def layer_loop_of(causal_lm: Any) -> LayerLoop | None:
    """The loop whose reference blocks compute this causal LM's layers on CPU, or None."""
    model = getattr(causal_lm, "model", None)
    layers = getattr(model, "layers", None)
    if model is None or layers is None:
        return None
    forward = getattr(layers[model.start_layer], "forward_hc_pre_from_prev", None)
    return forward.loop if isinstance(forward, LayerForward) else None


def substitute_layers(model: Any, loop: LayerLoop) -> None:
    """The loop's layers [start_layer, last_layer] of SGLang's DeepseekV4Model compute through `loop`."""
    for index in range(model.start_layer, loop.last_layer + 1):
        layer = model.layers[index]
        layer.forward_hc_pre_from_prev = LayerForward(loop, index, layer.hc_cfg)


class ReferenceHead(torch.nn.Module):
    """The causal LM's `logits_processor` on CPU: the reference head's logits the last layer computed (a module:
    SGLang's model holds its logits processor as a child module)."""

    def __init__(self, loop: LayerLoop) -> None:
        super().__init__()
        self.loop = loop

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.loop.take_output()


class FullForward:
    """The causal LM's forward on CPU: SGLang's own, with no gradients; an empty batch gives empty logits."""

    def __init__(self, forward: Callable[..., Any], loop: LayerLoop) -> None:
        self.forward, self.loop = forward, loop

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                 **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        mode = forward_batch.forward_mode
        if mode.is_idle() or forward_batch.batch_size == 0:
            return LogitsProcessorOutput(next_token_logits=torch.empty(0, self.loop.cfg.vocab_size))
        with torch.no_grad():
            return self.forward(input_ids, positions, forward_batch, *args, **kwargs)


def install_full_layers(causal_lm: torch.nn.Module) -> LayerLoop | None:
    """The CPU platform's model setup for every server but an asym-prefill one: the full role's reference model from
    SGLang's loaded parameters (reference_forward.reference_setup), its blocks as SGLang's decoder layers, its head as
    SGLang's logits op. Other architectures are left alone."""
    from .reference_forward import reference_setup

    setup = reference_setup(causal_lm)
    if setup is None:
        return None
    model, layers = causal_lm.model, setup.model.cfg.num_hidden_layers
    if setup.model.role != "full" or not getattr(model, "hc_pre_from_prev_sublayer", False):
        raise LayerLoopError("install_full_layers needs the full model running V4.1's hc_pre_from_prev layer loop")
    if (model.start_layer, model.end_layer) != (0, layers):
        raise LayerLoopError(f"layers [{model.start_layer}, {model.end_layer}) of {layers}: the CPU route runs one "
                             "pipeline stage holding every layer")
    loop = LayerLoop(setup, layers - 1)
    substitute_layers(model, loop)
    causal_lm.logits_processor = ReferenceHead(loop)
    causal_lm.forward = FullForward(causal_lm.forward, loop)
    log.info("sglang-asym: DeepSeek-V4.1 runs SGLang's model loop on CPU, the reference model's block as each of its "
             "%d layers and its head as the logits op (%s%s, %s caches, W %d in %d-row chunks, %s)", layers,
             setup.semantics.value, ", deterministic" if setup.deterministic else "", setup.model.quant.mode,
             setup.split.window, setup.split.chunk, setup.replay.label)
    return loop
