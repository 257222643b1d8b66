"""cupy.random: NumPy's generators, giving device arrays."""

import functools

import numpy as _np

from cupy._core import unwrap_args, unwrap_kwargs, wrap


class _Generator:
    """A NumPy generator whose draws come back as device arrays."""

    def __init__(self, host):
        self._host = host

    def __getattr__(self, name):
        value = getattr(self._host, name)
        if not callable(value):
            return value

        def method(*args, **kwargs):
            return wrap(value(*unwrap_args(args), **unwrap_kwargs(kwargs)))
        return method


def RandomState(seed=None):  # noqa: N802  (CuPy's name)
    return _Generator(_np.random.RandomState(seed))


def default_rng(seed=None):
    return _Generator(_np.random.default_rng(seed))


@functools.lru_cache(maxsize=None)  # one object per name, as a module attribute is
def __getattr__(name):
    value = getattr(_np.random, name)
    if isinstance(value, type) or not callable(value):
        return value

    def function(*args, **kwargs):
        return wrap(value(*unwrap_args(args), **unwrap_kwargs(kwargs)))
    return function
