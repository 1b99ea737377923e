"""A request's whole state after its full prompt, as symmetric PD ships it: extract, wire, install.

After the prefill worker ran all N prompt tokens through every layer, the decode worker needs every
layer's window rows (the last min(N, sliding_window)), every KV owner's compressed rows and index
keys for all N tokens, the ratio-2 owners' compressor tails (odd N), and two small aux rows: the
first sampled token and, for non-greedy sampling, the torch.Generator state right after that token
was drawn, so D continues exactly the random stream a colocated server would. The cache groups are
SplitPlan.symmetric_manifest()'s; with `model` rows their sizes are the model dtype's."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from ...cache import CacheSet, GroupKind, RequestCache, index_group, kv_group, parse_group, swa_group, tail_group
from ...cache.groups import row_count
from ...config import V41Config
from ...manifest import PayloadManifest, RowGroup
from ...model import V41Model
from ...split import SplitPlan
from ...transfer import TransferCompat
from .payload_io import decode_rows, encode_rows, transfer_compat

FIRST_TOKEN = "aux.first_token"  # one int64 row
RNG_STATE = "aux.rng_state"  # one row: the CPU torch.Generator state (mt19937), for non-greedy requests
RNG_STATE_BYTES = torch.Generator().get_state().numel()
AUX_ENCODINGS = {FIRST_TOKEN: "int64-token-id", RNG_STATE: "torch-cpu-generator-state"}
AUX_GROUPS = (FIRST_TOKEN, RNG_STATE)


class StateMismatch(ValueError):
    """Rows that do not form the state the manifest describes."""


def state_manifest(split: SplitPlan, row_format: str, dtype: torch.dtype, sampled: bool) -> PayloadManifest:
    """The symmetric payload of one request: its cache groups, then the aux rows (`sampled`: non-greedy)."""
    groups = [RowGroup(g.name, parse_group(g.name).row_bytes(split.config, row_format, dtype), g.num_rows)
              for g in split.symmetric_manifest().groups]
    groups.append(RowGroup(FIRST_TOKEN, 8, 1))
    if sampled:
        groups.append(RowGroup(RNG_STATE, RNG_STATE_BYTES, 1))
    return PayloadManifest(tuple(groups))


def cache_bytes(manifest: PayloadManifest) -> int:
    """Bytes of the manifest's cache rows (without the aux rows)."""
    return sum(g.nbytes for g in manifest.groups if g.name not in AUX_GROUPS)


def state_compat(cfg: V41Config, window: int, row_format: str, dtype: torch.dtype) -> TransferCompat:
    """What a symmetric P and D agree on: every group any request may ship (odd N >= the window: all
    tails, every layer's window rows), semantics exact."""
    n = cfg.sliding_window + (1 if cfg.sliding_window % 2 == 0 else 0)
    every = state_manifest(SplitPlan(cfg, n, window, "exact"), row_format, dtype, sampled=True)
    return transfer_compat(cfg, window, "exact", row_format, dtype, manifest=every, extra_encodings=AUX_ENCODINGS)


def extract_state(cache: RequestCache, manifest: PayloadManifest, groups: tuple[str, ...] | None = None
                  ) -> dict[str, torch.Tensor]:
    """Copy the manifest's cache rows (or only `groups` of them) out of a full-prompt cache."""
    rows: dict[str, torch.Tensor] = {}
    for g in manifest.groups:
        if g.name in AUX_GROUPS or (groups is not None and g.name not in groups):
            continue
        group = parse_group(g.name)
        if group.kind is GroupKind.TAIL:
            tail = cache.tail(group.layer)
            if tail is None:
                raise StateMismatch(f"{g.name}: the cache holds no compressor tail")
            rows[g.name] = tail.clone()
        elif group.kind is GroupKind.SWA:
            stored = cache.rows(g.name)
            rows[g.name] = stored.read(stored.end - g.num_rows, stored.end).clone()
        else:
            rows[g.name] = cache.rows(g.name).read(0, g.num_rows).clone()
    return rows


def install_state(model: V41Model, cache_set: CacheSet, rows: Mapping[str, torch.Tensor], prompt_len: int
                  ) -> RequestCache:
    """A fresh request cache holding a full prompt's state, positioned at N (ready to decode)."""
    cfg = model.cfg
    check_state_rows(cfg, rows, prompt_len)
    cache = cache_set.new_request()
    try:
        for layer in range(cfg.num_hidden_layers):
            window = rows[swa_group(layer)]
            cache.start_swa_at(layer, prompt_len - window.shape[0])
            cache.rows(swa_group(layer)).append(window.to(model.dtype))
        for owner in model.plan.kv_owner_layers:
            for group in (kv_group(owner), index_group(owner)):
                cache.rows(group).append(rows[group].to(model.dtype))
            if tail_group(owner) in rows:
                cache.set_tail(owner, rows[tail_group(owner)])
        cache.pos = prompt_len
    except Exception:
        cache.release()
        raise
    return cache


def check_state_rows(cfg: V41Config, rows: Mapping[str, torch.Tensor], prompt_len: int) -> None:
    """The cache rows (aux rows aside) are exactly the symmetric manifest's groups and row counts."""
    expected = {g.name: g.num_rows for g in SplitPlan(cfg, prompt_len, cfg.sliding_window, "exact")
                .symmetric_manifest().groups}
    got = {name: row_count(name, t) for name, t in rows.items() if name not in AUX_GROUPS}
    if got != expected:
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        wrong = sorted(k for k in expected.keys() & got.keys() if expected[k] != got[k])
        raise StateMismatch(f"state rows for N={prompt_len} do not match the symmetric manifest: missing {missing}, "
                            f"unexpected {extra}, wrong row counts {[(k, got[k], expected[k]) for k in wrong]}")


# ---- the wire -------------------------------------------------------------------------------
def encode_state_rows(group: str, rows: torch.Tensor, row_format: str, cfg: V41Config) -> np.ndarray:
    """Cache rows as payload_io encodes them; aux rows as raw bytes (one row)."""
    if group == FIRST_TOKEN:
        return rows.to(torch.int64).reshape(1, 1).view(torch.uint8).numpy()
    if group == RNG_STATE:
        return rows.to(torch.uint8).reshape(1, -1).numpy()
    return encode_rows(group, rows, row_format, cfg)


def decode_state_rows(group: str, data: np.ndarray, row_format: str, cfg: V41Config, dtype: torch.dtype
                      ) -> torch.Tensor:
    if group == FIRST_TOKEN:
        return torch.from_numpy(np.ascontiguousarray(data)).view(torch.int64).reshape(1).clone()
    if group == RNG_STATE:
        return torch.from_numpy(np.ascontiguousarray(data)).reshape(-1).clone()
    return decode_rows(group, data, row_format, cfg, dtype)


def aux_rows(first_token: int, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    rows = {FIRST_TOKEN: torch.tensor([first_token], dtype=torch.int64)}
    if generator is not None:
        rows[RNG_STATE] = generator.get_state()
    return rows


def restore_generator(rows: Mapping[str, torch.Tensor]) -> torch.Generator | None:
    """The generator P drew the first token with, continuing where it stopped (None: greedy)."""
    if RNG_STATE not in rows:
        return None
    generator = torch.Generator()
    generator.set_state(rows[RNG_STATE])
    return generator
