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


@contextlib.contextmanager
def np_array(active: bool = True):
    """A scope with NumPy's array semantics when ``active``; refused as ``np_shape`` is."""
    if active:
        _refuse_numpy_semantics("np_array(True)")
    yield


def set_np_shape(active) -> bool:
    """MXNet's global switch; turning NumPy's shape semantics off is a no-op (they are never
    on) and returns the previous state, False; turning them on is refused."""
    if active:
        _refuse_numpy_semantics("set_np_shape(True)")
    return False


def _refusing_decorator(kind: str):
    """MXNet's decorator ``kind`` running a function (or a class's methods) with NumPy
    semantics: here the decorated function, or the class's constructor, raises when called,
    so merely defining it (at import time, as MXNet's test modules do) still works."""
    def decorate(func_or_class):
        name = getattr(func_or_class, "__qualname__", repr(func_or_class))
        if inspect.isclass(func_or_class):
            def refused_init(self, *args, **kwargs):
                _refuse_numpy_semantics(f"{kind} on {name}")
            func_or_class.__init__ = refused_init
            return func_or_class

        @functools.wraps(func_or_class)
        def refused(*args, **kwargs):
            _refuse_numpy_semantics(f"{kind} on {name}")
        return refused
    decorate.__name__ = kind
    return decorate


use_np = _refusing_decorator("use_np")
use_np_shape = _refusing_decorator("use_np_shape")
use_np_array = _refusing_decorator("use_np_array")


__all__ = ["is_np_shape", "is_np_array", "np_shape", "np_array", "set_np_shape", "use_np",
           "use_np_shape", "use_np_array"]
