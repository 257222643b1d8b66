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


def _boom():
    raise ValueError("bad value")


def test_a_failure_not_yet_raised_can_be_carried_on_then_raises_once():
    from mixrt.errors import EngineError
    from mixrt.runtime.engine import Engine
    engine = Engine(threads=1)
    source, carried = engine.new_var("source"), engine.new_var("carried")
    engine.push(_boom, writes=(source,), name="boom")
    failure = engine.failure_of(source)
    assert isinstance(failure, EngineError) and "boom" in str(failure)
    engine.inherit(failure, [carried])
    with pytest.raises(EngineError, match="boom"):
        engine.wait_to_read(carried)
    assert engine.failure_of(source) is None  # raised: nothing left to carry
    engine.wait_all()  # and not raised again here
    engine.close()
