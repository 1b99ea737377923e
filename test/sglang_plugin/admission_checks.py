"""The admission checks that import SGLang's tokenizer manager, HTTP front and PD code, run in a process of its own
with the CPU import stand-ins by test_admission.py. Prints `REPORT <names of the checks that passed>`.

    python test/sglang_plugin/admission_checks.py
"""

from __future__ import annotations

import asyncio
import inspect
import os
import types

from sglang_asym.sglang_plugin.cpu_platform import import_gaps as cpu_import_gaps
from sglang_asym.sglang_plugin.cpu_platform.startup import STARTUP_GAPS

cpu_import_gaps.install(STARTUP_GAPS)

from sglang.srt.plugins import load_plugins  # noqa: E402  (after the stand-ins)

from sglang_asym.sglang_plugin import hooks
from sglang_asym.sglang_plugin.shared import admission, liveness  # noqa: E402
from sglang_asym.sglang_plugin.shared.admission import AdmissionGate, AdmissionLimits, Overloaded  # noqa: E402
from sglang_asym.sglang_plugin.shared.cli import translate  # noqa: E402
from sglang_asym.sglang_plugin.shared.validation import AsymArgumentError  # noqa: E402
from admission_stand_ins import RecordingManager  # noqa: E402  (this script's folder)


def prefill_refuses_beyond_its_limit():
    manager = RecordingManager()
    gate = AdmissionGate.for_manager(manager, AdmissionLimits(1, 0, 30), is_prefill=True)
    setattr(manager, admission.GATE_ATTR, gate)

    async def original(_manager, _obj, *args):
        yield {"text": "ok", "meta_info": {"finish_reason": {"type": "length"}}}

    async def one(room):
        obj = types.SimpleNamespace(rid=f"r{room}", bootstrap_room=room, bootstrap_host="127.0.0.1",
                                    bootstrap_port=1)
        return [item async for item in admission.around_generate_request(original, manager, obj)]

    async def drive():
        assert gate.rooms.decide(1)  # held by the decode worker's question
        try:
            await one(2)
            raise AssertionError("room 2 was admitted beyond the limit")
        except Overloaded as refused:
            assert refused.status_code == 503 and refused.retry_after_s == 5
        assert len(await one(1)) == 1  # room 1 was admitted before its copy arrived
        assert gate.rooms.holding() == 0
        assert len(await one(1)) == 1  # a rebootstrap of the ended room is decided anew
        assert not gate.rooms.decide(2)  # a refused room stays refused
        # SGLang's non-streaming handler takes the final item and closes the generator: a normal end too
        obj = types.SimpleNamespace(rid="r3", bootstrap_room=3, bootstrap_host="127.0.0.1", bootstrap_port=1)
        gen = admission.around_generate_request(original, manager, obj)
        assert (await gen.__anext__())["meta_info"]["finish_reason"]["type"] == "length"
        await gen.aclose()
        assert gate.rooms.holding() == 0 and gate.rooms.decide(3)

    asyncio.run(drive())


def refused_requests_take_no_room():
    """A request both roles refuse (prompt logprobs, n > 1) is refused by the gate before it decides its room, on
    P and on D alike: P never closes a room D would then ask about (D's client would hear "the prefill
    worker holds its limit" instead of the refusal), and D never asks P."""
    from sglang_asym.sglang_plugin.shared.admission_check import (PARALLEL_SAMPLING_MESSAGE, PROMPT_LOGPROBS_MESSAGE,
                                                                   AsymAdmissionError)

    async def original(_manager, _obj, *args):
        raise AssertionError("a refused request reached SGLang's generate_request")
        yield

    async def one(is_prefill, **fields):
        manager = RecordingManager()
        gate = AdmissionGate.for_manager(manager, AdmissionLimits(1, 0, 30), is_prefill=is_prefill)
        setattr(manager, admission.GATE_ATTR, gate)
        obj = types.SimpleNamespace(rid="r", bootstrap_room=7, bootstrap_host="127.0.0.1", bootstrap_port=1,
                                    **fields)
        try:
            [item async for item in admission.around_generate_request(original, manager, obj)]
            raise AssertionError("admitted")
        except AsymAdmissionError as refused:
            assert refused.status_code == 400
            assert gate.rooms.holding() == 0 and gate.rooms.decide(7)  # the room was never decided
            assert obj.is_single is True  # read by the abort task SGLang's HTTP front runs after a stream
            return str(refused)

    for is_prefill in (True, False):
        assert asyncio.run(one(is_prefill, return_logprob=True, logprob_start_len=0)) == PROMPT_LOGPROBS_MESSAGE
        assert asyncio.run(one(is_prefill, sampling_params={"n": 2})) == PARALLEL_SAMPLING_MESSAGE.format(n=2)


def unreachable_prefill_refuses_unless_decode_recomputes():
    """D asks P's bootstrap server, where nothing listens: a 503 at once, or the request admitted when D
    computes what P cannot send (--asym-transfer-fallback recompute)."""
    import socket

    from sglang_asym.sglang_plugin.shared.admission import PeerUnreachable

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]

    async def original(_manager, _obj, *args):
        yield {"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}}

    async def one(recomputes):
        manager = RecordingManager()
        gate = AdmissionGate.for_manager(manager, AdmissionLimits(2, 0, 30), is_prefill=False, recomputes=recomputes)
        setattr(manager, admission.GATE_ATTR, gate)
        obj = types.SimpleNamespace(rid="r", bootstrap_room=9, bootstrap_host="127.0.0.1", bootstrap_port=free_port)
        try:
            return [item async for item in admission.around_generate_request(original, manager, obj)]
        except PeerUnreachable as refused:
            assert refused.status_code == 503
            return None
        finally:
            assert gate.rooms.holding() == 0

    assert [item["text"] for item in asyncio.run(one(recomputes=True))] == ["ok"]
    assert asyncio.run(one(recomputes=False)) is None


def prefill_refusal_answers_the_decode_question():
    """P's launcher refused its copy of a room with a 400 (SGLang's tokenizer manager: a prompt longer than the
    context length, which D refuses alike) before D asked about the room: P's bootstrap server answers D's
    question with that refusal, and D's client gets the same 400 in P's words, not the 503 that says P is full
    (which a room P closed for any other reason still reads as). A stream's refusal by P's scheduler (a prompt
    longer than P's max_req_input_len) ends in a 4xx abort item rather than a ValueError: recorded alike. The
    other way round, D's close of a room it refused carries its 4xx, and P's later copy is refused with it."""
    from aiohttp import web

    from sglang_asym.sglang_plugin.shared.admission import DECODE_REFUSED_MESSAGE, DeadlinePassed, PrefillRefused
    from sglang_asym.sglang_plugin.shared.relayed_refusal import REFUSED_MESSAGE

    words = "The input (16385 tokens) is longer than the model's context length (16384 tokens)."
    long_words = "Input length (2042 tokens) exceeds the maximum allowed length (2042 tokens)."

    def failing(exc):
        async def original(_manager, _obj, *args):
            raise exc
            yield
        return original

    async def served(_manager, _obj, *args):
        yield {"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}}

    async def scheduler_refused(_manager, _obj, *args):  # a stream P's scheduler refuses: the abort is an item
        yield {"text": "", "meta_info": {"finish_reason": {"type": "abort", "status_code": 400,
                                                             "message": long_words}}}

    async def run(gate, original, room, port):
        obj = types.SimpleNamespace(rid=f"r{room}", bootstrap_room=room, bootstrap_host="127.0.0.1",
                                    bootstrap_port=port)
        try:
            return [item["text"] async for item in admission.around_generate_request(original, gate.manager, obj)]
        except ValueError as exc:
            return (type(exc).__name__, getattr(exc, "status_code", None), str(exc))

    async def drive():
        prefill = AdmissionGate.for_manager(RecordingManager(), AdmissionLimits(4, 0, 30), is_prefill=True)
        decode = AdmissionGate.for_manager(RecordingManager(), AdmissionLimits(4, 0, 30), is_prefill=False)
        for gate in (prefill, decode):
            setattr(gate.manager, admission.GATE_ATTR, gate)
        bootstrap = types.SimpleNamespace(app=web.Application())  # P's bootstrap server, with its routes
        setattr(bootstrap, admission.GATE_ATTR, prefill)
        admission.after_bootstrap_routes(None, bootstrap)
        runner = web.AppRunner(bootstrap.app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            assert await run(prefill, failing(ValueError(words)), 11, port) == ("ValueError", None, words)
            assert await run(decode, served, 11, port) == ("PrefillRefused", 400, REFUSED_MESSAGE.format(message=words))
            assert await run(prefill, failing(DeadlinePassed("past its deadline")), 12, port) == \
                ("DeadlinePassed", 503, "past its deadline")
            assert (await run(decode, served, 12, port))[:2] == ("Overloaded", 503)
            assert await run(decode, served, 13, port) == ["ok"]  # D asked first: admitted
            assert await run(prefill, served, 13, port) == ["ok"]
            assert await run(prefill, scheduler_refused, 14, port) == [""]
            assert await run(decode, served, 14, port) == ("PrefillRefused", 400,
                                                           REFUSED_MESSAGE.format(message=long_words))
            # the other way round: D refuses its copy first (the same context length) and closes the room on P
            # with its 400; P's copy that comes after the close is refused with D's 400, not a 503
            assert await run(decode, failing(ValueError(words)), 15, port) == ("ValueError", None, words)
            for _ in range(250):  # D's close reaches P's bootstrap server in a task of its own
                if prefill.rooms.refusal(15) is not None:
                    break
                await asyncio.sleep(0.02)
            decode_words = DECODE_REFUSED_MESSAGE.format(message=words)
            assert await run(prefill, served, 15, port) == ("ClosedRoomRefused", 400, decode_words)
            # and when P's copy was in flight: D's close aborts it, and P answers with D's 400, not with its abort
            async def aborted_by_the_close(_manager, _obj, *args):
                prefill.close_from_peer(16, (400, decode_words))  # D's close arrives while P's copy runs
                yield {"text": "", "meta_info": {"finish_reason": {"type": "abort", "message": "Aborted by AbortReq."}}}

            assert await run(prefill, aborted_by_the_close, 16, port) == ("ClosedRoomRefused", 400, decode_words)
            assert prefill.rooms.holding() == decode.rooms.holding() == 0
            assert prefill.rooms.refusals == {11: (400, words), 14: (400, long_words), 15: (400, decode_words),
                                              16: (400, decode_words)}
        finally:
            await runner.cleanup()

    asyncio.run(drive())
    assert issubclass(PrefillRefused, ValueError)  # SGLang's HTTP front answers it with its status_code


def limits_from_the_published_pool():
    """D's limit counts the extra pool slots SGLang resolves for requests in transfer (published in the
    launcher before the tokenizer manager starts, not on the ServerArgs record)."""
    import tempfile

    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    from sglang_asym.config import V41Config

    ckpt = tempfile.mkdtemp()
    V41Config.sglang_small().write_json(ckpt)
    for mode, extra, expected in (("asym-decode", 4, (6, 8)), ("asym-prefill", 0, (2, 4))):
        args = prepare_server_args(["--model-path", ckpt, "--disaggregation-mode", mode, "--device", "cpu",
                                    "--max-running-requests", "2", "--max-queued-requests", "2",
                                    "--skip-server-warmup"])
        assert AdmissionLimits.of(admission.resolved_pool_args(args), 30).limit == 4  # not published yet
        publish(args, role="tokenizer")
        pool = admission.resolved_pool_args(args)
        assert pool.disaggregation_decode_extra_slots == extra, (mode, pool)
        limits = AdmissionLimits.of(pool, 30)
        assert (limits.capacity, limits.limit) == expected, (mode, limits)


def retry_after_header():
    from sglang.srt.entrypoints.http_server import _create_error_response

    exc = Overloaded("full", 4)
    response = admission.after_create_error_response(_create_error_response(exc), exc)
    assert (response.status_code, response.headers["Retry-After"]) == (503, "4")
    other = ValueError("bad")
    assert "Retry-After" not in admission.after_create_error_response(_create_error_response(other), other).headers


def deadline_flag():
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    from sglang_asym.sglang_plugin.shared.settings import settings_of

    assert [t for t, _, _ in hooks.hook_table()][0] == "sglang.srt.server_args.ServerArgs.add_cli_args"
    import tempfile

    from sglang_asym.config import V41Config

    for name in (*admission.DEADLINE_ENVS, liveness.HEALTH_GENERATION_ENV):
        os.environ.pop(name, None)
    ckpt = tempfile.mkdtemp()
    V41Config.sglang_small().write_json(ckpt)
    args = prepare_server_args(["--model-path", ckpt, "--disaggregation-mode", "asym-decode", "--device", "cpu",
                                "--asym-request-deadline-s", "30.5", "--skip-server-warmup"])
    assert isinstance(args, ServerArgs) and settings_of(args).request_deadline_s == 30.5
    assert [os.environ[name] for name in admission.DEADLINE_ENVS] == ["31", "31"]
    assert os.environ[liveness.HEALTH_GENERATION_ENV] == "false"
    try:
        prepare_server_args(["--model-path", ckpt, "--disaggregation-mode", "asym-decode",
                             "--asym-request-deadline-s", "0"])
        raise AssertionError("a deadline of 0 s was accepted")
    except SystemExit as exc:
        assert exc.code == 2
    try:
        translate(types.SimpleNamespace(disaggregation_mode="null", asym_window=None, asym_semantics=None,
                                        asym_token_budget=None, asym_window_chunk=None,
                                        asym_transfer_fallback=None, asym_request_deadline_s=5.0))
        raise AssertionError("--asym-request-deadline-s was accepted without an asym mode")
    except AsymArgumentError as exc:
        assert "--asym-request-deadline-s applies only with" in str(exc)


def canaries():
    from sglang.srt import constants, environ
    from sglang.srt.disaggregation import utils
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVBootstrapServer
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.tokenizer_manager import ReqState, TokenizerManager

    assert list(inspect.signature(TokenizerManager.__init__).parameters)[:3] == ["self", "server_args", "port_args"]
    assert list(inspect.signature(TokenizerManager.generate_request).parameters) == ["self", "obj", "request"]
    assert inspect.isasyncgenfunction(TokenizerManager.generate_request.__wrapped__
                                      if hasattr(TokenizerManager.generate_request, "__wrapped__")
                                      else TokenizerManager.generate_request)
    assert list(inspect.signature(TokenizerManager.abort_request).parameters) == ["self", "rid", "abort_all"]
    assert "self.bootstrap_server = (" in inspect.getsource(TokenizerManager)
    assert {"obj", "finished"} <= set(ReqState.__dataclass_fields__)
    assert "_setup_routes" not in MooncakeKVBootstrapServer.__dict__  # the common routes are Mooncake's
    assert "self.app.router" in inspect.getsource(CommonKVBootstrapServer._setup_routes)
    assert list(inspect.signature(http_server._create_error_response).parameters) == ["e"]
    assert "_create_error_response(e)" in inspect.getsource(http_server.serve_generate_request)
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" in inspect.getsource(http_server.health_generate)
    for name in (*admission.DEADLINE_ENVS, liveness.HEALTH_GENERATION_ENV):
        assert hasattr(environ.envs, name), name
    assert constants.HEALTH_CHECK_RID_PREFIX == "HEALTH_CHECK" and utils.FAKE_BOOTSTRAP_HOST == "2.2.2.2"


if __name__ == "__main__":
    load_plugins()
    passed = []
    for check in (prefill_refuses_beyond_its_limit, refused_requests_take_no_room,
                  unreachable_prefill_refuses_unless_decode_recomputes,
                  retry_after_header, deadline_flag, canaries, limits_from_the_published_pool,
                  prefill_refusal_answers_the_decode_question):
        check()
        passed.append(check.__name__)
    print("REPORT " + " ".join(passed))
