"""onnxruntime's fused operators of the ``com.microsoft`` domain for transformer models: the
matrix products and convolution with their epilogues (FusedMatMul, FusedGemm, FusedConv) and
the GELU family (Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd, BiasSoftmax). The
normalizations of that family live in ``ops/attention/contrib_norm.py``.

onnxruntime's transformer optimizer and several exporters write these nodes. Each kernel
calls the mixrt kernel that computes the same thing (MatMul, Gemm, Softmax, the ``mixrt``
domain's FusedConv, FusedGemm and FusedElementwise) through :func:`run_kernel`, which picks
that op's fast path for the device, so these nodes run as fast as the ops they fuse.

Half-precision inputs are computed in float32 and rounded once at the end, as onnxruntime's
CPU kernels do (it casts a float16 node without a float16 kernel to float32 and back).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mixrt.ops.nn import fused
from mixrt.ops.elementwise.activation import (celu, elu, gelu, hard_sigmoid, hard_swish,
                                              leaky_relu, relu, selu, sigmoid, softplus, softsign,
                                              tanh, thresholded_relu)
from mixrt.ops.conv.conv import conv
from mixrt.ops.ir.dtypes import FLOATS, compute_dtype
from mixrt.ops.elementwise.fused_elementwise import fused_elementwise
from mixrt.ops.nn.nn import gemm, mat_mul, matmul_shape, softmax_coerced, widen
from mixrt.ops.ir.registry import op
from mixrt.ops.device import device_kind
from mixrt.ops.ir.types import TensorType, broadcast_shapes, normalize_axis, require_shape, \
    same_as_input, shape_text

MICROSOFT = "com.microsoft"
CONV_DTYPES = frozenset({"float16", "float32", "float64"})


# -- calling the kernels these ops fuse ----------------------------------------------------------

def run_kernel(xp, handle, *inputs, out=None, _prepacked=None, _node=None, **attributes):
    """``handle``'s op on ``inputs`` as one of its nodes runs on xp's device: through its
    fast path there, handed ``out`` (the arena view to write into), ``_prepacked`` and
    ``_node`` (the node's kept layouts and state) where that path takes them."""
    kernel = handle.kernels[0]
    device = device_kind(xp)
    if out is not None and kernel.writes_into(device):
        attributes["out"] = out
    if _prepacked is not None and kernel.wants_prepacked(device):
        attributes["_prepacked"] = _prepacked
    if _node is not None and kernel.wants_node_state(device):
        attributes["_node"] = _node
    return kernel.for_device(device)(xp, *inputs, **attributes)


def is_narrow(x) -> bool:
    """Whether ``x`` is a float narrower than float32 (computed in float32, rounded once)."""
    return x is not None and compute_dtype(x.dtype) != x.dtype


def widened(*arrays):
    """The arrays in their compute dtype (None stays None)."""
    return tuple(None if a is None else widen(a) for a in arrays)


# -- FusedMatMul --------------------------------------------------------------------------------

@op("FusedMatMul", since=1, domain=MICROSOFT, dtypes=FLOATS)
def fused_mat_mul(xp, A, B, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0,
                  out=None, _prepacked=None):
    """alpha * A' @ B'. transBatch moves an operand's first axis to just before its last two
    ((b, s, n, k) reads as (s, n, b, k)); trans then swaps the last two. A vector is left
    as it is."""
    _require_batch_ranks(A.ndim, B.ndim, transBatchA, transBatchB)
    a, b = _arranged(xp, A, transA, transBatchA), _arranged(xp, B, transB, transBatchB)
    if is_narrow(A):
        y = mat_mul(xp, *widened(a, b))
    else:
        y = run_kernel(xp, mat_mul, a, b, out=out, _prepacked=_prepacked)
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    return y.astype(A.dtype, copy=False)


def _arranged(xp, x, trans, trans_batch):
    if x.ndim < 2:
        return x
    if trans_batch:
        x = xp.moveaxis(x, 0, -2)
    return xp.swapaxes(x, -1, -2) if trans else x


def _arranged_shape(shape, trans, trans_batch):
    if len(shape) < 2:
        return tuple(shape)
    if trans_batch:
        shape = tuple(shape[1:-1]) + (shape[0], shape[-1])
    return tuple(shape[:-2]) + (shape[-1], shape[-2]) if trans else tuple(shape)


def _require_batch_ranks(rank_a, rank_b, trans_batch_a, trans_batch_b) -> None:
    if (trans_batch_a or trans_batch_b) and not (rank_a == rank_b >= 3):
        raise ValueError(f"FusedMatMul with transBatchA or transBatchB needs operands of one "
                         f"rank of at least 3; got ranks {rank_a} and {rank_b}")


@fused_mat_mul.infer
def _(A: TensorType, B: TensorType, *, transA=0, transB=0, transBatchA=0, transBatchB=0,
      **_):
    if A.shape is None or B.shape is None:
        return [TensorType(A.dtype, None)]
    if not A.shape or not B.shape:
        raise ValueError(f"FusedMatMul needs operands of rank 1 or more; got "
                         f"{shape_text(A.shape)} and {shape_text(B.shape)}")
    _require_batch_ranks(len(A.shape), len(B.shape), transBatchA, transBatchB)
    shape = matmul_shape(_arranged_shape(A.shape, transA, transBatchA),
                         _arranged_shape(B.shape, transB, transBatchB))
    return [TensorType(A.dtype, shape)]


# -- FusedGemm ----------------------------------------------------------------------------------

# onnxruntime's names of the activations a FusedGemm applies -> (mixrt's kernel, the kernel's
# parameters read from the node's activation_alpha, activation_beta, activation_gamma)
GEMM_ACTIVATIONS = {
    "Relu": (relu, ()),
    "Sigmoid": (sigmoid, ()),
    "Tanh": (tanh, ()),
    "Softsign": (softsign, ()),
    "Softplus": (softplus, ()),
    "LeakyRelu": (leaky_relu, (("alpha", "activation_alpha"),)),
    "Elu": (elu, (("alpha", "activation_alpha"),)),
    "Celu": (celu, (("alpha", "activation_alpha"),)),
    "ThresholdedRelu": (thresholded_relu, (("alpha", "activation_alpha"),)),
    "HardSigmoid": (hard_sigmoid, (("alpha", "activation_alpha"), ("beta", "activation_beta"))),
    "Selu": (selu, (("alpha", "activation_alpha"), ("gamma", "activation_gamma"))),
}
# onnxruntime's two contrib activations: alpha * f(beta * x)
SCALED_ACTIVATIONS = {"ScaledTanh": tanh, "ParametricSoftplus": softplus}


@op("FusedGemm", since=1, domain=MICROSOFT, dtypes=FLOATS)
def fused_gemm(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_alpha=None, activation_beta=None, activation_gamma=None, out=None,
               _prepacked=None):
    """activation(alpha * A' B' + beta * C). The activation's parameters default to its ONNX
    op's defaults (onnxruntime requires them to be written)."""
    params = dict(activation_alpha=activation_alpha, activation_beta=activation_beta,
                  activation_gamma=activation_gamma)
    in_place = _in_place_params(activation, params)
    if is_narrow(A):
        y = gemm(xp, *widened(A, B, C), alpha=alpha, beta=beta, transA=transA, transB=transB)
    elif in_place is not None:  # the mixrt FusedGemm: the activation runs on the product
        return run_kernel(xp, fused.fused_gemm, A, B, C, alpha=alpha, beta=beta,
                          transA=transA, transB=transB, activation=activation,
                          activation_params=in_place, out=out, _prepacked=_prepacked)
    else:
        y = run_kernel(xp, gemm, A, B, C, alpha=alpha, beta=beta, transA=transA,
                       transB=transB, out=out, _prepacked=_prepacked)
    return gemm_activation(xp, y, activation, params).astype(A.dtype, copy=False)


def _in_place_params(activation, params):
    """The activation_params of the mixrt FusedGemm, for an activation it applies in place
    whose parameters the node writes (onnxruntime requires them), else None."""
    if activation not in fused.ACTIVATIONS or activation not in GEMM_ACTIVATIONS:
        return None
    given = _parameters(activation, params)
    names = fused.ACTIVATIONS[activation][1]
    return [given[name] for name in names] if all(name in given for name in names) else None


def _parameters(activation, params) -> dict:
    """The activation kernel's keyword arguments that the node writes; the others keep the
    kernel's defaults, its ONNX op's."""
    _, names = GEMM_ACTIVATIONS[activation]
    return {name: params[attribute] for name, attribute in names
            if params[attribute] is not None}


def gemm_activation(xp, y, activation, params):
    """onnxruntime's FusedGemm activation of ``y`` ("" for none)."""
    if not activation:
        return y
    if activation in SCALED_ACTIVATIONS:
        scale = 1.0 if params["activation_alpha"] is None else params["activation_alpha"]
        inner = 1.0 if params["activation_beta"] is None else params["activation_beta"]
        f = SCALED_ACTIVATIONS[activation]
        return f(xp, y * y.dtype.type(inner)) * y.dtype.type(scale)
    _require_gemm_activation(activation)
    kernel, _ = GEMM_ACTIVATIONS[activation]
    return kernel(xp, y, **_parameters(activation, params))


def _require_gemm_activation(activation) -> None:
    if activation and activation not in GEMM_ACTIVATIONS \
            and activation not in SCALED_ACTIVATIONS:
        known = sorted(GEMM_ACTIVATIONS) + sorted(SCALED_ACTIVATIONS)
        raise ValueError(f"FusedGemm activation {activation!r} is not one of "
                         f"{', '.join(known)}")


@fused_gemm.infer
def _(A: TensorType, B: TensorType, C=None, *, transA=0, transB=0, activation="", **_):
    _require_gemm_activation(activation)
    return gemm.kernels[-1].infer_fn(A, B, C, transA=transA, transB=transB)


# -- FusedConv ----------------------------------------------------------------------------------

@op("FusedConv", since=1, domain=MICROSOFT, dtypes=CONV_DTYPES)
def fused_conv(xp, X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None, activation=None,
               activation_params=None, out=None, _prepacked=None, _node=None):
    """activation(Conv(X, W, B) + Z), computed by the mixrt domain's FusedConv (the
    activations are the same six: Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, Clip)."""
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides,
                      activation=activation or "", activation_params=activation_params)
    if is_narrow(X):
        y = run_kernel(xp, fused.fused_conv, *widened(X, W, B, Z), _prepacked=_prepacked,
                       **attributes)
        return y.astype(X.dtype)
    return run_kernel(xp, fused.fused_conv, X, W, B, Z, out=out, _prepacked=_prepacked,
                      _node=_node, **attributes)


@fused_conv.infer
def _(X, W, B=None, Z=None, *, activation=None, activation_params=None, **attributes):
    if activation:
        fused._checked_activation(activation, activation_params)
    types = conv.kernels[-1].infer_fn(X, W, B, **attributes)
    if isinstance(Z, TensorType) and Z.shape is not None and types[0].shape is not None:
        broadcast_shapes(types[0].shape, Z.shape)  # Z is added to the convolution's output
    return types


# -- the GELU family ----------------------------------------------------------------------------
#
# Each is a FusedElementwise program (ops/elementwise/fused_elementwise.py), the kernel the
# optimizer runs an exported GELU's Div/Erf/Add/Mul chain through: on the CPU one compiled pass
# over memory into the output, on the GPU one generated kernel. Gelu-20's own kernel takes several
# NumPy passes (its erf in float64): at BERT's 128 x 3072 the program ran a bias and GELU in ~0.6
# ms, the separate kernels in ~11.

class ProgramWriter:
    """A FusedElementwise program being written: registers 0.. hold the node's inputs and
    each step writes the next register; the last step's is the output."""

    def __init__(self, inputs: int):
        self.ops, self.operands, self.params = [], [], []
        self._next = inputs

    def __call__(self, op_type: str, *operands: int, params=()) -> int:
        self.ops.append(op_type)
        self.operands.extend(operands)
        self.params.extend(float(p) for p in params)
        self._next += 1
        return self._next - 1

    def scalar(self, value: float) -> int:
        return self("Scalar", params=(value,))

    def attributes(self) -> dict:
        return dict(ops=tuple(self.ops), operands=tuple(self.operands),
                    params=tuple(self.params))


@functools.cache
def gelu_program(approximate: str, biased: bool) -> dict:
    """0.5 x (1 + erf(x / sqrt 2)), or with approximate="tanh"
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), of x = input (+ bias)."""
    step = ProgramWriter(2 if biased else 1)
    x = step("Add", 0, 1) if biased else 0
    if approximate == "tanh":
        cube = step("Mul", step("Mul", x, x), x)
        inner = step("Add", x, step("Mul", cube, step.scalar(0.044715)))
        gate = step("Tanh", step("Mul", inner, step.scalar(math.sqrt(2 / math.pi))))
    elif approximate == "none":
        gate = step("Erf", step("Mul", x, step.scalar(1 / math.sqrt(2))))
    else:
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    step("Mul", step("Mul", x, step.scalar(0.5)), step("Add", gate, step.scalar(1.0)))
    return step.attributes()


@functools.cache
def quick_gelu_program(alpha: float) -> dict:
    """x * sigmoid(alpha x)."""
    step = ProgramWriter(1)
    step("Mul", 0, step("Sigmoid", step("Mul", 0, step.scalar(alpha))))
    return step.attributes()


def run_program(xp, program: dict, X, *others, out=None, _node=None):
    """The program over (X, *others) in X's compute dtype, rounded to X's dtype once."""
    wide = compute_dtype(X.dtype)
    inputs = tuple(a.astype(wide, copy=False) for a in (X,) + others)
    if wide != X.dtype:
        out = None  # computed aside, then rounded
    y = run_kernel(xp, fused_elementwise, *inputs, out=out, _node=_node, **program)
    return y.astype(X.dtype, copy=False)


@gelu.fast("cpu")
def gelu_cpu(xp, X, *, approximate="none", out=None, _node=None):
    """ONNX Gelu-20 as the compiled elementwise program its com.microsoft forms run: the
    NumPy form's erf is a polynomial of ~20 array passes (torch.onnx.export writes Gelu-20
    for BERT's feed-forward, where it was a quarter of the run)."""
    return run_program(xp, gelu_program(approximate, False), X, out=out, _node=_node)


@functools.cache
def hard_swish_program() -> dict:
    """x * HardSigmoid(x, alpha=1/6, beta=0.5): ONNX HardSwish in the unfused kernel's order
    (x * 1/6, + 0.5, clipped to [0, 1], times x)."""
    step = ProgramWriter(1)
    step("Mul", 0, step("HardSigmoid", 0, params=(1 / 6, 0.5)))
    return step.attributes()


@hard_swish.fast("cpu")
def hard_swish_cpu(xp, X, *, out=None, _node=None):
    """ONNX HardSwish as one compiled pass (the NumPy form takes four over the tensor; it
    follows every expansion convolution of MobileNetV3, DeepLabV3 and SSDlite)."""
    return run_program(xp, hard_swish_program(), X, out=out, _node=_node)


@op("Gelu", since=1, domain=MICROSOFT, dtypes=FLOATS)
def contrib_gelu(xp, X, *, out=None, _node=None):
    """x * Phi(x), the erf form of ONNX Gelu-20."""
    return run_program(xp, gelu_program("none", False), X, out=out, _node=_node)


@op("FastGelu", since=1, domain=MICROSOFT, dtypes=FLOATS)
def fast_gelu(xp, X, bias=None, *, out=None, _node=None):
    """The tanh approximation of GELU of X + bias: ONNX Gelu-20 with approximate="tanh"."""
    return _gelu_of_sum(xp, X, bias, "tanh", out, _node)


@op("BiasGelu", since=1, domain=MICROSOFT, dtypes=FLOATS)
def bias_gelu(xp, A, B, *, out=None, _node=None):
    """The erf form of GELU of A + B (a bias along the last axis)."""
    return _gelu_of_sum(xp, A, B, "none", out, _node)


def _gelu_of_sum(xp, X, bias, approximate, out, node):
    biases = () if bias is None else (bias,)
    return run_program(xp, gelu_program(approximate, bool(biases)), X, *biases, out=out,
                       _node=node)


@op("QuickGelu", since=1, domain=MICROSOFT, dtypes=FLOATS)
def quick_gelu(xp, X, *, alpha=1.702, out=None, _node=None):
    """x * sigmoid(alpha * x): ONNX Swish-24."""
    return run_program(xp, quick_gelu_program(float(alpha)), X, out=out, _node=_node)


contrib_gelu.infer(same_as_input)
quick_gelu.infer(same_as_input)


@fast_gelu.infer
def _(X: TensorType, bias=None, **_):
    return _biased_like_input("FastGelu", X, bias)


@bias_gelu.infer
def _(A: TensorType, B: TensorType, **_):
    return _biased_like_input("BiasGelu", A, B)


def _biased_like_input(op_type, X: TensorType, bias) -> list[TensorType]:
    """X's type, after checking that the bias broadcasts onto X without growing it."""
    if isinstance(bias, TensorType) and bias.shape is not None and X.shape is not None:
        if len(bias.shape) > len(X.shape) or \
                broadcast_shapes(X.shape, bias.shape) != tuple(X.shape):
            raise ValueError(f"{op_type}'s bias {shape_text(bias.shape)} does not broadcast "
                             f"onto its input {shape_text(X.shape)}")
    return [TensorType(X.dtype, X.shape)]


# -- BiasAdd, BiasSoftmax ----------------------------------------------------------------------

@op("BiasAdd", since=1, domain=MICROSOFT, dtypes=frozenset({"float16", "float32"}))
def bias_add(xp, X, bias, skip, *, out=None, _node=None):
    """X + skip + bias: X and skip (N, S, C), bias (C,); one pass, as a program."""
    return run_program(xp, BIAS_ADD_PROGRAM, X, bias, skip, out=out, _node=_node)


BIAS_ADD_PROGRAM = dict(ops=("Add", "Add"), operands=(0, 2, 3, 1), params=())


@bias_add.infer
def _(X: TensorType, bias: TensorType, skip: TensorType, **_):
    if X.shape is not None:
        if len(X.shape) != 3:
            raise ValueError(f"BiasAdd's input has shape {shape_text(X.shape)}; expected "
                             f"rank 3 (N, S, C)")
        require_shape("BiasAdd's bias", bias, (X.shape[2],))
        require_shape("BiasAdd's skip", skip, X.shape)
    return [TensorType(X.dtype, X.shape)]


@op("BiasSoftmax", since=1, domain=MICROSOFT, dtypes=FLOATS)
def bias_softmax(xp, data, bias, *, axis=1, is_inner_broadcast=None, out=None):
    """softmax(data + bias) over the axes from ``axis`` on taken together (Softmax-1's
    coercion). The bias broadcasts onto data (an attention mask over the heads, or over
    the batch); ``is_inner_broadcast`` says which, which the shapes already tell."""
    x, b = widened(data, bias)
    y = run_kernel(xp, softmax_coerced, x + b, axis=axis,
                   out=None if is_narrow(data) else out)
    return y.astype(data.dtype, copy=False)


@bias_softmax.infer
def _(data: TensorType, bias: TensorType, *, axis=1, **_):
    if data.shape is not None:
        normalize_axis(axis, len(data.shape))
    _biased_like_input("BiasSoftmax", data, bias)
    return [TensorType(data.dtype, data.shape)]
