"""Checks that need SGLang's model or pools built on CPU, run in a process of its own (SGLang's parallel
state owns torch.distributed for the process) by the tests beside this file. Each prints one line
`REPORT <json>` with raw facts; the tests assert on them.

    python test/sglang_plugin/sglang_cpu_checks.py load CHECKPOINT_DIR
    python test/sglang_plugin/sglang_cpu_checks.py payload [PROMPT_LEN]
    python test/sglang_plugin/sglang_cpu_checks.py intake CONFIG_DIR WINDOW
"""

from __future__ import annotations

import dataclasses
import glob
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

ROOM = 7_000_000_000_000_000_001  # a bootstrap room id above 2**62, as SGLang's router draws them


def _expected_value(items: list, tensors: dict[str, torch.Tensor], param: torch.Tensor) -> torch.Tensor:
    """The value SGLang's loader must have stored in `param`, built independently from the
    checkpoint tensors that map to it (`items`: (LoadTarget, checkpoint name))."""
    from sglang_asym.checkpoint.formats import dequantize_fp8

    first = items[0][0]
    if first.shard == "dequant_scale" or any(t.shard == "dequant_scale" for t, _ in items):
        weight = next(tensors[n] for t, n in items if t.shard != "dequant_scale")
        scale = next(tensors[n] for t, n in items if t.shard == "dequant_scale")
        return dequantize_fp8(weight, scale, torch.float32).to(param.dtype)

    def cast(t: torch.Tensor) -> torch.Tensor:
        if param.dtype == torch.float8_e4m3fn or param.dtype == torch.int8:
            assert t.dtype == param.dtype, (t.dtype, param.dtype)
            return t
        return t.to(torch.float32).to(param.dtype)  # e8m0 scales and fp32 tensors, as copy_ converts

    if first.shard is None:
        assert len(items) == 1, items
        return cast(tensors[items[0][1]])
    order = {"q": 0, "kv": 1, "gate": 0, "up": 1, "w1": 0, "w3": 1, "w2": 0}
    if first.expert is None:
        parts = sorted(items, key=lambda item: order[item[0].shard])
        return torch.cat([cast(tensors[n]) for _, n in parts], dim=0)
    experts = defaultdict(list)
    for target, name in items:
        experts[target.expert].append((order[target.shard], name))
    assert sorted(experts) == list(range(param.shape[0])), sorted(experts)
    return torch.stack([torch.cat([cast(tensors[n]) for _, n in sorted(experts[e])], dim=0)
                        for e in sorted(experts)])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _server_args(mode: str | None):
    """The record a scheduler publishes, with the plugin's settings as the launcher attached them.
    (Its model_path stays a placeholder: resolving a real one asks for an accelerator on CPU; the
    model itself comes from ModelConfig.)"""
    from sglang.srt.server_args import ServerArgs

    from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach

    record = ServerArgs(model_path="dummy")
    if mode is not None:
        attach(record, AsymSettings(mode))
    return record


def load(checkpoint: str) -> dict:
    """SGLang's own loading path, as a scheduler runs it, in an asym-prefill server: plugins loaded
    through the entry point, ModelConfig and quantization config from the checkpoint,
    `_initialize_model` (hooked), `DefaultModelLoader.load_weights_only` over SGLang's own file
    iterator; then every parameter compared with the checkpoint."""
    from sglang_asym.config import V41Config
    from sglang_on_cpu import sglang_cpu_context

    cfg = V41Config.from_json_file(checkpoint)
    with sglang_cpu_context():
        from safetensors.torch import load_file
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import loader
        from sglang.srt.plugins import load_plugins
        from sglang.srt import runtime_context
        from sglang.srt.runtime_context import SpawnRanks

        from meta_model import cpu_adjustments
        from sglang_asym.sglang_plugin.prefill.model import PrefillModelError
        from sglang_asym.sglang_plugin.prefill.role import PrefillRole
        from sglang_asym.sglang_plugin.shared.weight_names import load_target

        from sglang.srt.plugins.hook_registry import HookRegistry

        load_plugins()
        patched_before = sorted(HookRegistry._patched)
        # what run_scheduler_process does after load_plugins(): publish its (unpickled) ServerArgs
        # (through the module attribute: a name imported before load_plugins() is not rebound)
        runtime_context.publish(_server_args("asym-prefill"), role="scheduler", ranks=SpawnRanks(world_rank=0))
        patched_after = sorted(HookRegistry._patched)
        model_config, load_config = ModelConfig(checkpoint), LoadConfig()
        quant_config = loader._get_quantization_config(model_config, load_config)
        default_loader = loader.DefaultModelLoader(load_config)
        cpu = torch.device("cpu")

        def build():
            with cpu_adjustments(), cpu:
                return loader._initialize_model(model_config, load_config, quant_config)

        role = PrefillRole.from_config(cfg)
        model = build()
        params = dict(model.named_parameters())
        with cpu_adjustments():
            default_loader.load_weights_only(model, default_loader._get_all_weights(model_config, model), cpu)
        stats = model._sglang_asym_prefill_load_stats

        files = sorted(glob.glob(str(Path(checkpoint) / "*.safetensors")))
        tensors = {}
        for f in files:
            tensors.update(load_file(f))
        by_param = defaultdict(list)
        for name in sorted(role.checkpoint_names):
            target = load_target(name, params)
            if target is not None:
                by_param[target.param].append((target, name))
        compared = {}
        for pname, items in by_param.items():
            expected = _expected_value(items, tensors, params[pname].data)
            compared[pname] = {
                "equal": _same_bits(params[pname].data, expected),
                "dtype": str(params[pname].dtype).removeprefix("torch."),
                "sources": [n for _, n in items],
                "nonzero": bool(params[pname].data.view(torch.uint8).any()),
            }

        errors = {}
        for case, drop in (("missing_kv_path", "layers.20.attn.indexer.wk.weight"),
                           ("missing_encoder_scale", "layers.3.attn.wq_b.scale")):
            fresh = build()
            weights = default_loader._get_all_weights(model_config, fresh)
            try:
                with cpu_adjustments():
                    fresh.load_weights((n, t) for n, t in weights if n != drop)
                errors[case] = None
            except PrefillModelError as exc:
                errors[case] = str(exc)
        try:
            model.load_weights(iter(()), is_nextn=True)
            errors["nextn"] = None
        except PrefillModelError as exc:
            errors["nextn"] = str(exc)

        other_roles = {}
        for mode in ("asym-decode", None):  # the hook leaves every other server's model alone
            runtime_context.publish(_server_args(mode), role="scheduler", ranks=SpawnRanks(world_rank=0))
            other = build()
            other_roles[str(mode)] = [len(list(other.named_parameters())), type(other.lm_head).__name__,
                                      hasattr(other, "_sglang_asym_prefill_role")]
        return {
            "patched": [patched_before, patched_after],
            "quant_config": [type(quant_config).__name__, list(quant_config.weight_block_size),
                             quant_config.is_fp4_experts, quant_config.is_dsv4_fp4_experts],
            "checkpoint_tensors": len(tensors),
            "parameters": sorted(params),
            "passed": sorted(stats.passed),
            "skipped": stats.skipped,
            "compared": compared,
            "errors": errors,
            "layer_types": [type(layer).__name__ for layer in model.model.layers],
            "head": [type(model.lm_head).__name__, type(model.model.norm).__name__],
            "other_roles": other_roles,
        }


def _asym_kv_args(pool, mode: str, split, config_dir: str):
    """KVArgs of one asymmetric role over `pool`, built by SGLang's own `setup_state_kv_args` with the
    plugin's registration hook (P's also carries its pool for the exact-payload manager)."""
    from sglang.srt import runtime_context
    from sglang.srt.disaggregation import utils as disagg_utils
    from sglang.srt.disaggregation.base.conn import KVArgs
    from sglang.srt.runtime_context import SpawnRanks
    from sglang.srt.server_args import ServerArgs

    from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach

    record = ServerArgs(model_path=config_dir, device="cpu")
    attach(record, AsymSettings(mode, window=split.window, semantics=split.semantics.value))
    runtime_context.publish(record, role="scheduler", ranks=SpawnRanks(world_rank=0))
    kv_args = KVArgs()
    kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = pool.get_contiguous_buf_infos()
    kv_args.kv_layer_ids, kv_args.num_draft_entries, kv_args.engine_rank = [], 0, 0
    disagg_utils.setup_state_kv_args(kv_args, pool)
    return kv_args


def _send_indices(pages, pool, split) -> tuple:
    """What SGLang's send_kv_chunk computes for a request of B tokens: its pages, and per state
    component the window pages up to B and the request-state rows."""
    b, page = split.boundary, 256
    contiguous = np.array([pages.full_pages[k] for k in range(-(-b // page))], dtype=np.int32)
    window_start = max(0, b - split.config.sliding_window) // page * page
    swa = [pages.swa_pages[t // page] for t in range(window_start, b, page)]
    return contiguous, [swa, list(pool.request_state_transfer_indices(pages.req_pool_idx, b))]


class _LocalEngine:
    """The transfer engine's batch write as a local copy between the two pools (one process)."""

    def __init__(self) -> None:
        self.blocks: list = []

    def batch_transfer_sync(self, session_id, srcs, dsts, lengths) -> int:
        import ctypes

        for src, dst, length in zip(srcs, dsts, lengths):
            ctypes.memmove(dst, src, length)
            self.blocks.append((src, dst, length))
        return 0


def _exact_send(p_pool, p_pages, d_pool, d_pages, split, config_dir: str) -> dict:
    """The asym-prefill server's exact-payload manager (its two sends; the engine write a local copy):
    the contiguous pages in two chunks, then the state of the last one."""
    import types

    from sglang.srt.disaggregation.base.conn import KVPoll

    import payload_transfer as transfer
    from sglang_asym.sglang_plugin.shared import pool_payload as pp
    from sglang_asym.sglang_plugin.prefill.exact_payload import POOL_ATTR, exact_manager_class

    p_args = _asym_kv_args(p_pool, "asym-prefill", split, config_dir)
    d_args = _asym_kv_args(d_pool, "asym-decode", split, config_dir)
    setattr(p_args, POOL_ATTR, p_pool)
    cls = exact_manager_class()
    manager = cls.__new__(cls)
    engine = _LocalEngine()
    manager.__dict__.update(kv_args=p_args, engine=engine, request_status={ROOM: KVPoll.Transferring},
                            _asym_rooms={}, _asym_lock=__import__("threading").Lock(),
                            _asym_local=__import__("threading").local(), _asym_pool=p_pool,
                            _asym_labels={"model_name": "check", "role": "prefill"})
    manager.expect_asym_room(ROOM, split)
    p_contiguous, p_state = _send_indices(p_pages, p_pool, split)
    d_contiguous, d_state = _send_indices(d_pages, d_pool, split)
    before = {name: t.clone() for name, t in _pool_tensors(d_pool).items()}
    rcs = []
    for start in range(len(p_contiguous)):  # one page per chunk
        manager._asym_local.chunk = types.SimpleNamespace(room=ROOM, index_slice=slice(start, start + 1))
        rcs.append(manager.send_kvcache("local", p_contiguous[start:start + 1], d_args.kv_data_ptrs,
                                        d_contiguous[start:start + 1], None, d_args.kv_layer_ids))
    registration = types.SimpleNamespace(dst_state_data_ptrs=d_args.state_data_ptrs,
                                         dst_state_layer_ids=d_args.state_layer_ids,
                                         dst_state_item_lens=d_args.state_item_lens)
    request = types.SimpleNamespace(dst_state_indices=d_state, mooncake_session_id="local", room=ROOM,
                                    decode_prefix_len=0)
    rcs.append(manager.maybe_send_extra(request, p_state, None, registration))
    return {
        "rc": rcs,
        "room_bytes": manager._asym_rooms[ROOM].bytes_sent,
        "bytes": sum(n for _, _, n in engine.blocks),
        "writes": len(engine.blocks),
        "changed": sorted(n for n, t in _pool_tensors(d_pool).items() if not torch.equal(t, before[n])),
        "back": transfer.read_payload(d_pool, d_pages, split),
    }


def _sglang_registration_send(p_pool, p_pages, d_pool, d_pages, split, config_dir: str) -> dict:
    """The production path: SGLang's own `setup_state_kv_args` (hooked: asym_registration) builds both
    roles' KVArgs; SGLang's own `MooncakeKVManager.send_kvcache` and `maybe_send_extra` (the engine
    write captured) move the request with the indices SGLang's prefill computes for a request cut
    to B; the blocks are applied to D's pool."""
    import types

    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    import payload_transfer as transfer
    from sglang_asym.sglang_plugin.shared import pool_payload as pp

    p_args = _asym_kv_args(p_pool, "asym-prefill", split, config_dir)
    d_args = _asym_kv_args(d_pool, "asym-decode", split, config_dir)
    blocks: list = []
    manager = MooncakeKVManager.__new__(MooncakeKVManager)
    manager.__dict__.update(
        kv_args=p_args, is_mla_backend=True, is_hybrid_mla_backend=False, pp_size=1, attn_tp_size=1,
        state_tp_size=1, enable_custom_mem_pool=False, custom_mem_pool_type=None, max_transfer_batch_indices=0,
        state_strides_validated=set(), request_status={ROOM: KVPoll.Transferring})
    manager._transfer_data = lambda session, transfer_blocks: blocks.extend(transfer_blocks) or 0

    p_contiguous, p_state = _send_indices(p_pages, p_pool, split)
    d_contiguous, d_state = _send_indices(d_pages, d_pool, split)
    rc = manager.send_kvcache("capture", p_contiguous, d_args.kv_data_ptrs, d_contiguous, executor=None,
                              dst_layer_ids=d_args.kv_layer_ids, dst_kv_item_len=None)
    registration = types.SimpleNamespace(
        dst_state_data_ptrs=d_args.state_data_ptrs, dst_state_item_lens=d_args.state_item_lens,
        dst_state_dim_per_tensor=d_args.state_dim_per_tensor, dst_state_layer_ids=d_args.state_layer_ids,
        dst_attn_tp_size=1, dst_tp_rank=0)
    request = types.SimpleNamespace(dst_state_indices=d_state, mooncake_session_id="capture", room=ROOM)
    rc_extra = manager.maybe_send_extra(request, p_state, executor=None, target_rank_registration_info=registration)
    before = {name: t.clone() for name, t in _pool_tensors(d_pool).items()}
    transfer.apply_blocks([transfer.TransferBlock(s, d, n, "") for s, d, n in blocks])
    back = transfer.read_payload(d_pool, d_pages, split)
    return {
        "rc": [rc, rc_extra],
        "p_state_layer_ids": [[str(st) for st in p_args.state_types], p_args.state_layer_ids],
        "d_state_layer_ids": d_args.state_layer_ids,
        "kv_layer_ids": [p_args.kv_layer_ids, d_args.kv_layer_ids],
        "changed": sorted(n for n, t in _pool_tensors(d_pool).items() if not torch.equal(t, before[n])),
        "back": back,
        "bytes": sum(int(n) for _, _, n in blocks),
    }


def _encode_rows(group: str, rows: torch.Tensor, row_format: str, cfg) -> np.ndarray:
    """[n, C] prefix-state rows (tails: [2, C] for one row) -> uint8 [n, row_bytes] in `row_format`."""
    from sglang_asym.cache.groups import parse_group

    fmt = parse_group(group).format
    if fmt.release is None:  # a compressor tail: fp32 value and gate
        return rows.float().contiguous().view(1, -1).view(torch.uint8).numpy()
    packed = fmt.packed(row_format, cfg)
    if packed is not None:
        return packed.pack_rows(rows.float()).numpy()
    return rows.contiguous().view(torch.uint8).numpy()


def payload(prompt_len: str = "429", kv_layout: str = "v41") -> dict:
    """Our prefill role's payload (the row format of `kv_layout`: release formats in v41, V4 rows in v4)
    written into SGLang's DeepSeekV4TokenToKVPool on CPU, read back by SGLang's own readers, moved by
    SGLang's transfer planner to a second pool."""
    from sglang_asym.asym import run_prefix
    from sglang_asym.cache.groups import parse_group
    from sglang_asym.checkpoint.random_init import random_weights
    from sglang_asym.formats import unpack_rows
    from sglang_asym.model import V41Model
    import payload_transfer as transfer
    from sglang_asym.sglang_plugin.shared import pool_payload as pp
    from sglang_asym.sglang_plugin.shared.kv_pool import row_format_of_layout
    from sglang_on_cpu import sglang_cpu_context
    from harness.sglang_shapes import sglang_small
    from sglang_asym.split import SplitPlan

    cfg, n, window = sglang_small(), int(prompt_len), 128
    split = SplitPlan(cfg, n, window, "asym-exact-encoder")
    row_format = row_format_of_layout(kv_layout)
    model = V41Model(cfg, role="prefill", cache_quant=row_format, dtype="float32")
    weights = random_weights(cfg, 7)
    model.load_weights({k: v for k, v in weights.items() if k in model.expected_tensor_names()})
    tokens = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(3))
    state = run_prefix(model, model.new_cache_set(), tokens, split)
    rows = {g: _encode_rows(g, t, row_format, cfg) for g, t in state.rows.items()}
    manifest = split.manifest(row_format).nonempty()

    import tempfile

    config_dir = tempfile.mkdtemp(prefix="sglang_small_config_")
    cfg.write_json(config_dir)
    with sglang_cpu_context():
        from sglang.srt.plugins import load_plugins

        from sglang_on_cpu import build_kv_pool

        load_plugins()
        p_pool, d_pool = (build_kv_pool(cfg, full_tokens=2048, swa_tokens=1024, max_reqs=4, kv_layout=kv_layout)
                          for _ in range(2))
        p_pages = pp.RequestPages(full_pages=(3, 1), swa_pages=(1, 0), req_pool_idx=2)
        d_pages = pp.RequestPages(full_pages=(5, 6), swa_pages=(2, 4), req_pool_idx=1)
        transfer.write_payload(p_pool, p_pages, split, rows)
        p_back = transfer.read_payload(p_pool, p_pages, split)

        # SGLang's own CPU readers of the index-key pool, at the slots of our rows
        index_readback = {}
        for group in (g.name for g in manifest.groups if g.name.startswith("index.")):
            owner = parse_group(group).layer
            ratio = cfg.compress_ratios[owner]
            ipool = p_pool.index_pools[ratio]
            k = list(p_pool.sources_by_ratio[ratio]).index(owner)
            per_page = 256 // ratio
            slots = torch.tensor([p_pages.full_pages[j * ratio // 256] * per_page + j % per_page
                                  for j in range(rows[group].shape[0])])
            payload_i8, scales_i32 = ipool.get_index_k_fp4(k, slots)
            sglang_bytes = torch.cat([payload_i8.view(torch.uint8),
                                      scales_i32.contiguous().view(torch.uint8).view(-1, 4)], dim=1).numpy()
            dequant = ipool.get_index_k_dequant(k, slots)
            ours = unpack_rows(torch.from_numpy(rows[group]), "mxfp4", cfg.index_head_dim).to(torch.bfloat16)
            index_readback[group] = {"bytes_equal": bool((sglang_bytes == rows[group]).all()),
                                     "dequant_equal": bool(torch.equal(dequant, ours)),
                                     "dequant_nonzero": bool(dequant.abs().sum() > 0)}
        v4_readback = _v4_readback(cfg, split, p_pool, p_pages, rows) if kv_layout == "v4" else None

        d_before = {name: t.clone() for name, t in _pool_tensors(d_pool).items()}
        blocks = transfer.sglang_transfer_blocks(p_pool, p_pages, d_pool, d_pages, split)
        sent: dict[str, int] = defaultdict(int)
        for block in blocks:
            sent[block.entry] += len(transfer.read_block(block))
        transfer.apply_blocks(blocks)
        d_back = transfer.read_payload(d_pool, d_pages, split)
        changed = sorted(name for name, t in _pool_tensors(d_pool).items() if not torch.equal(t, d_before[name]))

        production, exact = {}, {}
        for semantics in ("asym-exact-encoder", "asym"):
            variant = SplitPlan(cfg, n, window, semantics)
            expected = {g.name for g in variant.manifest(row_format).nonempty().groups}
            for path, send in (("production", _sglang_registration_send), ("exact", _exact_send)):
                for name, t in _pool_tensors(d_pool).items():
                    t.zero_()
                result = send(p_pool, p_pages, d_pool, d_pages, variant, config_dir)
                back = result.pop("back")
                result["back_equal"] = {g: bool(np.array_equal(back[g], rows[g])) for g in expected}
                result["manifest_bytes"] = variant.manifest(row_format).total_bytes
                (production if path == "production" else exact)[semantics] = result

        speculating = _speculative_decode_send(cfg, kv_layout, p_pool, p_pages, d_pages, split, config_dir, rows)

        asym_split = SplitPlan(cfg, n, window, "asym")
        asym_plan = [[s.buffer_list, [e.name for e in s.entries], list(s.indices)]
                     for s in transfer.asym_send_entries(p_pool, p_pages, asym_split)]
        short_plan = transfer.asym_send_entries(p_pool, p_pages, SplitPlan(cfg, window, window, "asym-exact-encoder"))
        item_lens = {e.name: transfer._buf_infos(p_pool, kind)[2][e.index]
                     for kind, entries in pp.pool_entries(p_pool).items() for e in entries}
        return {
            "boundary": split.boundary,
            "manifest": [[g.name, g.num_rows, g.row_bytes] for g in manifest.groups],
            "p_readback_equal": {g: bool(np.array_equal(p_back[g], rows[g])) for g in rows},
            "d_readback_equal": {g: bool(np.array_equal(d_back[g], rows[g])) for g in rows},
            "index_readback": index_readback,
            "sent_bytes": dict(sent),
            "item_lens": item_lens,
            "blocks": len(blocks),
            "d_changed": changed,
            "plan": [[s.buffer_list, [e.name for e in s.entries], list(s.indices)]
                     for s in transfer.asym_send_entries(p_pool, p_pages, split)],
            "asym_plan": asym_plan,
            "short_plan": len(short_plan),
            "production": production,
            "exact": exact,
            "speculating": speculating,
            "sglang_fp4_table": _sglang_fp4_table(),
            "v4_readback": v4_readback,
        }


def _speculative_decode_send(cfg, kv_layout, p_pool, p_pages, d_pages, split, config_dir: str, rows: dict) -> dict:
    """The exact-payload manager into a decode pool built as SGLang builds it for a server that speculates
    (--speculative-num-draft-tokens 6: its ratio-2 pair ring has 8 rows per request, P's has 2)."""
    from unittest import mock

    from sglang.srt.mem_cache import deepseek_v4_memory_pool as v4_pool

    from sglang_on_cpu import build_kv_pool

    with mock.patch.object(v4_pool, "resolve_compress_state_ring_size",
                           lambda ratio: v4_pool.get_compress_state_ring_size(ratio, 6)):
        d_pool = build_kv_pool(cfg, full_tokens=2048, swa_tokens=1024, max_reqs=4, kv_layout=kv_layout)
    result = _exact_send(p_pool, p_pages, d_pool, d_pages, split, config_dir)
    back = result.pop("back")
    result["back_equal"] = {g: bool(np.array_equal(back[g], rows[g])) for g in back}
    result["ring_rows"] = [sorted({c.ring_size for c in pool.compress_state_pools
                                   if c is not None and c.request_scoped and c.ratio == 2}) for pool in (p_pool, d_pool)]
    return result


def _v4_readback(cfg, split, pool, pages, rows: dict) -> dict:
    """SGLang's own pure-torch reader of its V4 pages (`dequantize_k_cache_paged_ref`) at our window
    and compressed-KV rows, against our decoder (as bf16, what SGLang's reader returns)."""
    from sglang.test.kernels.deepseek_v4.k_cache_reference import dequantize_k_cache_paged_ref

    from sglang_asym.cache.groups import KIND_FORMATS, GroupKind, parse_group
    from sglang_asym.sglang_plugin.shared.pool_payload import group_rows

    out = {}
    for group in split.manifest("v4").nonempty().groups:
        gid = parse_group(group.name)
        if gid.kind is GroupKind.SWA:
            swa = pool.swa_kv_pool
            page_size, buf = swa.page_size, swa.kv_buffer[gid.layer]
            loc = [pages.swa_pages[t // 256] * page_size + t % page_size
                   for t in group_rows(split, group.name, group.num_rows)]
        elif gid.kind is GroupKind.KV:
            ratio = cfg.compress_ratios[gid.layer]
            page_size = pool.kv_pools[ratio].page_size  # 256 / ratio compressed rows
            buf = pool.kv_pools[ratio].kv_buffer[list(pool.sources_by_ratio[ratio]).index(gid.layer)]
            loc = [pages.full_pages[j * ratio // 256] * page_size + j % page_size for j in range(group.num_rows)]
        else:
            continue
        theirs = dequantize_k_cache_paged_ref(buf, torch.tensor(loc), page_size)[:, 0]
        codec = KIND_FORMATS[gid.kind].packed("v4", cfg)
        ours = codec.unpack_rows(torch.from_numpy(rows[group.name]), cfg.head_dim).to(torch.bfloat16)
        out[group.name] = {"equal": bool(torch.equal(theirs, ours)), "nonzero": bool(ours.abs().sum() > 0)}
    return out


def _sglang_fp4_table() -> list:
    from sglang.srt.layers.quantization.fp8 import DSV4_DEQUANT_FP4_TABLE

    return DSV4_DEQUANT_FP4_TABLE.tolist()


def _pool_tensors(pool) -> dict:
    import payload_transfer as transfer
    from sglang_asym.sglang_plugin.shared import pool_payload as pp

    out = {}
    for kind, entries in pp.pool_entries(pool).items():
        ptrs = transfer._buf_infos(pool, kind)[0]
        for entry in entries:
            out[entry.name] = ptrs[entry.index]
    tensors = {}
    for ratio, kv in pool.kv_pools.items():
        for o, buf in zip(pool.sources_by_ratio[ratio], kv.kv_buffer):
            tensors[f"kv.c{ratio}.L{o}"] = buf.view(torch.uint8)
        for o, buf in zip(pool.sources_by_ratio[ratio], pool.index_pools[ratio].index_k_with_scale_buffer):
            tensors[f"index.c{ratio}.L{o}"] = buf.view(torch.uint8)
    for i, buf in enumerate(pool.swa_kv_pool.kv_buffer):
        tensors[f"swa.L{i}"] = buf.view(torch.uint8)
    for o in pool.sources_by_ratio.get(2, ()):
        tensors[f"pair_ring.L{o}"] = pool.compress_state_pools[o].kv_score_buffer.kv_score.view(torch.uint8)
    assert {name: t.data_ptr() for name, t in tensors.items()} == out, "registered pointers differ"
    return tensors


def _intake_request(rid: str, prompt_len: int):
    """A fresh request as the scheduler builds it (SGLang's own Req), for SGLang's fake transfer."""
    from array import array

    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "", array("q", [1000 + t for t in range(prompt_len)]), SamplingParams(max_new_tokens=16),
               bootstrap_host=FAKE_BOOTSTRAP_HOST, bootstrap_port=0, bootstrap_room=7)


def _intake_state(req) -> dict:
    from sglang_asym.sglang_plugin.prefill.cut import prompt_len_of
    from sglang_asym.sglang_plugin.prefill.zero import is_zero_compute

    req.refresh_fill_ids()
    reason = req.finished_reason
    return {
        "ids": list(req.origin_input_ids[:64]), "unpadded": list(req.origin_input_ids_unpadded[:64]),
        "fill_ids": list(req.full_untruncated_fill_ids[:64]), "seqlen": req.seqlen,
        "prompt_len": prompt_len_of(req), "max_new_tokens": req.sampling_params.max_new_tokens,
        "sender": type(req.disagg_kv_sender).__name__ if getattr(req, "disagg_kv_sender", None) else None,
        "zero_compute": is_zero_compute(req),
        "finished": None if reason is None else {"type": type(reason).__name__, "status": int(reason.status_code),
                                                  "message": reason.message},
    }


def intake(config_dir: str, window: str) -> dict:
    """The asym-prefill intake hook on SGLang's own `PrefillBootstrapQueue.add` (SGLang's fake
    transfer backend, SGLang's Req): installed only by an asymmetric scheduler's publish, cuts fresh
    requests to B tokens (N <= W: to none, marked zero-compute), refuses unsplittable prompts and prompt
    logprobs, cuts a request for output logprobs like any other, leaves decode/symmetric alone."""
    from types import SimpleNamespace

    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin import hooks
    from sglang_asym.sglang_plugin.prefill import hooks as prefill_hooks
    from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach

    cpu_import_gaps.install()
    from sglang.srt import runtime_context
    from sglang.srt.disaggregation import prefill
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import SpawnRanks
    from sglang.srt.server_args import ServerArgs

    sglang_add = prefill.PrefillBootstrapQueue.add

    def publish(mode):
        record = ServerArgs(model_path="dummy")
        if mode is not None:
            attach(record, AsymSettings(mode, window=int(window)))
        runtime_context.reset_context()
        runtime_context.publish(record, role="scheduler", ranks=SpawnRanks(world_rank=0))

    report: dict = {}
    load_plugins()
    publish(None)
    report["symmetric_untouched"] = prefill.PrefillBootstrapQueue.add is sglang_add and \
        prefill_hooks.QUEUE_ADD not in HookRegistry._patched
    publish("asym-prefill")
    hooked = prefill.PrefillBootstrapQueue.add
    hooks.install_scheduler_hooks()
    report["installed"] = hooked is not sglang_add and prefill_hooks.QUEUE_ADD in HookRegistry._patched
    report["idempotent"] = prefill.PrefillBootstrapQueue.add is hooked

    streamed: list = []
    queue = object.__new__(prefill.PrefillBootstrapQueue)  # SGLang's add/create_sender on a bare queue
    queue.queue, queue.max_input_len, queue.bootstrap_port = [], 100_000, 0
    queue.transfer_backend, queue.kv_manager = None, None
    queue.scheduler = SimpleNamespace(model_config=SimpleNamespace(model_path=config_dir), output_streamer=SimpleNamespace(
        stream_output=lambda reqs, return_logprob, *a: streamed.extend(r.rid for r in reqs)))

    def add(rid, prompt_len, req=None):
        req = req or _intake_request(rid, prompt_len)
        queue.add(req, 1)
        return req

    cases = {}
    long_req = add("long", int(window) + 5)
    cases["long"] = _intake_state(long_req)
    cases["long_readded"] = _intake_state(add("long", 0, req=long_req))  # a requeued request keeps its cut
    cases["at_window"] = _intake_state(add("at_window", int(window)))
    cases["too_long"] = _intake_state(add("too_long", 8193))  # tiny: max_position_embeddings 8192
    prompt_logprobs = _intake_request("prompt_logprobs", int(window) + 5)
    prompt_logprobs.return_logprob, prompt_logprobs.logprob_start_len = True, 0
    cases["prompt_logprobs"] = _intake_state(add("prompt_logprobs", 0, req=prompt_logprobs))
    output_logprobs = _intake_request("output_logprobs", int(window) + 5)
    # SGLang's scheduler turns the default start -1 into N (output logprobs only) before this queue
    output_logprobs.return_logprob, output_logprobs.logprob_start_len = True, int(window) + 5
    cases["output_logprobs"] = _intake_state(add("output_logprobs", 0, req=output_logprobs))
    cases["output_logprobs_start"] = output_logprobs.logprob_start_len
    report["prefill"] = cases
    report["queued"] = [r.rid for r in queue.queue]
    report["streamed"] = list(streamed)

    publish("asym-decode")
    queue.queue = []
    report["decode_untouched"] = _intake_state(add("decode", int(window) + 5))
    return report


def weights(checkpoint: str) -> dict:
    """SGLang's loader fills its full V4.1 model (CPU patches applied as in a CPU-engine scheduler);
    the reference model built from those parameters is compared, tensor by tensor, with the same
    model read from the checkpoint by the project's own reader."""
    from sglang_asym.config import V41Config
    from sglang_asym.model.loading import model_from_checkpoint
    from sglang_on_cpu import sglang_cpu_context

    cfg = V41Config.from_json_file(checkpoint)
    with sglang_cpu_context():
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_loader import loader

        from sglang_asym.sglang_plugin.cpu_platform.patches import apply_cpu_patches
        from sglang_asym.sglang_plugin.cpu_platform.reference_weights import reference_model_from_sglang

        apply_cpu_patches()
        model_config, load_config = ModelConfig(checkpoint), LoadConfig()
        quant_config = loader._get_quantization_config(model_config, load_config)
        default_loader = loader.DefaultModelLoader(load_config)
        # as DefaultModelLoader.load_model builds it in a server: under the model's dtype, so parameters that
        # take the default dtype (the LM head among them) hold what the server's hold
        with loader.set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
            sglang_model = loader._initialize_model(model_config, load_config, quant_config)
        default_loader.load_weights_only(sglang_model, default_loader._get_all_weights(model_config, sglang_model),
                                         torch.device("cpu"))
        ours = reference_model_from_sglang(sglang_model, cfg, checkpoint).state_dict()
    expected = model_from_checkpoint(checkpoint, cache_quant="release").state_dict()
    # gate.bias_vl routes vision tokens only: SGLang drops it, the reference keeps it zero
    dropped = sorted(n for n in expected if n.endswith(".gate.bias_vl"))
    differing = sorted(n for n in expected if n not in dropped and not _same_bits(ours[n], expected[n]))
    return {"compared": len(expected), "same_keys": sorted(ours) == sorted(expected), "differing": differing[:20],
            "num_differing": len(differing), "dropped": len(dropped),
            "dropped_are_zero": all(not ours[n].any() for n in dropped)}


# What the CPU engine's DSpark (cpu_platform.py, dspark_worker.py, the DSpark entries of cpu_patches.py)
# relies on in SGLang: lines, by the function that holds them, and the signatures it calls.
DSPARK_RELIED_ON = {
    # the platform's worker replaces SGLang's
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker": [
        "platform_worker_cls = self.get_platform_worker_cls()", "return platform_worker_cls"],
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.get_platform_worker_cls": [
        "return current_platform.get_speculative_worker_cls(algorithm=self.name)"],
    # the verify window's slots come from the platform's function
    "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_func": [
        "platform_fn = _get_oot_speculative_cache_locs_fn()"],
    # the one device gate around_handle_dspark passes, read from the resolved device
    "sglang.srt.arg_groups.speculative_hook._handle_dspark": [
        "cfg = resolving_view(server_args)", 'if not cfg.device.startswith(("cuda", "npu", "xpu")):'],
    "sglang.srt.arg_groups.speculative_hook._disable_overlap_schedule_for_cpu": [
        'if cfg.device != "cpu" or cfg.disable_overlap_schedule:'],
    # the two slot helpers a speculative step's allocation calls by their module names
    "sglang.srt.mem_cache.allocation.alloc_for_spec_decode": [
        "last_loc = get_last_loc(", "assign_req_to_token_pool_func("],
}
DSPARK_SIGNATURES = (
    "sglang.srt.speculative.dspark_components.dspark_planner.alloc_verify_window",
    "sglang.srt.speculative.dspark_components.dspark_draft.make_next_draft_input",
    "sglang.srt.speculative.dflash_info.DFlashVerifyInput.prepare_for_verify",
    "sglang.srt.layers.logprob_processor.compute_spec_logprobs",
    "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",
    "sglang.srt.platforms.interface.SRTPlatform.get_speculative_cache_locs_fn",
    "sglang.srt.platforms.interface.SRTPlatform.get_speculative_worker_cls",
    "sglang.srt.platforms.interface.SRTPlatform.supports_speculative_algorithm",
)


def _dspark_relied_on() -> dict:
    import inspect
    import pkgutil

    def resolve(target):
        owner, attr = target.rsplit(".", 1)
        return getattr(pkgutil.resolve_name(owner), attr)

    return {"dspark_signatures": {t: list(inspect.signature(resolve(t)).parameters) for t in DSPARK_SIGNATURES},
            "dspark_missing_lines": {t: [line for line in lines if line not in inspect.getsource(resolve(t))]
                                     for t, lines in DSPARK_RELIED_ON.items()}}


def cpu_patches() -> dict:
    """Every CPU_PATCHES target as the pinned SGLang has it (signature, or the attribute's value), and
    whether HookRegistry applied each one in this process; the platform's entry point and class."""
    import importlib
    import os
    from importlib.metadata import entry_points

    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_asym.sglang_plugin.cpu_platform import patches as cp

    targets = {}
    for patch in cp.CPU_PATCHES:
        owner, attr = patch.target.rsplit(".", 1)
        module_path, _, cls_name = owner.rpartition(".")
        try:
            holder = importlib.import_module(owner)
        except ImportError:
            holder = getattr(importlib.import_module(module_path), cls_name)
        value = inspect_value = getattr(holder, attr)
        if patch.kind == "ATTRIBUTE":
            targets[patch.target] = {"value": inspect_value}
        else:
            targets[patch.target] = {"params": list(__import__("inspect").signature(value).parameters)}
    for process in (cp.LAUNCHER, cp.SCHEDULER):
        cp.apply_cpu_patches(process)
    platforms = [(ep.name, ep.value) for ep in entry_points(group="sglang.srt.platforms") if ep.dist.name == "sglang-asym"]
    os.environ["SGLANG_PLATFORM"] = "sglang_asym"
    from sglang_asym.sglang_plugin.cpu_platform import activate
    from sglang.srt.platforms import current_platform

    from sglang_asym.sglang_plugin.cpu_platform.spec_slots import speculative_cache_locs

    speculative = {"supports": [a for a in ("DSPARK", "EAGLE", "NGRAM", "DFLASH")
                                if current_platform.supports_speculative_algorithm(a)],
                   "worker": getattr(current_platform.get_speculative_worker_cls("DSPARK"), "__qualname__", None),
                   "eagle_worker": current_platform.get_speculative_worker_cls("EAGLE"),
                   "torch_cache_locs": current_platform.get_speculative_cache_locs_fn() is speculative_cache_locs}
    return {**_dspark_relied_on(), "speculative": speculative,
            "targets": targets, "applied": sorted(t for t in HookRegistry._patched),
            "attributes_now": {p.target: getattr(getattr(importlib.import_module(p.target.rsplit(".", 2)[0]),
                                                         p.target.rsplit(".", 2)[1]), p.target.rsplit(".", 1)[1])
                               for p in cp.CPU_PATCHES if p.kind == "ATTRIBUTE"},
            "platform_entry_points": platforms, "activate": activate(),
            "platform": type(current_platform).__name__, "out_of_tree": current_platform.is_out_of_tree()}


# Lines of SGLang's code the asymmetric hooks rely on (asym_decode.py, window_batch.py, prefill_zero.py,
# decode_destinations.py), by the function that holds them.
ASYM_RELIED_ON = {
    # asym_registration.no_symmetric_dspark_layout: the layout every KV manager announces at the handshake
    "sglang.srt.disaggregation.common.conn.CommonKVManager.__init__": [
        "self.dsv41_spec_layout = get_dsv41_spec_layout(args)"],
    "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req": [
        "decode_req.req.output_ids.append(committed_output_id)"],
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run": [
        "new_prebuilt_batch = self.get_new_prebuilt_batch(running_batch)",
        "running_batch = self.update_running_batch(running_batch)",
        "return NextBatchPlan(batch_to_run=ret, running_batch=running_batch)"],
    # asym_decode.py's mixed step: the decode batch SGLang picked is the one it runs next, in this thread
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.event_loop_normal_disagg_decode": [
        "batch = plan.batch_to_run", "result = self.run_batch(batch)"],
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.event_loop_overlap_disagg_decode": [
        "batch = plan.batch_to_run", "batch_result = self.run_batch(batch)"],
    "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch": [
        "req = self.waiting_queue[i]", "self.waiting_queue = waiting_queue"],
    "sglang.srt.disaggregation.decode.DecodePreallocQueue._swa_tail_len": [
        "window_start = max(0, seq_len - window_size)", "return seq_len - window_start"],
    "sglang.srt.disaggregation.decode.alloc_for_decode_prealloc": [
        "swa_evicted_seqlen = fill_len - swa_tail_len"],
    # transfer_fallback.py: the failures it recomputes, how SGLang streams their aborts, where it holds pages
    "sglang.srt.disaggregation.decode.DecodePreallocQueue._update_handshake_waiters": [
        'error_message = f"Decode handshake failed for request'],
    "sglang.srt.disaggregation.decode.DecodeTransferQueue.pop_transferred": [
        'f"Decode transfer failed for request rank', "self.scheduler.output_streamer.stream_output(",
        "self._defer_release(decode_req)"],
    "sglang.srt.disaggregation.decode.DecodeTransferQueue._defer_release": ["self._deferred_releases.append("],
    "sglang.srt.disaggregation.common.conn.CommonKVManager.parse_kv_status_message": [
        'msg[3].decode("utf-8", errors="replace")'],
    "sglang.srt.disaggregation.common.conn.CommonKVManager._encode_kv_status_message": [
        "if self.kv_status_msg_carries_reason:"],
    "sglang.srt.managers.scheduler.Scheduler.abort_request": [
        "for decode_req in self.disagg_decode_prealloc_queue.queue:",
        "for decode_req in self.disagg_decode_transfer_queue.queue:",
        "if recv_req.abort_all or decode_req.req.rid.startswith(recv_req.rid):"],
    "sglang.srt.disaggregation.decode.DecodePreallocQueue._create_receiver_and_enqueue": [
        "TransferBackend.FAKE if _is_fake_transfer(req) else self.transfer_backend"],
    "sglang.srt.disaggregation.decode.DecodePreallocQueue.pop_preallocated": [
        "self.scheduler.output_streamer.stream_output(",
        "window_start = max(total_prefix_len, seq_len - window_size)",
        "self._send_kv_metadata(", "StateType.SWA: _swa_payload,",
        "StateType.DSV4_REQUEST_STATE: _request_state_payload,"],
    # mooncake_regions.py: a failed batch registration returns nonzero, a failed single one raises
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.batch_register": [
        "ret_value = -1", "return ret_value"],
    "sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.register": [
        'raise RuntimeError(f"Mooncake memory registration failed (ret={ret_value})")'],
    "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend": [
        "= alloc_for_extend(", "self.sampling_info = SamplingBatchInfo.from_schedule_batch("],
    "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.pop_bootstrapped": [
        "elif not self.finalize_bootstrap(req):", "if not req.is_retracted and self.can_prefill_before_bootstrap(req):"],
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue": [
        "release_kv_cache(req, self.tree_cache, checkpoint=True)"],
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin._send_kv_chunk": [
        "window_start = max(req.disagg_decode_prefix_len, seq_len - window_size)", "c128_seq_len = transfer_input_len"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender._prepare_send_indices": [
        "is_last_chunk = self.curr_idx == self.num_kv_indices"],
    # exact_payload.py: the worker takes chunks from the queue it is handed and calls the two sends
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.transfer_worker": [
        "kv_chunk = queue.get()", "ret = self.send_kvcache(", "state_rc = self.maybe_send_extra(",
        "if ret != 0:"],
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.__init__": ["target=self.transfer_worker,"],
    # room_lifecycle.py: a Success concludes in the worker, the room's tables go at the sender's clear, and a
    # handshake for a room still at Success keeps it there
    "sglang.srt.disaggregation.common.conn.CommonKVManager.conclude_transfer": [
        "self.update_status(bootstrap_room, status)"],
    "sglang.srt.disaggregation.common.conn.CommonKVManager.update_status": [
        "self.request_status[bootstrap_room] = max(current, status)"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.abort": [
        "self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)"],
    "sglang.srt.disaggregation.common.conn.CommonKVSender.clear": [
        "self.kv_mgr.request_status.pop(self.bootstrap_room, None)",
        "self.kv_mgr.transfer_infos.pop(self.bootstrap_room, None)"],
    # drain.py: SIGTERM marks the tokenizer manager exiting; the HTTP front answers a ValueError raised by
    # generate_request with the error's status_code
    "sglang.srt.managers.tokenizer_manager.SignalHandler.sigterm_handler": [
        "self.tokenizer_manager.gracefully_exit = True"],
    "sglang.srt.entrypoints.http_server.serve_generate_request": [
        "except ValueError as e:", "return _create_error_response(e)"],
    "sglang.srt.entrypoints.http_server._create_error_response": [
        'status_code=getattr(e, "status_code", HTTPStatus.BAD_REQUEST)'],
    # drain.py: SIGTERM while unhealthy calls force_exit_handler, then stops the scheduler and the HTTP server;
    # an abort's finished_reason is what the request's handler answers with
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog": [
        "self.force_exit_handler()", "self._server_stop_hook()"],
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_req": [
        "finish_reason = recv_obj.finished_reason", "del self.rid_to_state[recv_obj.rid]"],
    # prefill_stop.py: the step's first act is the pending chunked abort, which finishes the request with its
    # discard_output_reason, aborts its sender and frees its pages
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run": [
        "self.process_pending_chunked_abort()"],
    "sglang.srt.managers.scheduler.Scheduler.process_pending_chunked_abort": [
        'reason = req.discard_output_reason or FINISH_ABORT("Aborted")', "req.disagg_kv_sender.abort()",
        "release_kv_cache(req, self.tree_cache, checkpoint=False)", "self.chunked_req = None"],
    # out_of_memory.py: P's normal loop hands run_batch's result to process_batch_result; an aborted request's
    # pages, metadata slot and sender are freed by the retire step
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.event_loop_normal_disagg_prefill": [
        "result = self.run_batch(batch)", "self.process_batch_result(batch, result)"],
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin._retire_aborted_prefill_result": [
        "sender.abort()", "maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)",
        "release_kv_cache(req, self.tree_cache, checkpoint=False)"],
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.start_prefill_thread": [
        "self.transfer_infos[room][mooncake_session_id] = (", "self.update_status(room, KVPoll.WaitingForInput)"],
    "sglang.srt.observability.req_time_stats.SchedulerReqTimeStats.compute_and_observe_kv_transfer_metrics": [
        "total_bytes = transfer_metric.transfer_total_bytes"],
    # deterministic.py: the flag's chunk alignment is the scheduler's truncation_align_size, set here
    "sglang.srt.managers.scheduler.Scheduler.init_deterministic_inference_config": [
        "self.truncation_align_size = (", "if not get_exec().deterministic.enable_deterministic_inference:"],
    "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue._init_kv_manager": [
        "setup_state_kv_args(", "kv_manager_class = get_kv_class(self.transfer_backend, KVClassType.MANAGER)"],
    # admission_check.py: the request is normalized (n as parallel_sample_num) before its state exists
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request": [
        "obj.normalize_batch_and_arguments()", "self._init_req_state(obj, request)"],
    # prefill/refusal.py: a prompt longer than P's pool is refused at intake and retired at the queue's door
    "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.add": [
        "if is_unadmitted_reject(req):", "self.scheduler.retire_unadmitted_request(req)"],
    # relayed_refusal.py: an abort's status is the answer's (a 400 the ValueError the HTTP front answers with a
    # 400), and the OpenAI stream makes an error event of an abort whose status is an HTTPStatus
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_finish_reason": [
        'status_code = finish_reason.get("status_code")', "if status_code == HTTPStatus.BAD_REQUEST:",
        'raise ValueError(finish_reason["message"])', "return out"],
    # relayed_refusal.py: the OpenAI handlers answer the tokenizer manager's ValueError by its text alone
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._handle_non_streaming_request": [
        "except ValueError as e:", "return self.create_error_response(str(e))"],
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._generate_completion_stream": [
        'if finish_reason_type == "abort" and isinstance(', 'finish_reason.get("status_code"), HTTPStatus'],
}
ASYM_SIGNATURES = (
    "sglang.srt.disaggregation.decode.DecodePreallocQueue._send_kv_metadata",
    "sglang.srt.disaggregation.decode.DecodePreallocQueue.add",
    "sglang.srt.managers.schedule_batch.Req.detach_kv",
    "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.can_prefill_before_bootstrap",
    "sglang.srt.disaggregation.prefill.maybe_release_metadata_buffer",
    "sglang.srt.disaggregation.utils.MetadataBuffers.set_buf",
    "sglang.srt.disaggregation.common.conn.CommonKVSender.send",
    "sglang.srt.managers.overlap_utils.resolve_forward_inputs",
    "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.request_state_transfer_indices",
    "sglang.srt.managers.schedule_batch.ScheduleBatch.init_new",
    "sglang.srt.managers.schedule_batch.Req.refresh_fill_ids",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
    "sglang.srt.model_executor.model_runner.ModelRunner.sample",
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.send_kvcache",
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.maybe_send_extra",
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager.transfer_worker",
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager._state_stride_mismatch",
    "sglang.srt.disaggregation.utils.build_transfer_entry_pairs",
    "sglang.srt.disaggregation.common.conn.CommonKVSender.get_transfer_metric",
    "sglang.srt.disaggregation.common.conn.CommonKVManager.conclude_transfer",
    "sglang.srt.disaggregation.common.conn.CommonKVSender.__init__",
    "sglang.srt.disaggregation.common.conn.CommonKVSender.clear",
    "sglang.srt.disaggregation.common.conn.CommonKVManager.update_status",
    "sglang.srt.disaggregation.common.conn.CommonKVManager.send_kv_status_message",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.force_exit_handler",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._init_req_state",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_finish_reason",
    "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.create_error_response",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run",
    "sglang.srt.managers.scheduler.Scheduler.process_pending_chunked_abort",
    "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin._retire_aborted_prefill_result",
    "sglang.srt.disaggregation.common.conn.CommonKVSender.poll",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_abort_req",
    "sglang.srt.disaggregation.common.conn.CommonKVSender.abort",
    "sglang.srt.disaggregation.common.conn.CommonKVManager._room_notify_targets",
    "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode",
    "sglang.srt.managers.scheduler.Scheduler.init_deterministic_inference_config",
)


def stock_prefill_rooms() -> dict:
    """SGLang's own prefill mode with the plugin loaded: its scheduler's publish applies get_kv_class's hook and
    none of the asymmetric tables'; on Mooncake the hook hands out SGLang's manager and sender with
    room_lifecycle.py's mixins; SGLang's decode mode and the fake backend keep SGLang's classes."""
    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin import hooks
    from sglang_asym.sglang_plugin.shared.room_lifecycle import RoomLifecycleManager, RoomLifecycleSender

    cpu_import_gaps.install()
    from sglang.srt import runtime_context
    from sglang.srt.disaggregation import utils
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import SpawnRanks
    from sglang.srt.server_args import ServerArgs

    def publish(mode: str) -> None:
        record = ServerArgs(model_path="dummy")
        record.disaggregation_mode = mode  # set after construction: its checks for a PD mode ask for a device
        runtime_context.reset_context()
        runtime_context.publish(record, role="scheduler", ranks=SpawnRanks(world_rank=0))

    def classes() -> dict:
        kinds = (utils.KVClassType.MANAGER, utils.KVClassType.SENDER, utils.KVClassType.RECEIVER)
        out = {}
        for backend in (utils.TransferBackend.MOONCAKE, utils.TransferBackend.FAKE):
            for kind in kinds:
                cls = utils.get_kv_class(backend, kind)
                out[f"{backend.name} {kind.name}"] = [cls.__name__, cls.__base__.__name__ if cls.__base__ else None,
                                                      issubclass(cls, (RoomLifecycleManager, RoomLifecycleSender))]
        return out

    plugin_targets = {t for t, _, _ in hooks.scheduler_hook_table()}
    load_plugins()
    report = {}
    for mode in ("decode", "prefill", "null"):
        publish(mode)
        report[mode] = {"patched": sorted(plugin_targets & set(HookRegistry._patched)), "classes": classes()}
    return report


def asym_hooks() -> dict:
    """Every scheduler hook target of the asymmetric modes and the SGLang code they rely on, as the pinned
    SGLang has them, and whether an asymmetric scheduler's publish applies them all."""
    import inspect
    import pkgutil

    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin import hooks
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)
    from sglang.srt.plugins.hook_registry import HookRegistry

    def resolve(target):
        owner, attr = target.rsplit(".", 1)
        return getattr(pkgutil.resolve_name(owner), attr)

    signatures = {t: list(inspect.signature(resolve(t)).parameters)
                  for t in [*(t for t, _, _ in hooks.scheduler_hook_table()), *ASYM_SIGNATURES]}
    missing_lines = {t: [line for line in lines if line not in inspect.getsource(resolve(t))]
                     for t, lines in ASYM_RELIED_ON.items()}
    hooks.install_scheduler_hooks()
    return {"signatures": signatures, "missing_lines": {t: v for t, v in missing_lines.items() if v},
            "applied": sorted(t for t, _, _ in hooks.scheduler_hook_table() if t in HookRegistry._patched),
            "state_types": [m for m in ("SWA", "DSV4_REQUEST_STATE")
                            if hasattr(pkgutil.resolve_name("sglang.srt.disaggregation.base.conn").StateType, m)]}


def force_exit() -> dict:
    """drain.py's hook after SGLang's force_exit_handler, over SGLang's own abort handler and request states:
    two requests in flight (one streamed) are each answered with an abort that carries a 503, their waiters
    are woken, and nothing is left in flight."""
    import asyncio
    import types

    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats

    from sglang_asym.sglang_plugin.shared.drain import FORCE_EXIT_MESSAGE, around_force_exit_handler

    manager = types.SimpleNamespace(rid_to_state={}, incremental_streaming_output=False, enable_lora=False,
                                    config_value=lambda key: "default")
    manager._handle_abort_req = types.MethodType(TokenizerManager._handle_abort_req, manager)
    manager._release_lora_once = types.MethodType(TokenizerManager._release_lora_once, manager)
    states = {}
    for rid, stream in (("plain", False), ("streamed", True)):
        obj = GenerateReqInput(input_ids=[5, 6, 7], rid=rid, stream=stream)
        states[rid] = manager.rid_to_state[rid] = ReqState([], False, asyncio.Event(), obj, APIServerReqTimeStats())
    called = []
    around_force_exit_handler(lambda m: called.append(m is manager), manager)
    return {"original_called": called, "in_flight_after": sorted(manager.rid_to_state),
            "answers": {rid: {"woken": state.event.is_set(), "finished": state.finished,
                              "finish_reason": state.out_list[-1]["meta_info"]["finish_reason"] if state.out_list
                              else None} for rid, state in states.items()},
            "message": FORCE_EXIT_MESSAGE}


def prefill_stop() -> dict:
    """prefill_stop.py's step hook over SGLang's KVPoll and FINISH_ABORT, with stand-in scheduler and request
    objects: which chunked requests it hands to SGLang's chunked-abort path, with what reason."""
    import types

    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)
    from sglang.srt.disaggregation.base.conn import KVPoll

    from sglang_asym.sglang_plugin.prefill.stop import around_next_prefill_batch

    def step(poll, pending_bootstrap=False, already_pending=None, with_sender=True) -> dict:
        sender = types.SimpleNamespace(poll=lambda: poll) if with_sender else None
        req = types.SimpleNamespace(disagg_kv_sender=sender, pending_bootstrap=pending_bootstrap, bootstrap_room=7,
                                    rid="r", prefix_len=256, origin_input_ids=[0] * 572, discard_output_reason=None)
        scheduler = types.SimpleNamespace(chunked_req=req, _pending_chunked_abort_req=already_pending)
        seen = []
        result = around_next_prefill_batch(lambda s, *a: seen.append(s._pending_chunked_abort_req) or "plan",
                                           scheduler, "running", None)
        reason = req.discard_output_reason
        return {"result": result, "pending_is_req_at_original": seen == [req],
                "reason": reason and {"message": reason.message, "status_code": int(reason.status_code)}}

    return {"failed": step(KVPoll.Failed), "transferring": step(KVPoll.Transferring),
            "waiting": step(KVPoll.WaitingForInput), "failed_but_bootstrapping": step(KVPoll.Failed, True),
            "failed_other_pending": step(KVPoll.Failed, already_pending=object()),
            "no_sender": step(KVPoll.Failed, with_sender=False)}


def relayed_refusal() -> dict:
    """relayed_refusal.py's hook over SGLang's own _handle_abort_finish_reason, for the abort D's decode queue
    gives a request whose handshake P failed (decode.py's words, SGLang's KVTransferError around P's reason):
    a refusal P relayed with a 400, a relayed failure of P's own (500), and P's plain abort words; each as a
    non-stream request and as a stream."""
    import asyncio
    import types
    from http import HTTPStatus

    from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
    from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

    cpu_import_gaps.install(STARTUP_GAPS)
    from fastapi import HTTPException
    from sglang.srt.disaggregation.common.conn import KVTransferError
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats

    from sglang_asym.sglang_plugin.shared.relayed_refusal import around_handle_abort_finish_reason, relay_reason
    from sglang_asym.sglang_plugin.shared.room_lifecycle import PREFILL_ABORT_WORDS

    room = 77
    reasons = {"refused": relay_reason(room, HTTPStatus.BAD_REQUEST, INPUT_TOO_LONG),
               "failed": relay_reason(room, HTTPStatus.INTERNAL_SERVER_ERROR, "the room's sender failed"),
               "aborted": f"sglang-asym: request of room {room} {PREFILL_ABORT_WORDS}"}

    def answer(reason: str, stream: bool) -> dict:
        manager = types.SimpleNamespace(rid_to_state={}, enable_lora=False)
        manager._release_lora_once = types.MethodType(TokenizerManager._release_lora_once, manager)
        obj = GenerateReqInput(input_ids=[5, 6, 7], rid="r", stream=stream)
        state = manager.rid_to_state["r"] = ReqState([], False, asyncio.Event(), obj, APIServerReqTimeStats())
        message = (f"Decode handshake failed for request rank=0 decode_req.req.rid='r' "
                   f"decode_req.req.bootstrap_room={room} with exception {KVTransferError(room, reason)}")
        out = {"meta_info": {"finish_reason": {"type": "abort", "message": message, "err_type": None,
                                               "status_code": HTTPStatus.INTERNAL_SERVER_ERROR}}}
        left = {"in_flight": sorted(manager.rid_to_state), "d_message": message}
        try:
            result = asyncio.run(around_handle_abort_finish_reason(
                TokenizerManager._handle_abort_finish_reason, manager, out, state, stream))
        except ValueError as exc:
            return {"raised": type(exc).__name__, "status": getattr(exc, "status_code", None), "message": str(exc),
                    **left, "in_flight": sorted(manager.rid_to_state)}
        except HTTPException as exc:
            return {"raised": "HTTPException", "status": exc.status_code, "message": exc.detail,
                    **left, "in_flight": sorted(manager.rid_to_state)}
        finish = result["meta_info"]["finish_reason"]
        return {"raised": None, "status": int(finish["status_code"]), "message": finish["message"],
                "http_status": isinstance(finish["status_code"], HTTPStatus), **left,
                "in_flight": sorted(manager.rid_to_state)}

    return {name: {"plain": answer(reason, False), "stream": answer(reason, True)} for name, reason in reasons.items()}


INPUT_TOO_LONG = ("Input length (3000 tokens) exceeds the maximum allowed length (2042 tokens). Use a shorter input "
                  "or enable --allow-auto-truncate.")
CHECKS = {"cpu_patches": cpu_patches, "weights": weights, "load": load, "payload": payload,
          "intake": intake, "asym_hooks": asym_hooks, "stock_prefill_rooms": stock_prefill_rooms, "force_exit": force_exit,
          "prefill_stop": prefill_stop, "relayed_refusal": relayed_refusal}

if __name__ == "__main__":
    report = CHECKS[sys.argv[1]](*sys.argv[2:])
    print("REPORT " + json.dumps(report))
