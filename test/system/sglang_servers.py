"""SGLang's own engine on CPU in the system tests: its servers, a patient router in front, greedy calls,
and SGLang's pool counter (shared by test_cpu_sglang_engine*.py)."""

from __future__ import annotations

import contextlib
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from sglang_asym.runtime.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
from sglang_asym.runtime.server_process import ServerProcess, post, start_server

from .helpers import ids

NEW_TOKENS = 8
SGLANG_ENV = {"SGLANG_PLUGINS": "sglang_asym"}


def sglang_server(mode: str, checkpoint: Path, logs: Path, *extra: str, env: dict[str, str] | None = None
                  ) -> ServerProcess:
    """`python -m sglang.launch_server --device cpu` in `mode` (null, prefill, decode, asym-prefill, asym-decode)."""
    return start_server(mode, checkpoint, logs, "--device", "cpu", "--enable-metrics", *extra,
                        module="sglang.launch_server", env={**SGLANG_ENV, **(env or {})})


def write_sglang_checkpoint(out: Path) -> Path:
    """The small V4.1 at SGLang's pool geometry (head_dim 512), release precision, with a tokenizer."""
    from sglang_asym.checkpoint import write_tokenizer
    from sglang_asym.checkpoint.quantization import without_quantization
    from sglang_asym.checkpoint.writer import write_checkpoint
    from sglang_asym.sglang_plugin.sglang_shapes import sglang_small

    write_checkpoint(out, without_quantization(sglang_small()), seed=11, precision="release", num_shards=3,
                     progress=False)
    write_tokenizer(out, sglang_small())
    return out


@contextlib.contextmanager
def patient_router(prefill: ServerProcess, decode: ServerProcess, flavor: RouterFlavor) -> Iterator[RouterProcess]:
    """A router in front of the pair. SGLang's /health runs a request through the scheduler, which on
    2 shared cores can take longer than the router's 5 s default while a long prompt computes: the
    health check gets 60 s and 10 failures before a worker counts as down."""
    proc = RouterProcess(RouterConfig(
        prefill=(PrefillWorker(prefill.url, prefill.bootstrap_port),), decode=(decode.url,), port=pick_free_port(),
        flavor=flavor, retry_max_retries=1,
        extra_args=("--disable-circuit-breaker", "--health-check-timeout-secs", "60", "--health-failure-threshold",
                    "10")))
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


def used_tokens(server: ServerProcess) -> float:
    """SGLang's own sglang:num_used_tokens gauge of a server."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("sglang:num_used_tokens"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{server.mode}: /metrics has no sglang:num_used_tokens")


def settle(servers: list[ServerProcess], timeout_s: float = 180) -> list[float]:
    """Each server's used tokens once all are 0 (or whatever they are after timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = [used_tokens(s) for s in servers]
        if not any(used):
            return used
        time.sleep(1)
    return [used_tokens(s) for s in servers]
