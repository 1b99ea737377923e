"""Roofline step-time model of V4.1-Flash on one replica of a GPU type (DP attention + expert parallelism).

A replica of G GPUs runs the layout SGLang uses for DeepSeek-style MoE at scale: attention data-parallel
(G ranks, each with its own batch and a copy of the dense weights) and routed experts split over the G
GPUs (EP G). One step of one rank:

  bytes  = dense weights of the layers run                (read once per step; ReplicaLayout: a copy per rank)
         + touched experts / G * bytes per expert        (occupancy: E * (1 - (1 - k/E)^T) experts touched by
                                                          the T tokens of all G ranks, per layer)
         + KV bytes its rows read (window rows, top-k compressed rows, index keys; FlashProfile.kv_read_bytes)
  flops  = 2 * active params * rows (routed experts at the FP4 rate where the GPU has one, the rest at FP8)
         + attention FLOPs of the rows (at the BF16 rate)
  comm   = EP dispatch (FP8) + combine (BF16) of each row's k expert copies per layer, over NVLink when the
           replica sits in one domain, else over the scale-out NICs (not overlapped: conservative)
  step_s = max(bytes / (HBM B/s * MBU), flops / MFU-scaled peak) + comm + fixed overhead
A prefill forward of T tokens is the same formula for T / G rows per GPU (the replica's GPUs share them). A symmetric
P with bounded replay (Role.SYM_P) is one forward with two parts: layers 0-19 on every row, layers 20-39 and the head
on each chunk's last min(W, rows) rows (exact when a prompt is one chunk; a prompt of several chunks is charged at
most W late rows per extra chunk); the parts' bytes and FLOPs add, the fixed cost is paid once.

MBU and MFU default to assumptions (public ranges for MoE serving); a calibration file measured on the GPU
replaces them (plan.calibration).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from ..config import DEFAULT_WINDOW, V41Config
from .errors import PlanInputError
from .flash_profile import FlashProfile, flash_profile
from .gpus import GpuSpec
from .replica_layout import ReplicaLayout
from .steptime import Role, StepTimeModel

WINDOW = DEFAULT_WINDOW  # rows bounded replay runs through the late layers


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak: memory-bandwidth (MBU) and tensor FLOP/s (MFU) utilisation, and fixed costs."""

    mbu: float = 0.7  # decode kernels on HBM3e reach ~70% of peak bandwidth (FlashMLA / DeepGEMM reports)
    mfu: float = 0.45  # large-batch prefill GEMMs + attention reach ~40-50% of dense peak
    step_overhead_s: float = 0.002  # CUDA-graph replay, sampling and scheduling per decode step
    prefill_overhead_s: float = 0.005  # per prefill forward (eager launch, chunk bookkeeping)

    def __post_init__(self) -> None:
        for name in ("mbu", "mfu"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise PlanInputError(f"Efficiency.{name} must be in (0, 1], got {v!r}")
        if self.step_overhead_s < 0 or self.prefill_overhead_s < 0:
            raise PlanInputError("Efficiency overheads must be >= 0")


@dataclass(frozen=True)
class GpuStepModel(StepTimeModel):
    """Step times of one DP rank of a replica of `gpus` GPUs running `role`'s weights."""

    gpu: GpuSpec
    gpus: int
    role: Role = Role.FULL
    efficiency: Efficiency = Efficiency()
    within_domain: bool = True
    cfg: V41Config = V41Config()

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise PlanInputError(f"a replica needs an int >= 1 GPUs, got {self.gpus!r}")
        if self.role is Role.LATE:
            raise PlanInputError("no replica plays the late layers alone (they are part of a bounded-replay P)")

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.gpu.name}x{self.gpus}/{self.role.value}"

    @property
    def profile(self) -> FlashProfile:
        return flash_profile(self.cfg)

    # ---- pieces ------------------------------------------------------------------------------------------
    def experts_touched(self, tokens_all_ranks: float) -> float:
        """Expected distinct routed experts per layer that `tokens_all_ranks` tokens select (uniform routing)."""
        e, k = self.profile.experts, self.cfg.num_experts_per_tok
        return e * (1 - (1 - k / e) ** max(tokens_all_ranks, 0.0))

    @property
    def layout(self) -> ReplicaLayout:
        return ReplicaLayout(self.role, self.gpus, self.cfg)

    def weight_read_bytes(self, role: Role, rows_per_rank: float) -> float:
        touched = self.experts_touched(rows_per_rank * self.gpus) / self.profile.experts
        return self.layout.step_read_bytes(role, touched)

    def matmul_seconds(self, role: Role, rows: float) -> float:
        p, g = self.profile, self.gpu
        flops = 2 * p.active_params_per_token(role) * rows
        share = p.expert_flop_share(role)
        return (flops * share / g.fp4_flops + flops * (1 - share) / g.fp8_flops) / self.efficiency.mfu

    def comm_seconds(self, role: Role, rows: float) -> float:
        if self.gpus == 1 or rows <= 0:
            return 0.0
        cfg = self.cfg
        layers = len(self.profile.role_layers(role))
        per_row = cfg.num_experts_per_tok * cfg.hidden_size * (1 + 2) * layers  # FP8 out, BF16 back
        remote = (self.gpus - 1) / self.gpus
        link = self.gpu.nvlink_bytes_per_s if self.within_domain else self.gpu.rdma_bytes_per_s
        return rows * per_row * remote / link

    def _step(self, role: Role, rows: float, kv_bytes: float, attn_flops: float, overhead: float) -> float:
        return self._step_parts([(role, rows, kv_bytes, attn_flops)], overhead)

    def _step_parts(self, parts: Sequence[tuple[Role, float, float, float]], overhead: float) -> float:
        """One forward made of (layers run, rows per GPU, KV bytes, attention FLOPs) parts run back to back."""
        g, eff = self.gpu, self.efficiency
        memory_s = sum(self.weight_read_bytes(r, n) + kv for r, n, kv, _ in parts) / (g.hbm_bytes_per_s * eff.mbu)
        compute_s = sum(self.matmul_seconds(r, n) + f / (g.bf16_flops * eff.mfu) for r, n, _, f in parts)
        return max(memory_s, compute_s) + sum(self.comm_seconds(r, n) for r, n, _, _ in parts) + overhead

    # ---- StepTimeModel ------------------------------------------------------------------------------------
    def decode_step_s(self, decode_contexts: Sequence[int], window_chunks: Sequence[int] = (),
                      window_context: int = 0) -> float:
        window_rows = sum(window_chunks)
        rows = len(decode_contexts) + window_rows
        if rows == 0:
            return 0.0
        p, role = self.profile, Role.FULL
        counts = Counter(decode_contexts)  # batches of thousands share a few contexts: count each once
        kv = sum(k * p.kv_read_bytes(c, role) for c, k in counts.items())
        flops = sum(k * p.attention_flops(c, role) for c, k in counts.items())
        if window_rows:
            ctx = window_context + self.cfg.sliding_window
            kv += window_rows * p.kv_read_bytes(ctx, role)
            flops += window_rows * p.attention_flops(ctx, role)
        return self._step(role, rows, kv, flops, self.efficiency.step_overhead_s)

    def prefill_s(self, tokens: int, role: Role, context: int = 0) -> float:
        return self.prefill_step_s([(tokens, context)], role)

    def prefill_step_s(self, segments: Sequence[tuple[int, int]], role: Role) -> float:
        """Several prompts' chunks in one forward of the replica: its G GPUs share the tokens (each GPU computes
        tokens / G rows; attention at each chunk's mean context) and read the weights once for all of them. A
        chunk's K/V tiles are read once per query tile: small next to the weights and the FLOPs."""
        segments = [(n, c) for n, c in segments if n > 0]
        if not segments:
            return 0.0
        if role is Role.SYM_P:  # bounded replay: early layers on every row, late layers on the last W of each chunk
            late = [(min(n, WINDOW), c + n - min(n, WINDOW)) for n, c in segments]
            return self._step_parts([self._prefill_part(segments, Role.RFC_P), self._prefill_part(late, Role.LATE)],
                                    self.efficiency.prefill_overhead_s)
        return self._step_parts([self._prefill_part(segments, role)], self.efficiency.prefill_overhead_s)

    def _prefill_part(self, segments: Sequence[tuple[int, int]], run: Role) -> tuple[Role, float, float, float]:
        p = self.profile
        rows = sum(n for n, _ in segments) / self.gpus
        flops = sum(n * p.attention_flops(c + n // 2, run) for n, c in segments) / self.gpus
        return run, rows, 0.0, flops

    # ---- throughput figures ---------------------------------------------------------------------------------
    def prefill_tokens_per_gpu_s(self, role: Role, chunk: int = 8192, prompt: int = 8192) -> float:
        """Prefill tokens per second per GPU for prompts of `prompt` tokens in chunks of `chunk`."""
        steps = -(-prompt // chunk)
        total = sum(self.prefill_s(min(chunk, prompt - i * chunk), role, i * chunk) for i in range(steps))
        return prompt / total / self.gpus

    def decode_tokens_per_gpu_s(self, batch_per_rank: int, context: int) -> float:
        return batch_per_rank / self.decode_step_s([context] * batch_per_rank)
