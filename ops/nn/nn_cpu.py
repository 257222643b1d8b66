"""NumPy ``out=`` paths of the dense layers: MatMul and Gemm (through the packed-panel
products of ``matmul_cpu.py``), inference BatchNormalization as one multiply and one add,
Softmax over rows split between the intra-op threads, LayerNormalization in one compiled loop
per row. They write into the arena view the executor hands them (the rules:
``ops/compiled/out_arrays.py``). Signatures are the generic kernels' plus ``out``.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.compiled.bound_calls import binds, binds_replay, padded
from mixrt.ops.ir.registry import CONSTANT_INPUTS
from mixrt.ops.nn import row_kernels
from mixrt.ops.compiled.out_arrays import into, native
from mixrt.ops.compiled.parallel import parallel_rows
from mixrt.ops.elementwise.row_blocks import same_view
from mixrt.ops.nn import matmul_cpu as few_rows
from mixrt.ops.nn.norm import batch_normalization, batch_normalization_9, layer_normalization
from mixrt.ops.nn.nn import gemm, mat_mul, softmax, softmax_coerced


@mat_mul.fast("cpu")
def mat_mul_cpu(xp, A, B, *, out=None, _prepacked=None):
    """A product against a constant weight through the panels is kept as the node's
    replay (``ops/compiled/replay.py``)."""
    if out is None:
        out = few_rows.graph_output(A, B)
    arrays = (A, B, out)
    if out is not None and replay.replayed(_prepacked, arrays):
        return out
    if out is not None and few_rows.rows_route(_prepacked, A, B, None, out, arrays):
        return out  # the node's panel product at a new number of rows
    if out is None or not native(A, B, out):
        return into(out, mat_mul(xp, A, B))
    if few_rows.one_row_blas(A, B, out):  # a decoder step's: straight to the BLAS
        return np.matmul(A, B, out=out)
    return few_rows.dense_product(A, B, out, _prepacked, _prepacked, arrays)


@gemm.fast("cpu")
def gemm_cpu(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, out=None,
             _prepacked=None):
    """A product with a constant bias through the panels is kept as the node's replay
    (``ops/compiled/replay.py``), and at a new number of rows takes its rows route
    (``matmul_cpu.RowsRoute``: a GPT-2's products spent ~45 us a call choosing their
    panels again at each new length, 2026-11-29)."""
    if out is None and native(A, B, C) and A.ndim == B.ndim == 2:
        out = few_rows.graph_output(A, B, transA, transB)
    arrays = (A, B, C, out)
    if out is not None and replay.replayed(_prepacked, arrays):
        return out
    if out is not None and not transA and alpha == 1.0 and beta == 1.0 and C is not None \
            and few_rows.rows_route(_prepacked, A, B, C, out, arrays):
        return out  # the node's biased panel product at a new number of rows
    if out is None or not native(A, B, C, out) or (C is not None
                                                    and np.may_share_memory(out, C)):
        return into(out, gemm(xp, A, B, C, alpha=alpha, beta=beta, transA=transA,
                               transB=transB))
    if few_rows.small_one_row(A, B, transA, transB, out):
        # what gemm_product comes to for it, without the panels' and few rows' checks that
        # cannot pass (~1.5 us of a decoder step's ~13 us Gemm, sixteen a GPT-2 step)
        np.matmul(A, B.T if transB else B, out=out)
    elif alpha == 1.0 and beta == 1.0 and few_rows.biased_gemm_product(
            A, B, C, transA, transB, out, _prepacked, constant_bias(_prepacked, 2), arrays):
        return out
    else:
        few_rows.gemm_product(A, B, transA, transB, out, _prepacked)
    if alpha != 1.0:
        out *= out.dtype.type(alpha)
    if C is not None and beta != 0.0:
        out += C if beta == 1.0 else C * C.dtype.type(beta)
    return out


def constant_bias(prepacked, index: int):
    """``prepacked`` where input ``index`` (a bias) is a constant of the session, else None:
    a replay holds the bias it was recorded with, so only a constant one may be kept."""
    return prepacked if prepacked is not None \
        and index in prepacked.get(CONSTANT_INPUTS, ()) else None


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
            or not native(X, scale, B, input_mean, input_var, out):
        result = batch_normalization(xp, X, scale, B, input_mean, input_var, epsilon=epsilon,
                                     momentum=momentum, training_mode=training_mode,
                                     _outputs=_outputs)
        if out is None or isinstance(result, tuple):
            return result
        return into(out, result)
    return _batch_norm_into(X, scale, B, input_mean, input_var, epsilon, out)


@batch_normalization_9.fast("cpu")
def batch_normalization_9_cpu(xp, X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9,
                              _outputs=1, out=None):
    if out is None or _outputs != 1 or not native(X, scale, B, mean, var, out):
        result = batch_normalization_9(xp, X, scale, B, mean, var, epsilon=epsilon,
                                       momentum=momentum, _outputs=_outputs)
        if out is None or isinstance(result, tuple):
            return result
        return into(out, result)
    return _batch_norm_into(X, scale, B, mean, var, epsilon, out)


@softmax.fast("cpu")
def softmax_cpu(xp, input, *, axis=-1, out=None):
    """Softmax over ``axis``, on the rows of a 2-D view when every axis after it has size 1
    (the last axis in most models; a classifier's (N, C, 1, 1) scores over axis 1), else the
    generic kernel."""
    if input.ndim == 2 and input.size <= SMALL_SOFTMAX and axis in (-1, 1) \
            and _small_rows_suit(input, out):
        return _small_softmax(input, out)
    if input.ndim == 0 or math.prod(input.shape[axis % input.ndim + 1:]) != 1:
        return into(out, softmax(xp, input, axis=axis))
    return _softmax_rows(xp, input, input.shape[axis], out, lambda: softmax(xp, input, axis=axis))


# elements of a 2-D softmax over its rows computed in one compiled call with nothing else
# asked: a classifier's (1, 10) scores took ~7 us, of which the checks and the split that
# serve a transformer's scores were most
SMALL_SOFTMAX = 1 << 12


def _small_rows_suit(input, out) -> bool:
    """A contiguous native float ``input``, and ``out`` (when given) of its shape and dtype,
    contiguous, apart from it or the very same view."""
    if input.dtype not in row_kernels.NATIVE or not input.flags.c_contiguous:
        return False
    if out is not None and (out.shape != input.shape or out.dtype != input.dtype
                            or not out.flags.c_contiguous or (
                                np.may_share_memory(out, input)
                                and not same_view(out, input))):
        return False
    return jit_cpu.enabled()


def _small_softmax(input, out):
    target = np.empty_like(input) if out is None else out
    jit_cpu.load(row_kernels.ROW_KERNELS).softmax_small(
        input.reshape(-1), target.reshape(-1), input.shape[0], input.shape[1])
    return target


@softmax_coerced.fast("cpu")
def softmax_coerced_cpu(xp, input, *, axis=1, out=None):
    """Opset 1-12's Softmax: over the axes from ``axis`` on, flattened into one, which are the
    rows of a 2-D view of a contiguous input."""
    if input.ndim == 0:
        return into(out, softmax_coerced(xp, input, axis=axis))
    return _softmax_rows(xp, input, math.prod(input.shape[axis % input.ndim:]), out,
                         lambda: softmax_coerced(xp, input, axis=axis))


# elements from which the vector softmax rows are split over the intra-op threads: on the AMD
# EPYC Zen 3 (2 threads) the split through Python threads took (2, 4, 128, 128) 153 -> 412 us
# and (2, 12, 128, 128) 447 -> 1064, and drew even only at (8, 12, 128, 128), 1.6M elements
# (2026-11-25)
SOFTMAX_SPLIT = 1 << 21


def _softmax_rows(xp, input, width, out, generic):
    """Softmax of the rows of ``width`` of ``input`` into ``out`` (made here when None): the
    vector rows of ``row_kernels.softmax_rows``, split over the intra-op threads only from
    SOFTMAX_SPLIT elements; else NumPy's passes over parts of rows. One compiled call also
    beats NumPy's reductions over several axes on small inputs: SqueezeNet's final (1, 1000,
    1, 1) took ~75 us inside a run (caches cold after the last convolution), 11 alone.
    Computing in place over ``input`` is safe: each row's max is taken before the row is
    overwritten."""
    if out is None and native(input):
        out = np.empty_like(input)
    if out is None or not native(input, out) or input.size == 0 or width == 0 or (
            np.may_share_memory(out, input) and not same_view(out, input)) or (
            not out.flags.c_contiguous):  # a reshape of it could be a copy, losing the writes
        return into(out, generic())
    rows = input.reshape(-1, width)
    target = out.reshape(rows.shape)
    if row_kernels.softmax_suits(rows, target):
        if rows.size < SOFTMAX_SPLIT:
            row_kernels.softmax_rows(rows, target, 0, rows.shape[0])
        else:
            parallel_rows(rows.shape[0], rows.shape[1],
                          lambda start, stop: row_kernels.softmax_rows(rows, target, start, stop))
        return out

    def part(start, stop):
        x, y = rows[start:stop], target[start:stop]
        np.subtract(x, x.max(axis=1, keepdims=True), out=y)
        np.exp(y, out=y)
        y /= y.sum(axis=1, keepdims=True)
    parallel_rows(rows.shape[0], rows.shape[1], part)
    return out


@layer_normalization.fast("cpu")
def layer_normalization_cpu(xp, X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1,
                            _outputs=1, out=None, _node=None):
    """float32 statistics over the trailing axes: one compiled loop per row
    (ops/compiled/jit_cpu.py, 8x the NumPy passes on the BERT encoder's 128x768), kept as
    the node's replay (``ops/compiled/replay.py``: its checks were ~2 of a decoder step's
    ~3 us), else five NumPy passes over X with no temporaries of its size: mean, centre
    into ``out``, sum of squares (einsum, no squared copy), scale by the inverse deviation,
    then the affine step."""
    arrays = (X, Scale, B, out)
    if out is not None and replay.replayed(_node, arrays):
        return out
    if out is not None and _outputs == 1 and stash_type == 1 \
            and row_kernels.layer_norm_suits(X, Scale, B, out):
        again = row_kernels.layer_norm(X, Scale, B, out, axis % X.ndim, epsilon)
        if again is not None:
            replay.record(_node, arrays, again, silent=True)
            return out
    if out is None and _outputs == 1 and stash_type == 1 and X.__class__ is np.ndarray:
        made = _layer_norm_made(X, Scale, B, axis, epsilon)
        if made is not None:
            return made
    if out is None or _outputs != 1 or stash_type != 1 or X.dtype != np.float32 \
            or not native(X, Scale, B, out) or np.may_share_memory(out, X):
        result = layer_normalization(xp, X, Scale, B, axis=axis, epsilon=epsilon,
                                     stash_type=stash_type, _outputs=_outputs)
        return result if out is None or isinstance(result, tuple) else into(out, result)
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


def _layer_norm_made(X, Scale, B, axis: int, epsilon: float):
    """The compiled row loop into an output made here, where the plan gives none (a graph
    output: a BERT encoder's last LayerNormalization writes its last hidden state), or None
    where that loop does not take these arrays. On NumPy's five passes such a node took 282
    us of a (2, 120, 448) state against 56 (2026-12-01), on every run."""
    if not row_kernels.layer_norm_suits(X, Scale, B, X):  # (X stands in for the output)
        return None
    made = np.empty(X.shape, X.dtype)
    return made if row_kernels.layer_norm(X, Scale, B, made, axis % X.ndim, epsilon) \
        is not None else None


# their planned calls, bound once per arena (ops/compiled/bound_calls.py): the recorded replays
binds_replay(mat_mul_cpu, lambda args, out: (args[0], args[1], out), "_prepacked")
binds_replay(gemm_cpu, lambda args, out: padded(args, 3) + (out,), "_prepacked")
binds_replay(layer_normalization_cpu, lambda args, out: padded(args, 3) + (out,))


@binds(softmax_cpu, feeds=True)
def bind_softmax(args, out, attributes):
    """Softmax over the last axis (or one before trailing ones) in one part of rows: the
    compiled row kernels on the rows as ``softmax_cpu`` calls them, without its checks."""
    (input,), axis = args, attributes.get("axis", -1)
    if input.ndim == 2 and input.size <= SMALL_SOFTMAX and axis in (-1, 1) \
            and _small_rows_suit(input, out):
        return lambda input: _small_softmax(input, out)
    if input.ndim == 0 or math.prod(input.shape[axis % input.ndim + 1:]) != 1 \
            or not native(input, out) or input.size == 0 or not out.flags.c_contiguous \
            or (np.may_share_memory(out, input) and not same_view(out, input)):
        return None
    width = input.shape[axis]
    shape = (input.size // width, width)
    target = out.reshape(shape)
    if not row_kernels.softmax_suits(input.reshape(shape), target) or input.size >= SOFTMAX_SPLIT:
        return None

    def call(input):
        row_kernels.softmax_rows(input.reshape(shape), target, 0, shape[0])
        return out
    return call
