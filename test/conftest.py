"""Shared test setup: one torch thread per test process and per server it starts (CI has 2 cores; a
server on torch's default of one thread per core, beside one busy core, answered a 127-token request in
224 s instead of 4.5 s: its OpenMP threads wait at barriers for a thread the other process holds), and
the memory a test module cached is given back when the module ends: its `lru_cache`d models and weights
(the small config's are gigabytes) would otherwise stay in the pytest process for the whole session,
beside the servers the system tests start later.

The suite runs on two pytest-xdist workers (scripts/test.sh). The system tests, which start SGLang servers
of gigabytes each, form two scopes that go first, one to each worker, and run there in file order (the
modules sharing the deterministic stack last): the modules with up to four servers up at once, and those
with one pair at a time (asym, faults, lifetime, overload), so at most six servers are up together; then the
in-process test modules, each on one torch thread, the longest first."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by every server and agent a test starts

TEST_ROOT = Path(__file__).resolve().parent
SERVER_TESTS = TEST_ROOT / "system"
SERVER_GROUP = "servers"
PAIR_SERVER_GROUP = "pair-servers"
# system test modules with at most one P / D pair (two servers) up at a time: they fit beside the others
PAIR_SERVER_MODULES = frozenset({"test_cpu_sglang_engine_asym.py", "test_faults_sglang_engine.py",
                                 "test_lifetime.py", "test_overload.py"})
# the modules that share the package-scoped deterministic_stack (system/conftest.py): they run last in their
# scope, so that the stack, up from their first test to the package's last test on the worker, is not up
# beside another module's servers
DETERMINISTIC_STACK_MODULES = ("test_cpu_sglang_engine_asym_dspark.py", "test_cpu_sglang_engine_deterministic.py",
                               "test_cpu_sglang_engine_dspark.py", "test_real_clients.py")
# the in-process modules that take minutes: handed out first after the system tests, so that no worker starts one
# of them while the other has nothing left to run
LONG_MODULES_FIRST = ("test/core/test_split.py", "test/speculative/test_split_lengths_small.py",
                      "test/speculative/test_split_lengths.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "leaves_servers_stopped: a system case that stops a shared server on purpose "
                                       "(its module's last): the after-case check does not restart it")


def _starts_servers(item) -> bool:
    return Path(str(item.path)).resolve().is_relative_to(SERVER_TESTS)


def pytest_collection_modifyitems(config, items):
    """The server-starting tests move to the front, so that one worker starts on them at once (xdist
    hands out scopes in collection order), the deterministic stack's modules last among them."""
    servers = sorted((item for item in items if _starts_servers(item)),
                     key=lambda item: Path(str(item.path)).name in DETERMINISTIC_STACK_MODULES)
    chosen = set(map(id, servers))
    others = [item for item in items if id(item) not in chosen]
    long_first = {TEST_ROOT.parent / name: rank for rank, name in enumerate(LONG_MODULES_FIRST)}
    others.sort(key=lambda item: long_first.get(Path(str(item.path)).resolve(), len(long_first)))
    items[:] = servers + others


def server_scope(nodeid: str) -> str | None:
    """The xdist scope of a system test's node id (relative to the repository), None for other tests."""
    prefix = SERVER_TESTS.relative_to(TEST_ROOT.parent).as_posix() + "/"
    if not nodeid.startswith(prefix):
        return None
    module = nodeid.removeprefix(prefix).split("::", 1)[0]
    return PAIR_SERVER_GROUP if module in PAIR_SERVER_MODULES else SERVER_GROUP


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` here means: the system tests in two scopes (the one-pair ones, and all others;
    each on one worker, file order), every other module a scope of its own (a module's cached
    models load on one worker only). xdist 3.8's own loadgroup marks groups by rewriting
    `item._nodeid`, which pytest 9 no longer reads."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep collection order: the server scope first

    class ServerGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return server_scope(nodeid) or super()._split_scope(nodeid)

    return ServerGroupScheduling(config, log)


def _test_modules():
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(TEST_ROOT):
            yield module


def clear_test_caches() -> int:
    """Clears every lru_cache defined at the top level of a test module; returns how many."""
    cleared = 0
    for module in _test_modules():
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", None) == module.__name__:
                value.cache_clear()
                cleared += 1
    return cleared


@pytest.fixture(autouse=True, scope="module")
def _give_back_module_memory():
    yield
    clear_test_caches()
    gc.collect()
    try:  # glibc keeps freed heap pages; hand them back to the OS
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
