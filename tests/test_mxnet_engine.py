"""MXNet's ``mx.engine`` (``mixrt/engine.py``): the bulk size, set and restored as MXNet
1.9.1 does (it answers the previous size and refuses a negative one)."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt import engine, nd
from mixrt.errors import InputError, MXNetError


def test_set_bulk_size_returns_the_previous_size():
    start = engine.set_bulk_size(5)
    assert engine.set_bulk_size(start) == 5 and engine.bulk_size() == start


def test_bulk_restores_the_size_and_results_are_unchanged():
    before = engine.bulk_size()
    with engine.bulk(10):
        assert engine.bulk_size() == 10
        x = nd.ones((10,))
        x *= 2
        x += 1
        for _ in range(20):
            x += 1
    assert engine.bulk_size() == before
    np.testing.assert_array_equal(x.asnumpy(), np.full(10, 23.0))
    with pytest.raises(ZeroDivisionError), engine.bulk(3):
        raise ZeroDivisionError
    assert engine.bulk_size() == before


@pytest.mark.parametrize("size", [-1, 2.5, "4", True])
def test_bad_sizes_are_refused(size):
    with pytest.raises(InputError, match="size"):
        engine.set_bulk_size(size)
    assert issubclass(InputError, MXNetError)
