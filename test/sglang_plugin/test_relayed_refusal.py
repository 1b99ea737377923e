"""relayed_refusal.py and prefill/refusal.py: P's refusal reaches D in words that carry P's status (on the recording
stand-in for SGLang's manager of test_room_lifecycle.py), and D's tokenizer manager answers the abort its decode
queue makes of them with that status and P's words, as a ValueError on a stream too (SGLang's own
_handle_abort_finish_reason, in a process of its own); a failure of P's own stays SGLang's 500."""

from __future__ import annotations

import json
from http import HTTPStatus

import pytest
from sglang.srt.disaggregation.base.conn import KVPoll

from sglang_asym.sglang_plugin.prefill.refusal import relay_refusal
from sglang_asym.sglang_plugin.shared.relayed_refusal import REFUSED_MESSAGE, relay_reason, relayed_refusal
from sglang_asym.sglang_plugin.shared.room_lifecycle import PREFILL_ABORT_WORDS

from .conftest import REPO, run_python
from .test_room_lifecycle import D, ROOM, Manager, handshake

TOO_LONG = ("Input length (3000 tokens) exceeds the maximum allowed length (2042 tokens). Use a shorter input or "
            "enable --allow-auto-truncate.")


def _manager() -> Manager:
    manager = Manager()
    manager.request_status = {}
    return manager


def test_a_refusal_after_ds_handshake_fails_the_room_at_once_in_words_with_ps_status():
    manager = _manager()
    handshake(manager)
    manager.request_status[ROOM] = KVPoll.WaitingForInput
    assert relay_refusal(manager, ROOM, TOO_LONG, HTTPStatus.BAD_REQUEST)
    reason = relay_reason(ROOM, 400, TOO_LONG)
    assert manager.sent == [([D], ROOM, KVPoll.Failed, reason)]  # one frame, not wrapped again in abort words
    assert reason == (f"sglang-asym: request of room {ROOM} refused and aborted on the prefill worker with HTTP 400: "
                      + TOO_LONG)
    assert PREFILL_ABORT_WORDS in reason  # D's recompute fallback leaves the room alone
    assert ROOM not in manager.transfer_infos and ROOM not in manager.request_status


def test_a_refusal_before_ds_handshake_answers_it_when_it_comes():
    manager = _manager()
    assert relay_refusal(manager, ROOM, TOO_LONG, HTTPStatus.BAD_REQUEST) and manager.sent == []
    handshake(manager)
    assert manager.statuses == [] and manager.sent == [([D], ROOM, KVPoll.Failed, relay_reason(ROOM, 400, TOO_LONG))]


def test_a_refusal_without_a_status_is_relayed_as_a_failure_of_ps():
    manager = _manager()
    relay_refusal(manager, ROOM, "Aborted", None)
    handshake(manager)
    [(_, _, _, reason)] = manager.sent
    assert reason == relay_reason(ROOM, 500, "Aborted") and relayed_refusal(reason) is None


@pytest.mark.parametrize("status", [400, 404, 413, 422, 429])
def test_a_relayed_4xx_is_read_back_from_ds_abort_message(status):
    text = "Decode transfer failed for request ... with exception KVTransferError(bootstrap_room=3): " + \
           relay_reason(3, status, "why: (x)\nsecond line")
    assert relayed_refusal(text) == (HTTPStatus(status), REFUSED_MESSAGE.format(message="why: (x)\nsecond line"))


def test_a_relayed_503_is_read_back_as_a_failure_of_ps_that_it_lives_through():
    text = "Decode handshake failed ... with exception KVTransferError(bootstrap_room=3): " + \
           relay_reason(3, 503, "ran out of memory")
    assert relayed_refusal(text) == (HTTPStatus.SERVICE_UNAVAILABLE,
                                     "sglang-asym: the prefill worker could not serve the request: ran out of memory")


@pytest.mark.parametrize("text", [
    relay_reason(3, 500, "P failed"), relay_reason(3, 502, "P busy"), relay_reason(3, 499, "no such status"),
    f"sglang-asym: request of room 3 {PREFILL_ABORT_WORDS}",
    "Decode handshake failed for request rank=0 with exception KVTransferError(bootstrap_room=3): Prefill "
    "bootstrap failed",
    "", "Aborted"])
def test_anything_else_is_not_a_relayed_refusal(text):
    assert relayed_refusal(text) is None


def test_ds_tokenizer_manager_answers_a_relayed_refusal_with_ps_status():
    done = run_python([str(REPO / "test/sglang_plugin/sglang_cpu_checks.py"), "relayed_refusal"], timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert done.returncode == 0 and len(lines) == 1, done.stderr[-3000:]
    report = json.loads(lines[0].removeprefix("REPORT "))
    refused = REFUSED_MESSAGE.format(message=TOO_LONG)
    # raised as SGLang raises a 400 abort, on a stream too (as D's own refusals before the first item): SGLang's
    # HTTP front answers with its status_code, a /generate stream with an error event of that code; the
    # request's state is gone either way
    for answer in report["refused"].values():
        assert (answer["raised"], answer["status"], answer["message"], answer["in_flight"]) == \
            ("RelayedRefusal", 400, refused, [])
    plain = report["refused"]["plain"]
    assert plain["d_message"].startswith("Decode handshake failed for request rank=0")
    for name in ("failed", "aborted"):  # a failure of P's own: SGLang's 500 and D's words, untouched
        plain, stream = report[name]["plain"], report[name]["stream"]
        assert (plain["raised"], plain["status"], plain["message"], plain["in_flight"]) == \
            ("HTTPException", 500, plain["d_message"], [])
        assert (stream["raised"], stream["status"], stream["message"]) == (None, 500, stream["d_message"])


def test_an_openai_answer_of_ps_relayed_503_keeps_its_status_and_others_stay_sglangs():
    from sglang_asym.sglang_plugin.shared.relayed_refusal import FAILED_MESSAGE, around_openai_error_response

    def original(serving, message, err_type="BadRequestError", status_code=400, param=None):
        return (message, err_type, status_code, param)

    failed = FAILED_MESSAGE.format(message="ran out of memory")
    assert around_openai_error_response(original, None, failed) == (failed, "ServiceUnavailableError", 503, None)
    refused = REFUSED_MESSAGE.format(message=TOO_LONG)
    assert around_openai_error_response(original, None, refused) == (refused, "BadRequestError", 400, None)
    assert around_openai_error_response(original, None, "x", "NotFoundError", 404, param="model") == (
        "x", "NotFoundError", 404, "model")
