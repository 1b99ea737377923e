"""Public specifications of the GPUs the planner sizes for (per GPU, dense tensor throughput, decimal units).

Sources (docs/planning.md lists them with the figures):
  H100 SXM: NVIDIA H100 datasheet (80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense BF16, 1,979 dense FP8, NVLink 4
    900 GB/s per GPU both directions); HGX H100 = 8-GPU NVLink domain; ConnectX-7 400 Gb/s per GPU.
  H800 SXM: the H100 with NVLink cut to 400 GB/s per GPU both directions (memory, bandwidth and tensor rates as
    H100); 8-GPU HGX domain; 400 Gb/s NIC per GPU.
  B200 (HGX B200): 180 GB HBM3e per GPU (DGX B200: 1,440 GB for 8), 8 TB/s, 2.25 PF dense BF16, 4.5 PF dense FP8,
    9 PF dense FP4; NVLink 5 1.8 TB/s per GPU both directions; 8-GPU domain; ConnectX-7 400 Gb/s per GPU.
  H200 SXM: NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s, 989 TFLOP/s dense BF16, 1,979 dense FP8, NVLink 4
    900 GB/s per GPU both directions); HGX H200 = 8-GPU NVLink domain; ConnectX-7 400 Gb/s per GPU.
  B300 (HGX B300): 288 GB HBM3e, 8 TB/s, 2.25 PF dense BF16, 4.5 PF FP8, ~14 PF dense FP4; NVLink 5 1.8 TB/s
    per GPU both directions; 8-GPU domain; ConnectX-8 800 Gb/s per GPU.
  GB200 NVL72: 186 GB HBM3e per GPU (the capacity the project's footprint uses), 8 TB/s; rack 720 PF FP8 and
    1,440 PF FP4 with sparsity -> 5 PF FP8 and 10 PF FP4 dense per GPU, 2.5 PF BF16; 72-GPU NVLink domain,
    1.8 TB/s per GPU; ConnectX-7 400 Gb/s per GPU.
  GB300 NVL72: 288 GB HBM3e, 8 TB/s; rack 1.1 EF dense FP4 and 360 PF dense FP8 -> 15 PF FP4 and 5 PF FP8 per
    GPU, 2.5 PF BF16; 72-GPU NVLink domain, 1.8 TB/s per GPU; ConnectX-8 800 Gb/s per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import PlanInputError


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's memory, bandwidth, dense FLOP/s and links, and the size of its scale-up (NVLink) domain."""

    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float
    nvlink_bytes_per_s: float  # one direction, per GPU
    rdma_bytes_per_s: float  # scale-out NIC, one direction, per GPU
    domain_gpus: int  # GPUs in one NVLink domain (HGX board or NVL72 rack)
    source: str

    def __post_init__(self) -> None:
        for field_name in ("hbm_bytes", "hbm_bytes_per_s", "bf16_flops", "fp8_flops", "fp4_flops",
                           "nvlink_bytes_per_s", "rdma_bytes_per_s"):
            value = getattr(self, field_name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise PlanInputError(f"GpuSpec {self.name!r}: {field_name} must be > 0, got {value!r}")
        if not isinstance(self.domain_gpus, int) or self.domain_gpus < 1:
            raise PlanInputError(f"GpuSpec {self.name!r}: domain_gpus must be an int >= 1, got {self.domain_gpus!r}")


GB = 1e9
TB = 1e12
PF = 1e15

GPUS: dict[str, GpuSpec] = {
    "H100": GpuSpec("H100", 80 * GB, 3.35 * TB, 0.989 * PF, 1.979 * PF, 1.979 * PF, 450 * GB, 50 * GB, 8,
                    "NVIDIA H100 SXM datasheet; no FP4 tensor cores (FP4 weights run at the FP8 rate); HGX 8-GPU"),
    "H800": GpuSpec("H800", 80 * GB, 3.35 * TB, 0.989 * PF, 1.979 * PF, 1.979 * PF, 200 * GB, 50 * GB, 8,
                    "NVIDIA H800 SXM: H100 figures with NVLink 400 GB/s both directions; HGX 8-GPU"),
    "B200": GpuSpec("B200", 180 * GB, 8 * TB, 2.25 * PF, 4.5 * PF, 9 * PF, 900 * GB, 50 * GB, 8,
                    "NVIDIA HGX B200 figures; HGX 8-GPU NVLink 5 domain; ConnectX-7"),
    "H200": GpuSpec("H200", 141 * GB, 4.8 * TB, 0.989 * PF, 1.979 * PF, 1.979 * PF, 450 * GB, 50 * GB, 8,
                    "NVIDIA H200 SXM datasheet; no FP4 tensor cores (FP4 weights run at the FP8 rate); HGX 8-GPU"),
    "B300": GpuSpec("B300", 288 * GB, 8 * TB, 2.25 * PF, 4.5 * PF, 14 * PF, 900 * GB, 100 * GB, 8,
                    "NVIDIA HGX B300 (Blackwell Ultra) figures; HGX 8-GPU NVLink 5 domain; ConnectX-8"),
    "GB200-NVL72": GpuSpec("GB200-NVL72", 186 * GB, 8 * TB, 2.5 * PF, 5 * PF, 10 * PF, 900 * GB, 50 * GB, 72,
                           "NVIDIA GB200 NVL72 rack figures / 72 (sparse halved); 72-GPU NVLink domain; ConnectX-7"),
    "GB300-NVL72": GpuSpec("GB300-NVL72", 288 * GB, 8 * TB, 2.5 * PF, 5 * PF, 15 * PF, 900 * GB, 100 * GB, 72,
                           "NVIDIA GB300 NVL72 rack figures / 72; 72-GPU NVLink domain; ConnectX-8"),
}
ALIASES = {"GB200": "GB200-NVL72", "GB300": "GB300-NVL72", "B300-HGX": "B300", "H200-SXM": "H200",
           "H100-SXM": "H100", "H800-SXM": "H800", "B200-HGX": "B200"}


def gpu(name: str) -> GpuSpec:
    """The spec of a GPU by name (case-insensitive; GB200 / GB300 mean their NVL72 racks)."""
    if not isinstance(name, str):
        raise PlanInputError(f"GPU name must be a string, got {name!r}")
    key = name.strip().upper()
    key = ALIASES.get(key, key)
    if key not in GPUS:
        raise PlanInputError(f"unknown GPU {name!r}; choose one of {sorted(GPUS)} (aliases: {sorted(ALIASES)})")
    return GPUS[key]
