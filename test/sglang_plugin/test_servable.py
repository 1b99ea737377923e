"""A V4.1 checkpoint SGLang's V4.1 cache pool cannot hold is refused in the launcher, naming the field and
the value it needs, before any scheduler child starts (servable.py); scripts/make_checkpoint.py writes a
servable checkpoint by default."""

import json

import pytest

from sglang_asym.config import V41Config
from sglang_asym.sglang_plugin.shared.servable import check_servable, declares_v41, pool_geometry_problems
from sglang_asym.sglang_plugin.shared.validation import AsymArgumentError

from .conftest import REPO, run_python

HEAD_DIM_64 = ("head_dim is 64, SGLang's V4.1 cache pool needs head_dim = 512 (every V4.1 pool layout stores "
               "512-dim main-KV rows (qk_nope_head_dim + qk_rope_head_dim))")
ROPE_16 = ("qk_rope_head_dim is 16, SGLang's V4.1 cache pool needs qk_rope_head_dim = 64 (the v4 pool layout "
           "stores a 448-dim FP8 nope part and a 64-dim bf16 rope part)")


def test_the_servable_preset_passes_and_the_unit_test_presets_name_each_field():
    assert pool_geometry_problems(V41Config.sglang_small()) == ()
    assert pool_geometry_problems(V41Config.sglang_tiny()) == ()  # the trained model's config (the demo serves it)
    assert pool_geometry_problems(V41Config.flash()) == ()
    assert pool_geometry_problems(V41Config.small()) == (HEAD_DIM_64, ROPE_16)
    assert pool_geometry_problems(V41Config.sglang_small().replace(qk_rope_head_dim=32)) == (
        "qk_rope_head_dim is 32, SGLang's V4.1 cache pool needs qk_rope_head_dim = 64 (the v4 pool layout "
        "stores a 448-dim FP8 nope part and a 64-dim bf16 rope part)",)


def test_check_servable_refuses_only_v41_checkpoints_it_cannot_serve(tmp_path, llama_checkpoint):
    small = tmp_path / "small"
    small.mkdir()
    V41Config.small().write_json(small)
    with pytest.raises(AsymArgumentError) as info:
        check_servable(str(small))
    assert str(info.value) == (f"{small} cannot be served by SGLang: {HEAD_DIM_64}; {ROPE_16}. "
                               "scripts/make_checkpoint.py --config sglang-small writes a small checkpoint SGLang serves")
    servable = tmp_path / "servable"
    servable.mkdir()
    V41Config.sglang_small().write_json(servable)
    check_servable(str(servable))
    check_servable(str(llama_checkpoint))  # another model: SGLang's business
    check_servable(str(tmp_path / "missing"))  # no config.json: the asymmetric validation says so
    check_servable("deepseek-ai/DeepSeek-V4.1-Flash")  # a hub name is not a local path
    check_servable(None)


def test_declares_v41_reads_the_released_and_the_text_layouts():
    assert declares_v41(json.loads(json.dumps(V41Config.sglang_small().to_hf_dict())))
    assert declares_v41({"architectures": ["DeepseekV41ForCausalLM"]})
    assert declares_v41({"model_type": "x", "text_config": {"model_type": "deepseek_v41_text"}})
    assert not declares_v41({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})


@pytest.mark.parametrize("mode", ["null", "asym-decode"])
def test_the_launcher_exits_2_with_the_field_before_any_child_starts(tmp_path, mode):
    ckpt = tmp_path / "v41-small"
    ckpt.mkdir()
    V41Config.small().write_json(ckpt)  # head_dim 64: what `--config small` writes
    done = run_python(["-m", "sglang.launch_server", "--device", "cpu", "--model-path", str(ckpt),
                       "--disaggregation-mode", mode])
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        f"sglang-asym: error: {ckpt} cannot be served by SGLang: {HEAD_DIM_64}; {ROPE_16}. "
        "scripts/make_checkpoint.py --config sglang-small writes a small checkpoint SGLang serves")
    assert "Traceback" not in done.stderr and "scheduler" not in done.stderr.lower()


def test_make_checkpoint_defaults_to_the_servable_preset():
    done = run_python([str(REPO / "scripts" / "make_checkpoint.py"), "--help"])
    assert done.returncode == 0, done.stderr
    assert "default sglang-small" in " ".join(done.stdout.split())
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_checkpoint", REPO / "scripts" / "make_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.DEFAULT_CONFIG == "sglang-small"
    assert pool_geometry_problems(V41Config.preset(module.DEFAULT_CONFIG)) == ()
