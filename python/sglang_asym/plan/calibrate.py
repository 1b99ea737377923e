"""Measure a GPU's achieved memory bandwidth and dense GEMM FLOP/s with torch and write the planner's calibration.

  python -m sglang_asym.plan.calibrate --device cuda --gpu auto --out calibration.json   (scripts/gpu_check.sh)

Three timed kernels, each the median of its repeats after warm-up:
  copy  a large device-to-device copy (bytes read + bytes written per second);
  gemv  a decode-like skinny GEMM: `rows` activations times one large weight matrix, which every decode step
        does per layer; its weight bytes read per second is the bandwidth the planner's MBU scales;
  gemm  a square dense GEMM (bf16 on CUDA, float32 on CPU): 2 m n k FLOP per second, the rate MFU scales.
MBU = gemv bandwidth / the named GPU's peak HBM bandwidth, MFU = GEMM FLOP/s / its dense BF16 peak (the planner
applies the same fraction to its FP8 and FP4 rates). Both must lie in (0, 1]: a figure above the table's peak
means the named GPU is not the one measured, and nothing is written. The fixed step and prefill overheads keep
the planner's assumed values (the file says so).

On CPU the run is a dry run of the same code (tiny fractions of a GPU's peaks, valid but meaningless); --gpu must
name a GPU there. Exit status: 0 written; 2 refused (unknown GPU, no CUDA device, a fraction out of range), with
the reason on stderr and no file.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from .calibration import write_calibration
from .errors import PlanInputError
from .gpu_model import Efficiency
from .gpus import GpuSpec, gpu

# torch.cuda.get_device_name -> the planner's table. Only SXM / superchip parts are in the table: PCIe and NVL
# boards of the same chip have lower clocks, bandwidth or power, so their names are refused rather than mapped.
_DEVICE_NAMES = ((r"\bGB300\b", "GB300-NVL72"), (r"\bGB200\b", "GB200-NVL72"), (r"\bB300\b", "B300"),
                 (r"\bB200\b", "B200"), (r"\bH200\b", "H200"), (r"\bH800\b", "H800"), (r"\bH100\b", "H100"))
_OTHER_FORM_FACTOR = re.compile(r"PCIE|\bNVL\b")


@dataclass(frozen=True)
class Sizes:
    """Tensor sizes of the three kernels; the defaults per device keep each timed call well above launch cost."""

    copy_bytes: int
    gemv_out: int  # weight rows (output features)
    gemv_in: int  # weight columns (input features)
    gemv_rows: int  # activations per decode-like step
    gemm_dim: int
    repeats: int = 20

    def __post_init__(self) -> None:
        for name in ("copy_bytes", "gemv_out", "gemv_in", "gemv_rows", "gemm_dim", "repeats"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanInputError(f"calibration size {name} must be an int >= 1, got {v!r}")


SIZES = {"cuda": Sizes(copy_bytes=2 << 30, gemv_out=16384, gemv_in=16384, gemv_rows=16, gemm_dim=8192),
         "cpu": Sizes(copy_bytes=64 << 20, gemv_out=2048, gemv_in=2048, gemv_rows=16, gemm_dim=512, repeats=5)}


@dataclass(frozen=True)
class Measurement:
    """What ran and what it achieved, in bytes/s and FLOP/s."""

    device: str  # torch's name of the device that ran it
    dtype: str
    copy_bytes_per_s: float
    gemv_bytes_per_s: float
    gemm_flops: float
    sizes: Sizes


def gpu_for_device_name(device_name: str) -> GpuSpec:
    """The planner's GPU for a name torch reports ("NVIDIA H100 80GB HBM3" -> H100); other parts are refused."""
    upper = device_name.upper()
    for pattern, table_name in _DEVICE_NAMES:
        if re.search(pattern, upper):
            if _OTHER_FORM_FACTOR.search(upper) and not table_name.endswith("NVL72"):
                break
            return gpu(table_name)
    raise PlanInputError(f"GPU {device_name!r} is not in the planner's table (SXM / superchip parts only: "
                         f"{[t for _, t in _DEVICE_NAMES]}); name one with --gpu to calibrate it as that part")


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of one call of fn, after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(device: torch.device, sizes: Sizes) -> Measurement:
    """Time the copy, the decode-like GEMV and the dense GEMM on `device` (bf16 on CUDA, float32 on CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()
    with torch.inference_mode():
        src = torch.empty(sizes.copy_bytes // elem, dtype=dtype, device=device).uniform_()
        dst = torch.empty_like(src)
        copy_s = _timed(lambda: dst.copy_(src), device, sizes.repeats)
        copy_rate = 2 * src.numel() * elem / copy_s  # each element read once and written once
        del src, dst

        weight = torch.randn(sizes.gemv_out, sizes.gemv_in, dtype=dtype, device=device)
        act = torch.randn(sizes.gemv_rows, sizes.gemv_in, dtype=dtype, device=device)
        gemv_s = _timed(lambda: torch.matmul(act, weight.t()), device, sizes.repeats)
        gemv_rate = weight.numel() * elem / gemv_s  # the weight dominates the bytes (activations are `rows` rows)
        del weight, act

        n = sizes.gemm_dim
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        gemm_s = _timed(lambda: torch.matmul(a, b), device, sizes.repeats)
        del a, b
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return Measurement(name, str(dtype).removeprefix("torch."), copy_rate, gemv_rate, 2 * n ** 3 / gemm_s, sizes)


def efficiency_from(measurement: Measurement, spec: GpuSpec) -> Efficiency:
    """MBU and MFU of a measurement against `spec`'s peaks; refused outside (0, 1] (the wrong GPU named)."""
    mbu = measurement.gemv_bytes_per_s / spec.hbm_bytes_per_s
    mfu = measurement.gemm_flops / spec.bf16_flops
    for name, value in (("mbu", mbu), ("mfu", mfu)):
        if not 0 < value <= 1:
            raise PlanInputError(f"measured {name} {value:.3g} of {spec.name}'s peak is outside (0, 1]: "
                                 f"{measurement.device!r} is not a {spec.name}")
    return Efficiency(mbu=mbu, mfu=mfu)


def describe(measurement: Measurement, spec: GpuSpec) -> str:
    """The 'measured' line of the file: what ran, where, when, and what stays assumed."""
    s = measurement.sizes
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"sglang_asym.plan.calibrate on {measurement.device} at {when}, {measurement.dtype}, medians of "
            f"{s.repeats}: gemv [{s.gemv_rows}x{s.gemv_in}]x[{s.gemv_in}x{s.gemv_out}] "
            f"{measurement.gemv_bytes_per_s / 1e9:.1f} GB/s of {spec.hbm_bytes_per_s / 1e9:.0f} (mbu); "
            f"copy {s.copy_bytes >> 20} MiB {measurement.copy_bytes_per_s / 1e9:.1f} GB/s; gemm {s.gemm_dim}^3 "
            f"{measurement.gemm_flops / 1e12:.2f} TFLOP/s of {spec.bf16_flops / 1e12:.0f} BF16 (mfu); "
            f"step/prefill overheads assumed")


def calibrate(device: torch.device, spec: GpuSpec, out: str | Path, sizes: Sizes) -> tuple[Efficiency, str]:
    """Measure on `device`, check the fractions, and add `spec`'s entry to the file at `out`."""
    measurement = measure(device, sizes)
    efficiency = efficiency_from(measurement, spec)
    measured = describe(measurement, spec)
    write_calibration(out, spec.name, efficiency, measured)
    return efficiency, measured


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_asym.plan.calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpu", default="auto", help="the planner's GPU to divide by; 'auto': torch's device name (CUDA)")
    p.add_argument("--out", required=True, help="calibration file to create or add this GPU's entry to")
    for field in ("copy_bytes", "gemv_out", "gemv_in", "gemv_rows", "gemm_dim", "repeats"):
        p.add_argument("--" + field.replace("_", "-"), type=int, help="override the device's default size")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.device == "cuda" and not torch.cuda.is_available():
            raise PlanInputError("no CUDA device visible to torch")
        device = torch.device(args.device)
        if args.gpu == "auto":
            if device.type != "cuda":
                raise PlanInputError("--gpu auto reads the CUDA device's name; on CPU name the GPU to divide by")
            spec = gpu_for_device_name(torch.cuda.get_device_name(device))
        else:
            spec = gpu(args.gpu)
        defaults = SIZES[device.type]
        overrides = {k: v for k, v in vars(args).items() if k in Sizes.__dataclass_fields__ and v is not None}
        sizes = Sizes(**{**defaults.__dict__, **overrides})
        efficiency, measured = calibrate(device, spec, args.out, sizes)
    except PlanInputError as exc:
        print(f"calibrate: {exc}; no calibration written", file=sys.stderr)
        return 2
    print(f"calibrate: {spec.name} mbu {efficiency.mbu:.3g} mfu {efficiency.mfu:.3g} -> {args.out}\n  {measured}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
