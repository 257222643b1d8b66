"""Contexts, dtypes, tolerances and comparisons of ``mxnet.test_utils``.

Arrays may be NDArrays, NumPy or CuPy arrays; every comparison runs on the host.
"""

from __future__ import annotations

import numpy as np

from mixrt.context import Context, current_context
from mixrt.nd import NDArray

# -- contexts, dtypes and tolerances -------------------------------------------------------

_default_context: Context | None = None


def default_context() -> Context:
    """The context tests run on: the one set by :func:`set_default_context`, else the
    current one."""
    return _default_context or current_context()


def set_default_context(ctx) -> None:
    global _default_context
    _default_context = ctx


def default_dtype():
    return np.float32


def _tolerance_table(float16, float32, float64) -> dict:
    exact = {np.dtype(t): 0 for t in (np.bool_, np.int8, np.uint8, np.int32, np.uint32,
                                      np.int64, np.uint64)}
    return {np.dtype(np.float16): float16, np.dtype(np.float32): float32,
            np.dtype(np.float64): float64, **exact}


def default_rtols() -> dict:
    """The relative tolerance of a comparison by dtype (the looser operand's wins)."""
    return _tolerance_table(1e-2, 1e-4, 1e-5)


def default_atols() -> dict:
    return _tolerance_table(1e-1, 1e-3, 1e-20)


def default_numeric_eps() -> dict:
    """The finite-difference step of a numeric gradient by dtype (powers of two, so the
    step itself is exact)."""
    return {np.dtype(np.float16): 2.0 ** -6, np.dtype(np.float32): 2.0 ** -9,
            np.dtype(np.float64): 2.0 ** -14}


def get_rtol(rtol=None):
    """The tolerance of :func:`almost_equal` when none is given: MXNet's fixed default."""
    return 1e-5 if rtol is None else rtol


def get_atol(atol=None):
    return 1e-20 if atol is None else atol


def get_tols(a, b, rtol=None, atol=None) -> tuple:
    """(rtol, atol): those given, else the looser of the two operands' dtype defaults."""
    dtypes = [_dtype_of(a), _dtype_of(b)]
    if rtol is None:
        rtol = max(default_rtols().get(d, 1e-4) for d in dtypes)
    if atol is None:
        atol = max(default_atols().get(d, 1e-3) for d in dtypes)
    return rtol, atol


def effective_dtype(dat):
    """The dtype ``dat`` is computed in (mixrt computes in the array's own dtype)."""
    return dat.dtype


def _dtype_of(value) -> np.dtype:
    return np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype


def _host(value) -> np.ndarray:
    if isinstance(value, NDArray):
        return value.asnumpy()
    if type(value).__module__.split(".")[0] == "cupy":
        return value.get()
    return np.asarray(value)


# -- comparisons ---------------------------------------------------------------------------

def same(a, b) -> bool:
    """Equal shapes and exactly equal elements."""
    return np.array_equal(_host(a), _host(b))


def almost_equal(a, b, rtol=None, atol=None, equal_nan=False, use_broadcast=True) -> bool:
    """Whether ``|a - b| <= atol + rtol * |b|`` everywhere (defaults rtol 1e-5, atol 1e-20)."""
    a, b = _host(a), _host(b)
    if not use_broadcast and a.shape != b.shape:
        return False
    return bool(np.allclose(a, b, rtol=get_rtol(rtol), atol=get_atol(atol),
                            equal_nan=equal_nan))


def assert_almost_equal(a, b, rtol=None, atol=None, names=("a", "b"), equal_nan=False,
                        use_broadcast=True, mismatches=(10, 10)) -> None:
    """Raise AssertionError unless ``|a - b| <= atol + rtol * |b|`` everywhere; tolerances
    not given are the looser of the two dtypes' defaults (:func:`default_rtols`). The
    message gives the worst element, its position and the share of elements off."""
    rtol, atol = get_tols(a, b, rtol, atol)
    a_host, b_host = _host(a), _host(b)
    if not use_broadcast and a_host.shape != b_host.shape:
        raise AssertionError(f"Items are not equal: {names[0]}.shape = {a_host.shape} and "
                             f"{names[1]}.shape = {b_host.shape} are not equal")
    if _all_close(a_host, b_host, rtol, atol, equal_nan):
        return
    raise AssertionError(_mismatch_report(a_host, b_host, rtol, atol, names, equal_nan))


CHUNK = 1 << 20  # elements per pass of _all_close: its temporaries stay in the caches


def _all_close(a: np.ndarray, b: np.ndarray, rtol, atol, equal_nan) -> bool:
    """``np.allclose``, a chunk at a time where the shapes agree: MXNet's tests compare
    gradients of 512 MB, and allclose's whole-array temporaries (the difference, its
    absolute value, the tolerance, the verdicts) made each such call take seconds."""
    if a.shape != b.shape or a.size <= CHUNK:
        return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    return all(np.allclose(flat_a[i:i + CHUNK], flat_b[i:i + CHUNK], rtol=rtol, atol=atol,
                           equal_nan=equal_nan) for i in range(0, a.size, CHUNK))


def _mismatch_report(a, b, rtol, atol, names, equal_nan) -> str:
    a, b = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
    violation = np.abs(a - b) / (atol + rtol * np.abs(b))
    if equal_nan:
        violation = np.where(np.isnan(a) & np.isnan(b), 0.0, violation)
    violation = np.where(np.isnan(violation), np.inf, violation)
    worst = np.unravel_index(np.argmax(violation), violation.shape) if violation.size else ()
    share = 100.0 * np.count_nonzero(violation > 1) / max(violation.size, 1)
    return (f"\nItems are not equal:\nError {float(violation[worst]):f} exceeds tolerance "
            f"rtol={rtol:e}, atol={atol:e} (mismatch {share:f}%).\n"
            f"Location of maximum error: {tuple(int(i) for i in worst)}, "
            f"{names[0]}={float(a[worst]):.8f}, {names[1]}={float(b[worst]):.8f}\n"
            f" {names[0]}: {np.array2string(a, threshold=20)}\n"
            f" {names[1]}: {np.array2string(b, threshold=20)}")


def same_array(array1: NDArray, array2: NDArray) -> bool:
    """Whether two NDArrays share memory: a write through one shows through the other
    (tested by adding 1 to ``array1`` and taking it away again)."""
    if array1.shape != array2.shape:
        return False
    before = array2.asnumpy()
    array1 += 1
    shared = not same(array2.asnumpy(), before)
    array1 -= 1
    return shared


def assert_exception(f, exception_type, *args, **kwargs) -> None:
    """Raise AssertionError unless ``f(*args, **kwargs)`` raises ``exception_type``."""
    try:
        f(*args, **kwargs)
    except exception_type:
        return
    raise AssertionError(f"{getattr(f, '__name__', f)} did not raise "
                         f"{exception_type.__name__}")


def compare_ndarray_tuple(t1, t2, rtol=None, atol=None) -> None:
    """Compare nested tuples of arrays element by element (None matches anything)."""
    if t1 is None or t2 is None:
        return
    if isinstance(t1, (tuple, list)):
        for s1, s2 in zip(t1, t2):
            compare_ndarray_tuple(s1, s2, rtol, atol)
        return
    assert_almost_equal(t1, t2, rtol=rtol, atol=atol)


def np_reduce(dat, axis, keepdims, numpy_reduce_func):
    """Reduce ``dat`` over ``axis`` (an int, a sequence or None for all) one axis at a
    time with a NumPy function of one axis (``np.argmax`` too), keeping the reduced axes
    as length 1 when ``keepdims``."""
    axes = range(dat.ndim) if axis is None else [axis] if isinstance(axis, int) else axis
    axes = sorted(a % dat.ndim for a in axes)
    reduced = dat
    for one in reversed(axes):
        reduced = numpy_reduce_func(reduced, axis=one)
    if keepdims:
        kept = [1 if i in axes else n for i, n in enumerate(dat.shape)]
        reduced = np.reshape(reduced, kept)
    return reduced
