"""Runs a session makes for itself on feeds it made up.

``Session.wait_compiled`` runs each form the session met once more at other sizes, on feeds
of zeros (``runtime/prepared_forms.py``), so that the kernels those sizes take are loaded
before a service's first requests. What a kernel learns from the values it is given must not
be learnt from those: a forest times its walks on a batch size's first calls and keeps the
fastest (``ops/ml/walk_choice.py``), and rows of zeros all take one path, on which the walk
that steps a block of rows together is fastest. Learnt there, a depth-14 decision tree's
batches of 3,000 real rows kept that walk at 415 us on one thread, where the stepped walk
takes 209.

A counter rather than a context variable: the runs may be handed to the session's runner
thread (``runtime/blas_threads.py``). A real request on another thread meanwhile is not
learnt from either, which costs it nothing but the lesson.
"""

from __future__ import annotations

import contextlib

import numpy as np

from mixrt.base.errors import InputError

_running = [0]  # made-up runs in progress in this process


def in_progress() -> bool:
    """Is a run on made-up feeds in progress?"""
    return _running[0] > 0


@contextlib.contextmanager
def made_up():
    """The block of runs on made-up feeds."""
    _running[0] += 1
    try:
        yield
    finally:
        _running[0] -= 1


def random_array(rng, dtype: np.dtype, shape: tuple, high: int = 10) -> np.ndarray:
    """Random values of ``dtype``: standard normal floats, integers from 0 below ``high``,
    booleans (``mixrt check``'s inputs, a row bucket's check)."""
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, high, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    raise InputError(f"cannot draw random inputs of dtype {dtype}; pass the inputs")
