"""P's forward on CPU through SGLang's own DeepSeek-V4.1 model loop, the reference model computing each decoder layer.

On the asym-prefill role the CPU platform's `post_load_model` calls `install_reference_layers` instead of the
whole-forward replacement (reference_forward.py). SGLang's causal LM forward then runs as SGLang runs it, with
P's cut inside (prefill/cut_hook.py): the embedding, `hc_broadcast`, `_forward_impl` and its non-CUDA layer loop
`_forward_layers_hc_pre_from_prev` over layers 0..L-1 and its epilogue, layer L's mHC combine and its KV path
`forward_low_ratio_sources` -> `_low_ratio_compress_torch` (the two kernels there without a CPU build replaced op
for op, cpu_ops.py), and the pipeline-stage exit before the head. What is substituted is each decoder layer's
`forward_hc_pre_from_prev` (SGLang's NonCudaDecoderMixin: its mix statistics are TileLang, its fused rope and MoE
clamp JIT-CUDA): layer i runs the reference model's block i (model/block.py).

The mHC state is the same on both sides: SGLang's `HcState(residual, pre)` is the reference's (streams, pre) --
the residual streams [rows, hc_mult, hidden] and the pre-mix the previous hyper-connection computed for the next
collapse. On CPU a layer hands its post over done (only the HIP fused boundary leaves an `HcPending` post, which
`materialized` completes). The loop's first state has no pre (SGLang's combine then reads stream 0); the
reference's first pre is the one-hot [1, 0, ..., 0], whose collapse is stream 0 exactly.

Each layer reads and writes only its own rows of each request in SGLang's pool (pool_cache.py): its window rows
and, on a KV owner, its compressed rows, index keys and pending token. What flows from layer to layer inside one
forward (each request's index selection and candidate blocks, and the compressed rows an owner just added for the
layers that read them) lives in a throwaway reference batch from layer 0 to layer L-1 of that forward. With
--enable-deterministic-inference each request's rows run each layer alone, as the whole-forward reference runs
each request as a forward of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...cache import CacheSet, CacheSizing, RequestCache
from ...model.batch import ChunkState, RowBatch, Segment
from ...model.model import V41Model
from ...split import Semantics
from ..shared.pool_dump import dump, dump_dir, transferred_extent
from ..shared.pool_rows import PoolRows
from . import pool_cache
from .reference_forward import RECORDS, ReferenceForward, RequestRows, WindowSplit, pieces

log = logging.getLogger(__name__)


class ReferenceLayerError(RuntimeError):
    """A batch the per-layer substitution cannot run (names what and why)."""


@dataclass
class _Group:
    """Rows of one reference pass of a layer: the requests' row range in SGLang's batch and their segments."""

    rows: slice
    batch: RowBatch


class _Forward:
    """One SGLang forward's reference state, from its first substituted layer to its last."""

    def __init__(self, forward_batch: Any, requests: list[RequestRows], caches: CacheSet, deterministic: bool) -> None:
        self.forward_batch = forward_batch
        self.requests = requests
        self.caches: list[RequestCache] = []
        segments, at = [], 0
        for r in requests:
            cache = caches.new_request()
            cache.pos = r.start
            self.caches.append(cache)
            n = r.tokens.numel()
            segments.append((slice(at, at + n), cache, torch.arange(r.start, r.end)))
            at += n
        if deterministic:  # each request alone: its rows start at 0 of its own pass
            self.groups = [_Group(rows, RowBatch(pos, [Segment(slice(0, pos.numel()), cache, ChunkState(pos))]))
                           for rows, cache, pos in segments]
        else:
            positions = torch.cat([pos for _, _, pos in segments])
            self.groups = [_Group(slice(0, at), RowBatch(positions, [Segment(rows, cache, ChunkState(pos))
                                                                     for rows, cache, pos in segments]))]

    def release(self) -> None:
        for cache in self.caches:
            cache.release()


class ReferenceLayers:
    """The reference model's blocks as SGLang's decoder layers 0..L-1, over SGLang's pool."""

    def __init__(self, model: V41Model, semantics: Semantics, deterministic: bool, split: WindowSplit) -> None:
        self.model, self.cfg = model, model.cfg
        self.semantics, self.deterministic, self.split = semantics, deterministic, split
        self.last_layer = model.plan.last_kv_source - 1
        self.rows: PoolRows | None = None
        self.current: _Forward | None = None

    def pool_rows(self) -> PoolRows:
        """The model runner builds its KV pool after loading the model: bound on the first forward."""
        if self.rows is None:
            if RECORDS.kv_pool is None:
                raise ReferenceLayerError("the model runner's pools were never seen (the init_new hook did not run)")
            rows = PoolRows(RECORDS.kv_pool, RECORDS.req_to_token, self.cfg)
            if rows.row_format != self.model.quant.mode:
                raise ReferenceLayerError(f"SGLang's pool holds {rows.row_format} rows, the reference model "
                                          f"quantizes its caches as {self.model.quant.mode}")
            self.rows = rows
        return self.rows

    def _requests(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> list[RequestRows]:
        mode = forward_batch.forward_mode
        if not mode.is_extend() or mode.is_target_verify():
            raise ReferenceLayerError(f"the asym-prefill role runs extend batches only, not {mode}")
        requests = ReferenceForward.request_rows(input_ids, positions, forward_batch)
        for r in requests:  # P computes prefix rows [0, B): no replay floor reaches them
            split = pieces(r, self.cfg, self.split.window, self.semantics, self.split.chunk)
            if len(split) != 1 or split[0][1]:
                raise ReferenceLayerError(f"rows [{r.start}, {r.end}) of a prompt of {r.prompt_len} tokens reach "
                                          f"past its prefix: the asym-prefill role computes [0, N - W) only")
        return requests

    def _begin(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> _Forward:
        if self.current is not None:  # a forward that raised before its last layer
            self.current.release()
            self.current = None
        requests = self._requests(input_ids, positions, forward_batch)
        longest = max(r.end for r in requests)
        sizing = CacheSizing(max_requests=len(requests), max_tokens=longest + 1, page_rows=64,
                             max_chunk_tokens=max(r.tokens.numel() for r in requests))
        self.current = _Forward(forward_batch, requests, self.model.new_cache_set(sizing), self.deterministic)
        return self.current

    def run_layer(self, index: int, state: Any, input_ids: torch.Tensor, positions: torch.Tensor,
                  forward_batch: Any, hc_cfg: Any) -> Any:
        """Layer `index` of SGLang's loop: the reference block over the forward's rows, its rows to the pool."""
        from sglang.srt.models import deepseek_v4_mhc as mhc

        current = self.current
        if index == 0 or current is None or current.forward_batch is not forward_batch:
            current = self._begin(input_ids, positions, forward_batch)
        try:
            state = state.materialized(hc_cfg)
            streams, pre = state.residual, state.pre
            if pre is None:  # the loop's first state: the combine reads stream 0
                pre = torch.zeros(streams.shape[0], streams.shape[1], dtype=torch.float32, device=streams.device)
                pre[:, 0] = 1
            rows, dtype = self.pool_rows(), self.model.dtype
            block, info = self.model.layers[index], self.model.plan.layers[index]
            for r, cache in zip(current.requests, current.caches):
                pool_cache.load_window(rows, cache, index, r.req, r.start, self.cfg.sliding_window, dtype)
                if info.owns_kv:
                    pool_cache.load_compressed(rows, cache, index, r.req, r.start, dtype)
            outputs = [block(streams[g.rows], pre[g.rows], g.batch, self.model.quant) for g in current.groups]
            if len(outputs) == 1:
                streams, pre = outputs[0]
            else:
                streams, pre = torch.cat([s for s, _ in outputs]), torch.cat([p for _, p in outputs])
            for r, cache in zip(current.requests, current.caches):
                pool_cache.store_window(rows, cache, index, r.req, r.start, r.end)
                if info.owns_kv:
                    pool_cache.store_compressed(rows, cache, index, r.req, r.start, r.end)
        except BaseException:
            self._end()
            raise
        if index == self.last_layer:
            self._end()
        return mhc.HcState(streams, pre)

    def _end(self) -> None:
        if self.current is not None:
            self.current.release()
            self.current = None


def _layer_forward(layers: ReferenceLayers, index: int, hc_cfg: Any) -> Callable[..., Any]:
    """Layer `index`'s `forward_hc_pre_from_prev`, as SGLang's loop calls it."""

    def forward_hc_pre_from_prev(positions: torch.Tensor, state: Any, input_ids: torch.Tensor, forward_batch: Any,
                                 input_ids_global: torch.Tensor) -> Any:
        with torch.no_grad():
            return layers.run_layer(index, state, input_ids, positions, forward_batch, hc_cfg)

    return forward_hc_pre_from_prev


class PrefillForward:
    """The causal LM's forward on CPU (SGLang's, with P's cut), then the test aid that dumps each request's
    transferred rows once its prefix is computed (shared/pool_dump.py: off unless its directory is set)."""

    def __init__(self, forward: Callable[..., Any], layers: ReferenceLayers) -> None:
        self.forward, self.layers = forward, layers
        self.deterministic = layers.deterministic  # what the deterministic-inference check asks (deterministic.py)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                 **kwargs: Any) -> Any:
        with torch.no_grad():
            out = self.forward(input_ids, positions, forward_batch, *args, **kwargs)
        if dump_dir() is not None and forward_batch.forward_mode.is_extend() and forward_batch.batch_size:
            cfg = self.layers.cfg
            for r in ReferenceForward.request_rows(input_ids, positions, forward_batch):
                extent = transferred_extent(cfg, r.prompt_len)
                if r.end == extent.num_tokens:
                    dump(self.layers.pool_rows(), RECORDS.role, RECORDS.room(r.req), r.req, extent)
        return out


def install_reference_layers(causal_lm: torch.nn.Module, reference: V41Model, semantics: Semantics,
                             deterministic: bool, split: WindowSplit) -> ReferenceLayers:
    """Makes the reference model's blocks SGLang's decoder layers 0..L-1 of the truncated prefill model (P's cut
    bound, prefill/cut_hook.py) and wraps the causal LM's forward for the pool-dump test aid."""
    from ..prefill.cut_hook import cut_of, set_room_lookup

    if cut_of(causal_lm) is None:
        raise ReferenceLayerError("install_reference_layers needs the asym-prefill model with P's cut bound")
    if reference.role != "prefill":
        raise ReferenceLayerError("install_reference_layers needs the prefill role's reference model")
    layers = ReferenceLayers(reference, semantics, deterministic, split)
    model = causal_lm.model
    for index in range(model.start_layer, layers.last_layer + 1):
        layer = model.layers[index]
        layer.forward_hc_pre_from_prev = _layer_forward(layers, index, layer.hc_cfg)
    set_room_lookup(causal_lm, RECORDS.room)
    causal_lm.forward = PrefillForward(causal_lm.forward, layers)
    return layers



def install_prefill_reference_layers(causal_lm: torch.nn.Module) -> ReferenceLayers:
    """The CPU platform's model setup for an asym-prefill server: the prefill role's reference model from
    SGLang's loaded parameters (reference_forward.reference_setup), its blocks as SGLang's layers 0..L-1."""
    from .reference_forward import reference_setup

    setup = reference_setup(causal_lm)
    if setup is None:
        raise ReferenceLayerError(f"{type(causal_lm).__name__} is not SGLang's DeepSeek-V4 causal LM")
    layers = install_reference_layers(causal_lm, setup.model, setup.semantics, setup.deterministic, setup.split)
    log.info("sglang-asym: DeepSeek-V4.1 asym-prefill runs SGLang's model loop with P's cut on CPU, the reference "
             "model's block as each of layers 0..%d (%s%s, %s caches)", layers.last_layer, setup.semantics.value,
             ", deterministic" if setup.deterministic else "", setup.model.quant.mode)
    return layers
