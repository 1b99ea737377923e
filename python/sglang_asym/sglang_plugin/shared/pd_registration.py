"""The asymmetric roles' PD registration (SGLang's KVArgs) over a DeepSeekV4TokenToKVPool.

SGLang registers every buffer of the V4 pool and, having no layer ids for it, pairs a prefill's
entries with its decode peer's by position. An asymmetric pair instead
- gives every registered entry its model layer id, on both sides, so that SGLang's own sender pairs
  entries by layer (`build_transfer_entry_pairs`, as it does across pipeline stages);
- on the prefill side registers only what the payload occupies: every compressed KV and index-key
  buffer (all of them are KV sources the split ships), the pair rings, and the SWA buffers of the
  encoder layers when the semantics ships their window rows (none for `asym`). The SWA component
  stays in place, possibly empty, because SGLang matches state components by position.
SGLang's symmetric DSpark PD layout check (`get_dsv41_spec_layout`, compared at the handshake) does not
apply: it asks for a draft SWA component and equal speculative settings on both sides, because a
symmetric DSpark P ships the draft KV too. An asymmetric P ships no draft state and never speculates, and
an asym-decode D that speculates drafts from its own window (cpu_platform/dspark_worker.py), so both roles announce no
such layout (`no_symmetric_dspark_layout`).
With requests cut to B = N - W on the prefill side, SGLang's own per-request indices (pages covering
[0, B), the window pages below B, the ring of an odd B) then make `send_kvcache` and
`maybe_send_extra` move exactly the manifest's entries (test_pool_payload.py checks it on CPU).
"""

from __future__ import annotations

from typing import Any

from ...config import V41Config
from ...split import Semantics, SplitPlan
from .pool_payload import CONTIGUOUS, REQUEST_STATE, pool_entries
from .settings import AsymSettings


class AsymRegistrationError(RuntimeError):
    """The pool or KVArgs are not what the asymmetric registration was written for."""


def _component(kv_args: Any, state_type: Any) -> int | None:
    matches = [i for i, st in enumerate(kv_args.state_types) if st == state_type]
    if len(matches) > 1:
        raise AsymRegistrationError(f"KVArgs registers {len(matches)} {state_type} components")
    return matches[0] if matches else None


def encoder_swa_layers(cfg: V41Config, settings: AsymSettings) -> tuple[int, ...]:
    """Layers whose SWA the prefill role ships: the encoder's, with window-row semantics only."""
    probe = SplitPlan(cfg, settings.window + 1, settings.window, settings.semantics)  # any N > W
    return probe.plan.encoder_layers if probe.ships_encoder_swa else ()


def apply_asym_registration(kv_args: Any, pool: Any, cfg: V41Config, settings: AsymSettings) -> None:
    """Rewrites SGLang's KVArgs (after `setup_state_kv_args`) for an asymmetric role."""
    from sglang.srt.disaggregation.base.conn import StateType

    Semantics.parse(settings.semantics)
    entries = pool_entries(pool)
    num_draft = int(getattr(kv_args, "num_draft_entries", 0) or 0)
    target = len(kv_args.kv_data_ptrs) - num_draft
    if target != len(entries[CONTIGUOUS]):
        raise AsymRegistrationError(f"KVArgs lists {target} target KV entries, the pool registers "
                                    f"{len(entries[CONTIGUOUS])}")
    if settings.is_prefill and num_draft:
        raise AsymRegistrationError("the asym-prefill role ships no draft KV (the decode role drafts itself)")
    # draft entries (decode side only) get ids above the target's, so they never pair with a sender's
    kv_args.kv_layer_ids = [e.layer for e in entries[CONTIGUOUS]] + [
        cfg.num_hidden_layers + i for i in range(num_draft)]

    swa = _component(kv_args, StateType.SWA)
    if swa is None:
        raise AsymRegistrationError("KVArgs registers no SWA state component")
    if len(kv_args.state_data_ptrs[swa]) != len(pool.swa_kv_pool.kv_buffer):
        raise AsymRegistrationError("KVArgs' SWA component is not exactly the pool's SWA buffers")
    start = getattr(pool, "start_layer", 0) or 0
    swa_layers = [start + i for i in range(len(kv_args.state_data_ptrs[swa]))]
    keep = set(encoder_swa_layers(cfg, settings)) if settings.is_prefill else set(swa_layers)
    chosen = [i for i, layer in enumerate(swa_layers) if layer in keep]
    for field in ("state_data_ptrs", "state_data_lens", "state_item_lens"):
        values = getattr(kv_args, field)
        values[swa] = [values[swa][i] for i in chosen]
    for field in ("state_dim_per_tensor", "state_conv_shard_groups", "state_slice_outer_counts"):
        values = getattr(kv_args, field, None)
        if values and values[swa]:
            values[swa] = [values[swa][i] for i in chosen]
    kv_args.state_layer_ids[swa] = [swa_layers[i] for i in chosen]

    rings = _component(kv_args, StateType.DSV4_REQUEST_STATE)
    if rings is not None:
        ring_layers = [e.layer for e in entries[REQUEST_STATE]]
        if len(ring_layers) != len(kv_args.state_data_ptrs[rings]):
            raise AsymRegistrationError("KVArgs' request-state entries are not the pool's pair rings")
        kv_args.state_layer_ids[rings] = ring_layers


def no_symmetric_dspark_layout(kv_args: Any) -> None:
    """Replaces SGLang's get_dsv41_spec_layout in an asymmetric server (see the module docstring)."""
    return None
