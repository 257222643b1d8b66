"""The fused products' CPU forms (FusedConv, FusedGemm, FusedMatMul), registered beside their
generic kernels in ``ops/nn/fused.py``. Signatures are the generic kernels'.

* FusedConv: a 1x1 node at a new image size through the direct form's call made from its
  kit, where the tile applies its activation (``conv_cpu.pointwise_anew``); a depthwise
  one without a residual through the compiled loop of
  ``ops/conv/jit_depthwise.py`` with its bias and activation as it stores each output; the
  direct convolution of ``ops/conv/conv_direct_cpu.py`` with the residual and a piecewise
  activation in its loop (another in a compiled pass after it); else
  ``conv_cpu.conv_bands`` with the bias, residual and activation applied to each band of
  the output right after its matmul, while it is still in cache. A call into the caller's
  ``out`` is kept as the node's replay (``ops/compiled/replay.py``).
* FusedGemm, FusedMatMul: the few-rows and packed-panel products of ``ops/nn/matmul_cpu.py``
  written into ``out``, then the epilogue in one compiled pass where it has one.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.settings import batch_invariant
from mixrt.ops.compiled import image_routes, jit_cpu, replay
from mixrt.ops.conv import one_pixel, pointwise_rows
from mixrt.ops.conv.conv_cpu import (conv_bands, depthwise_activated, direct, geometry,
                                     pointwise_anew)
from mixrt.ops.conv.conv_direct_cpu import NO_ACTIVATION, activation_limits
from mixrt.ops.conv.direct_forms import gated_limits, layer_limits
from mixrt.ops.compiled.bound_calls import binds_replay, padded
from mixrt.ops.nn import matmul_cpu as few_rows
from mixrt.ops.nn.nn_cpu import constant_bias
from mixrt.ops.nn.fused import (_aliases, _into, activate, add_and_activate_cpu,
                                compiled_activation, compiled_epilogue, fused_conv, fused_gemm, fused_mat_mul,
                                gemm_terms)


@fused_conv.fast("cpu")
def fused_conv_cpu(xp, X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, pads=None, strides=None, activation="",
                   activation_params=None, out=None, _prepacked=None, _node=None):
    """FusedConv through the CPU's direct or banded convolution (FusedConvPool's bands, in
    ``ops/conv/fused_conv_pool.py``, call it too)."""
    if out is not None and (replay.replayed(_prepacked, (X, W, B, Z, out))
                            or image_routes.ran(_prepacked, X, (W, B), Z, out, pads)):
        return out
    replay.forget(_prepacked)
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    # (None: a pass after, or a gate the direct form's parts apply)
    limits = activation_limits(activation, activation_params) or \
        gated_limits(activation, X.dtype)
    done = None if limits is None else \
        pointwise_anew(X, W, B, Z, attributes, limits, out, _prepacked)
    if done is None:
        done = _route(X, W, B, Z, attributes, activation, activation_params, out, _prepacked,
                      _node)
    image_routes.keep(_prepacked, X, (W, B), Z, out, pads)
    return done


def _route(X, W, B, Z, attributes, activation, activation_params, out, _prepacked, _node):
    """FusedConv's full route among the CPU forms (:func:`fused_conv_cpu`)."""
    group, pads = attributes["group"], attributes["pads"]
    strides, auto_pad = attributes["strides"], attributes["auto_pad"]
    if one_pixel.suits(X, W, group, pads, auto_pad, out) and not _aliases(np, out, X, W, B, Z):
        done = one_pixel.conv(X, W, B, Z, out, _conv_epilogue(activation, activation_params),
                              _prepacked)
        if done is not None:
            return done
    pointwise_rows.warm_bands(X, W, group, _prepacked)
    if pointwise_rows.suits(X, W, group, pads, strides, auto_pad, out, _prepacked) \
            and not _aliases(np, out, X, W, B, Z):
        done = _pixel_rows(X, W, B, Z, out, activation, activation_params, _prepacked)
        if done is not None:
            return done
    if _aliases(np, out, X, W, B, Z):  # out is an input's buffer: read it before writing
        return _into(np, fused_conv_cpu(np, X, W, B, Z, activation=activation,
                                        activation_params=activation_params,
                                        _prepacked=_prepacked, _node=_node, **attributes), out)
    return _banded(X, W, B, Z, attributes, (activation, activation_params), out, _prepacked,
                   _node)


def _pixel_rows(X, W, B, Z, out, activation, params, prepacked):
    """``pointwise_rows.conv``: its one compiled call where the activation is a clamp the
    call finishes its outputs with (Relu, Clip, LeakyRelu, none), else its calls with the
    activation after them or as their epilogue."""
    limits = activation_limits(activation, params)
    if limits is not None:
        done = pointwise_rows.conv(X, W, B, Z, out, None, prepacked, limits)
        if done is not None:
            return done
    gate = _hard_gate(activation, params)
    if gate is not None:  # the bands finish with it; elsewhere the forms below do
        done = pointwise_rows.conv(X, W, B, Z, out, None, prepacked, NO_ACTIVATION, gate)
        if done is not None:
            return done
    alone = Z is None and activation  # the activation alone: a compiled pass after
    done = pointwise_rows.conv(X, W, B, Z, out, _no_epilogue if alone else
                               _conv_epilogue(activation, params), prepacked)
    if done is not None and alone:
        return _activated(done, (activation, params), prepacked)
    return done


def _hard_gate(activation, params):
    """HardSigmoid or HardSwish as ``pointwise_rows.conv``'s gate (name, alpha, beta)
    (MobileNetV3's expansions end in HardSwish), else None."""
    if activation == "HardSwish":
        return activation, 1 / 6, 0.5
    if activation == "HardSigmoid" and len(params or ()) == 2:
        return activation, float(params[0]), float(params[1])
    return None


def _no_epilogue(y, bias, residual):
    """The pixel rows' epilogue where the activation runs after them (the bias is added in
    their tiles)."""


class _ConvEpilogue:
    """The one-pixel and pixel-row forms' epilogue: bias, residual, activation, in place;
    ``bind`` makes it a compiled pass over given arrays, for a replay to call."""

    def __init__(self, activation, params):
        self.activation, self.params = activation, params

    def __call__(self, y, bias, residual):
        add_and_activate_cpu(y, bias, residual, self.activation, self.params, replayed=True)

    def bind(self, y, bias, residual):
        """The epilogue over these arrays, done now; returns it as a call without arguments
        on them (their addresses, which a replay matches), or None where it is not one
        compiled pass (the epilogue then ran as :meth:`__call__`). Through
        ``add_and_activate_cpu`` a pass over EfficientNet-B0's squeeze-excite outputs (8 to
        1,152 values) took ~6.6 us of dispatch a call."""
        return compiled_epilogue(y, bias, residual, self.activation, self.params) \
            or self(y, bias, residual)


def _conv_epilogue(activation, params):
    return _ConvEpilogue(activation, params)


def _banded(X, W, B, Z, attributes, activation, out, prepacked, node):
    if Z is None:  # a depthwise one applies its bias and activation in its own loop
        done = depthwise_activated(X, W, B, attributes, activation, out, prepacked)
        if done is not None:
            return done
    found = geometry(prepacked, X, W, **attributes)
    shape = (X.shape[0], W.shape[0], *found[-1])
    if out is None:
        out = np.empty(shape, X.dtype)
    if Z is not None and tuple(Z.shape) != shape:  # a broadcast residual: add it afterwards
        conv_bands(X, W, B, out=out, prepacked=prepacked, **attributes)
        np.add(out, Z, out=out)
        return activate(np, out, *activation)
    limits = activation_limits(*activation)
    gated = None if limits is not None else gated_limits(activation[0], X.dtype)
    if gated is not None:  # HardSwish or Swish applied by the direct form's parts, in cache
        done = direct(X, W, B, Z, gated, attributes, out, prepacked, found, node)
        if done is not None:
            return done
    done = direct(X, W, B, Z, limits or NO_ACTIVATION, attributes, out, prepacked, found, node)
    if done is not None and limits is None:
        return _activated(done, activation, prepacked)
    if done is not None:
        return done
    residual = None if Z is None else Z.reshape(shape[0], shape[1], -1)
    bias = None if B is None else B.reshape(-1, 1)

    def epilogue(y, image, start, stop):
        # bias, residual and activation on the band while it is in cache
        band = None if residual is None else residual[image][:, start:stop]
        add_and_activate_cpu(y, bias, band, *activation)
    return conv_bands(X, W, None, out=out, epilogue=epilogue, prepacked=prepacked,
                      **attributes)


def _activated(out, activation: tuple, prepacked):
    """``out`` with the activation the direct convolution's tile does not apply (HardSwish,
    Sigmoid) in a pass of its own; the convolution's recorded call, when it made one,
    replays with that pass after it."""
    conv = None if prepacked is None else prepacked.get(replay.KEY)
    again = compiled_activation(out, *activation)
    if again is None:  # NumPy's, after the convolution's replay too
        add_and_activate_cpu(out, None, None, *activation)
        again = lambda array: add_and_activate_cpu(array, None, None, *activation)  # noqa: E731
    if conv is not None:
        action = conv.action
        conv.action = lambda *arrays: (action(*arrays), again(arrays[-1]))
    image_routes.then(prepacked, out, _ActivationPass(activation, {out.shape: again}))
    return out


class _ActivationPass:
    """``activation`` over an output of any size, in place, for the node's call kept for
    its image size (``ops/compiled/image_routes.py``): :func:`_activated`'s ``again`` is a
    pass over arrays of one layout, so one is kept per output shape (the last
    MAX_ACTIVATION_PASSES; ``passes`` starts with the full route's own), and a bound call of
    the kept call takes it as the full route's replay does."""

    __slots__ = ("activation", "passes")

    def __init__(self, activation: tuple, passes: dict):
        self.activation, self.passes = activation, passes

    def __call__(self, array):
        again = self.passes.get(array.shape)
        if again is not None:
            again(array)
            return
        again = compiled_activation(array, *self.activation)
        if again is None:
            add_and_activate_cpu(array, None, None, *self.activation)
            return
        if len(self.passes) >= MAX_ACTIVATION_PASSES:
            self.passes.clear()
        self.passes[array.shape] = again


MAX_ACTIVATION_PASSES = 8


@fused_gemm.fast("cpu")
def fused_gemm_cpu(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0,
                   activation="", activation_params=None, out=None, _prepacked=None):
    """FusedGemm with the product written straight into ``out`` by the few-rows or panel
    kernels where they take it (replayed as Gemm's, ``nn_cpu.gemm_cpu``)."""
    if out is None and A.ndim == B.ndim == 2:
        out = few_rows.graph_output(A, B, transA, transB)
    arrays = (A, B, C, out)
    if out is not None and replay.replayed(_prepacked, arrays):
        return out
    # a Relu, LeakyRelu or Clip is applied in the tiles after the bias, and the layer's
    # one call is then its replay (the MLP's layers paid a compiled pass each, cold)
    limits = layer_limits(activation, activation_params, A.dtype)
    whole = not activation or limits is not None
    if out is not None and whole and not transA and alpha == 1.0 and beta == 1.0 \
            and C is not None and few_rows.rows_route(_prepacked, A, B, C, out, arrays, limits):
        return out  # the node's biased panel product at a new number of rows
    if _aliases(np, out, A, B, C):
        return _into(np, fused_gemm_cpu(np, A, B, C, alpha=alpha, beta=beta, transA=transA,
                                        transB=transB, activation=activation,
                                        activation_params=activation_params,
                                        _prepacked=_prepacked), out)
    if out is not None and A.dtype == B.dtype == out.dtype:
        if alpha == 1.0 and beta == 1.0 and few_rows.biased_gemm_product(
                A, B, C, transA, transB, out, _prepacked,
                constant_bias(_prepacked, 2) if whole else None, arrays, limits):
            return out if whole else \
                add_and_activate_cpu(out, None, None, activation, activation_params)
        y = few_rows.gemm_product(A, B, transA, transB, out, _prepacked)
    else:
        y = np.matmul(A.T if transA else A, B.T if transB else B, out=out)
    y, C = gemm_terms(y, C, alpha, beta)
    return add_and_activate_cpu(y, C, None, activation, activation_params)


TINY_WORK = few_rows.TINY_WORK  # (the few-rows module's: its rows route keeps above it)
# What the tiny layer (``_jit_tiny_layer``) and a panel product cost, roughly: the tiny loop
# passes over its output row once per input element (rows x K of them), ~2 ns each and
# ~0.03 ns more per output column; a panel product's call costs ~1.3 us before its first
# multiply-add (its parts, spills, the native call) and ~2 ns more per column. One thread,
# float32, this host's EPYC (2026-12-05), us tiny / panels: 3 x 32 @ 32 x 10 0.7 / 1.3,
# 12 x 16 @ 16 x 64 1.0 / 1.4, 4 x 128 @ 128 x 10 2.0 / 1.4, 66 x 32 @ 32 x 10 (a 64-32-10
# MLP's last layer at 66 rows) 7.5 / 2.5.
TINY_CALL_NS, TINY_INPUT_NS, TINY_INPUT_COLUMN_NS = 400.0, 2.0, 0.03
PANEL_CALL_NS, PANEL_COLUMN_NS = 1300.0, 2.0


def tiny_layer_suits(A, B) -> bool:
    """Whether ``A @ B`` (B 2-D) takes the tiny layer: its work below TINY_WORK and, from
    two rows, its estimated time no more than the panel product's (above). One row always
    takes it there: a one-row panel call may be split over the threads, whose wake-up the
    estimate does not hold (1 x 256 @ 256 x 128: 1.7 us tiny, 4.2 split)."""
    k, n = B.shape
    if A.size * n >= TINY_WORK:
        return False
    if A.size <= k:  # one row
        return True
    tiny = TINY_CALL_NS + A.size * (TINY_INPUT_NS + TINY_INPUT_COLUMN_NS * n)
    return tiny <= PANEL_CALL_NS + PANEL_COLUMN_NS * n


@fused_mat_mul.fast("cpu")
def fused_mat_mul_cpu(xp, A, B, bias=None, Z=None, *, activation="", activation_params=None,
                      out=None, _prepacked=None):
    """FusedMatMul with the product written into ``out`` by the few-rows or panel kernels
    (a bias folded into the panels' pass). A panel product with a constant bias and nothing
    after it is kept as the node's replay (``ops/compiled/replay.py``)."""
    if out is None:
        out = _product_sized(few_rows.graph_output(A, B), bias, Z)
    arrays = (A, B, bias, Z, out)
    if out is not None and replay.replayed(_prepacked, arrays):
        return out
    # the activation the tiles apply after the bias (none with a residual, added after it)
    limits = None if Z is not None \
        else layer_limits(activation, activation_params, A.dtype)
    whole = Z is None and (not activation or limits is not None)  # the product is the node
    if out is not None and whole \
            and few_rows.rows_route(_prepacked, A, B, bias, out, arrays, limits):
        return out  # the node's panel product at a new number of rows
    if out is not None and Z is None and activation in _TINY_ACTIVATIONS and B.ndim == 2 \
            and tiny_layer_suits(A, B) and out.dtype == A.dtype == B.dtype \
            and not batch_invariant():
        return _tiny_layer(A, B, bias, activation, out)
    if out is not None and not activation and few_rows.one_row_blas(A, B, out):
        return _one_row_layer(A, B, bias, Z, out)
    if _aliases(np, out, A, B, bias, Z):
        return _into(np, fused_mat_mul_cpu(np, A, B, bias, Z, activation=activation,
                                           activation_params=activation_params,
                                           _prepacked=_prepacked), out)
    if out is not None and out.dtype == A.dtype == B.dtype:
        alone = Z is None and not activation  # nothing after the product to replay
        if bias is not None and few_rows.biased_panel_product(
                A, B, bias, out, _prepacked, constant_bias(_prepacked, 2) if whole else None,
                arrays, limits=limits):
            return out if whole else \
                add_and_activate_cpu(out, None, Z, activation, activation_params)
        y = few_rows.dense_product(A, B, out, _prepacked,
                                   _prepacked if alone and bias is None else None, arrays)
    else:
        y = np.matmul(A, B, out=out)
    return add_and_activate_cpu(y, bias, Z, activation, activation_params)


_TINY_ACTIVATIONS = ("", "Relu")


def _product_sized(out, *addends):
    """``out`` where the fused additions broadcast into the product's shape, else None (an
    addend that widens the result: the generic kernel sizes it)."""
    if out is None:
        return None
    shapes = [a.shape for a in addends if a is not None]
    return out if np.broadcast_shapes(out.shape, *shapes) == out.shape else None


def _one_row_layer(A, B, bias, Z, out):
    """``out = A @ B + bias + Z`` for one row below the panels' reach, as Gemm's one-row
    form runs it (``nn_cpu.gemm_cpu``): the BLAS's product, then NumPy's adds, without the
    checks among the product forms that cannot take it (a GPT-2 decoder step's dense
    layers). NumPy's product copies an ``out`` that overlaps A; the adds are elementwise
    in place."""
    np.matmul(A, B, out=out)
    if bias is not None:
        np.add(out, bias, out=out)
    if Z is not None:
        np.add(out, Z, out=out)
    return out


def _tiny_layer(A, B, bias, activation, out):
    """``out = activation(A @ B + bias)``: the compiled layer where it applies
    (:func:`tiny_layer_call`), else three NumPy calls. ``out`` may be A's memory (an
    in-place plan): NumPy's product copies an overlapping operand first, and the bias add
    and the Relu are elementwise in place."""
    call = tiny_layer_call(A, B, bias, activation, out)
    if call is not None:
        return call(A, B, bias)
    np.matmul(A, B, out=out)
    if bias is not None:
        np.add(out, bias, out=out)
    if activation:
        np.maximum(out, out.dtype.type(0), out=out)
    return out


def tiny_layer_call(A, B, bias, activation, out):
    """:func:`_tiny_layer` as one compiled call (``ops/nn/_jit_tiny_layer.py``),
    ``call(A, B, bias) -> out`` on arrays like these, where A, B and ``out`` are 2-D,
    C-contiguous, of one native float dtype, ``out`` apart from A and the bias one value a
    column (any leading ones); else None. The bias is flattened once: a bound call is given
    the same constant every time."""
    if not (A.ndim == B.ndim == out.ndim == 2 and A.dtype in jit_cpu.NATIVE
            and A.flags.c_contiguous and B.flags.c_contiguous and out.flags.c_contiguous
            and (bias is None or bias.size == B.shape[1] and bias.dtype == A.dtype
                 and bias.flags.c_contiguous)
            and not np.may_share_memory(out, A) and jit_cpu.enabled()):
        return None
    kernel = jit_cpu.load(TINY_LAYER).tiny_layer
    relu, flat = activation == "Relu", np.zeros(0, A.dtype) if bias is None else bias.reshape(-1)

    def call(A, B, bias=None):
        kernel(A, B, flat, out, relu)
        return out
    return call


TINY_LAYER = "mixrt.ops.nn._jit_tiny_layer"


# their planned calls, bound once per arena (ops/compiled/bound_calls.py): the recorded replays
binds_replay(fused_conv_cpu, lambda args, out: padded(args, 4) + (out,), "_prepacked")
binds_replay(fused_gemm_cpu, lambda args, out: padded(args, 3) + (out,), "_prepacked")
binds_replay(fused_mat_mul_cpu, lambda args, out: padded(args, 4) + (out,), "_prepacked")
