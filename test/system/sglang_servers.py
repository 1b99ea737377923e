"""SGLang's own engine on CPU in the system tests: its servers, a patient router in front, greedy calls,
SGLang's pool counter, and the reference model over SGLang's chunks (shared by test_cpu_sglang_engine*.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from harness.router_launch import (PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, WorkerHealth)
from harness.server_process import ServerProcess, post, start_server, wait_healthy

from .helpers import ids, stop_all

NEW_TOKENS = 8
SGLANG_ENV = {"SGLANG_PLUGINS": "sglang_asym"}
# SGLang's own retraction test switch: every third decode forward retracts one request of the running
# batch (never the last one, so one-request-at-a-time tests on such a server are not touched)
RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1"}
RETRACTED = "sglang:num_retracted_requests_total"
DETERMINISTIC = "--enable-deterministic-inference"
STACK_P_POOL_TOKENS = 2048  # the deterministic stack's P --max-total-tokens (D keeps the CPU default, 8192)


def sglang_server(mode: str, checkpoint: Path, logs: Path, *extra: str, env: dict[str, str] | None = None,
                  port: int | None = None, bootstrap_port: int | None = None) -> ServerProcess:
    """`python -m sglang.launch_server --device cpu` in `mode` (null, prefill, decode, asym-prefill, asym-decode);
    `port` / `bootstrap_port` restart a worker where it was."""
    return start_server(mode, checkpoint, logs, "--device", "cpu", "--enable-metrics", *extra,
                        module="sglang.launch_server", env={**SGLANG_ENV, **(env or {})}, port=port,
                        bootstrap_port=bootstrap_port)


def write_sglang_checkpoint(out: Path, cfg: Any = None) -> Path:
    """The small V4.1 at SGLang's pool geometry (head_dim 512; `cfg`: a variant of it, default sglang_small),
    release precision, with a tokenizer."""
    from sglang_asym.checkpoint import write_tokenizer
    from sglang_asym.checkpoint.quantization import without_quantization
    from sglang_asym.checkpoint.writer import write_checkpoint
    from harness.sglang_shapes import sglang_small

    cfg = sglang_small() if cfg is None else cfg
    write_checkpoint(out, without_quantization(cfg), seed=11, precision="release", num_shards=3, progress=False)
    write_tokenizer(out, cfg)
    return out


@dataclasses.dataclass(frozen=True)
class DumpGroups:
    """The pool-dump group names the transfer tests read, for one config: the last layer's window rows, the last KV
    source's compressed rows, and the first ratio-2 owner's compressed rows, index keys and pending tail."""

    last_window: str
    last_kv: str
    ratio2_kv: str
    ratio2_index: str
    ratio2_tail: str

    @classmethod
    def of(cls, cfg: Any) -> "DumpGroups":
        from sglang_asym.layer_plan import LayerPlan

        plan = LayerPlan.from_config(cfg)
        owner = plan.ratio2_owners[0]
        return cls(f"swa.L{cfg.num_hidden_layers - 1}", f"kv.L{plan.last_kv_source}", f"kv.L{owner}",
                   f"index.L{owner}", f"tail.L{owner}")


def sglang_workspace(tmp_path_factory: Any, name: str) -> tuple[Path, Path]:
    """A module's work folder and an empty logs folder in it."""
    work = tmp_path_factory.mktemp(name)
    logs = work / "logs"
    logs.mkdir()
    return work, logs


@contextlib.contextmanager
def patient_router(prefill: ServerProcess, decode: ServerProcess, flavor: RouterFlavor,
                   health: WorkerHealth | None = None, log_path: Path | None = None) -> Iterator[RouterProcess]:
    """A router in front of the pair. SGLang's /health runs a request through the scheduler, which on
    2 shared cores can take longer than the router's 5 s default while a long prompt computes: the
    health check gets 60 s and 10 failures before a worker counts as down (or `health`'s settings)."""
    checks = ("--disable-circuit-breaker", "--health-check-timeout-secs", "60", "--health-failure-threshold", "10")
    proc = RouterProcess(RouterConfig(
        prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),), decode=(decode.url,),
        flavor=flavor, retry_max_retries=1, health=health, extra_args=() if health else checks),
        log_path=log_path)
    proc.start(ready_timeout_s=180)
    try:
        yield proc
    finally:
        proc.stop()


def greedy(base: str, prompt: list[int], new_tokens: int = NEW_TOKENS, ignore_eos: bool = False) -> list[int]:
    sampling = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": ignore_eos}
    status, resp = post(base + "/generate", {"input_ids": prompt, "sampling_params": sampling}, timeout_s=600)
    assert status == 200, resp
    assert len(resp["output_ids"]) == new_tokens
    return resp["output_ids"]


def prompt_of(n: int) -> list[int]:
    return ids(n, seed=n)


def equal_pool_dumps(dumps: Path, count: int) -> list[tuple[int, dict]]:
    """The pool dumps (pool_dump.py) of `count` transferred requests (D's empty extents of asym prompts of
    N <= W aside): each request's groups read out of P's pool and out of D's are the same groups, byte for byte. Returns (num_tokens, P's groups) per request."""
    import numpy as np

    rooms = []
    for path in sorted(dumps.glob("decode-*.npz")):
        d = np.load(path)
        if int(d["num_tokens"]) == 0:  # an asym prompt of N <= W: P sent nothing, so D's extent holds no row
            assert not (dumps / path.name.replace("decode-", "prefill-", 1)).exists(), path.name
            assert all(d[name].shape[0] == 0 for name in d.files if name != "num_tokens"), path.name
            continue
        rooms.append(path.name.removeprefix("decode-"))
    assert len(rooms) == count and sorted(p.name.removeprefix("prefill-") for p in dumps.glob("prefill-*.npz")) == rooms
    out = []
    for room in rooms:
        p, d = np.load(dumps / f"prefill-{room}"), np.load(dumps / f"decode-{room}")
        n = int(p["num_tokens"])
        assert int(d["num_tokens"]) == n and sorted(p.files) == sorted(d.files)
        groups = {name: p[name] for name in p.files if name != "num_tokens"}
        for name, rows in groups.items():
            assert np.array_equal(rows, d[name]), (n, name)
        out.append((n, groups))
    return out


def metric_sum(server: ServerProcess, name: str) -> float | None:
    """The sum of every series of metric `name` on a server's /metrics (None: no such series)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        values = [float(line.rsplit(" ", 1)[1]) for line in resp.read().decode().splitlines()
                  if line.startswith((name + "{", name + " "))]
    return sum(values) if values else None


def mooncake_regions(server: ServerProcess) -> int:
    """Memory regions an asymmetric server's scheduler holds registered with Mooncake now (registered minus
    deregistered, sglang_plugin/shared/mooncake_regions.py)."""
    registered = metric_sum(server, "sglang_asym:mooncake_regions_registered_total")
    if registered is None:
        raise AssertionError(f"{server.mode}: /metrics has no sglang_asym:mooncake_regions_registered_total")
    return int(registered - (metric_sum(server, "sglang_asym:mooncake_regions_deregistered_total") or 0))


def used_tokens(server: ServerProcess) -> float:
    """SGLang's own sglang:num_used_tokens gauge of a server."""
    value = metric_sum(server, "sglang:num_used_tokens")
    if value is None:
        raise AssertionError(f"{server.mode}: /metrics has no sglang:num_used_tokens")
    return value


def wait_computing(prefill: ServerProcess, timeout_s: float = 180.0) -> None:
    """Until P has computed a prefix batch: its used-token gauge is above 0 (SGLang's disaggregated prefill loop
    sets it with the batch's result, after the forward, which took over 60 s on the slowest CI host)."""
    deadline = time.monotonic() + timeout_s
    while not metric_sum(prefill, "sglang:num_used_tokens"):
        assert time.monotonic() < deadline, f"P computed nothing within {timeout_s} s"
        time.sleep(0.05)


def settle(servers: list[ServerProcess], timeout_s: float = 180) -> list[float]:
    """Each server's used tokens once all are 0 (or whatever they are after timeout_s). A gauge not published yet
    counts as not settled: SGLang publishes it every 40 decode forwards and, on an idle scheduler, 30 s after its
    last report, so a D that served a few speculative requests within 30 s of its start has none yet."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = [metric_sum(s, "sglang:num_used_tokens") for s in servers]
        if all(u == 0 for u in used):
            return used
        time.sleep(1)
    return [used_tokens(s) for s in servers]


BACK_TO_EMPTY_S = 60  # after a case, each shared server's used tokens are 0 again within this


def broken(servers: Mapping[str, Any]) -> list[str]:
    """What is wrong with a shared server set after a case: a server that exited, fails /health, or whose
    used tokens (SGLang's gauge, where it has published one) are not back to 0 within BACK_TO_EMPTY_S."""
    import concurrent.futures

    live = {name: s for name, s in servers.items() if isinstance(s, ServerProcess)}

    def unhealthy(server: ServerProcess) -> str | None:
        try:
            wait_healthy(server, timeout_s=120)
        except (RuntimeError, TimeoutError) as exc:
            return str(exc).splitlines()[0]
        return None

    with concurrent.futures.ThreadPoolExecutor(max(len(live), 1)) as pool:  # each /health is a scheduler request
        found = dict(zip(live, pool.map(unhealthy, live.values())))
    problems = [f"{name}: {why}" for name, why in found.items() if why]
    healthy = [(name, s) for name, s in live.items() if not any(p.startswith(name + ":") for p in problems)]
    published = [(name, s) for name, s in healthy if metric_sum(s, "sglang:num_used_tokens") is not None]
    used = settle([s for _, s in published], BACK_TO_EMPTY_S)
    problems += [f"{name}: {u:g} used tokens {BACK_TO_EMPTY_S} s after the case"
                 for (name, _), u in zip(published, used) if u]
    return problems


def restore(*server_sets: dict[str, Any]) -> None:
    """Between the cases of shared server sets (a module's own, a set several modules share): nothing to do
    when every server is healthy with empty pools; otherwise each broken set restarts whole on its ports (the
    next case gets working servers, and routers configured with those ports stay valid) and the case that
    broke it fails here."""
    problems = []
    for servers in server_sets:
        found = broken(servers)
        if not found:
            continue
        problems += found
        names = [name for name, s in servers.items() if isinstance(s, ServerProcess)]
        stop_all([servers[name] for name in names])
        for name in names:
            servers[name] = servers[name].restarted()
        for name in names:
            wait_healthy(servers[name], timeout_s=600)
    if problems:
        raise AssertionError(f"the case left its shared servers broken (restarted): {problems}")


def greedy_together(base: str, prompts: list[list[int]], new_tokens: int | list[int] = NEW_TOKENS) -> list[list[int]]:
    """Greedy outputs of `prompts` sent all at once (one thread each), in prompt order; ignore_eos, so every
    request decodes `new_tokens` steps (one count for all, or one per prompt) and they share the scheduler's
    batches for as long as possible."""
    import concurrent.futures

    counts = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(prompts)
    assert len(counts) == len(prompts), (len(counts), len(prompts))
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(greedy, base, prompt, count, True) for prompt, count in zip(prompts, counts)]
        return [f.result() for f in futures]


def server_info(server: ServerProcess) -> dict:
    """SGLang's /server_info of a server (its resolved server arguments among them)."""
    import json

    with urllib.request.urlopen(server.url + "/server_info", timeout=30) as resp:
        return json.loads(resp.read())


def forward_log(path: Path) -> list[dict]:
    """The reference forward's log lines (SGLANG_ASYM_FORWARD_LOG, a test aid), oldest first."""
    import json

    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def reference_greedy_over_chunks(checkpoint: Path, prompt: list[int], chunk: int,
                                 cache_quant: str = "release") -> list[int]:
    """Greedy tokens of the reference model run over SGLang's chunks of `chunk` prompt tokens, each cut
    where the reference forward cuts it (reference_forward.pieces), then decoded one token at a time, with
    the caches quantized as `cache_quant` (SGLang's pool layout: release for v41, v4 for v4). A colocated
    server whose --chunked-prefill-size is at least the prompt, and SGLang's symmetric pair, compute the
    prompt in one chunk: `chunk` = ONE_CHUNK."""
    return list(reference_tokens(checkpoint, tuple(prompt), chunk, cache_quant))


ONE_CHUNK = 8192  # above every prompt of the system tests: SGLang's default chunked-prefill size and more


@functools.lru_cache(maxsize=2)
def reference_model(checkpoint: Path, cache_quant: str) -> Any:
    """The reference model of a checkpoint in this process, loaded once per module (the root conftest clears
    this cache when the module ends)."""
    from sglang_asym.model.loading import model_from_checkpoint

    return model_from_checkpoint(checkpoint, cache_quant=cache_quant)


@functools.lru_cache(maxsize=256)
def reference_tokens(checkpoint: Path, prompt: tuple[int, ...], chunk: int, cache_quant: str = "release",
                     semantics: str | None = None, new_tokens: int = NEW_TOKENS) -> tuple[int, ...]:
    """What the servers are compared with: the reference model's greedy tokens for `prompt`, computed once per
    module. `semantics` None: SGLang's colocated / symmetric computation (reference_lifecycle over chunks of
    `chunk` tokens); an asymmetric semantics: the asym pair's (asym_reference)."""
    model = reference_model(checkpoint, cache_quant)
    if semantics is None:
        return tuple(reference_lifecycle(model, list(prompt), chunk, new_tokens))
    return tuple(asym_reference(model, list(prompt), chunk, semantics, new_tokens))


def asym_reference(model: Any, prompt: list[int], prefill_chunk: int, semantics: str, count: int,
                   pick: Callable[[torch.Tensor], int] | None = None) -> list[int]:
    """The greedy tokens an asym-prefill / asym-decode pair of `semantics` computes: P runs [0, B) in SGLang's
    chunks of `prefill_chunk` tokens, D runs the window [B, N) with the semantics' floors in the reference
    forward's window chunks, then decodes one token at a time (the reference model is not chunk-invariant
    bit for bit, so the pieces are the pair's). `pick` chooses each token from its logits (default argmax;
    a constrained request's pick masks them first)."""
    from sglang_asym.split import Semantics

    n, window = len(prompt), model.cfg.sliding_window
    boundary = max(n - window, 0)
    spans = [(s, min(s + prefill_chunk, boundary)) for s in range(0, boundary, prefill_chunk)] + [(boundary, n)]
    return _run_spans(model, prompt, spans, Semantics.parse(semantics), count, pick=pick)


def asym_reference_logprobs(checkpoint: Path, prompt: list[int], prefill_chunk: int, semantics: str,
                            count: int) -> tuple[list[int], torch.Tensor]:
    """The asym pair's greedy tokens for `prompt` (asym_reference) and the log-softmax of the logits each was
    sampled from, [count, vocab] in float32, as SGLang's sampler computes a greedy token's logprobs."""
    from sglang_asym.split import Semantics

    model = reference_model(checkpoint, "release")
    n, window = len(prompt), model.cfg.sliding_window
    boundary = max(n - window, 0)
    spans = [(s, min(s + prefill_chunk, boundary)) for s in range(0, boundary, prefill_chunk)] + [(boundary, n)]
    rows: list[torch.Tensor] = []
    tokens = _run_spans(model, prompt, spans, Semantics.parse(semantics), count, sampled_logits=rows)
    return tokens, torch.log_softmax(torch.stack(rows).float(), dim=-1)


def reference_lifecycle(model: Any, sequence: list[int], chunk: int, count: int,
                        replayed: int | None = None) -> list[int]:
    """One lifecycle of a request as the reference model computes it: `sequence` run over SGLang's chunks
    of `chunk` tokens with that sequence's floors, then `count` greedy tokens. A first lifecycle samples its
    first token from the prompt's last row; a rebootstrap after a retraction (`replayed`: the output token
    SGLang kept aside) discards that sample and decodes on from the replayed token, which is not counted."""
    from sglang_asym.sglang_plugin.cpu_platform.reference_forward import DEFAULT_SEMANTICS

    spans = [(s, min(s + chunk, len(sequence))) for s in range(0, len(sequence), chunk)]
    return _run_spans(model, sequence, spans, DEFAULT_SEMANTICS, count, replayed)


def _run_spans(model: Any, sequence: list[int], spans: list[tuple[int, int]], semantics: Any, count: int,
               replayed: int | None = None, sampled_logits: list[torch.Tensor] | None = None,
               pick: Callable[[torch.Tensor], int] | None = None) -> list[int]:
    """`sequence` forwarded as the SGLang forwards `spans` (each cut into the reference forward's pieces,
    with the floors of `semantics`), then greedy decoding: see reference_lifecycle for `replayed`. The logits
    each output token was sampled from are appended to `sampled_logits` when given."""
    from sglang_asym.sglang_plugin.cpu_platform.reference_forward import RequestRows, pieces

    cfg, n = model.cfg, len(sequence)
    tokens = torch.tensor(sequence)
    cache = model.new_cache_set().new_request()
    try:
        logits = None
        for start, end in spans:
            if end <= start:
                continue
            rows = RequestRows(0, start, tokens[start:end], n)
            for piece, floors in pieces(rows, cfg, cfg.sliding_window, semantics, 32):
                cache.swa_floor.update(floors)
                logits = model(piece.tokens, cache, logits="last")
        pick = pick or (lambda row: int(row.argmax()))
        out, last = [], replayed if replayed is not None else pick(logits)
        if replayed is None:
            out.append(last)
            if sampled_logits is not None:
                sampled_logits.append(logits.reshape(-1))
        while len(out) < count:
            logits = model(torch.tensor([last]), cache, logits="last")
            last = pick(logits)
            out.append(last)
            if sampled_logits is not None:
                sampled_logits.append(logits.reshape(-1))
        return out
    finally:
        cache.release()
