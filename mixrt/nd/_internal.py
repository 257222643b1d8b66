"""The few of MXNet's ``nd._internal`` operators that its users and tests call directly:
the region assignments behind ``x[begin:end] = value``."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.nd.ndarray import NDArray


def _target(fn: str, lhs, out) -> NDArray:
    """``out`` (written in place) or a copy of ``lhs``."""
    if not isinstance(lhs, NDArray):
        raise InputError(f"{fn}: lhs must be an NDArray, got {type(lhs).__name__}")
    if out is None:
        return lhs.copy()
    if not isinstance(out, NDArray) or out.shape != lhs.shape:
        raise InputError(f"{fn}: out must be an NDArray of lhs's shape {lhs.shape}")
    if out is not lhs:
        out[:] = lhs
    return out


def _slice_assign(lhs, rhs, begin, end, step=(), out=None, name=None) -> NDArray:
    """``lhs`` with the region ``begin:end:step`` of its first axes set to ``rhs``."""
    return _target("_slice_assign", lhs, out).slice_assign(rhs, begin, end, step)


def _slice_assign_scalar(data, scalar=0.0, begin=(), end=(), step=(), out=None,
                         name=None) -> NDArray:
    """``data`` with the region ``begin:end:step`` set to ``scalar``."""
    return _target("_slice_assign_scalar", data, out).slice_assign_scalar(scalar, begin,
                                                                            end, step)


_crop_assign = _slice_assign
_crop_assign_scalar = _slice_assign_scalar
