"""run_http_server (the blocking entry the launch CLI uses) in a real process: serves, then exits on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sglang_asym.testing.lifetime import die_with_parent_preexec
from sglang_asym.testing.router_launch import pick_free_port

from .harness import get, post_json, wait_until

_SCRIPT = """
import sys
from runtime_http.fakes import FakeEngine
from sglang_asym.runtime.http import HttpServerConfig, TextTokenizer, run_http_server
tokenizer = TextTokenizer.from_dir(sys.argv[1])
run_http_server(FakeEngine(tokenizer), tokenizer, HttpServerConfig(model_path=sys.argv[1], port=int(sys.argv[2])))
"""


def _answers(url: str) -> bool:
    try:
        return get(url, "/health")[0] == 200
    except OSError:
        return False


def test_run_http_server_serves_until_sigterm(checkpoint_dir):
    port = pick_free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(checkpoint_dir), str(port)],
                            cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=die_with_parent_preexec())
    try:
        wait_until(lambda: _answers(url) or proc.poll() is not None, timeout_s=30, what="the server to answer")
        assert proc.poll() is None, proc.stdout.read().decode()
        status, body = post_json(url, "/generate", {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}})
        assert status == 200 and body["meta_info"]["completion_tokens"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
