"""NumPy ``out=`` paths of the ops that build a transformer's attention mask: comparisons,
logic, IsNaN/IsInf, Where and Cast, written into the arena view the executor hands them
(the rules: ``ops/compiled/out_arrays.py``), and bound once per arena
(``ops/compiled/bound_calls.py``). A 2-layer BERT with hidden 64 over 8 tokens runs ten such
steps (the mask's Cast, And, Where, and each layer's IsNaN and two Where): with no ``out=``
each allocated its result and took the kernel's full route, 3-6 us a step of a 0.2 ms run.

They apply to NumPy's own dtypes only (bool, the integers, float16/32/64): there the ufunc
(or ``copyto``) into ``out`` is the generic kernel's arithmetic, bit for bit. Narrow floats,
strings and the saturating or rounding casts keep the generic kernels, whose result is copied
into ``out``.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled.bound_calls import binds
from mixrt.ops.compiled.out_arrays import into
from mixrt.ops.elementwise import cast as cast_ops
from mixrt.ops.elementwise import elementwise
from mixrt.ops.elementwise.cast import target_dtype
from mixrt.ops.elementwise.elementwise import quiet

PLAIN = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64))
FLOATS = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _plain(*arrays, dtypes=PLAIN) -> bool:
    """NumPy arrays, each of one of ``dtypes``, the operands sharing one dtype."""
    first = arrays[0]
    return all(isinstance(a, np.ndarray) and a.dtype == first.dtype for a in arrays) \
        and first.dtype in dtypes


def _ufunc_form(generic, ufunc, arity, dtypes=PLAIN, result_dtype=None):
    """``generic``'s ``out=`` path and binder as ``ufunc`` into ``out`` (NumPy's ufuncs read
    operands that overlap ``out`` correctly, so an input may share its memory)."""
    def writes(args, out):
        return out is not None and _plain(*args, dtypes=dtypes) and isinstance(out, np.ndarray) \
            and out.dtype == (result_dtype or args[0].dtype)

    def fast(xp, *args, out=None):
        if not writes(args, out):
            return into(out, generic(xp, *args))
        with quiet(np):
            return ufunc(*args, out=out)
    fast.__name__ = f"{generic.__name__}_cpu"

    @binds(fast, feeds=True)  # inside a run, whose NumPy error state is quiet already
    def bind(args, out, attributes):
        if not writes(args, out):
            return None
        if arity == 1:
            return lambda X: ufunc(X, out=out)
        return lambda A, B: ufunc(A, B, out=out)
    generic.fast("cpu")(fast)
    return fast


BOOL = np.dtype(np.bool_)
for _name, _ufunc in (("equal", np.equal), ("less", np.less), ("greater", np.greater),
                      ("less_or_equal", np.less_equal),
                      ("greater_or_equal", np.greater_equal)):
    _ufunc_form(getattr(elementwise, _name), _ufunc, 2, result_dtype=BOOL)
for _name, _ufunc in (("and_", np.logical_and), ("or_", np.logical_or),
                      ("xor", np.logical_xor)):
    _ufunc_form(getattr(elementwise, _name), _ufunc, 2, dtypes={BOOL}, result_dtype=BOOL)
_ufunc_form(elementwise.not_, np.logical_not, 1, dtypes={BOOL}, result_dtype=BOOL)
_ufunc_form(elementwise.isnan, np.isnan, 1, dtypes=FLOATS, result_dtype=BOOL)


@elementwise.isinf.fast("cpu")
def isinf_cpu(xp, X, *, detect_negative=1, detect_positive=1, out=None):
    if out is None or not _isinf_plain(X, out, detect_negative, detect_positive):
        return into(out, elementwise.isinf(xp, X, detect_negative=detect_negative,
                                           detect_positive=detect_positive))
    return np.isinf(X, out=out)


def _isinf_plain(X, out, detect_negative=1, detect_positive=1) -> bool:
    return bool(detect_negative and detect_positive) and _plain(X, dtypes=FLOATS) \
        and isinstance(out, np.ndarray) and out.dtype == BOOL


@binds(isinf_cpu, feeds=True)
def _bind_isinf(args, out, attributes):
    if not _isinf_plain(args[0], out, attributes.get("detect_negative", 1),
                        attributes.get("detect_positive", 1)):
        return None
    return lambda X: np.isinf(X, out=out)


# -- Where ----------------------------------------------------------------------------------------

def _where_writes(condition, X, Y, out) -> bool:
    """Two copies into ``out`` give ``where``'s values where neither the condition nor X
    shares ``out``'s memory (Y may: it is copied first). Where is not written in place
    (its registration declares no IN_PLACE memory), so this holds in planned runs."""
    return isinstance(out, np.ndarray) and isinstance(condition, np.ndarray) \
        and condition.dtype == BOOL and _plain(X, Y) and out.dtype == X.dtype \
        and not np.may_share_memory(out, X) and not np.may_share_memory(out, condition)


@elementwise.where.fast("cpu")
def where_cpu(xp, condition, X, Y, *, out=None):
    if out is None or not _where_writes(condition, X, Y, out):
        return into(out, elementwise.where(xp, condition, X, Y))
    np.copyto(out, Y)
    np.copyto(out, X, where=condition)
    return out


@binds(where_cpu, feeds=True)
def _bind_where(args, out, attributes):
    if not _where_writes(*args, out):
        return None
    copyto = np.copyto

    def call(condition, X, Y):
        copyto(out, Y)
        copyto(out, X, where=condition)
        return out
    return call


# -- Cast -----------------------------------------------------------------------------------------

def _cast_form(generic):
    """Cast between NumPy's own dtypes is ``astype`` (``cast.cast_array``), which is the cast
    ``copyto`` makes; the other casts (strings, narrow floats, saturation, float8e8m0's
    rounding) keep the generic kernel."""
    def fast(xp, input, *, out=None, **attributes):
        if out is None or not _cast_plain(input, out, attributes):
            return into(out, generic(xp, input, **attributes))
        with quiet(np):
            np.copyto(out, input, casting="unsafe")
        return out
    fast.__name__ = f"{generic.__name__}_cpu"

    @binds(fast, feeds=True)  # inside a run, whose NumPy error state is quiet already
    def bind(args, out, attributes):
        if not _cast_plain(args[0], out, attributes):
            return None
        copyto = np.copyto

        def call(input):
            copyto(out, input, casting="unsafe")
            return out
        return call
    generic.fast("cpu")(fast)


def _cast_plain(input, out, attributes) -> bool:
    to = attributes.get("to")
    return to is not None and isinstance(input, np.ndarray) and isinstance(out, np.ndarray) \
        and input.dtype in PLAIN and out.dtype in PLAIN and out.dtype == target_dtype(to) \
        and not np.may_share_memory(out, input)


for _kernel in (cast_ops.cast, cast_ops.cast_9, cast_ops.cast_19, cast_ops.cast_24):
    _cast_form(_kernel)
