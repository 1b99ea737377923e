"""The root conftest gives back what a test module cached: every top-level lru_cache of a test module is
cleared when the module ends (the small config's cached models are gigabytes)."""

from __future__ import annotations

import functools

from conftest import clear_test_caches


@functools.lru_cache(maxsize=None)
def cached_square(x: int) -> list[int]:
    return [x * x]


def test_clear_test_caches_empties_the_caches_of_test_modules():
    cached_square(3)
    cached_square(4)
    assert cached_square.cache_info().currsize == 2
    assert clear_test_caches() >= 1
    assert cached_square.cache_info().currsize == 0
