"""MXNet's switches between its legacy semantics and NumPy's (``mxnet.util``).

MXNet 1.x runs with legacy shape and array semantics unless a scope turns NumPy's on
(``np_shape``, ``use_np``); mixrt has only the legacy ones. The queries answer so, a scope
that asks for the legacy semantics is a no-op, and one that asks for NumPy's fails with a
typed error where it is entered, instead of running code under semantics it did not ask for.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from mixrt.errors import MixrtError


def is_np_shape() -> bool:
    """False: shapes follow MXNet's legacy rules (there is no NumPy-shape mode)."""
    return False


def is_np_array() -> bool:
    """False: arrays are ``mixrt.nd`` NDArrays (there is no ``mixrt.numpy``)."""
    return False


def _refuse_numpy_semantics(what: str):
    raise MixrtError(f"{what}: mixrt has MXNet's legacy shape and array semantics only, "
                     f"not NumPy's (mxnet.numpy / npx); run this code without it")


@contextlib.contextmanager
def np_shape(active: bool = True):
    """A scope with NumPy's shape semantics when ``active``; mixrt refuses that scope and
    lets the legacy one (``active=False``) through."""
    if active:
        _refuse_numpy_semantics("np_shape(True)")
    yield


def use_np(func_or_class):
    """MXNet's decorator running a function (or a class's methods) with NumPy semantics;
    here the decorated function, or the class's constructor, raises when called, so merely
    defining it (at import time) still works."""
    name = getattr(func_or_class, "__qualname__", repr(func_or_class))
    if inspect.isclass(func_or_class):
        def refused_init(self, *args, **kwargs):
            _refuse_numpy_semantics(f"use_np on {name}")
        func_or_class.__init__ = refused_init
        return func_or_class

    @functools.wraps(func_or_class)
    def refused(*args, **kwargs):
        _refuse_numpy_semantics(f"use_np on {name}")
    return refused


__all__ = ["is_np_shape", "is_np_array", "np_shape", "use_np"]
