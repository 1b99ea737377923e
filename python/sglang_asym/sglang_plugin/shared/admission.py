"""Admission control and bounded lifetimes on an asym pair, decided in each server's launcher process.

SGLang 0.5.23 ignores `--max-queued-requests` in PD mode and bounds a request's waits only by its
bootstrap and transfer timeouts (300 s each), so under overload requests queue without limit and
clients wait minutes for nothing. Hooked on the tokenizer manager of an asym-prefill / asym-decode
server (TokenizerManager.generate_request AROUND):

  bound      a server holds at most `limit` requests: its request pool's capacity (--max-running-requests,
             plus on D the slots SGLang's pool reserves for requests in transfer,
             --disaggregation-decode-extra-slots) plus --max-queued-requests (default: the capacity
             again) waiting beyond the pool. A request beyond it is refused at once with 503 and a
             Retry-After header (an SSE error event with code 503 on a stream, whose status line was
             already sent).
  both sides the router sends a request to P (which it does not wait for) and to D at once, so one
             side's refusal must end the other side's copy: D decides for the pair. D checks its own
             bound, then asks P's bootstrap server (same launcher process as P's tokenizer manager,
             route ADMISSION_PATH) whether P admits the room; P decides a room once, whichever comes
             first of D's question and P's own copy of the request, so both sides agree. A room D
             refuses, or that D ends early, is closed on P: P's copy is refused on arrival or aborted.
             A room whose request ends normally is forgotten: D's retraction sends P the same room
             again (a rebootstrap), decided anew. A P that does not answer refuses the room, unless
             D recomputes what P cannot send (--asym-transfer-fallback recompute). A room whose copy P's
             launcher refused with a 4xx before D asked (SGLang's tokenizer manager: a prompt longer than
             the context length, which D refuses alike) is answered with that refusal, and D's client gets
             the same 4xx in P's words, not a 503 that says P is full; the other way round, D's close of a
             room it refused with a 4xx carries that refusal, and P's copy is refused with it, whether it
             comes after the close or was aborted by it (a router that answers with P's error, smg, then says
             D's 400, not P's 503 or P's abort).
  deadline   every admitted request ends within --asym-request-deadline-s on each side: past it, the
             request is aborted in its scheduler (which frees its pool slots and tells the peer) and
             the client gets a 503 that says so. The scheduler's own PD waits (P's bootstrap wait,
             D's transfer wait) are set to the same bound (environment_defaults).

Health checks (SGLang's HEALTH_CHECK requests) and batch requests pass ungated; the deadline still
holds for them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, AsyncIterator, Callable

from ..cpu_platform.cpu_patch import register_missing
from .admission_check import AsymAdmissionError, refusal_of
from .relayed_refusal import REFUSED_MESSAGE

DECODE_REFUSED_MESSAGE = "sglang-asym: the decode worker refused the request: {message}"

log = logging.getLogger(__name__)

GENERATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
MANAGER_INIT = "sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__"
BOOTSTRAP_ROUTES = "sglang.srt.disaggregation.common.conn.CommonKVBootstrapServer._setup_routes"
ERROR_RESPONSE = "sglang.srt.entrypoints.http_server._create_error_response"
ADMISSION_PATH = "/sglang_asym/admission"
GATE_ATTR = "_sglang_asym_admission"
FALLBACK_CAPACITY = 64  # a GPU server without --max-running-requests: SGLang sizes its pool later
PEER_TIMEOUT_S = 5.0
ABORT_GRACE_S = 5.0  # how long an aborted request's own finish is awaited before the client is answered
# The scheduler's PD waits, bounded by the request deadline (an operator's own value is kept).
DEADLINE_ENVS = ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT")
SGLANG_PD_WAIT_S = 300  # SGLang 0.5.23's own default of both waits: a longer deadline does not lengthen them


class Overloaded(ValueError):
    """SGLang's HTTP front turns a ValueError into an error response with its `status_code`. 503, not 429:
    sglang-router answers a decode worker's 503 with a 503 ("decode_unavailable") but any status it has no
    name for, 429 among them, with a 500."""

    status_code = 503

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PeerUnreachable(Overloaded):
    pass


class DeadlinePassed(ValueError):
    status_code = 503


class ClosedRoomRefused(ValueError):
    """A copy of a room that was closed with a 4xx (this server's own earlier refusal, or the peer's that its
    close carried) is refused with that 4xx and those words."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class PrefillRefused(ValueError):
    """P's launcher refused the room's request with a 4xx (its `status_code`) before D asked about the room."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(REFUSED_MESSAGE.format(message=message))
        self.status_code = status_code


def client_refusal(exc: BaseException) -> tuple[int, str] | None:
    """(status, words) of an error SGLang's HTTP front answers with a 4xx; None for any other."""
    status = int(getattr(exc, "status_code", HTTPStatus.BAD_REQUEST))
    return (status, str(exc)) if isinstance(exc, ValueError) and 400 <= status < 500 else None


@dataclass(frozen=True)
class AdmissionLimits:
    """What one server admits: `capacity` running requests plus `queued` waiting ones, each for at most
    `deadline_s` seconds."""

    capacity: int
    queued: int
    deadline_s: float

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.queued < 0 or not self.deadline_s > 0:
            raise ValueError(f"AdmissionLimits out of range: {self}")

    @property
    def limit(self) -> int:
        return self.capacity + self.queued

    @property
    def retry_after_s(self) -> int:
        """A client's wait before retrying: a few seconds, never more than the deadline."""
        return max(1, min(5, math.ceil(self.deadline_s)))

    @classmethod
    def of(cls, server_args: Any, deadline_s: float) -> "AdmissionLimits":
        """From SGLang's (resolved) arguments: the request pool's slots are the running ones plus, on D,
        the extra slots for requests in transfer."""
        running = server_args.max_running_requests or FALLBACK_CAPACITY
        capacity = running + (getattr(server_args, "disaggregation_decode_extra_slots", None) or 0)
        queued = server_args.max_queued_requests
        return cls(capacity, capacity if queued is None else queued, deadline_s)


def resolved_pool_args(server_args: Any) -> Any:
    """The pool arguments as SGLang resolved and published them in this process (the launcher publishes
    before it creates the tokenizer manager): a default --max-running-requests and D's extra slots exist
    only there, not on the ServerArgs record."""
    from types import SimpleNamespace

    from sglang.srt.runtime_context import get_disagg, get_schedule, get_server_args

    try:
        if get_server_args() is not server_args:
            return server_args
        schedule, disagg = get_schedule(), get_disagg()
        extra = disagg.disaggregation_decode_extra_slots if disagg.disaggregation_mode == "decode" else 0
        return SimpleNamespace(max_running_requests=schedule.max_running_requests,
                               max_queued_requests=schedule.max_queued_requests,
                               disaggregation_decode_extra_slots=extra)
    except ValueError:  # nothing published in this process
        return server_args


def environment_defaults(deadline_s: float) -> None:
    """Bounds the scheduler's PD waits by the deadline (never above SGLang's own default); set in the launcher
    before its schedulers start."""
    for name in DEADLINE_ENVS:
        os.environ.setdefault(name, str(max(1, min(math.ceil(deadline_s), SGLANG_PD_WAIT_S))))


class RoomDecision(enum.Enum):
    """A server's answer for a room; true only when the room is held."""

    ADMITTED = "admitted"
    FULL = "full"  # the server holds its limit of rooms
    ENDED = "ended"  # the room was already closed here (refused, or ended early by this server or its peer)

    def __bool__(self) -> bool:
        return self is RoomDecision.ADMITTED


@dataclass
class RoomTable:
    """The rooms a server holds (admitted, not ended) and the ones it closed (refused or ended; with the 4xx
    its own request was refused with, if it was), each remembered for `ttl_s` so a late question about the
    room gets the same answer. Thread-safe: P's bootstrap server answers in its own thread."""

    limit: int
    ttl_s: float
    held: dict[int, float] = field(default_factory=dict)
    closed: dict[int, float] = field(default_factory=dict)
    refusals: dict[int, tuple[int, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _purge(self, now: float) -> None:
        for table in (self.held, self.closed):
            for room in [r for r, expiry in table.items() if expiry <= now]:
                del table[room]
        for room in [r for r in self.refusals if r not in self.closed]:
            del self.refusals[room]

    def decide(self, room: int, now: float | None = None) -> RoomDecision:
        """ADMITTED if `room` is (or now becomes) held; a decision, once made, stands."""
        now = time.monotonic() if now is None else now
        with self.lock:
            self._purge(now)
            if room in self.closed:
                return RoomDecision.ENDED
            if room in self.held:
                return RoomDecision.ADMITTED
            if len(self.held) < self.limit:
                self.held[room] = now + self.ttl_s
                return RoomDecision.ADMITTED
            self.closed[room] = now + self.ttl_s
            return RoomDecision.FULL

    def release(self, room: int) -> None:
        """Forgets `room`, whose request ended normally: the same room again (a rebootstrap after D's
        retraction) is decided anew."""
        with self.lock:
            self.held.pop(room, None)

    def close(self, room: int, now: float | None = None, refusal: tuple[int, str] | None = None) -> bool:
        """Ends `room` (refused, ended early or finished; `refusal`: the 4xx its request was refused with);
        True if it was held."""
        now = time.monotonic() if now is None else now
        with self.lock:
            self.closed[room] = now + self.ttl_s
            if refusal is not None:  # the first refusal stands (P's own, before D's close that relays it)
                self.refusals.setdefault(room, refusal)
            return self.held.pop(room, None) is not None

    def refusal(self, room: int) -> tuple[int, str] | None:
        """The 4xx the closed `room`'s request was refused with, if it was."""
        with self.lock:
            return self.refusals.get(room) if room in self.closed else None

    def holding(self) -> int:
        with self.lock:
            self._purge(time.monotonic())
            return len(self.held)


@dataclass
class AdmissionGate:
    """One server's admission state, kept on its tokenizer manager (and on P's bootstrap server)."""

    limits: AdmissionLimits
    is_prefill: bool
    manager: Any
    rooms: RoomTable
    loop: asyncio.AbstractEventLoop | None = None
    recomputes: bool = False  # D computes a prefix P cannot send (--asym-transfer-fallback recompute)

    @classmethod
    def for_manager(cls, manager: Any, limits: AdmissionLimits, is_prefill: bool,
                    recomputes: bool = False) -> "AdmissionGate":
        return cls(limits, is_prefill, manager, RoomTable(limits.limit, limits.deadline_s + ABORT_GRACE_S),
                   recomputes=recomputes)

    def abort_room(self, room: int) -> None:
        """Aborts this server's copy of `room` if it is in flight (runs on the manager's event loop)."""
        for rid, state in list(self.manager.rid_to_state.items()):
            if getattr(state.obj, "bootstrap_room", None) == room and not state.finished:
                log.warning("room %s closed by the decode worker: aborting request %s", room, rid)
                self.manager.abort_request(rid)

    def close_from_peer(self, room: int, refusal: tuple[int, str] | None = None) -> None:
        """D refused (with the 4xx `refusal`, if so) or ended `room`: P's copy is refused on arrival or aborted
        now."""
        if self.rooms.close(room, refusal=refusal) and self.loop is not None:
            self.loop.call_soon_threadsafe(self.abort_room, room)


def exempt(obj: Any) -> bool:
    """SGLang's own health-check requests and batch requests are not gated."""
    from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST

    rid = obj.rid if isinstance(obj.rid, str) else ""
    return (rid.startswith(HEALTH_CHECK_RID_PREFIX) or obj.bootstrap_host == FAKE_BOOTSTRAP_HOST
            or not isinstance(obj.bootstrap_room, int))


def admission_url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{ADMISSION_PATH}"


async def ask_prefill(obj: Any, op: str, refusal: tuple[int, str] | None = None) -> dict | None:
    """P's answer for the request's room ({"admitted": bool, "refusal": {"status", "message"} when P refused the
    room's own request with a 4xx}), None when P is unreachable. A "close" carries D's 4xx `refusal` if any."""
    import aiohttp

    if obj.bootstrap_host is None or obj.bootstrap_port is None:
        return None
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as session:
            async with session.post(admission_url(obj.bootstrap_host, obj.bootstrap_port),
                                    json={"room": obj.bootstrap_room, "op": op,
                                          "refusal": refusal and {"status": refusal[0], "message": refusal[1]}}
                                    ) as resp:
                if resp.status != 200:
                    return None
                answer = await resp.json()
                return {"admitted": bool(answer["admitted"]), "refusal": answer.get("refusal")}
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, KeyError, ValueError) as exc:
        log.error("admission question to the prefill worker failed: %r", exc)
        return None


def close_on_prefill(obj: Any, refusal: tuple[int, str] | None = None) -> None:
    """Tells P, without waiting, that D refused (with the 4xx `refusal`, if so) or ended the room."""
    asyncio.get_running_loop().create_task(ask_prefill(obj, "close", refusal))


async def within_deadline(gen: AsyncIterator, manager: Any, obj: Any, deadline_s: float) -> AsyncIterator:
    """`gen`'s items until it ends; past `deadline_s`, the request is aborted in the scheduler (which frees
    its slots) and DeadlinePassed raised."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    step: asyncio.Future | None = None
    try:
        while True:
            step = asyncio.ensure_future(gen.__anext__())
            done, _ = await asyncio.wait({step}, timeout=max(0.0, end - loop.time()))
            if not done:
                rids = [obj.rid] if isinstance(obj.rid, str) else list(obj.rid or [])
                log.error("request %s passed its %g s deadline: aborted", rids, deadline_s)
                for rid in rids:
                    manager.abort_request(rid)
                await asyncio.wait({step}, timeout=ABORT_GRACE_S)  # the scheduler's abort reaches the state
                raise DeadlinePassed(f"sglang-asym: the request passed its deadline of {deadline_s:g} s "
                                     f"(--asym-request-deadline-s) and was aborted")
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield item
    finally:
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait({step})
        if step is not None and step.done() and not step.cancelled():
            step.exception()  # retrieved: the outcome the client gets is raised above
        await gen.aclose()


def gate_of(manager: Any) -> AdmissionGate | None:
    return getattr(manager, GATE_ATTR, None)


async def around_generate_request(original: Callable, manager: Any, obj: Any, *args: Any, **kwargs: Any):
    gate = gate_of(manager)
    if gate is None:
        async for item in original(manager, obj, *args, **kwargs):
            yield item
        return
    gate.loop = asyncio.get_running_loop()
    limits = gate.limits
    if exempt(obj):
        async for item in within_deadline(original(manager, obj, *args, **kwargs), manager, obj, limits.deadline_s):
            yield item
        return
    refusal = refusal_of(obj, getattr(getattr(manager, "model_config", None), "vocab_size", None))
    if refusal is not None:  # both sides refuse it alike: no room is decided for it on either
        answerable(obj)
        raise AsymAdmissionError(refusal)
    room = obj.bootstrap_room
    decision = gate.rooms.decide(room)
    if not decision:
        if not gate.is_prefill:
            close_on_prefill(obj)
        if decision is RoomDecision.ENDED and gate.rooms.refusal(room) is not None:
            status, words = gate.rooms.refusal(room)
            log.warning("refused room %s with the %d it was closed with", room, status)
            answerable(obj)
            raise ClosedRoomRefused(words, status)
        if decision is RoomDecision.ENDED:
            log.warning("refused room %s: it was already ended here or by the peer worker", room)
            raise Overloaded("sglang-asym: this request's room was already ended (refused or aborted by the "
                             "other worker of the pair); retry later", limits.retry_after_s)
        log.warning("refused room %s: %d requests held (limit %d)", room, gate.rooms.holding(), limits.limit)
        answerable(obj)
        raise Overloaded(f"sglang-asym: this server holds its limit of {limits.limit} requests "
                         f"(--max-running-requests + --max-queued-requests); retry later", limits.retry_after_s)
    ended, refused_with = False, None
    try:
        if not gate.is_prefill:
            answer = await ask_prefill(obj, "admit")
            if answer is None and gate.recomputes:
                log.warning("room %s: the prefill worker did not answer the admission question; admitted "
                            "for the recompute fallback", room)
            elif answer is None:
                raise PeerUnreachable("sglang-asym: the prefill worker did not answer the admission question",
                                      limits.retry_after_s)
            elif answer["refusal"]:  # P refused its copy first: what D would refuse too, in P's words
                raise PrefillRefused(str(answer["refusal"]["message"]), int(answer["refusal"]["status"]))
            elif not answer["admitted"]:
                raise Overloaded("sglang-asym: the prefill worker holds its limit of requests; retry later",
                                 limits.retry_after_s)
        async for item in within_deadline(original(manager, obj, *args, **kwargs), manager, obj, limits.deadline_s):
            # SGLang's non-streaming handler takes the final item and closes the generator at this yield
            ended = finished_normally(item)
            if refused_with is None:  # a stream's 4xx abort is an item, not a ValueError
                refused_with = refused_in(item)
            if gate.is_prefill and refused_with is None and aborted(item) and gate.rooms.refusal(room) is not None:
                # D closed the room with its 4xx while P's copy ran (close_from_peer aborted it): P answers with
                # D's refusal, not with its own abort (a router that answers with P's error, smg, says D's 4xx)
                status, words = gate.rooms.refusal(room)
                raise ClosedRoomRefused(words, status)
            yield item
    except ValueError as exc:
        # P: for D's question, if it comes after; D: for P's copy, if it comes after D's close
        refused_with = client_refusal(exc)
        answerable(obj)
        raise
    finally:
        if ended:
            gate.rooms.release(room)
        else:
            gate.rooms.close(room, refusal=refused_with)
            if not gate.is_prefill:  # D refused or ended the room early: P's copy must not wait for it
                close_on_prefill(obj, refused_with and (refused_with[0], DECODE_REFUSED_MESSAGE.format(
                    message=refused_with[1])))


def answerable(obj: Any) -> None:
    """A request the gate refuses before SGLang normalized it lacks `is_single`, which the abort task SGLang's
    HTTP front runs after a stream's response reads (an AttributeError 2 s after the answer, in D's ASGI app):
    set as normalizing would, from the rids the request carries."""
    if not hasattr(obj, "is_single"):
        obj.is_single = not isinstance(obj.rid, (list, tuple))


def _finish_reason(item: Any) -> Any:
    """The finish_reason of an output item of SGLang's generate_request (None while the request runs)."""
    return (item.get("meta_info") or {}).get("finish_reason") if isinstance(item, dict) else None


def aborted(item: Any) -> bool:
    """An output item of SGLang's generate_request that ends its request by an abort."""
    reason = _finish_reason(item)
    return isinstance(reason, dict) and reason.get("type") == "abort"


def finished_normally(item: Any) -> bool:
    """An output item of SGLang's generate_request that ends its request, other than by an abort."""
    return _finish_reason(item) is not None and not aborted(item)


def refused_in(item: Any) -> tuple[int, str] | None:
    """(status, words) of an output item that ends its request with a 4xx abort (how SGLang's scheduler refuses
    a request in a stream); None for any other item."""
    reason = _finish_reason(item)
    if not isinstance(reason, dict) or reason.get("type") != "abort":
        return None
    status = reason.get("status_code")
    return (int(status), str(reason.get("message", ""))) if isinstance(status, int) and 400 <= status < 500 else None


def after_create_error_response(response: Any, exc: Any) -> Any:
    if isinstance(exc, Overloaded):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


def after_bootstrap_routes(result: Any, server: Any) -> None:
    server.app.router.add_post(ADMISSION_PATH, lambda request: handle_admission(server, request))


async def handle_admission(server: Any, request: Any) -> Any:
    from aiohttp import web

    gate = getattr(server, GATE_ATTR, None)
    if gate is None:
        return web.json_response({"error": "not an asym-prefill server, or not started"}, status=503)
    body = await request.json()
    room = int(body["room"])
    if body.get("op") == "close":
        refusal = body.get("refusal")
        gate.close_from_peer(room, refusal and (int(refusal["status"]), str(refusal["message"])))
        return web.json_response({"admitted": False})
    admitted = bool(gate.rooms.decide(room))
    refusal = None if admitted else gate.rooms.refusal(room)
    return web.json_response({"admitted": admitted, "refusal": refusal and {"status": refusal[0],
                                                                           "message": refusal[1]}})


def after_manager_init(result: Any, manager: Any, server_args: Any, *args: Any, **kwargs: Any) -> None:
    from .settings import settings_of

    settings = settings_of(server_args)
    if settings is None:
        return
    limits = AdmissionLimits.of(resolved_pool_args(server_args), settings.request_deadline_s)
    gate = AdmissionGate.for_manager(manager, limits, settings.is_prefill,
                                     recomputes=settings.transfer_fallback == "recompute")
    log.info("admission: this %s worker holds at most %d requests (%d in its pool, %d queued), each for at "
             "most %g s", "prefill" if settings.is_prefill else "decode", limits.limit, limits.capacity,
             limits.queued, limits.deadline_s)
    setattr(manager, GATE_ATTR, gate)
    bootstrap = getattr(manager, "bootstrap_server", None)
    if settings.is_prefill and bootstrap is not None:
        setattr(bootstrap, GATE_ATTR, gate)


def launcher_hooks() -> tuple[tuple[str, Callable, str], ...]:
    """(target, hook, HookType name), applied in an asym server's launcher process."""
    return (
        (MANAGER_INIT, after_manager_init, "AFTER"),
        (BOOTSTRAP_ROUTES, after_bootstrap_routes, "AFTER"),
        (GENERATE_REQUEST, around_generate_request, "AROUND"),
        (ERROR_RESPONSE, after_create_error_response, "AFTER"),
    )


def register_admission() -> None:
    """Registers launcher_hooks() without applying them (the drain refusal applies them with its own
    hooks on the same generate_request, which SGLang's registry patches once). Idempotent."""
    register_missing(launcher_hooks())
