"""Random inputs and scopes of ``mxnet.test_utils``: arrays and shapes drawn from NumPy's
and Python's global generators (which MXNet's tests seed), environment variables for a block,
standard error discarded for a block, and retries of randomised tests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random as rnd
import sys

import numpy as np

from mixrt.errors import InputError
from mixrt.nd import array
from mixrt.test_utils.compare import default_dtype

# -- random inputs -------------------------------------------------------------------------

def random_arrays(*shapes):
    """Standard-normal NumPy arrays of the default dtype, one per shape (an array, not a
    list, when there is one shape)."""
    arrays = [np.array(np.random.randn(), dtype=default_dtype()) if len(shape) == 0
              else np.random.randn(*shape).astype(default_dtype()) for shape in shapes]
    return arrays[0] if len(arrays) == 1 else arrays


def random_uniform_arrays(*shapes, low=0.0, high=1.0, dtype=None):
    dtype = default_dtype() if dtype is None else dtype
    # a list even for one shape, as MXNet's (its tests index [0]; random_arrays unwraps)
    return [np.random.uniform(low, high, size=shape).astype(dtype) for shape in shapes]


def random_sample(population, k):
    """``k`` distinct elements of ``population`` in random order (NumPy's generator)."""
    chosen = list(population)
    np.random.shuffle(chosen)
    return chosen[:k]


def rand_shape_2d(dim0=10, dim1=10, allow_zero_size=False):
    low = 0 if allow_zero_size else 1
    return rnd.randint(low, dim0), rnd.randint(low, dim1)


def rand_shape_3d(dim0=10, dim1=10, dim2=10, allow_zero_size=False):
    low = 0 if allow_zero_size else 1
    return rnd.randint(low, dim0), rnd.randint(low, dim1), rnd.randint(low, dim2)


def rand_shape_nd(num_dim, dim=10, allow_zero_size=False):
    """A random shape of ``num_dim`` axes, each at most ``dim`` long."""
    low = 0 if allow_zero_size else 1
    return tuple(int(n) for n in np.random.randint(low, dim + 1, size=num_dim))


def rand_ndarray(shape, stype="default", density=None, dtype=None, modifier_func=None,
                 shuffle_csr_indices=False, distribution=None, ctx=None):
    """A random NDArray: standard normal (or ``modifier_func`` of it); for a sparse
    ``stype`` a ``density`` share of the elements is kept, the rest is zero."""
    values = random_arrays(shape)
    if modifier_func is not None:
        values = np.asarray(modifier_func(values), dtype=values.dtype)
    if stype != "default":
        density = np.random.rand() if density is None else density
        values = np.where(np.random.rand(*shape) < density, values, 0).astype(values.dtype)
    result = array(values, ctx=ctx, dtype=dtype)
    return result if stype == "default" else result.tostype(stype)


# -- scopes --------------------------------------------------------------------------------

@contextlib.contextmanager
def environment(*args):
    """Environment variables set for a block and restored after it:
    ``environment("NAME", "value")`` or ``environment({"NAME": "value", ...})``; a value of
    None unsets the variable."""
    if len(args) == 2:
        wanted = {args[0]: args[1]}
    elif len(args) == 1 and isinstance(args[0], dict):
        wanted = args[0]
    else:
        raise InputError(f"environment() takes a name and a value or one dict; got {args!r}")
    saved = {name: os.environ.get(name) for name in wanted}
    _set_environment(wanted)
    try:
        yield
    finally:
        _set_environment(saved)


def _set_environment(values: dict) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)


@contextlib.contextmanager
def discard_stderr():
    """Send what is written to the process's standard error (file descriptor 2, so C
    extensions' output too) to the null device for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def retry(n):
    """Decorator: run a randomised test up to ``n`` times until it passes, re-raising the
    last AssertionError."""
    if n < 1:
        raise InputError(f"retry(n) needs n >= 1, got {n}")

    def decorate(test):
        @functools.wraps(test)
        def retried(*args, **kwargs):
            for attempt in range(n):
                try:
                    return test(*args, **kwargs)
                except AssertionError:
                    if attempt == n - 1:
                        raise
        return retried
    return decorate
