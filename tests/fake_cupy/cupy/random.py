"""cupy.random: NumPy's generators, giving device arrays."""

import functools

import numpy as _np

from cupy._core import on_device


class _Generator:
    """A NumPy generator whose draws come back as device arrays."""

    def __init__(self, host):
        self._host = host

    def __getattr__(self, name):
        value = getattr(self._host, name)
        return on_device(value) if callable(value) else value


def RandomState(seed=None):  # noqa: N802  (CuPy's name)
    return _Generator(_np.random.RandomState(seed))


def default_rng(seed=None):
    return _Generator(_np.random.default_rng(seed))


@functools.lru_cache(maxsize=None)  # one object per name, as a module attribute is
def __getattr__(name):
    value = getattr(_np.random, name)
    if isinstance(value, type) or not callable(value):
        return value
    return on_device(value)


@on_device
def random(size=None, dtype=float):
    """CuPy's signature takes a dtype (float32 draws for a float32 Dropout); NumPy's has
    none, so the pass-through above would fail."""
    return _np.random.random(size).astype(dtype, copy=False)
