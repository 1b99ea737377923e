"""A staged transfer over the real Mooncake engine (TCP, 127.0.0.1) whose row copies run through
sgl_kernel_ext's Triton kernel in Triton's interpreter ($SGLANG_ASYM_STAGING_COPY=triton in both
agents): P gathers each handed-over range into its staging extent with the kernel, the room goes out
in a few entries, D checks every landed byte, then scatters the landed rows into its pool slots with
the kernel and checks every byte there and that no other slot changed."""

from __future__ import annotations

import dataclasses

import pytest
from transfer import transfer_cases   # test/transfer's shared setup (test/ is on the path)
from transfer.transfer_cases import CONFIG, SUCCESS, TERMINAL, AgentPair, asym_groups

from support.loopback_rpc import AgentProcess

STAGED = dataclasses.replace(CONFIG, landing_bytes=4 << 20, staging_bytes=4 << 20)
KERNEL_ENV = {**transfer_cases.AGENT_ENV, "SGLANG_ASYM_STAGING_COPY": "triton"}


class KernelPathPair(AgentPair):
    def _prefill(self) -> AgentProcess:
        return AgentProcess(transfer_cases.PREFILL, env=KERNEL_ENV, config=self.config, compat=transfer_cases.COMPAT,
                            capacities=transfer_cases.CAPACITIES)

    def _decode(self) -> AgentProcess:
        return AgentProcess(transfer_cases.DECODE, env=KERNEL_ENV, config=self.config, compat=transfer_cases.COMPAT,
                            capacities=transfer_cases.CAPACITIES)


@pytest.fixture(scope="module")
def pair():
    agents = KernelPathPair(STAGED, first_room=1 << 46)
    yield agents
    agents.stop()


@pytest.mark.parametrize("n_tokens", [257, 1000])
def test_staged_transfer_through_the_triton_interpreter_moves_every_byte(pair, n_tokens: int) -> None:
    P, D, groups = pair.P, pair.D, asym_groups(n_tokens)
    payload = sum(b * r for _, b, r in groups)
    room = pair.next_room()
    runs_before = P.call("copy_runs")["kernel_runs"]
    P.call("start_sender", room=room, groups=groups, seed=n_tokens)
    D.call("start_receiver", room=room, groups=groups, bootstrap_port=pair.port, snapshot=True)
    chunks = P.call("send_pipelined", room=room, chunk_rows=300)
    assert D.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert P.call("wait", room=room, states=TERMINAL)[:2] == (SUCCESS, "")
    assert P.call("staged", room=room) and D.call("staged", room=room)
    runs = P.call("copy_runs")
    assert runs["copy_mode"] == "triton"
    # every handed-over range was one kernel launch set (one plan) on P, none through the torch reference
    assert runs["kernel_runs"]["triton"] - runs_before.get("triton", 0) == len(chunks)
    assert runs["kernel_runs"]["torch"] == 0
    assert D.call("verify", room=room, seed=n_tokens) == {"mismatched_groups": [], "untouched_ok": True,
                                                          "bytes_checked": payload}
    landed = D.call("scatter_landed", room=room, seed=n_tokens)
    assert (landed["mismatched_groups"], landed["untouched_ok"], landed["bytes_checked"]) == ([], True, payload)
    assert landed["copy_mode"] == "triton" and landed["kernel_runs"]["triton"] >= len(groups)
    D.call("release", room=room)
    P.call("release", room=room)
    pair.assert_clean()
