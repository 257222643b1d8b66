"""The array class autograd hands values back in: mixrt.nd.ndarray's NDArray, which records
on autograd's tape and so builds on it. It hands its class in as it loads
(:func:`use_array_type`), so autograd never imports mixrt.nd's arrays.
"""

from __future__ import annotations

_ARRAY_TYPE: list = []


def use_array_type(array_type) -> None:
    _ARRAY_TYPE[:] = [array_type]


def new_array(raw, ctx):
    """An NDArray over ``raw`` (a NumPy or CuPy array) on ``ctx``."""
    return _ARRAY_TYPE[0](raw, ctx)
