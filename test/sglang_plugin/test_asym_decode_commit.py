"""asym-decode's commit hook (asym_decode.around_commit_transfer_to_req) on SGLang's request fields: a fresh
request drops P's placeholder token and waits for its window [N - W, N); a request SGLang rebootstrapped
after a retraction (a V4 pool keeps no host copy, so P recomputes the prompt and the output tokens but the
last, and SGLang's commit replays that last token) keeps every output token and waits for the window of
the sequence P was given, whose sampled token is not kept. The destinations D sends P are those of the
same boundary. SGLang's own commit is the `commit` stand-in below (it appends what SGLang appends)."""

from types import SimpleNamespace

import pytest

from sglang_asym.sglang_plugin.decode import window_step as asym_decode
from sglang_asym.sglang_plugin.prefill.cut import prompt_len_of
from sglang_asym.sglang_plugin.shared.settings import AsymSettings
from sglang_asym.sglang_plugin.decode.window_batch import WindowChunk

SETTINGS = AsymSettings("asym-decode", window=128, token_budget=256, window_chunk=32)
N = 300


@pytest.fixture(autouse=True)
def _decode_settings(monkeypatch):
    monkeypatch.setattr(asym_decode, "_settings", lambda: SETTINGS)


def _req(output_ids: list[int], forced: int | None = None):
    return SimpleNamespace(rid="r", origin_input_ids=list(range(N)), output_ids=list(output_ids), return_logprob=False,
                           finished=lambda: False, to_finish=None, pd_rebootstrap_forced_output_id=forced)


def _commit(queue, decode_req):
    """What SGLang's commit does to output_ids: replays the kept token of a rebootstrap, else appends P's."""
    req = decode_req.req
    if decode_req.is_rebootstrap and req.pd_rebootstrap_forced_output_id is not None:
        req.output_ids.append(req.pd_rebootstrap_forced_output_id)
        req.pd_rebootstrap_forced_output_id = None
    else:
        req.output_ids.append(999)  # P's sampled placeholder
    return "committed"


QUEUE = SimpleNamespace(scheduler=SimpleNamespace(_sglang_asym_window_steps=7))


def test_a_fresh_request_drops_ps_placeholder_and_waits_for_its_window():
    decode_req = SimpleNamespace(req=_req([]), is_rebootstrap=False)
    assert asym_decode.around_commit_transfer_to_req(_commit, QUEUE, decode_req) == "committed"
    assert decode_req.req.output_ids == []
    assert asym_decode.window_of(decode_req.req) == asym_decode.WindowProgress(N - 128, N - 128, N, 7)
    assert prompt_len_of(decode_req.req) is None  # its floors are those of its prompt


def test_a_rebootstrapped_request_keeps_its_tokens_and_waits_for_the_window_of_what_p_was_given():
    # retracted after 3 tokens: SGLang kept the last one aside (forced), P was given N + 2 tokens
    decode_req = SimpleNamespace(req=_req([11, 12], forced=13), is_rebootstrap=True)
    asym_decode.around_commit_transfer_to_req(_commit, QUEUE, decode_req)
    req = decode_req.req
    assert req.output_ids == [11, 12, 13]
    progress = asym_decode.window_of(req)
    assert progress == asym_decode.WindowProgress(N + 2 - 128, N + 2 - 128, N + 2, 7, replayed_token=True)
    assert progress.rows_left == 128 and prompt_len_of(req) == N + 2
    WindowChunk(req, progress.next_row, progress.end)  # inside the request's tokens
    with pytest.raises(ValueError, match=r"\[174, 304\) is not inside its 303 tokens"):
        WindowChunk(req, progress.next_row, progress.end + 2)


def test_a_rebootstrap_with_no_kept_token_drops_ps_placeholder():
    decode_req = SimpleNamespace(req=_req([]), is_rebootstrap=True)  # retracted before its first token
    asym_decode.around_commit_transfer_to_req(_commit, QUEUE, decode_req)
    assert decode_req.req.output_ids == []
    assert asym_decode.window_of(decode_req.req).replayed_token is False


def test_a_fresh_request_with_other_than_one_token_at_commit_is_refused():
    decode_req = SimpleNamespace(req=_req([5]), is_rebootstrap=False)
    with pytest.raises(RuntimeError, match="expected P's one placeholder token at commit, found 2"):
        asym_decode.around_commit_transfer_to_req(_commit, QUEUE, decode_req)


def test_the_destinations_d_sends_are_those_of_the_same_boundary(monkeypatch):
    import sglang_asym.sglang_plugin.decode.destinations as destinations

    seen = []
    monkeypatch.setattr(destinations, "destinations_for_prefix",
                        lambda queue, req, boundary, state: seen.append(boundary) or ("kv", state))
    sent = []
    for outputs in ([], [11, 12]):  # fresh; rebootstrapped (the kept token already popped by SGLang)
        decode_req = SimpleNamespace(req=_req(outputs))
        asym_decode.around_send_kv_metadata(lambda q, d, kv, page, state, **kw: sent.append(kv), QUEUE, decode_req,
                                            "all", 1, None)
    assert seen == [N - 128, N + 2 - 128] and sent == ["kv", "kv"]
