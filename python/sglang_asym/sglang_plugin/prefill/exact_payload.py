"""asym-prefill's Mooncake KV manager: it moves exactly the SplitPlan payload, row by row.

SGLang's `MooncakeKVManager` moves whole items: a page of every registered buffer per page index, a
whole pair ring per request. For an asymmetric room that is several times the payload (the page
holding B's last rows, the window pages' rows below B - W + 1, every ring row). `exact_manager_class()`
builds the subclass an asym-prefill server runs instead (the `get_kv_class` hook hands it out). For
a room it was told about (`expect_room`, called where P cuts the request) it replaces two sends:
  send_kvcache      each chunk's pages      -> the manifest's compressed-KV and index-key rows on
                                               those pages
  maybe_send_extra  the last chunk's state  -> the encoder layers' window rows and an odd B's pending
                                               compressor token
Every row goes straight from its slot in P's pool to the same slot of the page SGLang's receiver
announced in D's pool (one write per contiguous run): no staging extent on either side, no copy on
D, and D commits the request exactly as before. Bootstrap, status, aux data, failures and aborts
stay SGLang's; other rooms (health checks' fake transfers) take SGLang's own path. A decode peer whose
pair rings are wider than P's (an asym-decode D that speculates: SGLang sizes its rings for the draft
tokens) is accepted at registration (`_state_stride_mismatch` exempts the rings, whose rows go to the row
D reads, by D's announced ring size). Bytes moved are
counted on /metrics as `sglang_asym:kv_transfer_payload_bytes_total`, which for one request equals
`SplitPlan.manifest().total_bytes`; the sender subclass makes SGLang's own per-request transfer
metric (`sglang:kv_transfer_total_mb`) report the same bytes instead of its page-count estimate.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...cache.groups import GroupKind, parse_group
from ...manifest import RowGroup
from ...split import SplitPlan
from ..shared.kv_pool import PAGE_SIZE, pool_row_format
from ..shared.pool_payload import PoolPayloadError, RequestPages, group_rows, row_sites
from ..shared.room_lifecycle import RoomLifecycleManager, RoomLifecycleSender

log = logging.getLogger(__name__)

POOL_ATTR = "sglang_asym_pool"  # set on P's KVArgs by the registration hook: the pool the rows live in
# SGLang's state components -> the manifest kinds they carry (kv and index rows go with the pages)
STATE_GROUP_KINDS = {"SWA": (GroupKind.SWA,), "DSV4_REQUEST_STATE": (GroupKind.TAIL,)}


REQUEST_STATE_TYPE = "DSV4_REQUEST_STATE"  # SGLang's StateType of the pair rings


class ExactPayloadError(RuntimeError):
    """A room whose payload cannot be placed on the pages SGLang announced (names room and group)."""


@dataclass(frozen=True)
class Block:
    src: int
    dst: int
    length: int


def coalesce(blocks: Sequence[Block]) -> list[Block]:
    """Merges blocks whose source and destination both continue the previous block's."""
    out: list[Block] = []
    for block in sorted(blocks, key=lambda b: (b.src, b.dst)):
        last = out[-1] if out else None
        if last is not None and last.src + last.length == block.src and last.dst + last.length == block.dst:
            out[-1] = Block(last.src, last.dst, last.length + block.length)
        else:
            out.append(block)
    return out


@dataclass(frozen=True)
class Registered:
    """One side's registered entries of one buffer list: base pointers, model layer ids and, where the
    peer announced them, item lengths (a pair ring's item is one request's whole ring)."""

    ptrs: Sequence[int]
    layer_ids: Sequence[int]
    item_lens: Sequence[int] = ()


def _entry_pairs(src: Registered, dst: Registered) -> dict[int, int]:
    from sglang.srt.disaggregation.utils import build_transfer_entry_pairs

    return dict(build_transfer_entry_pairs(list(src.layer_ids), list(dst.layer_ids), len(src.ptrs), len(dst.ptrs)))


def _peer_ring_rows(group: RowGroup, dst: Registered, j: int) -> int | None:
    """Rows per request of the peer's pair ring behind entry j (None: not a ring, or the peer announced
    no item lengths, so its layout is taken to be ours). A decode peer that speculates keeps a wider
    ring than the prefill side (SGLang sizes it for the draft tokens), and the pending token goes to
    the row the peer will read: (B - 1) modulo its own ring size."""
    if parse_group(group.name).kind is not GroupKind.TAIL or j >= len(dst.item_lens):
        return None
    item = int(dst.item_lens[j])
    if item <= 0 or item % group.row_bytes:
        raise ExactPayloadError(f"{group.name}: the decode peer's ring item of {item} bytes is not a whole "
                                f"number of {group.row_bytes}-byte rows")
    return item // group.row_bytes


def group_blocks(pool: Any, split: SplitPlan, group: RowGroup, rows: range, src_pages: RequestPages,
                 dst_pages: RequestPages, src: Registered, dst: Registered) -> list[Block]:
    """The writes that copy `rows` of manifest group `group` from P's pool slots to D's.

    Slots are found with P's pool objects for both sides (the two pools share one layout, which
    SGLang's registration checks, but for the pair ring's rows per request: D's announced item
    length gives its ring); D's address is its registered base of the paired entry plus the
    same in-buffer offset at D's page."""
    if not rows:
        return []
    src_sites = row_sites(pool, group.name, rows, src_pages, split, group.row_bytes)
    base = src_sites[0].buffer.data_ptr()
    try:
        i = list(src.ptrs).index(base)
    except ValueError:
        raise ExactPayloadError(f"{group.name}: its pool buffer is not among this server's registered entries"
                                ) from None
    j = _entry_pairs(src, dst)[i]
    dst_sites = row_sites(pool, group.name, rows, dst_pages, split, group.row_bytes,
                          ring_rows=_peer_ring_rows(group, dst, j))
    dst_base = dst.ptrs[j]
    stride = src_sites[0].buffer.shape[1]
    blocks = []
    for s, d in zip(src_sites, dst_sites):
        for offset, length in s.parts:
            blocks.append(Block(base + s.page * stride + offset, dst_base + d.page * stride + offset, length))
    return blocks


def _pages(first_page: int, pages: Sequence[int]) -> tuple[int | None, ...]:
    return (None,) * first_page + tuple(int(p) for p in pages)


def chunk_blocks(pool: Any, split: SplitPlan, first_page: int, src_pages: Sequence[int], dst_pages: Sequence[int],
                 src: Registered, dst: Registered) -> list[Block]:
    """The compressed KV and index-key rows of the manifest that lie on one chunk's pages (request
    pages [first_page, first_page + len(src_pages)))."""
    if len(dst_pages) < len(src_pages):
        raise ExactPayloadError(f"the decode side announced {len(dst_pages)} pages for a chunk of {len(src_pages)}")
    src_req = RequestPages(_pages(first_page, src_pages), (), 0)
    dst_req = RequestPages(_pages(first_page, dst_pages[:len(src_pages)]), (), 0)
    end_page = first_page + len(src_pages)
    blocks: list[Block] = []
    for group in split.manifest(pool_row_format(pool)).nonempty().groups:
        gid = parse_group(group.name)
        if not gid.kind.streams:  # kv and index rows: final once their page is computed
            continue
        per_page = PAGE_SIZE // split.config.compress_ratios[gid.layer]
        rows = range(first_page * per_page, min(group.num_rows, end_page * per_page))
        blocks += group_blocks(pool, split, group, rows, src_req, dst_req, src, dst)
    return blocks


def swa_first_page(split: SplitPlan, num_pages: int) -> int:
    """The request page a window page list of `num_pages` pages ending at B starts at (SGLang lists
    the pages from the page-aligned window start up to B)."""
    first = -(-split.boundary // PAGE_SIZE) - num_pages
    if first < 0:
        raise ExactPayloadError(f"{num_pages} window pages for a transfer that ends at {split.boundary}")
    return first


def state_blocks(pool: Any, split: SplitPlan, kinds: Sequence[GroupKind], src_indices: Sequence[int],
                 dst_indices: Sequence[int], src: Registered, dst: Registered) -> list[Block]:
    """The manifest's rows of one state component: window rows (`swa`: indices are the window pages
    up to B) or the pending compressor token (`tail`: indices are request slots)."""
    if len(src_indices) != len(dst_indices):
        raise ExactPayloadError(f"{kinds}: {len(src_indices)} source items, {len(dst_indices)} destinations")
    blocks: list[Block] = []
    for group in split.manifest(pool_row_format(pool)).nonempty().groups:
        kind = parse_group(group.name).kind
        if kind not in kinds:
            continue
        rows = group_rows(split, group.name, group.num_rows)
        if kind is GroupKind.SWA:
            first = swa_first_page(split, len(src_indices))
            src_req = RequestPages((), _pages(first, src_indices), 0)
            dst_req = RequestPages((), _pages(first, dst_indices), 0)
        else:
            if len(src_indices) != 1 or len(dst_indices) != 1:
                raise ExactPayloadError(f"{group.name}: expected one request slot per side, got "
                                        f"{list(src_indices)} -> {list(dst_indices)}")
            src_req, dst_req = RequestPages((), (), int(src_indices[0])), RequestPages((), (), int(dst_indices[0]))
        blocks += group_blocks(pool, split, group, rows, src_req, dst_req, src, dst)
    return blocks


def _announced(per_component: Sequence[Sequence[int]] | None, i: int) -> Sequence[int]:
    """Component i's item lengths from the peer's registration ([] when it sent none)."""
    return per_component[i] if per_component is not None and i < len(per_component) else ()


# ---- the manager ----------------------------------------------------------------------------


@dataclass
class _Room:
    split: SplitPlan
    bytes_sent: int = 0
    chunks: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _ChunkTrackingQueue:
    """A transfer worker's queue that remembers, per worker thread, the chunk it handed out last:
    SGLang's `send_kvcache` is not told which room it sends for."""

    def __init__(self, queue: Any, local: threading.local) -> None:
        self._queue, self._local = queue, local

    def get(self) -> Any:
        chunk = self._queue.get()
        self._local.chunk = chunk
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


@functools.lru_cache(maxsize=1)
def _payload_counter() -> Any:
    from prometheus_client import Counter

    return Counter("sglang_asym:kv_transfer_payload_bytes", "Payload bytes P wrote into D's pool (asymmetric rooms).",
                   ("model_name", "role"))


def expect_room(manager: Any, room: int | None, split: SplitPlan) -> None:
    """Tells an exact-payload manager the split of a room P is about to send (no-op for any other manager)."""
    if room is not None and hasattr(manager, "expect_asym_room"):
        manager.expect_asym_room(int(room), split)


@functools.lru_cache(maxsize=1)
def exact_manager_class() -> type:
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.runtime_context import get_server_args

    class ExactPayloadKVManager(RoomLifecycleManager, MooncakeKVManager):
        """MooncakeKVManager that ships an asymmetric room's manifest rows and nothing else (and keeps a
        rebootstrapped room's second handshake: shared/room_lifecycle.py)."""

        def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
            self._asym_rooms: dict[int, _Room] = {}
            self._asym_lock = threading.Lock()
            self._asym_local = threading.local()
            self._asym_pool = getattr(args, POOL_ATTR, None)
            server_args = get_server_args()
            self._asym_labels = {"model_name": server_args.served_model_name, "role": "prefill"}
            super().__init__(args, *rest, **kwargs)

        # -- rooms --
        def expect_asym_room(self, room: int, split: SplitPlan) -> None:
            if self._asym_pool is None:
                raise ExactPayloadError("the exact-payload manager has no pool (registration hook not run)")
            with self._asym_lock:
                for stale in [r for r in self._asym_rooms if r not in self.request_status and r != room]:
                    del self._asym_rooms[stale]  # concluded and cleared by SGLang: nothing more will be sent
                self._asym_rooms[room] = _Room(split)

        def _asym_room(self, room: int | None) -> _Room | None:
            with self._asym_lock:
                return self._asym_rooms.get(room) if room is not None else None

        def asym_room_bytes(self, room: int | None) -> int | None:
            """Bytes written so far for an asymmetric room (None: not one of this manager's rooms)."""
            state = self._asym_room(room)
            if state is None:
                return None
            with state.lock:
                return state.bytes_sent

        def transfer_worker(self, queue: Any, *args: Any, **kwargs: Any) -> Any:
            return super().transfer_worker(_ChunkTrackingQueue(queue, self._asym_local), *args, **kwargs)

        def _current_chunk(self) -> Any:
            return getattr(self._asym_local, "chunk", None)

        def _write(self, session_id: str, room: int, state: _Room, blocks: list[Block]) -> int:
            blocks = coalesce(blocks)
            if not blocks:
                return 0
            rc = self.engine.batch_transfer_sync(session_id, [b.src for b in blocks], [b.dst for b in blocks],
                                                 [b.length for b in blocks])
            if rc == 0:
                moved = sum(b.length for b in blocks)
                with state.lock:
                    state.bytes_sent += moved
                _payload_counter().labels(**self._asym_labels).inc(moved)
            return rc

        def _fail_room(self, room: int, exc: Exception) -> int:
            # The room fails alone; a nonzero return would mark D's whole session failed.
            log.error("sglang-asym: room %s: %s", room, exc)
            self.conclude_failure(bootstrap_room=room, failure_reason=f"sglang-asym: {exc}")
            return 0

        # -- the two sends --
        def send_kvcache(self, mooncake_session_id: str, prefill_kv_indices: Any, dst_kv_ptrs: list[int],
                         dst_kv_indices: Any, executor: Any, dst_layer_ids: list[int] | None = None,
                         *args: Any, **kwargs: Any) -> int:
            chunk = self._current_chunk()
            state = self._asym_room(getattr(chunk, "room", None))
            if state is None:
                return super().send_kvcache(mooncake_session_id, prefill_kv_indices, dst_kv_ptrs, dst_kv_indices,
                                            executor, dst_layer_ids, *args, **kwargs)
            try:
                if kwargs.get("dst_device_kv_indices") is not None:
                    raise ExactPayloadError("device-side destination indices (HiSparse) are not supported")
                blocks = chunk_blocks(self._asym_pool, state.split, int(chunk.index_slice.start or 0),
                                      np.asarray(prefill_kv_indices), np.asarray(dst_kv_indices),
                                      Registered(self.kv_args.kv_data_ptrs, self.kv_args.kv_layer_ids),
                                      Registered(dst_kv_ptrs, dst_layer_ids or ()))
            except (ExactPayloadError, PoolPayloadError, RuntimeError) as exc:
                return self._fail_room(chunk.room, exc)
            with state.lock:
                state.chunks += 1
            return self._write(mooncake_session_id, chunk.room, state, blocks)

        def _state_stride_mismatch(self, *, state_type: Any = None, **kwargs: Any) -> str | None:
            # SGLang addresses a peer's state rows by the prefill's item length and so refuses a peer whose
            # items differ; the pair rings' rows go through maybe_send_extra below, addressed by the ring size
            # D announces (a speculating D's ring is wider than P's), so only the rings are exempt
            if getattr(state_type, "name", None) == REQUEST_STATE_TYPE:
                return None
            return super()._state_stride_mismatch(state_type=state_type, **kwargs)

        def maybe_send_extra(self, req: Any, prefill_state_indices: list, executor: Any,
                             target_rank_registration_info: Any = None) -> int:
            state = self._asym_room(req.room)
            if state is None:
                return super().maybe_send_extra(req, prefill_state_indices, executor, target_rank_registration_info)
            if target_rank_registration_info is None:
                return self._fail_room(req.room, ExactPayloadError("no registration of the decode peer"))
            if req.decode_prefix_len:
                return self._fail_room(req.room, ExactPayloadError(
                    f"the decode side holds a {req.decode_prefix_len}-token prefix; the asymmetric payload is "
                    "shipped whole"))
            info, args = target_rank_registration_info, self.kv_args
            blocks: list[Block] = []
            try:
                for i, state_type in enumerate(args.state_types):
                    kinds = STATE_GROUP_KINDS.get(getattr(state_type, "name", str(state_type)))
                    indices = prefill_state_indices[i] if i < len(prefill_state_indices) else None
                    if kinds is None or indices is None or len(indices) == 0:
                        continue
                    blocks += state_blocks(
                        self._asym_pool, state.split, kinds, np.asarray(indices), np.asarray(req.dst_state_indices[i]),
                        Registered(args.state_data_ptrs[i], args.state_layer_ids[i]),
                        Registered(info.dst_state_data_ptrs[i], info.dst_state_layer_ids[i],
                                   _announced(getattr(info, "dst_state_item_lens", None), i)))
            except (ExactPayloadError, PoolPayloadError, RuntimeError) as exc:
                return self._fail_room(req.room, exc)
            rc = self._write(req.mooncake_session_id, req.room, state, blocks)
            expected = state.split.manifest(pool_row_format(self._asym_pool)).total_bytes
            log.debug("sglang-asym: room %s shipped %d bytes in %d chunks (manifest %d)", req.room,
                      state.bytes_sent, state.chunks, expected)
            return rc

    return ExactPayloadKVManager


@functools.lru_cache(maxsize=1)
def exact_sender_class() -> type:
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    class ExactPayloadKVSender(RoomLifecycleSender, MooncakeKVSender):
        """MooncakeKVSender whose transfer metric (SGLang's `sglang:kv_transfer_total_mb` and speed)
        reports the bytes the exact-payload manager wrote, not SGLang's page-count estimate."""

        def get_transfer_metric(self) -> Any:
            metric = super().get_transfer_metric()
            sent = getattr(self.kv_mgr, "asym_room_bytes", lambda room: None)(self.bootstrap_room)
            if sent is not None:
                metric.transfer_total_bytes = sent
            return metric

    return ExactPayloadKVSender


def around_get_kv_class(original: Any, transfer_backend: Any, class_type: Any) -> Any:
    """On Mooncake, asym-prefill servers get the exact-payload manager and its sender, and SGLang's own
    prefill mode SGLang's classes with the room-lifecycle mixins (shared/room_lifecycle.py); everything
    else SGLang's classes."""
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend
    from sglang.srt.runtime_context import get_server_args

    from ..shared.room_lifecycle import stock_mooncake_classes
    from ..shared.settings import settings_of

    cls = original(transfer_backend, class_type)
    server_args = get_server_args()
    settings = settings_of(server_args)
    kinds = (KVClassType.MANAGER, KVClassType.SENDER)
    if transfer_backend != TransferBackend.MOONCAKE or class_type not in kinds:
        return cls
    pick = kinds.index(class_type)
    if settings is None:
        return stock_mooncake_classes()[pick] if server_args.disaggregation_mode == "prefill" else cls
    return (exact_manager_class(), exact_sender_class())[pick] if settings.is_prefill else cls
