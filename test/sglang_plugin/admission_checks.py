"""The admission checks that import SGLang's tokenizer manager, HTTP front and PD code, run in a fresh process
with the CPU import stand-ins by test_admission.py. Prints `REPORT <names of the checks that passed>`.

    python test/sglang_plugin/admission_checks.py
"""

from __future__ import annotations

import asyncio
import inspect
import os
import types

from sglang_asym.sglang_plugin import cpu_import_gaps
from sglang_asym.sglang_plugin.startup import STARTUP_GAPS

cpu_import_gaps.install(STARTUP_GAPS)

from sglang.srt.plugins import load_plugins  # noqa: E402  (after the stand-ins)

from sglang_asym.sglang_plugin import admission, hooks, liveness  # noqa: E402
from sglang_asym.sglang_plugin.admission import AdmissionGate, AdmissionLimits, Overloaded  # noqa: E402
from sglang_asym.sglang_plugin.cli import translate  # noqa: E402
from sglang_asym.sglang_plugin.validation import AsymArgumentError  # noqa: E402


class RecordingManager:
    """Just what the gate touches on SGLang's TokenizerManager: rid_to_state and abort_request."""

    def __init__(self):
        self.rid_to_state = {}
        self.aborted = []

    def abort_request(self, rid):
        self.aborted.append(rid)


def prefill_refuses_beyond_its_limit():
    manager = RecordingManager()
    gate = AdmissionGate.for_manager(manager, AdmissionLimits(1, 0, 30), is_prefill=True)
    setattr(manager, admission.GATE_ATTR, gate)

    async def original(_manager, _obj, *args):
        yield {"text": "ok"}

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
        assert await one(1) == [{"text": "ok"}]  # room 1 was admitted before its copy arrived
        assert gate.rooms.holding() == 0 and not gate.rooms.decide(1)  # ended rooms stay closed

    asyncio.run(drive())


def retry_after_header():
    from sglang.srt.entrypoints.http_server import _create_error_response

    exc = Overloaded("full", 4)
    response = admission.after_create_error_response(_create_error_response(exc), exc)
    assert (response.status_code, response.headers["Retry-After"]) == (503, "4")
    other = ValueError("bad")
    assert "Retry-After" not in admission.after_create_error_response(_create_error_response(other), other).headers


def deadline_flag():
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    from sglang_asym.sglang_plugin.settings import settings_of

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
    for check in (prefill_refuses_beyond_its_limit, retry_after_header, deadline_flag, canaries):
        check()
        passed.append(check.__name__)
    print("REPORT " + " ".join(passed))
