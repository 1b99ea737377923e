"""A small V4.1 checkpoint in the released layout (FP8 32x32 blocks, FP4 experts, sharded, DSpark
included) loads on CPU along SGLang's own path in an asym-prefill scheduler: the plugin loaded
through its entry point, SGLang's ModelConfig and quantization config, the hooked
`_initialize_model` (the prefill role's truncation), `DefaultModelLoader.load_weights_only` over
SGLang's own file iterator, SGLang's `load_weights` behind the role's filter. Every loaded parameter
equals the checkpoint bit for bit (FP8/FP4 codes and scales raw, fp32 tensors cast as SGLang stores
them, `wo_a` dequantized to bf16 as SGLang does)."""

import json

import pytest

from sglang_asym.checkpoint.quantization import without_quantization
from sglang_asym.checkpoint.writer import write_checkpoint
from sglang_asym.sglang_plugin.prefill.role import PrefillRole
from harness.sglang_shapes import sglang_small

from .conftest import REPO, run_python

CFG = sglang_small()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("sglang_small_ckpt")
    # without the config's own quantization_config: the writer's (release precision) is what SGLang reads
    write_checkpoint(path, without_quantization(CFG), seed=11, precision="release", num_shards=3, progress=False)
    return path


@pytest.fixture(scope="module")
def report(checkpoint):
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "load", str(checkpoint)])
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    return json.loads(lines[0].removeprefix("REPORT "))


def test_every_parameter_equals_the_checkpoint(report):
    compared = report["compared"]
    sglang_own = {f"model.layers.{i}.self_attn.attn_mqa.{s}" for i in range(20) for s in ("k_scale", "v_scale")}
    assert set(compared) == set(report["parameters"]) - sglang_own
    assert [name for name, c in compared.items() if not c["equal"]] == []
    assert len(compared) == 590


def test_the_stored_forms_that_were_compared(report):
    compared = report["compared"]
    wqkv = compared["model.layers.3.self_attn.wqkv_a.weight"]
    assert (wqkv["dtype"], wqkv["sources"]) == ("float8_e4m3fn", ["layers.3.attn.wkv.weight", "layers.3.attn.wq_a.weight"])
    wo_a = compared["model.layers.3.self_attn.wo_a.weight"]
    assert (wo_a["dtype"], sorted(wo_a["sources"])) == ("bfloat16", ["layers.3.attn.wo_a.scale", "layers.3.attn.wo_a.weight"])
    experts = compared["model.layers.3.mlp.experts.w13_weight"]
    assert experts["dtype"] == "int8" and len(experts["sources"]) == 2 * CFG.n_routed_experts
    assert compared["model.layers.3.mlp.experts.w13_weight_scale_inv"]["dtype"] == "float32"
    assert compared["model.layers.20.self_attn.compressor.wkv.weight"]["dtype"] == "bfloat16"  # fp32 on disk
    assert all(c["nonzero"] for name, c in compared.items() if "weight" in name)


def test_the_filter_passed_exactly_the_role(report):
    role = PrefillRole.from_config(CFG)
    assert report["passed"] == sorted(role.checkpoint_names)
    assert report["skipped"] == report["checkpoint_tensors"] - len(role.checkpoint_names)
    assert report["skipped"] > 0
    assert report["layer_types"] == ["DeepseekV4PlatformDecoderLayer"] * 21 + ["PPMissingLayer"] * 19
    assert report["head"] == ["PPMissingLayer", "PPMissingLayer"]


def test_the_scheduler_hooks_are_installed_when_an_asym_scheduler_publishes(report):
    """The asymmetric scheduler hooks, and (no CUDA here: SGLang's engine on CPU) the CPU scheduler
    patches, whose list test_cpu_engine_canaries.py pins."""
    from sglang_asym.sglang_plugin import hooks
    from sglang_asym.sglang_plugin.cpu_platform.patches import CPU_PATCHES, SCHEDULER
    from sglang_asym.sglang_plugin.cpu_platform.deterministic import DETERMINISTIC_PATCHES

    before, after = report["patched"]
    assert "sglang.srt.model_loader.loader._initialize_model" not in before
    cpu = {p.target for p in CPU_PATCHES if p.process == SCHEDULER and p.kind != "ATTRIBUTE"}
    assert len(cpu) == 15  # + cpu_ops.py: the V4 pool's fused store, the fp4 index-key store, the backend's metadata
    # --enable-deterministic-inference's scheduler patches are installed with them (they act only with the flag)
    cpu |= {p.target for p in DETERMINISTIC_PATCHES if p.process == SCHEDULER}
    assert len(cpu) == 17
    asym = {target for target, _, _ in hooks.scheduler_hook_table()}
    assert len(asym) == 23 and "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.add" in asym
    assert sorted(set(after) - set(before)) == sorted(asym | cpu)


def test_sglang_reads_the_release_quantization(report):
    assert report["quant_config"] == ["Fp8Config", [32, 32], True, True]


def test_other_servers_build_the_whole_model(report):
    assert report["other_roles"] == {"asym-decode": [1246, "ParallelLMHead", False],
                                     "None": [1246, "ParallelLMHead", False]}


def test_a_checkpoint_missing_a_role_tensor_is_refused(report):
    assert report["errors"] == {
        "missing_kv_path": "the checkpoint lacks 1 tensors the prefill role needs, "
                           "e.g. ['layers.20.attn.indexer.wk.weight']",
        "missing_encoder_scale": "the checkpoint lacks 1 tensors the prefill role needs, "
                                 "e.g. ['layers.3.attn.wq_b.scale']",
        "nextn": "the asym-prefill role has no draft (nextn) layers to load",
    }
