"""The dense products' bound calls (``ops/compiled/bound_calls.py``) where their kernels take the
BLAS: MatMul, FusedMatMul, Gemm and FusedGemm.

Below the packed panels' reach (``matmul_cpu.PANEL_MIN_WORK`` multiply-adds) a product is
NumPy's ``matmul`` into the arena's view plus NumPy's bias add, and the kernels spent
longer choosing that route than running it: a 2-layer BERT's 16 x 64 @ 64 x 64 layers took
8-14 us a call of which the product was ~2. Each binder asks the kernel's own questions, in
its order, once, and binds only where the answer is such a route (a panel product is bound
through its replay instead, ``bound_calls.binds_replay``); the bound call then makes the same
NumPy calls on the same operands, so it computes the very same bits.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.settings import batch_invariant
from mixrt.ops.compiled.out_arrays import native
from mixrt.ops.compiled.bound_calls import binds, padded, replay_binder
from mixrt.ops.compiled.workspace import packed
from mixrt.ops.conv.direct_forms import layer_limits
from mixrt.ops.nn import row_kernels
from mixrt.ops.nn import matmul_cpu as products
from mixrt.ops.elementwise import jit_elementwise
from mixrt.ops.nn.fused import (_activation, _aliases, add_and_activate_cpu, compiled_epilogue,
                                gemm_terms)
from mixrt.ops.nn.fused_cpu import (_TINY_ACTIVATIONS, _one_row_layer, _tiny_layer,
                                    fused_gemm_cpu, fused_mat_mul_cpu, tiny_layer_call,
                                    tiny_layer_suits)
from mixrt.ops.nn.nn_cpu import gemm_cpu, mat_mul_cpu


def _blas_product(A, B, out):
    """The call ``dense_product`` comes to for these arrays when it is NumPy's product
    (``product(A, B)``), else None: the panels, the stacked panels and the transposed
    few-rows form are routes of their own."""
    if B.ndim == 2 and B.size < products.MIN_WEIGHT \
            and A.size * B.shape[1] < products.PANEL_MIN_WORK and not products.streamed(B):
        return _stacked(A, B, out)
    if products.panels_suit(A, B, out, None) or products.stacks_suit(A, B, out) \
            or products.suits(A, B):
        return None
    return _stacked(A, B, out)


def _product(kernel, args, out, attributes) -> tuple:
    """What ``dense_product`` comes to for ``kernel``'s A and B: (the bound call through
    the kernel's replay, None) for the packed panels against a constant weight, else
    (None, NumPy's product as a call, or None where it takes another route)."""
    A, B = args[0], args[1]
    prepacked = attributes.get("_prepacked")
    if prepacked is not None and products.panels_suit(A, B, out, prepacked):
        return replay_binder(kernel)(args, out, attributes), None
    return None, _blas_product(A, B, out) or _few_rows(A, B, out, prepacked)


def _few_rows(A, B, out, prepacked, B_rows=None):
    """``product_into`` against a constant weight as a call (its compiled loop for up to
    eight rows, its transposed product for more) where ``dense_product`` takes it for these
    arrays; else None. Unbound, a BERT layer's 8 x 256 @ 256 x 256 took ~140 us a run in a
    session on an AMD EPYC Zen 3 (the loop ~35 of it), where onnxruntime's took ~40."""
    if prepacked is None and B_rows is None or not out.flags.c_contiguous \
            or products.stacks_suit(A, B, out) or not products.suits(A, B) \
            or np.may_share_memory(out, A):
        return None
    rows = (-1, A.shape[-1])
    a = A.reshape(rows)
    if B_rows is None:
        B_rows = packed(prepacked, "rows_of_transpose", lambda: np.ascontiguousarray(B.T))
    target = out.reshape(a.shape[0], B_rows.shape[0])
    if row_kernels.few_rows_suits(a, B_rows, target):
        call = row_kernels.few_rows_call(a.shape, B_rows, target)
    else:
        call = products.transposed_call(a.shape, B_rows, target)
    return lambda A, B: call(A.reshape(rows))


def _panel_layer(A, B, bias, out, attributes, Z=None):
    """A fused layer's panel product, the bias folded into its tiles where it is one
    contiguous value per column (and with it an activation the tiles apply, where no
    residual ``Z`` comes between), then the residual and the activation, as the fused
    kernels make them; for a layer whose product kept no replay (a bias that is not a
    constant, an epilogue that is not the product's). None where the panels do not take
    the product."""
    prepacked = attributes.get("_prepacked")
    if prepacked is None or not products.panels_suit(A, B, out, prepacked):
        return None
    activation, params = attributes.get("activation", ""), attributes.get("activation_params")
    folded = bias is not None and bias.ndim == 1 and bias.dtype == A.dtype \
        and bias.flags.c_contiguous and bias.shape[0] == B.shape[1]
    limits = layer_limits(activation, params, A.dtype) \
        if folded and Z is None else None
    product = products.panel_call(A, B, prepacked, bias if folded else None, limits)
    if folded and Z is None and (limits is not None or not activation):
        def whole(A, B, bias=None, Z=None):  # the product is the layer
            product(A, out)
            return out
        return whole
    finish = _bound_epilogue(out, activation, params)

    def call(A, B, bias=None, Z=None):  # FusedGemm's C comes as the bias; its B is packed
        product(A, out)
        return finish(None if folded else bias, Z)
    return call


def _numpy_epilogue(activation, params):
    """``finish(out, C)``: out += C, then the activation in place, by NumPy's calls."""
    finish = _activation(activation, params)

    def epilogue(out, C):
        if C is not None:
            out += C
        return finish(np, out)
    return epilogue


def _bound_epilogue(out, activation, params):
    """``finish(bias, Z)``: ``add_and_activate_cpu`` on ``out``, which a bound call's first
    call binds as one compiled pass over out, the bias and Z (the same arrays on every call
    of a bound step) where it is one, and later calls just make. Through
    ``add_and_activate_cpu`` a scikit-learn MLP's 64 x 64 bias and Relu took ~8 us of
    dispatch, the pass ~1."""
    bound = None  # the pass, or False where it is not one

    def finish(bias, Z):
        nonlocal bound
        if bound:
            bound()
            return out
        if bound is None:
            bound = compiled_epilogue(out, bias, Z, activation, params) or False
            if bound:  # done as it was bound
                return out
        return add_and_activate_cpu(out, bias, Z, activation, params)
    return finish


def _stacked(A, B, out):
    """``stacked_product`` as a call: one product over A's merged rows where it merges."""
    if A.ndim > 2 and B.ndim == 2 and A.flags.c_contiguous and out.flags.c_contiguous \
            and out.shape == A.shape[:-1] + B.shape[1:]:
        rows = (-1, A.shape[-1])
        target = out.reshape(-1, B.shape[1])
        return lambda A, B: np.matmul(A.reshape(rows), B, out=target)
    return lambda A, B: np.matmul(A, B, out=out)


# A, the activation, read as given by every route below (a model's first layer reads the
# feed: a scikit-learn MLP at 4 rows spent 9 of its 24 us in that layer's unbound route)
@binds(mat_mul_cpu, feeds=(0,))
def bind_mat_mul(args, out, attributes):
    A, B = args
    if not native(A, B, out):
        return None
    if products.one_row_blas(A, B, out):
        return lambda A, B: np.matmul(A, B, out=out)
    replayed, product = _product(mat_mul_cpu, args, out, attributes)
    if product is None:
        return replayed

    def call(A, B):
        product(A, B)
        return out
    return call


@binds(fused_mat_mul_cpu, feeds=(0,))
def bind_fused_mat_mul(args, out, attributes):
    A, B, bias, Z = padded(args, 4)
    activation = attributes.get("activation", "")
    params = attributes.get("activation_params")
    if Z is None and activation in _TINY_ACTIVATIONS and B.ndim == 2 \
            and tiny_layer_suits(A, B) and out.dtype == A.dtype == B.dtype \
            and not batch_invariant():
        return tiny_layer_call(A, B, bias, activation, out) \
            or (lambda A, B, bias=None: _tiny_layer(A, B, bias, activation, out))
    if not activation and products.one_row_blas(A, B, out):
        return lambda *args: _one_row_layer(*padded(args, 4), out)
    if _aliases(np, out, A, B, bias, Z) or not out.dtype == A.dtype == B.dtype:
        return None
    replayed, product = _product(fused_mat_mul_cpu, args, out, attributes)
    if product is None:
        return replayed or _panel_layer(A, B, bias, out, attributes, Z)
    if activation:
        finish = _bound_epilogue(out, activation, params)

        def call(A, B, bias=None, Z=None):
            product(A, B)
            return finish(bias, Z)
        return call

    def call(A, B, bias=None, Z=None):
        product(A, B)
        if bias is not None:
            np.add(out, bias, out=out)
        if Z is not None:
            np.add(out, Z, out=out)
        return out
    return call


def _gemm_terms(alpha: float, beta: float):
    """Gemm's ``out = alpha * out + beta * C`` after the product, as ``gemm_cpu`` applies
    them (in place, in that order)."""
    def finish(out, C):
        if alpha != 1.0:
            out *= out.dtype.type(alpha)
        if C is not None and beta != 0.0:
            out += C if beta == 1.0 else C * C.dtype.type(beta)
        return out
    return finish


# as for MatMul: every route below reads A as given (a scikit-learn or PyTorch MLP's first
# Linear reads the feed: unbound, a 24 -> 307 FusedGemm at 3 rows took ~20 us of route a
# run, a third of a 5-layer MLP's)
@binds(gemm_cpu, feeds=(0,))
def bind_gemm(args, out, attributes):
    A, B, C = padded(args, 3)
    transA, transB = attributes.get("transA", 0), attributes.get("transB", 0)
    if not native(A, B, C, out) or (C is not None and np.may_share_memory(out, C)):
        return replay_binder(gemm_cpu)(args, out, attributes)
    finish = _gemm_terms(attributes.get("alpha", 1.0), attributes.get("beta", 1.0))
    if not products.small_one_row(A, B, transA, transB, out):
        return replay_binder(gemm_cpu)(args, out, attributes) \
            or _blas_gemm(A, B, transA, transB, out, attributes, finish)

    def call(A, B, C=None):  # a decoder step's or a classifier's one row: the BLAS's gemv
        np.matmul(A, B.T if transB else B, out=out)
        return finish(out, C)
    return call


def _blas_gemm(A, B, transA, transB, out, attributes, finish):
    """Gemm's call where ``gemm_product`` comes to NumPy's product (a few rows of a small
    layer, below the panels and the few-rows form: GPT-2 h64's eight 8 x 64 @ 64 x 192
    layers a token step, ~2 us of route each) or to its few-rows form (GPT-2 h256's
    Conv1D layers over 8 tokens, 300-400 us a layer unbound on an AMD EPYC Zen 3), else
    None."""
    left, right = A.T if transA else A, B.T if transB else B
    prepacked = attributes.get("_prepacked")
    if products.panels_suit(left, right, out, prepacked):
        return None
    if products.suits(left, right):  # gemm_product's few-rows form, B's rows where it has them
        product = _few_rows(left, right, out, prepacked,
                            B if transB and B.flags.c_contiguous else None)
        if product is None:
            return None

        def few(A, B, C=None):
            product(A.T if transA else A, None)
            return finish(out, C)
        return few

    def call(A, B, C=None):
        np.matmul(A.T if transA else A, B.T if transB else B, out=out)
        return finish(out, C)
    return call


def _fused_gemm_terms(alpha, beta, activation, params, out):
    """FusedGemm's ``alpha``/``beta`` terms and its activation after the product, as
    ``fused_gemm_cpu`` applies them (``gemm_terms``, then ``add_and_activate_cpu``); with
    alpha and beta 1 (a Linear layer), its bias and activation as one compiled pass over
    ``out``, bound on the first call (a 24 -> 307 layer with Relu at 3 rows: 12.9 -> 8.8 us a
    run, ~4 us of add_and_activate_cpu's dispatch and a replay's reshapes, 2026-11-28); under
    256 values, NumPy's calls as the kernel makes them there."""
    if alpha == 1.0 and beta == 1.0:
        if out.size < jit_elementwise.JIT_MIN_ELEMENTS // jit_elementwise.COSTLY_DIVISOR:
            # NumPy's calls, as add_and_activate_cpu makes them at this size (the same
            # bits as the unbound kernel's), the activation looked up once
            return _numpy_epilogue(activation, params)
        epilogue = _bound_epilogue(out, activation, params)
        return lambda out, C: epilogue(C, None)

    def finish(out, C):
        y, C = gemm_terms(out, C, alpha, beta)
        return add_and_activate_cpu(y, C, None, activation, params)
    return finish


@binds(fused_gemm_cpu, feeds=(0,))
def bind_fused_gemm(args, out, attributes):
    A, B, C = padded(args, 3)
    transA, transB = attributes.get("transA", 0), attributes.get("transB", 0)
    alpha, beta = attributes.get("alpha", 1.0), attributes.get("beta", 1.0)
    activation = attributes.get("activation", "")
    params = attributes.get("activation_params")
    if _aliases(np, out, A, B, C) or not A.dtype == B.dtype == out.dtype \
            or (alpha == 1.0 and beta == 1.0 and C is not None and not transA
                and products.panels_suit(A, B.T if transB else B, out,
                                         attributes.get("_prepacked"))):
        return replay_binder(fused_gemm_cpu)(args, out, attributes) \
            or _panel_layer(A, B.T if transB else B, C, out, attributes)
    if not products.small_one_row(A, B, transA, transB, out):
        # a few rows under the panels' reach (a classifier's MLP at a small batch): the
        # product gemm_product comes to, then the terms and the activation as the kernel
        # applies them; unbound, each of an MLP's 3-row layers took its route every run
        return _blas_gemm(A, B, transA, transB, out, attributes,
                          _fused_gemm_terms(alpha, beta, activation, params, out))
    finish = _fused_gemm_terms(alpha, beta, activation, params, out)

    def call(A, B, C=None):  # as fused_gemm_cpu's gemm_product comes to for one row
        return finish(np.matmul(A, B.T if transB else B, out=out), C)
    return call
