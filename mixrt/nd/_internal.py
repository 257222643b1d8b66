"""The few of MXNet's ``nd._internal`` operators that its users and tests call directly:
the region assignments behind ``x[begin:end] = value``, the unique Zipfian candidate
sampler ``nd.contrib.rand_zipfian``'s kin, and the AdamW operators under ``nd.contrib``'s
wrappers (``_adamw_update``, ``_mp_adamw_update``, ``_multi_adamw_update``,
``_multi_mp_adamw_update``) and multi-tensor LAMB (``_multi_lamb_update``,
``_multi_mp_lamb_update``)."""

from __future__ import annotations

import numbers

from mixrt import dispatch
from mixrt.base.errors import InputError
from mixrt.context import as_context
from mixrt.nd.contrib import (_multi_adamw_update, _multi_mp_adamw_update,  # noqa: F401
                              _multi_lamb_update, _multi_mp_lamb_update,
                              adamw_update as _adamw_update,
                              mp_adamw_update as _mp_adamw_update)
from mixrt.nd.ndarray import NDArray
from mixrt.ops.ir.registry import MIXRT


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


def _sample_unique_zipfian(range_max, shape=None, ctx=None, out=None, name=None):
    """MXNet's candidate sampler: per row of ``shape`` = (batch_size, num_sampled), that
    many distinct classes in [0, range_max) drawn from the approximate Zipfian
    distribution, and how many draws each row took (both int64; ``mixrt::
    SampleUniqueZipfian``)."""
    if shape is None or len(tuple(shape)) != 2:
        raise InputError(f"_sample_unique_zipfian: shape must be (batch_size, num_sampled), "
                         f"got {shape!r}")
    if isinstance(range_max, bool) or not isinstance(range_max, numbers.Integral) or \
            range_max < 1 or int(shape[1]) > range_max:
        raise InputError(f"_sample_unique_zipfian: range_max must be an int >= num_sampled "
                         f"({shape[1]}), got {range_max!r}")
    with as_context(ctx):
        result = dispatch.invoke(MIXRT, "SampleUniqueZipfian", [],
                                 {"range_max": int(range_max),
                                  "shape": [int(d) for d in shape]}, num_outputs=2)
    if out is not None:
        for target, value in zip(out, result):
            target[:] = value
        return out
    return list(result)
