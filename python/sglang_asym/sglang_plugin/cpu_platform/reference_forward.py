"""What the CPU route's layers (layer_loop.py) need beyond SGLang's ForwardBatch, and how a forward's rows run.

`ScheduleRecords` (`RECORDS`, one per scheduler process): the model runner's pools, the server's role, each occupied
req slot's prompt length and bootstrap room (from the ForwardBatch.init_new hook), and the window rows queued to
ride in the next decode forward (`ride_next_decode`). `ForwardPlan`: each request's rows (`request_rows`) and the
passes they run in (`pieces`, `phases`, `forward_groups`): rows from B = N - W on with the semantics' floors on the
grid of D's window chunks, so a prompt's window computes as D's window steps compute it; bounded replay's rows
before B up to the last KV source only; with --enable-deterministic-inference each piece, and each verify row, alone.
docs/sglang-engine-cpu.md has the whole story.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ...config import V41Config
from ...model.model import V41Model
from ...sched.config import chunk_rows_for
from ...split import Semantics, SplitPlan
from .kv_layout import cpu_kv_layout_name
from .replay_mode import ReplayMode
from ..shared.kv_pool import row_format_of_layout
from ..shared.pool_rows import PoolRows
from ..prefill.cut import prompt_len_of
from .reference_weights import reference_model_from_sglang

log = logging.getLogger(__name__)

DEFAULT_SEMANTICS = Semantics.DECODER_REPLAY  # SGLang 0.5.23's default for V4.1 (bounded replay on)


@dataclass(frozen=True)
class WindowSplit:
    """The window W whose floors a prompt's rows from B = N - W on get, and the chunk grid those rows run on:
    the server's --asym-window / --asym-window-chunk (the decode role's window steps read the same settings),
    or for a symmetric server the model's sliding window and the default chunk."""

    window: int
    chunk: int

    def __post_init__(self) -> None:
        if not 1 <= self.chunk <= self.window:
            raise ValueError(f"WindowSplit.chunk must be in [1, window={self.window}], got {self.chunk}")

    @classmethod
    def of(cls, settings: Any, cfg: V41Config) -> "WindowSplit":
        """From an AsymSettings record (None: a symmetric server). A chunk of 0 means whole windows."""
        if settings is None:
            return cls(cfg.sliding_window, chunk_rows_for(cfg.sliding_window, None))
        return cls(settings.window, settings.chunk_rows or settings.window)


@dataclass(frozen=True)
class RequestRecord:
    """One occupied req slot as the reference layers need it: the prompt length N whose floors apply (an
    asym-prefill request was cut to B = N - W tokens: its floors are those of N) and its PD bootstrap room."""

    prompt_len: int
    room: int | None = None


class ScheduleRecords:
    """What ForwardBatch does not carry, handed over by the init_new hook (patches.py) in this scheduler
    process: the model runner's pools, this server's role, a RequestRecord per occupied req slot, and the
    extend rows queued to ride in the next decode forward (`ride_next_decode`)."""

    def __init__(self) -> None:
        self.kv_pool: Any = None
        self.req_to_token: torch.Tensor | None = None
        self.role = "null"  # SGLang's disaggregation mode of this server
        self.requests: dict[int, RequestRecord] = {}
        self.riders: list[Rider] = []

    def note(self, batch: Any, model_runner: Any) -> None:
        if self.kv_pool is None and getattr(model_runner, "token_to_kv_pool", None) is not None:
            from sglang.srt.runtime_context import get_server_args

            self.kv_pool = model_runner.token_to_kv_pool
            self.req_to_token = model_runner.req_to_token_pool.req_to_token
            mode = get_server_args().disaggregation_mode
            self.role = str(getattr(mode, "value", mode))
        reqs, slots = getattr(batch, "reqs", None), getattr(batch, "req_pool_indices", None)
        if reqs and slots is not None:
            for req, slot in zip(reqs, slots.tolist()):
                self.requests[int(slot)] = RequestRecord(prompt_len_of(req) or len(req.origin_input_ids),
                                                         getattr(req, "bootstrap_room", None))

    def room(self, slot: int) -> int | None:
        record = self.requests.get(slot)
        return None if record is None else record.room

    def take_riders(self) -> list["Rider"]:
        left, self.riders = self.riders, []
        return left


RECORDS = ScheduleRecords()  # this scheduler process's (SGLang runs one model runner per scheduler process)


def note_schedule_batch(batch: Any, model_runner: Any) -> None:
    """Called by the init_new hook for every ScheduleBatch this scheduler turns into a forward."""
    RECORDS.note(batch, model_runner)


@dataclass(frozen=True)
class RequestRows:
    """One request's rows in a forward: tokens at [start, start + len(tokens))."""

    req: int  # SGLang req_pool_idx
    start: int
    tokens: torch.Tensor
    prompt_len: int | None  # None: no floors can apply (decode and verify rows)
    verify: bool = False  # speculative verify rows: logits of every row, a pending pair kept for every accept end

    @property
    def end(self) -> int:
        return self.start + self.tokens.numel()


@dataclass
class RowsOutput:
    """What one request's pieces of a forward give: the last piece's logits count (every piece's, in order,
    for verify rows), and each piece's captured layer inputs, concatenated per row."""

    last: torch.Tensor | None = None
    verify: list[torch.Tensor] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)

    def add(self, r: RequestRows, logits: torch.Tensor | None, captured: list[torch.Tensor]) -> None:
        self.last = logits
        if r.verify and logits is not None:
            self.verify.append(logits)
        if captured:
            self.features.append(torch.cat(captured, dim=-1))

    def logits(self) -> torch.Tensor | None:
        return torch.cat(self.verify) if self.verify else self.last


@functools.lru_cache(maxsize=4096)
def _floors(cfg: V41Config, prompt_len: int, window: int, semantics: Semantics) -> tuple[int, tuple[tuple[int, int], ...]]:
    split = SplitPlan(cfg, prompt_len, window, semantics)
    return split.boundary, tuple(sorted(split.swa_floors().items()))


def pieces(r: RequestRows, cfg: V41Config, window: int, semantics: Semantics, window_chunk: int,
           verify_by_row: bool = False) -> list[tuple[RequestRows, dict[int, int]]]:
    """One request's rows as (rows, floors) forwards: rows before B = max(N - W, 0) in one piece without
    floors, rows from B on with the floors in pieces on the grid B + k * window_chunk, the chunks the
    decode worker's window steps use, so a window computes exactly as those steps compute it.
    With `verify_by_row`, verify rows run one row per forward (as one-row decode steps compute them)."""
    if r.verify and verify_by_row:
        return [(RequestRows(r.req, r.start + j, r.tokens[j:j + 1], None, verify=True), {})
                for j in range(r.tokens.numel())]
    if r.prompt_len is None:  # decode and verify rows
        return [(r, {})]
    boundary, floors = _floors(cfg, r.prompt_len, window, semantics)
    if r.end <= boundary:
        return [(r, {})]
    floors = dict(floors)  # empty when N <= W: the whole prompt is the window, with no floor
    cuts = [c for c in range(boundary, r.end, window_chunk) if c > r.start] + [r.end]
    out, at = [], r.start
    for cut in cuts:
        out.append((RequestRows(r.req, at, r.tokens[at - r.start:cut - r.start], r.prompt_len),
                    floors if at >= boundary else {}))
        at = cut
    return out


def phases(rows: Sequence[RequestRows], cfg: V41Config, window: int, semantics: Semantics,
           window_chunk: int, verify_by_row: bool = False
           ) -> list[list[tuple[int, RequestRows, dict[int, int]]]]:
    """(index, rows, floors) per forward: phase k runs the k-th piece of every request that has one."""
    split = [pieces(r, cfg, window, semantics, window_chunk, verify_by_row) for r in rows]
    depth = max(len(p) for p in split)
    return [[(i, *p[k]) for i, p in enumerate(split) if k < len(p)] for k in range(depth)]


@dataclass(frozen=True)
class Rider:
    """Extend rows that run inside the next decode forward (a mixed step: one forward holds the running
    batch's decode rows and these window rows); `on_logits` gets each request's last-row logits."""

    rows: tuple[RequestRows, ...]
    on_logits: Callable[[torch.Tensor], None]
    work: Any = None  # the caller's record of what the rows are (to run them another way if no decode came)


def ride_next_decode(forward_batch: Any, on_logits: Callable[[torch.Tensor], None], work: Any = None) -> Rider:
    """Queues an extend ForwardBatch's rows for the next decode forward of this scheduler process."""
    rider = Rider(tuple(ForwardPlan.request_rows(forward_batch.input_ids, forward_batch.positions, forward_batch)),
                  on_logits, work)
    RECORDS.riders.append(rider)
    return rider


def take_unridden() -> list[Rider]:
    """Riders no decode forward took (the caller runs them another way)."""
    return RECORDS.take_riders()


def captures_every_row(forward_batch: Any) -> bool:
    """Whether SGLang runs this forward with CaptureHiddenMode.FULL (a speculative worker's forwards)."""
    mode = getattr(forward_batch, "capture_hidden_mode", None)
    return mode is not None and bool(mode.is_full())


class ForwardPlan:
    """How a forward's rows run over the pool: in which passes, which rows stop at the last KV source, which
    layers' window rows a pass reads and writes (layer_loop.py runs the plan; so does the tests' whole-forward)."""

    def __init__(self, model: V41Model, rows: PoolRows, semantics: Semantics, deterministic: bool = False,
                 split: WindowSplit | None = None, replay: ReplayMode = ReplayMode()) -> None:
        """`rows`: the pool's row access (PoolRows, or anything with its read/write methods); `split`: the
        server's window and chunk (default: a symmetric server's, WindowSplit.of(None, cfg)); `replay`: whether
        a full model's prompt rows before B stop at the last KV source (SGLang's bounded replay, the default)."""
        self.model, self.cfg = model, model.cfg
        self.split = WindowSplit.of(None, self.cfg) if split is None else split
        self.window = self.cfg.sliding_window  # the attention window: rows each query reads back
        self.semantics = semantics
        self.deterministic = deterministic
        self.rows = rows
        # the prefill role keeps window rows of the encoder layers only (layer 20 runs its KV path)
        plan = model.plan
        self.swa_layers = tuple(plan.encoder_layers if model.role == "prefill" else range(self.cfg.num_hidden_layers))
        self.replay = replay if model.role == "full" else ReplayMode(bounded=False)
        self.late_layers = range(plan.last_kv_source, self.cfg.num_hidden_layers)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The layers whose inputs the DSpark drafter reads (the checkpoint's dspark_target_layer_ids)."""
        return tuple(self.cfg.dspark_target_layer_ids)

    def forward_groups(self, phase: list[tuple[int, RequestRows, dict[int, int]]], capture: tuple[int, ...] = ()
                       ) -> list[list[tuple[int, RequestRows, dict[int, int]]]]:
        """The forwards of one phase: all its pieces together, or (deterministic) each piece alone, with a
        cache set sized for it alone (nothing of the batch reaches its arithmetic); with bounded replay, the
        pieces that stop at the last KV source in a forward of their own."""
        groups = [[item] for item in phase] if self.deterministic else [phase]
        split = [[[item for item in group if self.to_kv_source_only(item[1], capture) == short] for short in (True, False)]
                 for group in groups]
        return [part for parts in split for part in parts if part]

    def to_kv_source_only(self, r: RequestRows, capture: tuple[int, ...] = ()) -> bool:
        """Whether `r` are prompt rows before B that bounded replay runs only up to the last KV source (never
        verify or decode rows, nor a forward whose late-layer inputs a speculative drafter reads)."""
        if r.prompt_len is None or r.verify or capture or not self.replay.bounded:
            return False
        boundary, floors = _floors(self.cfg, r.prompt_len, self.split.window, self.semantics)
        return self.replay.to_kv_source_only(r.end, boundary, dict(floors), self.late_layers)

    @staticmethod
    def request_rows(input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any) -> list[RequestRows]:
        mode = forward_batch.forward_mode
        if mode.is_idle() or forward_batch.batch_size == 0:
            return []
        reqs = [int(r) for r in forward_batch.req_pool_indices.tolist()]
        if mode.is_decode():
            return [RequestRows(req, int(p), input_ids[i:i + 1], None)
                    for i, (req, p) in enumerate(zip(reqs, positions.tolist()))]
        if mode.is_target_verify():  # the same number of rows per request: the bonus token and the drafts
            q = int(forward_batch.spec_info.draft_token_num)
            if input_ids.numel() != q * len(reqs):
                raise RuntimeError(f"a verify batch of {len(reqs)} requests x {q} rows holds {input_ids.numel()} tokens")
            return [RequestRows(req, int(positions[i * q]), input_ids[i * q:(i + 1) * q], None, verify=True)
                    for i, req in enumerate(reqs)]
        if not mode.is_extend():
            raise NotImplementedError(f"the CPU route runs extend, decode and verify batches, not {mode}")
        missing = [req for req in reqs if req not in RECORDS.requests]
        if missing:
            raise RuntimeError(f"no prompt length for req slots {missing} (the init_new hook did not see them)")
        out, at = [], 0
        for req, n in zip(reqs, forward_batch.extend_seq_lens_cpu):
            out.append(RequestRows(req, int(positions[at]), input_ids[at:at + n], RECORDS.requests[req].prompt_len))
            at += n
        return out

    def window_layers(self, short: bool) -> tuple[int, ...]:
        """The layers whose window rows a piece reads from the pool and writes back (`short`: bounded replay's
        rows before B, which touch none from the last KV source on: no later row reads them)."""
        if short:
            return tuple(layer for layer in self.swa_layers if layer not in self.late_layers)
        return self.swa_layers

@dataclass(frozen=True)
class ReferenceSetup:
    """The reference model built from SGLang's loaded V4.1 model, and how this server runs it."""

    model: V41Model
    semantics: Semantics
    deterministic: bool
    split: WindowSplit
    replay: ReplayMode


def reference_setup(sglang_model: torch.nn.Module) -> ReferenceSetup | None:
    """The reference model of this server's role (the prefill role's for SGLang's truncated asym-prefill model)
    from SGLang's loaded parameters, with the server's semantics, determinism and window split; None for
    another architecture."""
    from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM
    from sglang.srt.runtime_context import get_server_args

    if not isinstance(sglang_model, DeepseekV4ForCausalLM):
        return None
    from ..prefill.model import role_of
    from ..shared.settings import settings_of

    server_args = get_server_args()
    model_path = server_args.model_path
    cfg = V41Config.from_json_file(model_path)
    role = "prefill" if role_of(sglang_model) is not None else "full"
    # the caches are quantized as the pool stores them: V4.1's formats in v41, SGLang's V4 row in v4
    cache_quant = row_format_of_layout(cpu_kv_layout_name())
    reference = reference_model_from_sglang(sglang_model, cfg, model_path, cache_quant=cache_quant, role=role)
    settings = settings_of(server_args)
    semantics = DEFAULT_SEMANTICS if settings is None else Semantics.parse(settings.semantics)
    replay = ReplayMode.from_environment() if role == "full" else ReplayMode(bounded=False)
    return ReferenceSetup(reference, semantics, bool(server_args.enable_deterministic_inference),
                          WindowSplit.of(settings, cfg), replay)
