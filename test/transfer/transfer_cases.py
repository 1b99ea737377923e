"""Shared setup of the transfer tests: the asymmetric manifests, settings, and a pair of
spawned worker agents (one prefill, one decode, one Mooncake engine each) on 127.0.0.1."""

from __future__ import annotations

import itertools
import os
import socket
import time

from sglang_asym.transfer import KVPoll, RowFormat, TransferCompat, TransferConfig
from support.loopback_rpc import AgentProcess

W = 128
RATIO2_OWNERS = (2, 8, 14)
RATIO1_OWNER = 20
KV_ROW, INDEX_ROW, TAIL_ROW = 288, 68, 4096


def asym_groups(n_tokens: int) -> list[tuple[str, int, int]]:
    """Test manifest for a prompt of n_tokens: ratio-2 owners get one row per 2 prefix tokens,
    the ratio-1 owner one per token, and an odd prefix adds one 4096 B tail per ratio-2 owner."""
    b = max(0, n_tokens - W)
    if b == 0:
        return []
    groups = []
    for layer in RATIO2_OWNERS:
        groups += [(f"L{layer}.kv", KV_ROW, b // 2), (f"L{layer}.index", INDEX_ROW, b // 2)]
    groups += [(f"L{RATIO1_OWNER}.kv", KV_ROW, b), (f"L{RATIO1_OWNER}.index", INDEX_ROW, b)]
    if b % 2:
        groups.append(("tails", TAIL_ROW, len(RATIO2_OWNERS)))
    return groups


ROW_FORMATS = tuple(RowFormat(name, row_bytes, "fp8_e4m3+ue8m0" if row_bytes == KV_ROW else
                              "fp4_e2m1+ue8m0" if row_bytes == INDEX_ROW else "fp32_pair_state")
                    for name, row_bytes, _ in asym_groups(W + 1))
COMPAT = TransferCompat("sha256:test-model", ROW_FORMATS, page_size=256, window=W, semantics="asym")
OTHER_COMPAT = TransferCompat("sha256:other-model", ROW_FORMATS, page_size=256, window=W,
                              semantics="decoder-replay")
CAPACITIES = {f.group: 64 if f.group == "tails" else 8192 for f in ROW_FORMATS}
SMALL_CAPACITIES = {f.group: 64 if f.group == "tails" else 4096 for f in ROW_FORMATS}
CONFIG = TransferConfig(bootstrap_timeout_s=3.0, waiting_timeout_s=30.0, heartbeat_interval_s=0.1,
                        peer_timeout_s=1.0, quarantine_grace_s=4.0, write_timeout_s=1)
AGENT_ENV = {"MC_LOG_LEVEL": "ERROR"}
PREFILL = "support.loopback_agents:PrefillAgent"
DECODE = "support.loopback_agents:DecodeAgent"

TERMINAL = [int(KVPoll.Failed), int(KVPoll.Success)]
SUCCESS, FAILED = int(KVPoll.Success), int(KVPoll.Failed)
WAITING = int(KVPoll.WaitingForInput)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bound_room(pair: "AgentPair", groups: list[tuple[str, int, int]], seed: int) -> int:
    """A room bound on both sides with the first 256 rows of L20.kv already written."""
    room = pair.next_room()
    pair.P.call("start_sender", room=room, groups=groups, seed=seed)
    pair.D.call("start_receiver", room=room, groups=groups, bootstrap_port=pair.port)
    assert pair.D.call("wait", room=room, states=[WAITING] + TERMINAL)[0] == WAITING
    assert pair.P.call("wait", room=room, states=[WAITING] + TERMINAL)[0] == WAITING
    pair.P.call("send_rows", room=room, group="L20.kv", start=0, end=256)
    deadline = time.monotonic() + 5
    while pair.P.call("rows_written", room=room)["L20.kv"] != 256 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pair.P.call("rows_written", room=room)["L20.kv"] == 256
    return room


class AgentPair:
    def __init__(self, config: TransferConfig = CONFIG, first_room: int = 1 << 40) -> None:
        self.config = config
        self._rooms = itertools.count(first_room)
        self.P = self._prefill()
        self.D = self._decode()
        self.P.info, self.D.info  # noqa: B018 - wait for both, started in parallel

    def _prefill(self) -> AgentProcess:
        return AgentProcess(PREFILL, env=AGENT_ENV, config=self.config, compat=COMPAT, capacities=CAPACITIES)

    def _decode(self) -> AgentProcess:
        return AgentProcess(DECODE, env=AGENT_ENV, config=self.config, compat=COMPAT, capacities=CAPACITIES,
                            extra={"same": (COMPAT, SMALL_CAPACITIES), "other": (OTHER_COMPAT, SMALL_CAPACITIES)})

    @property
    def port(self) -> int:
        return self.P.info["bootstrap_port"]

    def next_room(self) -> int:
        return next(self._rooms)

    def restart_prefill(self) -> None:
        self.P.stop()
        self.P = self._prefill()
        self.P.info  # noqa: B018

    def restart_decode(self) -> None:
        self.D.stop()
        self.D = self._decode()
        self.D.info  # noqa: B018

    def assert_clean(self, timeout_s: float = 2.0) -> None:
        """No active room on either side; every slot of every pool free; nothing leaked."""
        assert self.P.call("wait_idle", timeout_s=timeout_s) == 0
        stats = self.P.call("stats")
        assert stats["free"] == CAPACITIES and stats["staging_free"] in (None, True)
        state = self.D.call("wait_slots_free", timeout_s=timeout_s)
        assert state["all_free"], state["reports"]
        assert self.D.call("active_rooms") == 0

    def stop(self) -> None:
        self.P.stop()
        self.D.stop()


TCP_ESTABLISHED = 1  # the `st` column of /proc/net/tcp


def _tcp_table() -> list[tuple[int, int, int, int, int]]:
    """(local port, remote port, tx_queue, rx_queue, inode) of every established IPv4 TCP socket here."""
    rows = []
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[3], 16) != TCP_ESTABLISHED:
                continue
            tx, rx = (int(q, 16) for q in fields[4].split(":"))
            rows.append((int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16), tx, rx, int(fields[9])))
    return rows


def wait_delivered(sender_pid: int, to_port: int, timeout_s: float = 5.0) -> None:
    """Wait until what process `sender_pid` sent to 127.0.0.1:`to_port` sits in the receiving socket's
    kernel buffer (nothing unacknowledged on the sender's side, something unread on the receiver's).
    With the receiver frozen, this says a ZMQ message left the sender's I/O thread and will be read
    first thing after the thaw."""
    inodes = set()
    for fd in os.listdir(f"/proc/{sender_pid}/fd"):
        try:
            target = os.readlink(f"/proc/{sender_pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    deadline = time.monotonic() + timeout_s
    while True:
        table = _tcp_table()
        ours = [(local, tx) for local, remote, tx, _, inode in table if remote == to_port and inode in inodes]
        unread = [rx for local, remote, _, rx, _ in table if local == to_port and remote in {p for p, _ in ours}]
        if ours and all(tx == 0 for _, tx in ours) and any(rx > 0 for rx in unread):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing from pid {sender_pid} arrived at port {to_port} within {timeout_s}s "
                               f"(sender sockets {ours}, unread {unread}); a sender that must first ask the "
                               f"frozen receiver something (a bootstrap lookup) sends nothing")
        time.sleep(0.001)
