"""Canaries: the SGLang 0.5.23 symbols the plugin hooks or relies on, exactly as the plugin expects
them. A new SGLang that renames, re-signs or changes one of them fails here first, loudly.
(The V4 model / KV pool symbols are checked in test_sglang_inspect.py, from a separate process.)"""

import inspect
import pickle
import pkgutil
import typing
from importlib.metadata import entry_points

import msgspec

import sglang
import sglang.launch_server
from sglang.srt import plugins
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang.srt.server_args import ServerArgs, prepare_server_args

from sglang_asym.sglang_plugin import hooks
from sglang_asym.sglang_plugin.hooks import ENTRY_POINT_NAME
from sglang_asym.sglang_plugin.shared.cli import find_action
from sglang_asym.sglang_plugin.shared.settings import SERVER_ARGS_ATTR, AsymSettings, attach, settings_of


def params(fn):
    return list(inspect.signature(fn).parameters)


def test_pinned_version():
    assert sglang.__version__ == "0.5.23"


def test_entry_point_is_registered():
    ours = [ep for ep in entry_points(group=plugins.GENERAL_PLUGINS_GROUP) if ep.name == ENTRY_POINT_NAME]
    assert [(ep.value, ep.dist.name) for ep in ours] == [("sglang_asym.sglang_plugin:register", "sglang-asym")]
    assert plugins.GENERAL_PLUGINS_GROUP == "sglang.srt.plugins"


def test_plugin_loader_and_allow_list():
    assert params(plugins.load_plugins) == []
    assert params(plugins.load_plugins_by_group) == ["group", "excluded_dists"]
    assert plugins.envs.SGLANG_PLUGINS.name == "SGLANG_PLUGINS"


def test_hook_registry_api():
    assert params(HookRegistry.register) == ["target", "hook", "hook_type", "source"]
    assert [t.name for t in HookType] == ["BEFORE", "AFTER", "AROUND", "REPLACE"]
    assert params(HookRegistry.apply_hooks) == []


def test_every_hooked_symbol_has_a_canary():
    # launcher-time hooks: canaries in this file; scheduler-time hooks (their modules need the CPU
    # import stand-ins): signatures and relied-on code pinned in test_sglang_inspect.py
    assert [t for t, _, _ in hooks.hook_table()] == [
        "sglang.srt.server_args.ServerArgs.add_cli_args", "sglang.srt.server_args.ServerArgs.from_cli_args",
        "sglang.srt.server_args.prepare_server_args", "sglang.srt.runtime_context.publish"]
    assert [t for t, _, _ in hooks.scheduler_hook_table()] == [
        "sglang.srt.disaggregation.utils.setup_state_kv_args",
        "sglang.srt.disaggregation.common.conn.get_dsv41_spec_layout",
        *(f"sglang.srt.distributed.device_communicators.mooncake_transfer_engine.MooncakeTransferEngine.{name}"
          for name in ("register", "deregister", "batch_register", "batch_deregister")),
        "sglang.srt.model_loader.loader._initialize_model", "sglang.srt.disaggregation.utils.get_kv_class",
        "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.add",
        "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.can_prefill_before_bootstrap",
        "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.pop_bootstrapped",
        "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.process_disagg_prefill_inflight_queue",
        "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.get_next_disagg_prefill_batch_to_run",
        "sglang.srt.managers.scheduler.Scheduler.run_batch", "sglang.srt.managers.scheduler.Scheduler.process_batch_result",
        "sglang.srt.disaggregation.decode.DecodePreallocQueue._swa_tail_len",
        "sglang.srt.disaggregation.decode.DecodePreallocQueue._send_kv_metadata",
        "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req",
        "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin.get_next_disagg_decode_batch_to_run",
        "sglang.srt.disaggregation.decode.SchedulerDisaggregationDecodeMixin._get_new_prebuilt_batch",
        "sglang.srt.disaggregation.decode.DecodePreallocQueue.pop_preallocated",
        "sglang.srt.disaggregation.decode.DecodeTransferQueue.pop_transferred",
        "sglang.srt.managers.scheduler.Scheduler.abort_request"]


def test_every_hook_target_resolves():
    for target, hook, hook_type in hooks.hook_table():
        owner, attr = target.rsplit(".", 1)
        assert hasattr(pkgutil.resolve_name(owner), attr), target
        assert hook_type in HookType.__members__


def test_add_cli_args_is_a_static_method_of_the_parser():
    raw = ServerArgs.__dict__["add_cli_args"]
    assert isinstance(raw, staticmethod)
    assert params(raw.__func__) == ["parser"]


def test_from_cli_args_is_a_classmethod_of_the_namespace():
    raw = ServerArgs.__dict__["from_cli_args"]
    assert isinstance(raw, classmethod)
    assert params(raw.__func__) == ["cls", "args"]


def test_prepare_server_args_takes_argv_and_calls_from_cli_args():
    assert params(prepare_server_args) == ["argv"]
    source = inspect.getsource(prepare_server_args)
    assert "ServerArgs.add_cli_args(parser)" in source
    assert "ServerArgs.from_cli_args(raw_args)" in source


def test_publish_takes_the_server_args_and_a_role_keyword():
    from sglang.srt import runtime_context

    assert params(runtime_context.publish) == ["server_args", "role", "hf_config", "ranks"]
    assert inspect.signature(runtime_context.publish).parameters["role"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params(runtime_context.get_server_args) == []


def test_hook_registry_bookkeeping_the_model_hooks_use():
    assert isinstance(HookRegistry._hooks, dict) and isinstance(HookRegistry._patched, set)
    assert "source" in inspect.signature(HookRegistry.register).parameters


def test_launch_server_loads_plugins_before_parsing():
    source = inspect.getsource(sglang.launch_server)
    assert "from sglang.srt.server_args import prepare_server_args" in source
    main = source[source.index('if __name__ == "__main__":'):]
    assert main.index("load_plugins()") < main.index("prepare_server_args(sys.argv[1:])")


def test_disaggregation_mode_is_still_the_closed_literal(server_parser):
    from sglang.srt.arg_groups.fields.disagg import Disagg

    mode = [f for f in msgspec.structs.fields(Disagg) if f.name == "disaggregation_mode"][0]
    assert mode.default == "null"
    assert typing.get_args(typing.get_args(mode.type)[0]) == ("null", "prefill", "decode")
    assert list(find_action(server_parser, "disaggregation_mode").choices) == [
        "null", "prefill", "decode", "asym-prefill", "asym-decode"]


def test_parser_dests_the_validation_reads(server_parser):
    expected = {
        "model_path": None,
        "device": None,
        "disaggregation_mode": "null",
        "disaggregation_transfer_backend": "mooncake",
        "enable_pd_role_switch": False,
        "disaggregation_decode_enable_radix_cache": False,
        "enable_decoder_swa_bounded_replay": None,
    }
    assert {dest: find_action(server_parser, dest).default for dest in expected} == expected
    backends = find_action(server_parser, "disaggregation_transfer_backend").choices
    assert {"mooncake", "mooncake_tcp"} <= set(backends)


def test_server_args_fields_the_cuda_guards_read(server_parser):
    # cuda_guards.py reads these from the resolved record; the prefill graph backend names and the
    # resolved graph config's shape are SGLang's
    from sglang.srt.model_executor.cuda_graph_config import Backend

    fields = {"device", "enable_decoder_swa_bounded_replay", "cuda_graph_config", "cuda_graph_backend_prefill",
              "disable_cuda_graph", "disable_prefill_cuda_graph", "tp_size", "dp_size", "ep_size", "pp_size",
              "attn_cp_size", "speculative_algorithm"}
    assert fields <= set(ServerArgs.__struct_fields__)
    assert (Backend.BREAKABLE, Backend.DISABLED, Backend.FULL) == ("breakable", "disabled", "full")
    defaults = {"cuda_graph_backend_prefill": None, "disable_prefill_cuda_graph": False, "tp_size": 1,
                "speculative_algorithm": None}
    assert {dest: find_action(server_parser, dest).default for dest in defaults} == defaults


def test_from_cli_args_takes_the_translated_mode(server_parser, v41_checkpoint):
    args = server_parser.parse_args(["--model-path", str(v41_checkpoint)])
    args.disaggregation_mode = "prefill"
    assert ServerArgs.from_cli_args(args).disaggregation_mode == "prefill"


def test_server_args_carry_the_settings_through_pickling():
    assert SERVER_ARGS_ATTR not in {f.name for f in msgspec.structs.fields(ServerArgs)}
    record = ServerArgs(model_path="dummy")
    attach(record, AsymSettings("asym-decode", window=64))
    copy = pickle.loads(pickle.dumps(record))
    assert settings_of(copy) == AsymSettings("asym-decode", window=64)
    assert copy.model_path == "dummy"


def test_the_model_loop_code_the_prefill_cut_relies_on():
    # prefill_cut_hook.py; read from source (importing the V4 model needs the CPU import stand-ins)
    import ast
    import importlib.util
    from pathlib import Path

    def source(module):
        return Path(importlib.util.find_spec(module).origin).read_text()

    def functions(text):
        return {node.name: [a.arg for a in node.args.args + node.args.kwonlyargs]
                for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)}

    model = source("sglang.srt.models.deepseek_v4")
    assert functions(model)["_forward_layers_hc_pre_from_prev"][:4] == [
        "self", "positions", "hidden_states", "forward_batch"]
    assert "return state.residual, state.pre, None" in model  # the loop's epilogue result the cut reads
    assert "state = state.materialized(self.layers[self.end_layer - 1].hc_cfg)" in model
    assert "if not self.pp_group.is_last_rank:\n            return hidden_states" in model  # the causal LM's exit
    assert 'return PPProxyTensors({"hidden_states": hidden_states.flatten(1)})' in model  # the model's exit
    assert "    get_attn_backend,\n" in model
    backend = functions(source("sglang.srt.layers.attention.deepseek_v4_backend"))
    assert backend["forward_low_ratio_sources"] == [
        "self", "layer", "x", "q_lora", "positions", "forward_batch", "run_compressor", "run_indexer"]
    mhc = source("sglang.srt.models.deepseek_v4_mhc")
    assert functions(mhc)["combine"] == ["hc", "state", "quantized"]
    assert "class HcState(msgspec.Struct):" in mhc and "    pre: Optional[torch.Tensor] = None" in mhc
