"""`SGLANG_ASYM_CPU_RUNTIME=embedded python -m sglang.launch_server --device cpu --disaggregation-mode
asym-prefill | asym-decode` (SGLang 0.5.23's launcher with the sglang-asym plugin, handing the command line
to the embedded runtime) serves behind the real router and answers exactly as the colocated server does.
Without that variable SGLang's own engine serves the pair: test_cpu_sglang_engine_asym.py."""

from __future__ import annotations

import json
import urllib.request

import pytest

from sglang_asym.testing.router_launch import PrefillWorker, RouterConfig, RouterFlavor, RouterProcess, pick_free_port
from sglang_asym.testing.server_process import post, start_server, wait_healthy

pytestmark = pytest.mark.timeout(900)


def test_sglang_launch_server_hands_the_asym_modes_to_the_embedded_runtime_on_request(small_checkpoint, cluster,
                                                                                      tmp_path):
    env = {"SGLANG_PLUGINS": "sglang_asym", "SGLANG_ASYM_CPU_RUNTIME": "embedded"}
    p = start_server("asym-prefill", small_checkpoint, tmp_path, "--device", "cpu", module="sglang.launch_server",
                     env=env)
    d = start_server("asym-decode", small_checkpoint, tmp_path, "--device", "cpu", module="sglang.launch_server",
                     env=env)
    router = None
    try:
        for server in (p, d):
            wait_healthy(server, timeout_s=300)
            with urllib.request.urlopen(server.url + "/server_info", timeout=10) as resp:
                assert json.loads(resp.read())["disaggregation_mode"] == server.mode
        router = RouterProcess(RouterConfig(prefill=(PrefillWorker(p.url, p.bootstrap_port),), decode=(d.url,),
                                            port=pick_free_port(), flavor=RouterFlavor.SGLANG_ROUTER))
        router.start(ready_timeout_s=120)
        body = {"input_ids": [(i * 31 + 7) % 700 + 3 for i in range(400)],
                "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
        status, want = post(cluster["colocated"].url + "/generate", body)
        assert status == 200
        status, got = post(router.url + "/generate", body)
        assert status == 200, got
        assert got["output_ids"] == want["output_ids"] and len(got["output_ids"]) == 6
    finally:
        if router is not None:
            router.stop()
        p.stop()
        d.stop()
