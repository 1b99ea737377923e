"""AsymSettings: mode/window/semantics validation and their ride on ServerArgs through pickling."""

import pickle
from types import SimpleNamespace

import pytest

from sglang_asym.sglang_plugin.shared.settings import AsymSettings, attach, settings_of


def test_defaults_and_sglang_mode():
    prefill = AsymSettings("asym-prefill")
    assert (prefill.window, prefill.semantics, prefill.sglang_mode, prefill.is_prefill) == (
        128, "asym-exact-encoder", "prefill", True)
    decode = AsymSettings("asym-decode", window=64, semantics="asym")
    assert (decode.sglang_mode, decode.is_prefill) == ("decode", False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="prefill"), "AsymSettings.mode must be one of ('asym-prefill', 'asym-decode'), got 'prefill'"),
        (dict(mode="asym-decode", window=0), "AsymSettings.window must be a positive integer, got 0"),
        (dict(mode="asym-decode", window=True), "AsymSettings.window must be a positive integer, got True"),
        (dict(mode="asym-decode", semantics="exact"),
         "AsymSettings.semantics must be one of ('asym-exact-encoder', 'asym'), got 'exact'"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError) as err:
        AsymSettings(**kwargs)
    assert str(err.value) == message


def test_attach_and_pickle_round_trip():
    record = SimpleNamespace()
    assert settings_of(record) is None
    settings = AsymSettings("asym-decode", window=32, semantics="asym")
    attach(record, settings)
    assert settings_of(record) is settings
    assert pickle.loads(pickle.dumps(settings)) == settings
