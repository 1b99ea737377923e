"""The suite's xdist scopes (test/conftest.py): system tests in two scopes, the tiny-checkpoint ones apart
(they run beside the big servers on the other worker, so they must stay light), other tests by module."""

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
    assert conftest.server_scope("test/system/test_faults.py::test_a[x]") == "tiny-servers"
    assert conftest.server_scope("test/system/test_dead_peer.py::test_b") == "tiny-servers"
    assert conftest.server_scope("test/system/test_router_pd.py::test_c") == "servers"
    assert conftest.server_scope("test/system/test_cpu_sglang_engine.py::test_d[1]") == "servers"
    assert conftest.server_scope("test/core/test_split.py::test_e") is None


def test_the_tiny_server_modules_start_only_tiny_checkpoint_servers():
    conftest = _suite_conftest()
    for name in sorted(conftest.TINY_SERVER_MODULES):
        source = (TEST_ROOT / "system" / name).read_text()
        assert "tiny_checkpoint" in source, name
        heavy = re.findall(r"\b(small_checkpoint|sglang_checkpoint|write_sglang_checkpoint|cluster)\b", source)
        assert heavy == [], (name, heavy)
