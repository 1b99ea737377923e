"""Timeouts and limits of the transfer layer (one frozen config per worker process)."""

from __future__ import annotations

from dataclasses import dataclass

# Mooncake's TCP transport rejects a batch with -1 (after a partial write) once more than
# about 2048 entries are queued to one peer; keep every batch well below that.
MOONCAKE_PEER_QUEUE_LIMIT = 2048


@dataclass(frozen=True)
class TransferConfig:
    host: str = "127.0.0.1"              # address advertised to peers (ZMQ, Mooncake, bootstrap)
    bootstrap_timeout_s: float = 30.0    # creation -> handshake bound, both sides
    waiting_timeout_s: float = 300.0     # handshake bound -> verdict (SGLang's waiting timeout)
    heartbeat_interval_s: float = 1.0    # D pings every P it waits on; P answers
    peer_timeout_s: float = 5.0          # silence after which a peer counts as dead or frozen
    quarantine_grace_s: float = 30.0     # failed rows stay unusable this long unless P confirms
    write_timeout_s: int = 5             # Mooncake TCP timeouts (env) and a write's no-progress bound, s
    max_batch_entries: int = 1024        # entries per batch write (coalesced runs)
    http_timeout_s: float = 5.0          # one bootstrap HTTP request
    tick_s: float = 0.02                 # service loop period (deadlines, heartbeats)
    checksum_threads: int = 4            # CRC threads (zlib releases the GIL): P's sums as rows come, D's by group
    finished_room_memory_s: float = 600.0  # how long late messages for a finished room are recognised
    # Staged transfers (landing.py): D lands each room in one contiguous extent of a registered zone of
    # landing_bytes, P gathers the rows it writes into a registered staging buffer of staging_bytes, so a
    # room goes out in a few large entries instead of one per slot run. 0 turns either side off (rooms
    # that do not fit go direct: D's pool rows, one entry per run). The servers turn both on (TCP).
    landing_bytes: int = 0
    staging_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("bootstrap_timeout_s", "waiting_timeout_s", "heartbeat_interval_s", "peer_timeout_s",
                     "http_timeout_s", "tick_s", "finished_room_memory_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TransferConfig.{name} must be positive, got {getattr(self, name)}")
        if self.checksum_threads < 1:
            raise ValueError(f"TransferConfig.checksum_threads must be >= 1, got {self.checksum_threads}")
        for name in ("landing_bytes", "staging_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"TransferConfig.{name} must be an int >= 0, got {getattr(self, name)!r}")
        if self.quarantine_grace_s < 0:
            raise ValueError(f"TransferConfig.quarantine_grace_s must be >= 0, got {self.quarantine_grace_s}")
        if self.peer_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"TransferConfig.peer_timeout_s ({self.peer_timeout_s}) must exceed "
                f"heartbeat_interval_s ({self.heartbeat_interval_s})")
        if not isinstance(self.write_timeout_s, int) or self.write_timeout_s < 1:
            raise ValueError(f"TransferConfig.write_timeout_s must be an int >= 1, got {self.write_timeout_s!r}")
        if not 1 <= self.max_batch_entries <= MOONCAKE_PEER_QUEUE_LIMIT // 2:
            raise ValueError(
                f"TransferConfig.max_batch_entries must be in [1, {MOONCAKE_PEER_QUEUE_LIMIT // 2}], "
                f"got {self.max_batch_entries}")


def stall_threshold(config: TransferConfig) -> float:
    """A gap between two service ticks longer than this means OUR process was stalled
    (frozen, starved of CPU): peer silence measured across it says nothing about the peer."""
    return max(4 * config.tick_s, config.heartbeat_interval_s)
