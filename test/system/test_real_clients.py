"""What real clients send to the mission's pair (`python -m sglang.launch_server --device cpu
--disaggregation-mode asym-prefill / asym-decode`, on the nine-layer tiny checkpoint: the clients' path is the
subject, not the 40-layer schedule) behind sglang-router: the deterministic stack's pair (system/conftest.py),
shared with the deterministic and DSpark modules:
- the `openai` client: models, completions (greedy tokens equal /generate's), chat, streaming with usage,
  stop strings; output logprobs (completions' `logprobs`, chat's `logprobs` / `top_logprobs`): one per output
  token, the greedy token's the highest of its top entries, the first one computed by D's window step;
- batch requests (`/generate` with a list of `input_ids`, a completion with a list of prompts; sglang-router
  refuses `/generate` with a list of `text` with a 422 before any worker sees it):
  sglang-router gives each item its own bootstrap room (SGLang numbers a single room room + i per item on
  both roles alike), so P and D pair every item up: each item's greedy tokens equal the same prompt's alone
  (the pair runs with --enable-deterministic-inference: otherwise items decoding in one forward round
  otherwise than one request alone, and their greedy tokens can part after a few steps);
- constrained decoding (`regex`; SGLang's json_schema / ebnf take the same grammar path) is served: the greedy
  tokens equal the in-process reference's under the same grammar mask, the first one from D's window step;
- SGLang's own bench_serving (random dataset) through the router: every request completes;
- one case per class of refusal or failure, each ended on both roles at once (the classes again behind smg):
  what both roles refuse alike before any bootstrap (admission_check.py: prompt logprobs, n > 1, sampling
  parameters SGLang's SamplingParams.verify rejects; SGLang's own tokenizer manager: a prompt longer than the
  context length), a prompt only P refuses (longer than P's scheduler takes: P's pool is the smaller; P relays its 400 to D,
  prefill/refusal.py, and D answers with it, shared/relayed_refusal.py), and a stream its client closes
  mid-way. Each is answered within 2 s with a 4xx (a refused /generate stream: an error event with the same
  code; the closed stream: both roles end it within ABORT_S), both pools back to empty, neither worker unhealthy,
  and the next request served;
- P's prefix forward running out of memory (its scheduler's address space capped just above what it maps):
  a 503 that says so on both roles at once, P's scheduler serves on.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import resource
import time
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest

from sglang_asym.sglang_plugin.shared.settings import DEFAULT_SEMANTICS
from harness.bench_serving_client import RandomLoad, requested_lengths, run_bench_serving, unserved
from harness.router_launch import RouterFlavor
from harness.server_process import post, post_stream

from .sglang_servers import (ONE_CHUNK, STACK_P_POOL_TOKENS, asym_reference, greedy, patient_router, prompt_of,
                             reference_model, restore, server_info, settle, used_tokens)

pytestmark = pytest.mark.timeout(1800)

WINDOW = 128
REFUSAL_S = 2.0
STATS_STEPS = 40  # SGLang's decode scheduler publishes its stats (the used-token gauge) every 40 steps
ABORT_S = 5.0  # a stream its client closed is ended on both roles, and both pools are empty again, within this
MODEL = "v41-small"
# no match of it ends within a case's 8 tokens, so the grammar never asks for the end of the sequence
CONSTRAINT = "(ab|cd){50}"
# text_of(words) is about 3.8 tokens a word: beyond the context length (8192), and between P's and D's prompt limits
LONGER_THAN_CONTEXT_WORDS = 5000
BEYOND_PREFILL_WORDS = 1000


def text_of(words: int) -> str:
    """A text prompt (the routers take OpenAI prompts as text only)."""
    return " ".join(f"word{i % 97}" for i in range(words))


@pytest.fixture(scope="module")
def _gauges_published(deterministic_stack) -> None:
    """SGLang publishes a fresh worker's used-token gauge with its first stats (D: every 40 decode steps)."""
    greedy(deterministic_stack["router"].url, prompt_of(150), new_tokens=48, ignore_eos=True)


@pytest.fixture
def pair(deterministic_stack, sglang_tiny_checkpoint, _gauges_published):
    """The deterministic stack's pair behind its sglang-router (system/conftest.py): deterministic, so that a
    batch's items, which decode in one forward, equal the same prompts sent alone; P's pool the smaller. Read
    from the stack for each case: a stack restored after a broken case holds new server processes."""
    stack = deterministic_stack
    return {"prefill": stack["prefill"], "decode": stack["decode"], "router": stack["router"],
            "checkpoint": sglang_tiny_checkpoint}


@pytest.fixture(autouse=True)
def _shared_servers_back_to_empty(deterministic_stack):
    """After each case: the shared servers healthy with empty pools, or restarted and the case failed."""
    yield
    restore(deterministic_stack)


@pytest.fixture
def client(pair):
    """The openai client on the router; every case starts and ends with both pools empty."""
    workers = [pair["prefill"], pair["decode"]]
    assert settle(workers) == [0, 0]
    yield openai.OpenAI(base_url=pair["router"].url + "/v1", api_key="none", max_retries=0, timeout=300)
    assert settle(workers, timeout_s=30) == [0, 0]


def _healthy(pair) -> bool:
    return all(urllib.request.urlopen(pair[role].url + "/health", timeout=30).status == 200
               for role in ("prefill", "decode"))


def _serves_next(pair) -> None:
    assert len(greedy(pair["router"].url, prompt_of(200))) == 8


def test_openai_models_completions_and_chat(pair, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    prompt = text_of(150)
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.usage.prompt_tokens > WINDOW and done.usage.completion_tokens == 8
    assert done.choices[0].finish_reason == "length"
    status, generated = post(pair["router"].url + "/generate", {
        "text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}})
    assert status == 200 and len(generated["output_ids"]) == 8
    assert generated["meta_info"]["prompt_tokens"] == done.usage.prompt_tokens
    assert done.choices[0].text == generated["text"]
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "tell me " * 80}],
                                          max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 6 and chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.role == "assistant"


def test_openai_streaming_with_usage_and_stop_strings(pair, client):
    prompt = text_of(200)
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens > WINDOW
    stop = full[len(full) // 2:len(full) // 2 + 2]
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == full[:full.index(stop)]


def _recovers(pair, bound_s: float) -> None:
    """Both pools empty within `bound_s`, both workers healthy, the next request served."""
    assert settle([pair["prefill"], pair["decode"]], timeout_s=bound_s) == [0, 0]
    assert _healthy(pair)
    _serves_next(pair)


def _refused_at_once(pair, call) -> Exception:
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        call()
    took = time.monotonic() - start
    assert 400 <= refused.value.status_code < 500, refused.value
    assert took < REFUSAL_S, (took, refused.value)
    _recovers(pair, REFUSAL_S)
    return refused.value


def _generate_refused_at_once(pair, body: dict, status: int | None = None, route: str = "/generate") -> str:
    """`route` (/generate) through the router answers `body` with a 4xx (`status` when given) within REFUSAL_S;
    returns the error text."""
    start = time.monotonic()
    answered, answer = post(pair["router"].url + route, body, timeout_s=60)
    took = time.monotonic() - start
    assert 400 <= answered < 500 and answered == (status or answered) and took < REFUSAL_S, (answered, took, answer)
    _recovers(pair, REFUSAL_S)
    return json.dumps(answer)


def _stream_refused_at_once(pair, route: str, body: dict) -> list[dict]:
    """A stream through the router (`route`) that ends within REFUSAL_S; returns its events."""
    start = time.monotonic()
    events = post_stream(pair["router"].url + route, {**body, "stream": True}, timeout_s=60)
    took = time.monotonic() - start
    assert took < REFUSAL_S, (took, events)
    _recovers(pair, REFUSAL_S)
    return events


def test_openai_output_logprobs_one_per_greedy_token(pair, client):
    prompt = text_of(300)  # N > W: the first token comes from D's window step
    sampling = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    status, plain = post(pair["router"].url + "/generate", {"text": prompt, "sampling_params": sampling})
    assert status == 200 and len(plain["output_ids"]) == 6
    status, generated = post(pair["router"].url + "/generate", {
        "text": prompt, "sampling_params": sampling, "return_logprob": True, "top_logprobs_num": 2})
    assert status == 200 and generated["output_ids"] == plain["output_ids"]
    entries, tops = generated["meta_info"]["output_token_logprobs"], generated["meta_info"]["output_top_logprobs"]
    assert [token for _, token, _ in entries] == plain["output_ids"] and len(tops) == 6
    for (logprob, token, _), top in zip(entries, tops):
        assert len(top) == 2 and logprob <= 0.0
        assert top[0][:2] == [logprob, token] and top[1][0] <= logprob  # greedy: the token is its top entry

    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                     extra_body={"ignore_eos": True})
    choice = done.choices[0]
    assert done.usage.completion_tokens == 6 and choice.text == plain["text"]
    logprobs = choice.logprobs
    assert logprobs.token_logprobs == [logprob for logprob, _, _ in entries]
    assert len(logprobs.tokens) == len(logprobs.top_logprobs) == 6 and "".join(logprobs.tokens) == plain["text"]
    for logprob, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        # keyed by token text: two top tokens of the same text (the small tokenizer's '') share one key
        assert 1 <= len(top) <= 2 and max(top.values()) <= logprob
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=2, stream=True,
        extra_body={"ignore_eos": True}) if c.choices and c.choices[0].logprobs is not None]
    # equal up to the double's last bit: SGLang's streamed and whole answers can part there (measured on the tiny
    # checkpoint: -3.7149105072021484 streamed, -3.714910507202149 whole)
    assert [value for chunk in streamed for value in chunk.token_logprobs] == pytest.approx(
        logprobs.token_logprobs, rel=1e-12, abs=0)

    messages = [{"role": "user", "content": "tell me " * 80}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                           extra_body={"ignore_eos": True}).choices[0].message.content
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert chat.usage.completion_tokens == 5 and chat.choices[0].message.content == plain
    assert len(content) == 5 and "".join(entry.token for entry in content) == plain
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.logprob <= 0.0
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == entry.logprob
        assert entry.top_logprobs[1].logprob <= entry.logprob


def test_prompt_logprobs_are_refused_by_both_roles_at_once(pair, client):
    refused = _refused_at_once(pair, lambda: client.completions.create(
        model=MODEL, prompt=text_of(300), max_tokens=4, temperature=0, logprobs=2, echo=True))
    assert "prompt logprobs (logprob_start_len >= 0, or an OpenAI completion with echo and logprobs)" in str(refused)


def test_parallel_sampling_is_refused_by_both_roles_at_once(pair, client):
    refused = _refused_at_once(pair, lambda: client.completions.create(
        model=MODEL, prompt=text_of(300), max_tokens=4, temperature=0.7, n=2, seed=5))
    assert "parallel sampling (n = 2)" in str(refused)


def test_batch_requests_pair_up_each_item(pair, client):
    url = pair["router"].url + "/generate"
    sampling = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    prompts = [prompt_of(300), prompt_of(90)]  # N > W (P sends a prefix) and N <= W (P sends nothing)
    status, batch = post(url, {"input_ids": prompts, "sampling_params": sampling})
    assert status == 200 and [item["output_ids"] for item in batch] == [greedy(pair["router"].url, p, 6, True)
                                                                         for p in prompts]
    texts = [text_of(300), text_of(40)]
    alone = [post(url, {"text": text, "sampling_params": sampling})[1]["text"] for text in texts]
    done = client.completions.create(model=MODEL, prompt=texts, max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(done.choices, key=lambda c: c.index)] == alone
    assert done.usage.completion_tokens == 12


def test_a_list_of_texts_to_generate_is_refused_by_the_router(pair, client):
    """sglang-router's /generate takes `text` as one string: a list is refused before any worker sees it."""
    start = time.monotonic()
    status, answer = post(pair["router"].url + "/generate", {
        "text": [text_of(300), text_of(40)], "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert status == 422 and time.monotonic() - start < REFUSAL_S, (status, answer)
    _recovers(pair, REFUSAL_S)


def constrained_reference(checkpoint, prompt: list[int], regex: str, count: int) -> list[int]:
    """The pair's greedy tokens under `regex` by the in-process reference: each token the argmax of its logits
    masked by xgrammar's bitmask for the regex (SGLang's default grammar backend, built as SGLang builds it)."""
    import xgrammar
    from transformers import AutoTokenizer

    model = reference_model(checkpoint, "release")
    vocab = model.cfg.vocab_size
    info = xgrammar.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(checkpoint), vocab_size=vocab)
    matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_regex(regex))
    mask = xgrammar.allocate_token_bitmask(1, vocab)

    def pick(logits):
        row = logits.reshape(1, -1).float().clone()
        matcher.fill_next_token_bitmask(mask)
        xgrammar.apply_token_bitmask_inplace(row, mask)
        token = int(row.argmax())
        assert matcher.accept_token(token)
        return token

    return asym_reference(model, prompt, ONE_CHUNK, DEFAULT_SEMANTICS, count, pick=pick)


def test_constrained_decoding_equals_the_reference_under_the_same_grammar(pair, client):
    prompt = prompt_of(150)  # N > W: D's window step samples the first token, under the grammar's mask
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    status, plain = post(pair["router"].url + "/generate", body)
    assert status == 200 and not re.fullmatch(r"(ab|cd)*[ac]?", plain["text"]), plain["text"]
    body["sampling_params"]["regex"] = CONSTRAINT
    status, constrained = post(pair["router"].url + "/generate", body)
    assert status == 200, constrained
    assert constrained["output_ids"] == constrained_reference(pair["checkpoint"], prompt, CONSTRAINT, 8)
    assert re.fullmatch(r"(ab|cd)*[ac]?", constrained["text"]) and len(constrained["output_ids"]) == 8


@pytest.mark.parametrize("sampling", [{"temperature": -1}, {"top_p": 2}], ids=["temperature", "top_p"])
def test_invalid_sampling_parameters_are_refused_by_both_roles_at_once(pair, client, sampling):
    refused = _generate_refused_at_once(pair, {"input_ids": prompt_of(300),
                                               "sampling_params": {"max_new_tokens": 4, **sampling}})
    assert next(iter(sampling)) in refused


def _context_length(pair) -> int:
    """The model's context length, as both workers state it (SGLang's /v1/models)."""
    lengths = []
    for role in ("prefill", "decode"):
        with urllib.request.urlopen(pair[role].url + "/v1/models", timeout=30) as resp:
            lengths.append(json.loads(resp.read())["data"][0]["max_model_len"])
    assert lengths[0] == lengths[1], lengths
    return lengths[0]


def test_a_prompt_longer_than_the_context_is_refused_by_both_roles_at_once(pair, client):
    """SGLang's tokenizer manager refuses it on each role alike (the same model, the same context length) before
    any bootstrap."""
    context = _context_length(pair)
    words = f"The input ({context + 1} tokens) is longer than the model's context length ({context} tokens)"
    refused = _generate_refused_at_once(pair, {"input_ids": prompt_of(context + 1),
                                               "sampling_params": {"max_new_tokens": 4, "temperature": 0}}, 400)
    assert words in refused
    events = _stream_refused_at_once(pair, "/generate", {"input_ids": prompt_of(context + 1),
                                                         "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    assert [(e["error"]["code"], words in e["error"]["message"]) for e in events] == [(400, True)]
    prompt = text_of(LONGER_THAN_CONTEXT_WORDS)
    refused = _refused_at_once(pair, lambda: client.completions.create(model=MODEL, prompt=prompt, max_tokens=4))
    assert refused.status_code == 400 and f"longer than the model's context length ({context} tokens)" in str(refused)


def test_a_prompt_longer_than_the_prefill_worker_takes_is_refused_with_its_400(pair, client):
    """SGLang's scheduler takes prompts shorter than its max_req_input_len, bounded by the server's own pool:
    P's (STACK_P_POOL_TOKENS) is the smaller, so P refuses at its door a prompt D would take, with a 400. D hears
    it from P (prefill/refusal.py) and answers the client with P's 400 and words (shared/relayed_refusal.py), not a failed
    handshake's 500; a /generate stream, an error event with code 400; an OpenAI stream, a 400 before any chunk
    (as SGLang answers the refusals D makes itself)."""
    from transformers import AutoTokenizer

    p_limit, d_limit = (server_info(pair[role])["max_req_input_len"] for role in ("prefill", "decode"))
    assert p_limit < STACK_P_POOL_TOKENS < d_limit, (p_limit, d_limit)
    words = f"Input length ({p_limit} tokens) exceeds the maximum allowed length ({p_limit} tokens)"
    body = {"input_ids": prompt_of(p_limit), "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    refused = _generate_refused_at_once(pair, body, 400)
    assert "sglang-asym: the prefill worker refused the request: " + words in refused
    events = _stream_refused_at_once(pair, "/generate", body)
    assert [(e["error"]["code"], words in e["error"]["message"]) for e in events] == [(400, True)], events

    prompt = text_of(BEYOND_PREFILL_WORDS)
    tokens = len(AutoTokenizer.from_pretrained(pair["checkpoint"])(prompt)["input_ids"])
    assert p_limit <= tokens < d_limit, (tokens, p_limit, d_limit)
    refused = _refused_at_once(pair, lambda: client.completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                                                        temperature=0))
    assert refused.status_code == 400 and f"exceeds the maximum allowed length ({p_limit} tokens)" in str(refused)
    refused = _generate_refused_at_once(pair, {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                                               "stream": True}, 400, "/v1/completions")
    assert f"exceeds the maximum allowed length ({p_limit} tokens)" in refused


def test_stream_closed_by_its_client_ends_on_both_roles(pair, client):
    router = urllib.parse.urlsplit(pair["router"].url)
    conn = http.client.HTTPConnection(router.hostname, router.port, timeout=120)
    conn.request("POST", "/generate", json.dumps({
        "input_ids": prompt_of(300), "stream": True,
        "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}),
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    events = 0
    while events < STATS_STEPS + 5:  # D published its used tokens (every 40 decode steps) while it held them
        events += resp.readline().startswith(b"data:")
    assert used_tokens(pair["decode"]) > 0
    conn.sock.shutdown(2)  # the client goes away mid-stream, long before its 400 tokens
    conn.close()
    _recovers(pair, ABORT_S)


OUT_OF_MEMORY_WORDS = 380  # a text prompt of about 1440 tokens: P computes about 1310, within its pool
OUT_OF_MEMORY_HEADROOM_MB = 16  # address space P's scheduler may map beyond what it maps now, during the case


def _scheduler_pid(server) -> int:
    """P's scheduler process: the launcher's child holding the model (the largest resident set)."""
    children = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
                and _field(int(entry.name), "PPid") == server.proc.pid]
    return max(children, key=lambda pid: _field(pid, "VmRSS") or 0)


def _field(pid: int, name: str) -> int | None:
    """A number field of /proc/PID/status (kB for sizes), None when the process or the field is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith(name + ":")), None)


@contextlib.contextmanager
def address_space_capped(pid: int, headroom_mb: int):
    """For the block, process `pid` may map at most `headroom_mb` more than it maps now (RLIMIT_AS, the
    kernel's own limit: an allocation beyond it fails as it does when memory runs out); then no limit."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    resource.prlimit(pid, resource.RLIMIT_AS, (_field(pid, "VmSize") * 1024 + headroom_mb * 2**20, hard))
    try:
        yield
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))


def _out_of_memory_on_p(pair, client: openai.OpenAI | None = None) -> tuple[int, str, float, Exception | None]:
    """A prompt is served through pair["router"] once; then P's scheduler may map only a little more memory than
    it maps now, and the same prompt's prefix forward needs more: torch's allocator fails in P's forward ("can't
    allocate memory"; the first run made oneDNN's primitives for these shapes, so the failure is not inside
    oneDNN, which does not recover from one). Returns the capped /generate's status, its answer, its seconds,
    and what `client` (when given) got for the same text as a completion; checks the recovery: both pools empty
    within REFUSAL_S, both workers healthy, the next request served, the same prompt's tokens as before."""
    scheduler = _scheduler_pid(pair["prefill"])
    body = {"text": text_of(OUT_OF_MEMORY_WORDS), "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    status, served = post(pair["router"].url + "/generate", body, timeout_s=300)
    assert status == 200 and len(served["output_ids"]) == 4, served
    completion = None
    with address_space_capped(scheduler, OUT_OF_MEMORY_HEADROOM_MB):
        start = time.monotonic()
        answered, answer = post(pair["router"].url + "/generate", body, timeout_s=120)
        took = time.monotonic() - start
        if client is not None:
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(model=MODEL, prompt=body["text"], max_tokens=4, temperature=0)
            completion = refused.value
    assert _field(scheduler, "VmRSS") is not None  # the same scheduler process serves on
    _recovers(pair, REFUSAL_S)
    status, again = post(pair["router"].url + "/generate", body, timeout_s=300)
    assert status == 200 and again["output_ids"] == served["output_ids"], again
    return answered, json.dumps(answer), took, completion


def test_a_prefill_forward_out_of_memory_ends_the_request_on_both_roles_and_p_serves_on(pair, client):
    """P ends the request whose forward ran out of memory with a 503 that says so and lives on
    (prefill/out_of_memory.py); D hears it through the room (the Failed frame carries P's status and words) and
    answers the client with them, as a /generate and as an OpenAI completion (_out_of_memory_on_p)."""
    answered, answer, took, completion = _out_of_memory_on_p(pair, client)
    assert answered == 503 and "the prefill worker could not serve the request" in answer, (answered, took, answer)
    assert "ran out of memory computing this prompt's prefix" in answer and "can't allocate memory" in answer
    # P's forward up to its failing allocation (1.2 s on an idle 2-core machine), then the answer at once on both
    # roles (D's waiting timeout would be 300 s)
    assert took < 3 * REFUSAL_S, took
    assert completion.status_code == 503 and "ran out of memory" in str(completion), completion
    log = pair["prefill"].log.read_text(errors="replace")
    assert log.count("ran out of memory (") == 2 and "the worker serves on" in log


def test_sglang_bench_serving_random_dataset_all_succeed(pair, client):
    load = RandomLoad(num_prompts=3, input_len=300, output_len=4, range_ratio=0.5, max_concurrency=1)
    record = run_bench_serving(pair["router"].url, pair["checkpoint"], load, timeout_s=600)
    assert record["completed"] == 3 and unserved(record, load) == [], record
    assert record["total_output_tokens"] == sum(requested_lengths(load)[1])
    assert record["mean_ttft_ms"] > 0 and record["p99_itl_ms"] >= record["median_itl_ms"] >= 0


def test_the_refusal_classes_end_at_once_behind_smg(pair):
    """The same classes through smg in front of the same pair (smg routes by the served model's name): refused by
    both roles alike before any bootstrap (invalid sampling parameters, prompt logprobs, n > 1, a prompt longer
    than the context), refused by P alone (longer than P takes: smg answers with P's 400 or D's relay of it,
    whichever comes first, and D, told by P, frees its slot), and P's forward out of memory (a 503 once P's forward failed). Each refusal answered
    with its 4xx within REFUSAL_S, both pools empty again, both workers healthy, the next request served through
    smg."""
    context = _context_length(pair)
    p_limit = server_info(pair["prefill"])["max_req_input_len"]
    with patient_router(pair["prefill"], pair["decode"], RouterFlavor.SMG) as smg:
        behind_smg = {**pair, "router": smg}
        client = openai.OpenAI(base_url=smg.url + "/v1", api_key="none", max_retries=0, timeout=300)
        refused = _generate_refused_at_once(behind_smg, {"input_ids": prompt_of(300),
                                                         "sampling_params": {"max_new_tokens": 4, "top_p": 2}})
        assert "top_p" in refused
        refused = _refused_at_once(behind_smg, lambda: client.completions.create(
            model=MODEL, prompt=text_of(300), max_tokens=4, temperature=0, logprobs=2, echo=True))
        assert "prompt logprobs" in str(refused)
        refused = _refused_at_once(behind_smg, lambda: client.completions.create(
            model=MODEL, prompt=text_of(300), max_tokens=4, temperature=0.7, n=2, seed=5))
        assert "parallel sampling (n = 2)" in str(refused)
        refused = _generate_refused_at_once(behind_smg, {"input_ids": prompt_of(context + 1),
                                                         "sampling_params": {"max_new_tokens": 4}}, 400)
        assert f"longer than the model's context length ({context} tokens)" in refused
        refused = _generate_refused_at_once(behind_smg, {"input_ids": prompt_of(p_limit),
                                                         "sampling_params": {"max_new_tokens": 4}}, 400)
        # smg answers with whichever worker's error comes first: P's 400 itself, or D's relay of it (sglang-router
        # always answers with D's); the same 400 and P's words either way, and D's slot is freed all the same
        assert '"code": "prefill_bad_request"' in refused or '"code": "decode_bad_request"' in refused, refused
        assert f"exceeds the maximum allowed length ({p_limit} tokens)" in refused
        answered, answer, took, _ = _out_of_memory_on_p(behind_smg)
        assert answered == 503 and "ran out of memory computing this prompt's prefix" in answer, (answered, answer)
        assert took < 3 * REFUSAL_S, took
