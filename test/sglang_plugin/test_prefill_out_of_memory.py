"""prefill/out_of_memory.py's reading of an exception as running out of memory, and the words it answers with.
The whole path (P's forward under an address-space cap, the 503 on both roles, P serving on) is
test/system/test_real_clients.py's out-of-memory case."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sglang_asym.sglang_plugin.prefill.out_of_memory import FailedPrefillBatch, is_out_of_memory, message_for

CPU_ALLOCATOR_FAILURE = """
import os, resource, torch
torch.zeros(8)
mapped = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize')).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (mapped + 64 * 2**20, resource.RLIM_INFINITY))
try:
    torch.empty(256 * 2**20, dtype=torch.uint8)
except BaseException as exc:
    print(type(exc).__name__ + ": " + str(exc).splitlines()[0])
"""


def test_the_cpu_allocators_failure_under_a_memory_cap_reads_as_out_of_memory():
    done = subprocess.run([sys.executable, "-c", CPU_ALLOCATOR_FAILURE], capture_output=True, text=True, timeout=120,
                          env={"OMP_NUM_THREADS": "1", "PATH": ""})
    kind, _, words = done.stdout.strip().partition(": ")
    assert kind == "RuntimeError" and "can't allocate memory" in words, (done.stdout, done.stderr[-2000:])
    assert is_out_of_memory(RuntimeError(words))


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                 MemoryError()])
def test_accelerator_and_python_allocation_failures_read_as_out_of_memory(exc):
    assert is_out_of_memory(exc)


# oneDNN's words: it cannot create primitives any more after a failed allocation, so the worker must end
@pytest.mark.parametrize("exc", [RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)"),
                                 RuntimeError("could not create a primitive"),
                                 ValueError("can't allocate memory"), AssertionError(), KeyError("pool")])
def test_other_failures_do_not(exc):
    assert not is_out_of_memory(exc)


def test_the_answer_names_the_batch_and_the_error_and_says_the_worker_serves_on():
    assert message_for(FailedPrefillBatch(2, 2744, "DefaultCPUAllocator: can't allocate memory")) == (
        "sglang-asym: the prefill worker ran out of memory computing this prompt's prefix (a batch of 2 requests, "
        "2744 new tokens: DefaultCPUAllocator: can't allocate memory); it serves on, retry later or with a shorter prompt")
    assert FailedPrefillBatch(1, 1, "x").delay_sample_func is None  # SGLang launches no sampling step for it
