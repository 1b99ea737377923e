"""The CPU stand-ins for torchvision / vllm, checked in a fresh process (they change sys.meta_path)."""

import json

from .conftest import run_python

PROBE = r"""
import json, importlib.util
from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
real_before = importlib.util.find_spec("torchvision") is not None
missing = cpu_import_gaps.install()
again = cpu_import_gaps.install()
import torchvision.transforms as T
from torchvision.transforms.functional import InterpolationMode
from vllm._custom_ops import rms_norm
from transformers.utils import import_utils
out = {"real_before": real_before, "missing": missing, "again": again,
       "repr": repr(InterpolationMode.BILINEAR), "tv_available": import_utils.is_torchvision_available()}
try:
    T.Compose([])
except ModuleNotFoundError as exc:
    out["error"] = [str(exc), exc.name]
try:
    rms_norm(1)
except ModuleNotFoundError as exc:
    out["vllm_error"] = str(exc)
import sglang.srt.configs.deepseek_v41  # reaches torchvision through srt/configs/__init__
out["sglang_imports"] = True
print("PROBE " + json.dumps(out))
"""


def test_stand_ins_let_sglang_import_and_fail_loudly_when_used():
    done = run_python(["-c", PROBE])
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("PROBE "))
    assert out == {
        "real_before": False,
        "missing": ["torchvision", "vllm"],
        "again": ["torchvision", "vllm"],
        "repr": "<missing torchvision.transforms.functional.InterpolationMode.BILINEAR>",
        "tv_available": False,
        "error": ["torchvision.transforms.Compose is unavailable on this CPU machine: PyPI ships only CUDA "
                  "builds of torchvision; none imports beside torch CPU", "torchvision"],
        "vllm_error": "vllm._custom_ops.rms_norm is unavailable on this CPU machine: vLLM is not installed "
                      "beside SGLang on CPU machines",
        "sglang_imports": True,
    }
