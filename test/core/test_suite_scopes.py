"""The suite's xdist scopes (test/conftest.py): system tests in two scopes, the one-pair ones apart (they run
beside the bigger server sets on the other worker, so they must stay light), other tests by module."""

import importlib.util
import re
from pathlib import Path

TEST_ROOT = Path(__file__).resolve().parents[1]


def _suite_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest_under_test", TEST_ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scope_of_each_kind_of_test():
    conftest = _suite_conftest()
    assert conftest.server_scope("test/system/test_faults_sglang_engine.py::test_a[x]") == "pair-servers"
    assert conftest.server_scope("test/system/test_lifetime.py::test_b") == "pair-servers"
    assert conftest.server_scope("test/system/test_cpu_sglang_engine_asym.py::test_c[asym]") == "pair-servers"
    assert conftest.server_scope("test/system/test_cpu_sglang_engine_dspark.py::test_c") == "servers"
    assert conftest.server_scope("test/system/test_cpu_sglang_engine.py::test_d[1]") == "servers"
    assert conftest.server_scope("test/core/test_split.py::test_e") is None


def test_the_pair_server_modules_start_at_most_two_servers():
    conftest = _suite_conftest()
    for name in sorted(conftest.PAIR_SERVER_MODULES):
        source = (TEST_ROOT / "system" / name).read_text()
        if name == "test_lifetime.py":  # its driver starts the servers
            source = (TEST_ROOT / "system" / "lifetime_driver.py").read_text()
        starts = re.findall(r"\bsglang_server\(", source)
        assert 1 <= len(starts) <= 2, (name, starts)
