"""NumPy ``out=`` paths for the ops that carry most of a network's bytes.

The generic kernels return new arrays; these write into the output the executor hands them (a
view of the memory arena), so a planned run allocates nothing and an elementwise op can work in
place over an input whose last reader it is. Each applies only to native float32/float64
operands and otherwise calls the generic kernel and copies its result, so every registered
behaviour (integer wrap-around, narrow floats computed in float32) stays the generic one.
Signatures are the generic kernels' plus ``out``.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.elementwise.activation import relu, sigmoid, tanh
from mixrt.ops.elementwise import elementwise
from mixrt.ops.elementwise.elementwise import add, div, mul, quiet, sub, sum_
from mixrt.ops.nn.nn import (batch_normalization, batch_normalization_9, gemm, layer_normalization,
                          mat_mul, softmax, softmax_coerced)
from mixrt.ops.shape.index import scatter_elements
from mixrt.ops.ir.types import normalize_axis
from mixrt.ops.shape.shape import concat, expand, host_ints, transpose
from mixrt.ops.elementwise.fused_elementwise import same_view
from mixrt.ops.compiled.parallel import parallel_rows
from mixrt.ops.elementwise.simd_cpu import relu_
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.nn import matmul_cpu as few_rows

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def _native(*arrays) -> bool:
    """All present operands are NumPy arrays of one native float dtype (a loop: this runs
    for every node of a planned CPU run)."""
    dtype = None
    for a in arrays:
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            return False
        if dtype is None:
            dtype = a.dtype
            if dtype not in NATIVE:
                return False
        elif a.dtype != dtype:
            return False
    return dtype is not None


def _into(out, result):
    if out is None:
        return result
    np.copyto(out, result)
    return out


def _binary(generic, ufunc):
    def fast(xp, A, B, *, out=None):
        if out is None or not _native(A, B, out):
            return _into(out, generic(xp, A, B))
        return ufunc(A, B, out=out)
    fast.__name__ = f"{generic.__name__}_cpu"
    return fast


add.fast("cpu")(_binary(add, np.add))
sub.fast("cpu")(_binary(sub, np.subtract))
mul.fast("cpu")(_binary(mul, np.multiply))
div.fast("cpu")(_binary(div, np.divide))


def _unary(generic, ufunc):
    """The float unary op whose generic kernel is ``ufunc`` on native floats, into ``out``
    (allocating and then copying into the arena cost ~1 us of a small node's ~2)."""
    def fast(xp, X, *, out=None):
        if out is None or not _native(X, out):
            return _into(out, generic(xp, X))
        with quiet(np):
            return ufunc(X, out)
    fast.__name__ = f"{generic.__name__}_cpu"
    return fast


for _generic, _ufunc in (
        ("abs_", np.abs), ("neg", np.negative), ("exp", np.exp), ("log", np.log),
        ("sqrt", np.sqrt), ("reciprocal", np.reciprocal), ("floor", np.floor),
        ("ceil", np.ceil), ("sin", np.sin), ("cos", np.cos), ("tan", np.tan),
        ("asin", np.arcsin), ("acos", np.arccos), ("atan", np.arctan), ("sinh", np.sinh),
        ("cosh", np.cosh), ("asinh", np.arcsinh), ("acosh", np.arccosh),
        ("atanh", np.arctanh)):
    getattr(elementwise, _generic).fast("cpu")(_unary(getattr(elementwise, _generic), _ufunc))


@sum_.fast("cpu")
def sum_cpu(xp, *data_0, out=None):
    if out is None or not _native(*data_0, out) or len(data_0) < 2:
        return _into(out, sum_(xp, *data_0))
    # the first add may not write over an operand a later add still reads
    if any(np.may_share_memory(out, x) for x in data_0[2:]):
        return _into(out, sum_(xp, *data_0))
    np.add(data_0[0], data_0[1], out=out)
    for x in data_0[2:]:
        np.add(out, x, out=out)
    return out


@relu.fast("cpu")
def relu_cpu(xp, X, *, out=None):
    if out is None or not _native(X, out):
        return _into(out, relu(xp, X))
    return relu_(X, out)


@tanh.fast("cpu")
def tanh_cpu(xp, X, *, out=None):
    if out is None or not _native(X, out):
        return _into(out, tanh(xp, X))
    return np.tanh(X, out=out)


@sigmoid.fast("cpu")
def sigmoid_cpu(xp, X, *, out=None):
    if out is None or not _native(X, out):
        return _into(out, sigmoid(xp, X))
    # 1 / (1 + e^-x) = (1 + tanh(x / 2)) / 2: one transcendental, no overflow, in place
    np.multiply(X, X.dtype.type(0.5), out=out)
    np.tanh(out, out=out)
    out += 1
    out *= 0.5
    return out


@mat_mul.fast("cpu")
def mat_mul_cpu(xp, A, B, *, out=None, _prepacked=None):
    if out is None or not _native(A, B, out):
        return _into(out, mat_mul(xp, A, B))
    return few_rows.dense_product(A, B, out, _prepacked)


@gemm.fast("cpu")
def gemm_cpu(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None,
             _prepacked=None):
    if out is None and _native(A, B, C) and A.ndim == B.ndim == 2:
        # a graph output (the executor passes no out= for those, a classifier's logits)
        # takes the same product forms into a new array
        out = np.empty((A.shape[1 if transA else 0], B.shape[0 if transB else 1]), A.dtype)
    if out is None or not _native(A, B, C, out) or (C is not None
                                                    and np.may_share_memory(out, C)):
        return _into(out, gemm(xp, A, B, C, alpha=alpha, beta=beta, transA=transA,
                               transB=transB))
    if alpha == 1.0 and beta == 1.0 and few_rows.biased_gemm_product(
            A, B, C, transA, transB, out, _prepacked):
        return out
    few_rows.gemm_product(A, B, transA, transB, out, _prepacked)
    if alpha != 1.0:
        out *= out.dtype.type(alpha)
    if C is not None and beta != 0.0:
        out += C if beta == 1.0 else C * C.dtype.type(beta)
    return out


def _batch_norm_into(X, scale, B, mean, var, epsilon, out):
    """Inference batch norm as one multiply and one add over X (folded per channel)."""
    shape = (-1,) + (1,) * (X.ndim - 2)
    factor = scale / np.sqrt(var + X.dtype.type(epsilon))
    shift = B - mean * factor
    np.multiply(X, factor.astype(X.dtype, copy=False).reshape(shape), out=out)
    out += shift.astype(X.dtype, copy=False).reshape(shape)
    return out


@batch_normalization.fast("cpu")
def batch_normalization_cpu(xp, X, scale, B, input_mean, input_var, *, epsilon=1e-5,
                            momentum=0.9, training_mode=0, _outputs=1, out=None):
    if out is None or training_mode or _outputs != 1 \
            or not _native(X, scale, B, input_mean, input_var, out):
        result = batch_normalization(xp, X, scale, B, input_mean, input_var, epsilon=epsilon,
                                     momentum=momentum, training_mode=training_mode,
                                     _outputs=_outputs)
        if out is None or isinstance(result, tuple):
            return result
        return _into(out, result)
    return _batch_norm_into(X, scale, B, input_mean, input_var, epsilon, out)


@batch_normalization_9.fast("cpu")
def batch_normalization_9_cpu(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                              _outputs=1, out=None):
    if out is None or _outputs != 1 or not _native(X, scale, B, mean, var, out):
        result = batch_normalization_9(xp, X, scale, B, mean, var, epsilon=epsilon,
                                       momentum=momentum, _outputs=_outputs)
        if out is None or isinstance(result, tuple):
            return result
        return _into(out, result)
    return _batch_norm_into(X, scale, B, mean, var, epsilon, out)


@softmax.fast("cpu")
def softmax_cpu(xp, input, *, axis=-1, out=None):
    """Softmax over ``axis``, on the rows of a 2-D view when every axis after it has size 1
    (the last axis in most models; a classifier's (N, C, 1, 1) scores over axis 1), else the
    generic kernel."""
    if input.ndim == 0 or math.prod(input.shape[axis % input.ndim + 1:]) != 1:
        return _into(out, softmax(xp, input, axis=axis))
    return _softmax_rows(xp, input, input.shape[axis], out, lambda: softmax(xp, input, axis=axis))


@softmax_coerced.fast("cpu")
def softmax_coerced_cpu(xp, input, *, axis=1, out=None):
    """Opset 1-12's Softmax: over the axes from ``axis`` on, flattened into one, which are the
    rows of a 2-D view of a contiguous input."""
    if input.ndim == 0:
        return _into(out, softmax_coerced(xp, input, axis=axis))
    return _softmax_rows(xp, input, math.prod(input.shape[axis % input.ndim:]), out,
                         lambda: softmax_coerced(xp, input, axis=axis))


def _softmax_rows(xp, input, width, out, generic):
    """Softmax of the rows of ``width`` of ``input`` into ``out`` (made here when None), rows
    split over the intra-op threads: exp is heavy enough per element that two threads run it
    in about half the time (ops/compiled/parallel.py). The row max and the division are compiled
    loops (ops/compiled/jit_cpu.py; NumPy's ``max(axis=1)`` on the encoder's 128-wide rows cost twice
    its exp): BERT's (12, 128, 128) scores 250 -> 125 us on one thread. One compiled call
    also beats NumPy's reductions over several axes on small inputs: SqueezeNet's final
    (1, 1000, 1, 1) took ~75 us inside a run (caches cold after the last convolution), 11
    alone. Computing in place over ``input`` is safe: each row's max is taken before the row
    is overwritten."""
    if out is None and _native(input):
        out = np.empty_like(input)
    if out is None or not _native(input, out) or input.size == 0 or width == 0 or (
            np.may_share_memory(out, input) and not same_view(out, input)) or (
            not out.flags.c_contiguous):  # a reshape of it could be a copy, losing the writes
        return _into(out, generic())
    rows = input.reshape(-1, width)
    target = out.reshape(rows.shape)
    if jit_cpu.softmax_suits(rows, target):
        parallel_rows(rows.shape[0], rows.shape[1],
                      lambda start, stop: jit_cpu.softmax_rows(rows, target, start, stop))
        return out

    def part(start, stop):
        x, y = rows[start:stop], target[start:stop]
        np.subtract(x, x.max(axis=1, keepdims=True), out=y)
        np.exp(y, out=y)
        y /= y.sum(axis=1, keepdims=True)
    parallel_rows(rows.shape[0], rows.shape[1], part)
    return out


@expand.fast("cpu")
def expand_cpu(xp, input, shape, *, out=None):
    """One broadcasting copy into ``out``: ``np.array`` of the zero-stride view took 55 us
    for Llama's grouped key heads (1, 2, 1, 64, 64) -> (1, 2, 2, 64, 64), copyto 7."""
    target = np.broadcast_shapes(input.shape, tuple(host_ints(shape)))
    if out is None:
        out = np.empty(target, input.dtype)
    elif out.shape != target or out.dtype != input.dtype or np.may_share_memory(out, input):
        return _into(out, expand(xp, input, shape))
    np.copyto(out, np.broadcast_to(input, target))
    return out


@scatter_elements.fast("cpu")
def scatter_elements_cpu(xp, data, indices, updates, *, axis=0, reduction="none", out=None):
    """Plain ScatterElements (no reduction) as one flat assignment at linear offsets: the
    generic tuple of broadcast index grids cost ~4.5 ns an element (Faster R-CNN's RoI
    features, (150, 256, 7, 7), 8 ms a call). An index past either end raises IndexError,
    as the generic kernel's fancy assignment does."""
    if reduction != "none" or data.ndim == 0 or indices.shape != updates.shape \
            or indices.ndim != data.ndim or not isinstance(data, np.ndarray) \
            or any(n > d for n, d in zip(indices.shape, data.shape)):
        return _into(out, scatter_elements(xp, data, indices, updates, axis=axis,
                                           reduction=reduction))
    axis = normalize_axis(axis, data.ndim)
    length = data.shape[axis]
    along = indices.astype(np.int64, copy=True)
    if along.size and (along.min() < -length or along.max() >= length):
        bad = int(along.min()) if along.min() < -length else int(along.max())
        raise IndexError(f"index {bad} is out of bounds for axis {axis} of size {length}; "
                         f"expected every index within [-{length}, {length})")
    along[along < 0] += length
    strides = [int(np.prod(data.shape[i + 1:], dtype=np.int64)) for i in range(data.ndim)]
    along *= strides[axis]
    for dim, (count, stride) in enumerate(zip(indices.shape, strides)):
        if dim != axis and count > 1:
            along += (np.arange(count, dtype=np.int64) * stride).reshape(
                (1,) * dim + (count,) + (1,) * (data.ndim - dim - 1))
    result = out if out is not None and out.shape == data.shape and out.dtype == data.dtype \
        and out.flags.c_contiguous and not np.may_share_memory(out, updates) else None
    if result is None:
        result = np.array(data, order="C")
    elif result is not data:
        np.copyto(result, data)
    result.reshape(-1)[along.reshape(-1)] = updates.reshape(-1)
    return _into(out, result)


@concat.fast("cpu")
def concat_cpu(xp, *inputs, axis=None, out=None):
    if out is None or not all(isinstance(x, np.ndarray) and x.dtype == out.dtype
                              for x in inputs):
        return _into(out, concat(xp, *inputs, axis=axis))
    return np.concatenate(inputs, axis=1 if axis is None else axis, out=out)


@transpose.fast("cpu")
def transpose_cpu(xp, data, *, perm=None, out=None):
    if out is None:
        return transpose(xp, data, perm=perm)
    np.copyto(out, np.transpose(data, perm))
    return out


@layer_normalization.fast("cpu")
def layer_normalization_cpu(xp, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1,
                            _outputs=1, out=None):
    """float32 statistics over the trailing axes: one compiled loop per row (ops/compiled/jit_cpu.py,
    8x the NumPy passes on the BERT encoder's 128x768), else five NumPy passes over X with no
    temporaries of its size: mean, centre into ``out``, sum of squares (einsum, no squared
    copy), scale by the inverse deviation, then the affine step."""
    if out is not None and _outputs == 1 and stash_type == 1 \
            and jit_cpu.layer_norm_suits(X, Scale, B, out) \
            and jit_cpu.layer_norm(X, Scale, B, out, axis % X.ndim, epsilon):
        return out
    if out is None or _outputs != 1 or stash_type != 1 or X.dtype != np.float32 \
            or not _native(X, Scale, B, out) or np.may_share_memory(out, X):
        result = layer_normalization(xp, X, Scale, B, axis=axis, epsilon=epsilon,
                                     stash_type=stash_type, _outputs=_outputs)
        return result if out is None or isinstance(result, tuple) else _into(out, result)
    start = axis % X.ndim
    rows = int(np.prod(X.shape[:start], dtype=np.int64))
    flat, target = X.reshape(rows, -1), out.reshape(rows, -1)
    np.subtract(flat, flat.mean(axis=1, keepdims=True), out=target)
    variance = np.einsum("ij,ij->i", target, target) / target.shape[1]
    target *= (1.0 / np.sqrt(variance + np.float32(epsilon))).astype(np.float32)[:, None]
    out *= Scale
    if B is not None:
        out += B
    return out
