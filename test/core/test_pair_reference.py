"""The forwards the in-process pair reference runs (test/harness/pair_reference.py): P's prefill chunks of
[0, B), then D's window [B, N)."""

import pytest

from harness.pair_reference import pair_spans


def test_spans_follow_p_chunks_then_the_window():
    assert pair_spans(1, 128, 512) == [(0, 1)]
    assert pair_spans(128, 128, 512) == [(0, 128)]
    assert pair_spans(129, 128, 512) == [(0, 1), (1, 129)]
    assert pair_spans(1000, 128, 512) == [(0, 512), (512, 872), (872, 1000)]
    assert pair_spans(4097, 128, 8192) == [(0, 3969), (3969, 4097)]


@pytest.mark.parametrize("args", [(0, 128, 512), (10, 0, 512), (10, 128, 0)])
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValueError, match="must be >= 1"):
        pair_spans(*args)
