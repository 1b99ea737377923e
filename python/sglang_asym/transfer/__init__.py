"""Transfer layer: moves a request's prefix payload from the prefill worker P to the decode
worker D over the Mooncake Transfer Engine, with an SGLang-compatible bootstrap.

Modules (one job each):
    poll            KVPoll, numbered as SGLang's
    config, compat  TransferConfig (timeouts, limits); TransferCompat (what P and D must agree on)
    codec, messages typed, versioned msgpack control messages
    channel, loops  ZMQ sockets; the service thread (messages, deadlines) and the task worker
    bootstrap       SGLang-compatible bootstrap HTTP server; bootstrap_client talks to it
    engine, regions Mooncake wrapper (return codes -> exceptions), registered-memory checks
    row_pool, runs  pools of fixed-size rows; slot-run coalescing
    slots           slot ownership: a pool's allocator, the quarantine of failed rooms, D's ledger
    extents, staging  staged transfers: P's staging and D's landing extents (a room in a few entries)
    checksum        per-group CRC32C over rows in row order (P folds rows in as send_rows hands them over)
    prefill_manager, prefill_room, prefill_writer   P side (PrefillTransferManager and its per-request Sender)
    decode_manager, decode_room, decode_verifier   D side (DecodeTransferManager and its
                    per-request Receiver; the verifier re-reads every destination row after P's completion)
"""

from sglang_asym.transfer.compat import RowFormat, TransferCompat
from sglang_asym.transfer.config import TransferConfig
from sglang_asym.transfer.poll import KVPoll
from sglang_asym.transfer.row_pool import RowPool
from sglang_asym.transfer.slots import SlotAllocator

__all__ = ["KVPoll", "RowFormat", "RowPool", "SlotAllocator", "TransferCompat", "TransferConfig"]
