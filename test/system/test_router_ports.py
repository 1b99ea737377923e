"""The router launcher's own ports: a port it picked that another process binds first is picked again;
a port the caller chose is never replaced (real router binary, nothing listening behind it)."""

from __future__ import annotations

import socket

import pytest

from harness import router_launch
from harness.router_launch import PrefillWorker, RouterConfig, RouterProcess, RouterStartError

READY_S = 15
UNSERVED = RouterConfig(prefill=(PrefillWorker("http://127.0.0.1:9"),), decode=("http://127.0.0.1:9",))


@pytest.fixture
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_a_picked_port_taken_before_the_router_binds_it_is_picked_again(taken_port, monkeypatch, tmp_path):
    picks = iter([taken_port])
    real_pick = router_launch.pick_free_port
    monkeypatch.setattr(router_launch, "pick_free_port", lambda host="127.0.0.1": next(picks, None) or real_pick(host))
    router = RouterProcess(UNSERVED, tmp_path / "router.log")
    with pytest.raises(RouterStartError) as raised:  # no worker behind it: it never turns ready
        # long enough for the router binary to start and meet the taken port on a loaded host (it printed
        # nothing within 4 s once), short since the retried start never turns ready
        router.start(ready_timeout_s=READY_S)
    assert f"not ready after {READY_S}" in str(raised.value) and not raised.value.port_taken
    assert router.config.port not in (0, taken_port)
    assert router.pid is None  # stopped


def test_a_port_the_caller_chose_is_not_replaced(taken_port, tmp_path):
    router = RouterProcess(RouterConfig(prefill=UNSERVED.prefill, decode=UNSERVED.decode, port=taken_port),
                           tmp_path / "router.log")
    with pytest.raises(RouterStartError) as raised:
        router.start(ready_timeout_s=30)
    assert raised.value.port_taken
    assert router.config.port == taken_port
