"""Admission control, request deadlines and liveness health (sglang_plugin/admission.py, liveness.py): the room
table's decisions, the limits a server derives, the deadline's abort, the 429's Retry-After, the flag, and
canaries for the SGLang 0.5.23 symbols these hooks rely on."""

import asyncio
import inspect
import os
import types

import pytest

from sglang_asym.sglang_plugin import hooks
from sglang_asym.sglang_plugin.shared import admission, liveness
from sglang_asym.sglang_plugin.shared.admission import (AdmissionGate, AdmissionLimits, DeadlinePassed,
                                                        Overloaded, RoomDecision, RoomTable)

from .admission_stand_ins import RecordingManager
from .conftest import REPO, run_python


def test_room_table_decides_each_room_once_up_to_its_limit():
    table = RoomTable(limit=2, ttl_s=10)
    admitted, full, ended = RoomDecision.ADMITTED, RoomDecision.FULL, RoomDecision.ENDED
    assert [table.decide(room, now=0) for room in (1, 2, 3)] == [admitted, admitted, full]
    assert [bool(d) for d in (admitted, full, ended)] == [True, False, False]
    assert table.decide(1, now=1) is admitted and table.decide(3, now=1) is ended  # a decision stands
    assert table.close(1, now=2) is True and table.close(3, now=2) is False
    assert table.decide(1, now=3) is ended  # a closed room is refused to a late question
    assert table.decide(4, now=3) and not table.decide(5, now=3)  # 1's slot went to 4
    assert table.decide(5, now=20)  # every entry expired after ttl_s


def test_a_room_that_ended_normally_is_decided_anew():
    """D's retraction sends P the same room again (a rebootstrap): P's answer is taken again, not recalled."""
    table = RoomTable(limit=1, ttl_s=10)
    assert table.decide(1, now=0) and not table.decide(2, now=0)
    table.release(1)
    assert table.held == {}
    assert table.decide(1, now=1) and not table.decide(3, now=1)  # the rebootstrap holds the slot again
    table.release(1)
    assert not table.decide(2, now=2)  # a refusal still stands


def test_limits_follow_the_pool_capacity_and_max_queued_requests():
    args = types.SimpleNamespace(max_running_requests=8, max_queued_requests=None)
    assert AdmissionLimits.of(args, 120).limit == 16
    args.max_queued_requests = 3
    limits = AdmissionLimits.of(args, 2.5)
    assert (limits.capacity, limits.queued, limits.limit, limits.retry_after_s) == (8, 3, 11, 3)
    assert AdmissionLimits.of(types.SimpleNamespace(max_running_requests=None, max_queued_requests=0), 60).limit \
        == admission.FALLBACK_CAPACITY
    # D's pool also holds SGLang's extra slots for requests in transfer: the queue bound starts above them
    decode = types.SimpleNamespace(max_running_requests=2, max_queued_requests=None,
                                   disaggregation_decode_extra_slots=4)
    assert (AdmissionLimits.of(decode, 60).capacity, AdmissionLimits.of(decode, 60).limit) == (6, 12)
    decode.max_queued_requests = 2
    assert AdmissionLimits.of(decode, 60).limit == 8
    with pytest.raises(ValueError):
        AdmissionLimits(0, 1, 10)


def test_a_final_item_other_than_an_abort_ends_the_request_normally():
    assert admission.finished_normally({"meta_info": {"finish_reason": {"type": "length"}}})
    assert not admission.finished_normally({"meta_info": {"finish_reason": None}})
    assert not admission.finished_normally({"meta_info": {"finish_reason": {"type": "abort", "message": "x"}}})
    assert not admission.finished_normally({"text": "partial"})


def test_a_request_past_its_deadline_is_aborted_and_answered_with_503():
    manager = RecordingManager()
    obj = types.SimpleNamespace(rid="r1", bootstrap_room=7, bootstrap_host="127.0.0.1", bootstrap_port=1)
    closed = []

    async def never(_manager, _obj):
        try:
            await asyncio.sleep(3600)
            yield {}
        finally:
            closed.append(True)

    async def drive():
        async for _ in admission.within_deadline(never(manager, obj), manager, obj, 0.2):
            pass

    start = asyncio.run(_timed(drive))
    assert isinstance(start[1], DeadlinePassed) and start[1].status_code == 503
    assert manager.aborted == ["r1"] and closed == [True]
    assert 0.2 <= start[0] < 0.2 + admission.ABORT_GRACE_S + 1


async def _timed(fn):
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        await fn()
    except Exception as exc:  # the outcome under test
        return loop.time() - start, exc
    return loop.time() - start, None


def test_sglang_side_checks_in_a_fresh_process():
    """The checks that import SGLang's tokenizer manager, HTTP front and PD code (they need the CPU import
    stand-ins, so they run in their own process): admission_checks.py."""
    done = run_python([str(REPO / "test/sglang_plugin/admission_checks.py")], timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "REPORT " + " ".join(CHECKS), done.stdout[-2000:]


CHECKS = ("prefill_refuses_beyond_its_limit", "refused_requests_take_no_room",
          "unreachable_prefill_refuses_unless_decode_recomputes",
          "retry_after_header", "deadline_flag", "canaries", "limits_from_the_published_pool",
          "prefill_refusal_answers_the_decode_question")


@pytest.mark.parametrize("deadline_s, wait", [(40.0, "40"), (120.0, "120"), (900.0, "300"), (0.2, "1")])
def test_the_pd_waits_follow_the_deadline_up_to_sglangs_own_default(monkeypatch, deadline_s, wait):
    for name in admission.DEADLINE_ENVS:
        monkeypatch.delenv(name, raising=False)
    admission.environment_defaults(deadline_s)
    assert [os.environ[name] for name in admission.DEADLINE_ENVS] == [wait, wait]
    monkeypatch.setenv(admission.DEADLINE_ENVS[0], "7")  # an operator's own value is kept
    admission.environment_defaults(deadline_s)
    assert os.environ[admission.DEADLINE_ENVS[0]] == "7"
