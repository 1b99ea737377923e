"""The whole-forward reference over SGLang's pool: the tests' oracle for the CPU route's forward.

Before the CPU route ran SGLang's own model loop (sglang_asym/sglang_plugin/cpu_platform/layer_loop.py), this was
the forward: for each pass of the same plan (reference_forward.ForwardPlan), each request's rows are read from the
pool into a throwaway reference cache, `V41Model.forward_batch` runs every layer, and the new rows go back to the
pool. full_layer_checks.py and prefill_layer_checks.py show that SGLang's loop with the reference layers writes the
same pool bytes and gives the same logits; the unit tests here check the plan's behaviours (riders, verify rows,
deterministic passes, bounded replay) on it, over an in-memory pool (memory_rows.py) or SGLang's.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from sglang_asym.cache import CacheSet, RequestCache
from sglang_asym.model.model import SegmentInput, SegmentOutput
from sglang_asym.sglang_plugin.cpu_platform import pool_cache
from sglang_asym.sglang_plugin.cpu_platform.reference_forward import (RECORDS, ForwardPlan, RequestRows, RowsOutput,
                                                                      captures_every_row, phases, take_unridden)
from sglang_asym.sglang_plugin.shared.pool_dump import dump, dump_dir, log_forward, transferred_extent


class ReferenceForward(ForwardPlan):
    """The whole-forward reference: a callable with DeepseekV4ForCausalLM.forward's signature."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.forwards = 0
        self.last_pieces: list[tuple[tuple[int, ...], list[RequestRows]]] = []  # run_rows': each pass's layers, rows

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, *args: Any,
                 **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        rows = self.request_rows(input_ids, positions, forward_batch)
        if not rows:
            return LogitsProcessorOutput(next_token_logits=torch.empty(0, self.cfg.vocab_size))
        decoding = forward_batch.forward_mode.is_decode()
        verifying = rows[0].verify
        capture = self.feature_layers if captures_every_row(forward_batch) else ()
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

    def run_rows(self, rows: Sequence[RequestRows], capture: tuple[int, ...] = ()
                 ) -> tuple[list[torch.Tensor | None], set[int], list[torch.Tensor]]:
        """Runs the requests' rows over the pool: each request's last-row logits (every row's, [rows, V], for
        verify rows; None in the prefill role), the layers that ran, and with `capture` each request's
        captured layer inputs, concatenated per row ([rows, len(capture) * hidden]; [] without capture)."""
        outs = [RowsOutput() for _ in rows]
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

    def _run(self, phase: list[tuple[int, RequestRows, dict[int, int]]], capture: tuple[int, ...] = ()
             ) -> list[tuple[torch.Tensor | None, dict[int, torch.Tensor]]]:
        caches = self.model.new_cache_set()
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
            if layer not in self.window_layers(short):  # bounded replay's prefix rows: no window there
                cache.start_swa_at(layer, r.start)
                continue
            # rows below a floor are never read (and bounded replay never wrote them)
            pool_cache.load_window(rows, cache, layer, r.req, r.start, self.window, dtype, floors.get(layer, 0))
        for owner in rows.ratio:
            pool_cache.load_compressed(rows, cache, owner, r.req, r.start, dtype)
        cache.swa_floor.update(floors)
        cache.pos = r.start
        return cache

    def _store(self, cache: RequestCache, r: RequestRows, short: bool = False) -> None:
        """The rows the forward added for `r`, written to the pool at the request's slots."""
        for layer in self.window_layers(short):
            pool_cache.store_window(self.rows, cache, layer, r.req, r.start, r.end)
        for owner in self.rows.ratio:
            pool_cache.store_compressed(self.rows, cache, owner, r.req, r.start, r.end, r.verify)
