"""Fused kernels of the ``mixrt`` domain: a matrix product or convolution with its bias,
residual add and activation applied in place, in one kernel call.

The optimizer (``runtime/passes/fuse.py``) makes these nodes from ONNX ones at opt_level 2.
Their attributes are plain ONNX kinds, so a ``.mxr`` file or an ONNX export carries them:
``activation`` names one of :data:`ACTIVATIONS` ("" for none) and ``activation_params`` holds
its constants in the order listed there.

Every kernel accepts ``out``: when the executor passes a buffer (C-contiguous, the output's
exact shape and dtype) the result is written there and returned; the bias, residual and
activation then run in place on it, so a fused node touches one output buffer once per step
instead of allocating one per op.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.ops.compiled import replay
from mixrt.ops.conv.conv import conv
from mixrt.ops.elementwise import jit_elementwise
from mixrt.ops.elementwise.fused_elementwise import program as elementwise_program
from mixrt.ops.nn.nn import matmul_shape
from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.elementwise.simd_cpu import clip_, relu_
from mixrt.ops.ir.types import TensorType



# -- activations, applied in place -------------------------------------------------------------
# Helpers of every fused op, not kernels: on the CPU they call the SIMD loops of simd_cpu.py,
# on a GPU the same arithmetic through xp (CuPy's ufuncs take no ``where=``).

def _relu(xp, y):
    if xp is np:
        relu_(y, y)
    else:
        xp.maximum(y, y.dtype.type(0), out=y)


def _leaky_relu(xp, y, alpha):
    if xp is np:
        np.multiply(y, y.dtype.type(alpha), out=y, where=y < 0)
    else:  # CuPy ufuncs take no where=
        xp.copyto(y, xp.where(y >= 0, y, y * y.dtype.type(alpha)))


def _sigmoid(xp, y):
    # 1 / (1 + e^-y), four in-place passes; e^-y overflowing to inf still gives 0
    xp.negative(y, out=y)
    xp.exp(y, out=y)
    y += y.dtype.type(1)
    xp.reciprocal(y, out=y)


def _tanh(xp, y):
    xp.tanh(y, out=y)


def _hard_sigmoid(xp, y, alpha, beta):
    y *= y.dtype.type(alpha)
    y += y.dtype.type(beta)
    _clip(xp, y, 0.0, 1.0)


def _hard_swish(xp, y):
    # y * HardSigmoid(y, 1/6, 0.5) in the unfused kernel's order (ops/elementwise/activation.py)
    gate = y * y.dtype.type(1 / 6)
    gate += y.dtype.type(0.5)
    _clip(xp, gate, 0.0, 1.0)
    y *= gate


def _swish(xp, y):
    # y * Sigmoid(y) (SiLU) as the FusedElementwise program the unfused pair becomes
    y[...] = _SWISH.run(xp, (y,))


def _clip(xp, y, low, high):
    # max then min, so low > high gives high, as ONNX Clip does; infinite bounds are no-ops
    if xp is np:
        clip_(y, low, high, y)
        return
    xp.maximum(y, y.dtype.type(low), out=y)
    xp.minimum(y, y.dtype.type(high), out=y)


ACTIVATIONS = {  # name -> (in-place function, parameter names)
    "Relu": (_relu, ()),
    "LeakyRelu": (_leaky_relu, ("alpha",)),
    "Sigmoid": (_sigmoid, ()),
    "Tanh": (_tanh, ()),
    "HardSigmoid": (_hard_sigmoid, ("alpha", "beta")),
    "HardSwish": (_hard_swish, ()),
    "Swish": (_swish, ()),  # Sigmoid(y) and Mul(y, it): SiLU, EfficientNet's activation
    "Clip": (_clip, ("min", "max")),
}
# the program fuse_elementwise makes of Swish's pair: s = Sigmoid(y), then y * s
_SWISH = elementwise_program(("Sigmoid", "Mul"), (0, 0, 1), (), 1)


def activate(xp, y, activation: str, params) -> object:
    """Apply ``activation`` to ``y`` in place (``y`` must be a buffer the caller owns)."""
    if activation:
        fn, params = _checked_activation(activation, params)
        fn(xp, y, *params)
    return y


def _activation(activation: str, params):
    """``finish(xp, y)``: the activation applied to ``y`` in place, returning ``y``."""
    if not activation:
        return lambda xp, y: y
    fn, params = _checked_activation(activation, params)

    def finish(xp, y):
        fn(xp, y, *params)
        return y
    return finish


def _checked_activation(activation: str, params) -> tuple:
    """(in-place function, its parameters as a list) of a named activation."""
    found = ACTIVATIONS.get(activation)
    if found is None:
        raise ValueError(f"unknown fused activation {activation!r}; expected one of "
                         f"{', '.join(ACTIVATIONS)} or '' for none")
    fn, names = found
    params = list(params or ())
    if len(params) != len(names):
        raise ValueError(f"activation {activation} takes activation_params {list(names)}, "
                         f"got {params}")
    return fn, params


def _epilogue(has_bias: bool, has_residual: bool, activation: str, params):
    """y [+ bias] [+ residual], then the activation, as a FusedElementwise program over the
    registers (y, bias?, residual?), or None when there is nothing to do or the activation
    has no compiled loop (Sigmoid, Tanh: NumPy's SIMD exp is faster than numba's)."""
    return _epilogue_program(bool(has_bias), bool(has_residual), activation or "",
                             tuple(float(v) for v in params or ()))


@functools.lru_cache(maxsize=256)
def _epilogue_program(has_bias: bool, has_residual: bool, activation: str, params: tuple):
    if activation and (activation not in ACTIVATIONS
                       or len(params) != len(ACTIVATIONS[activation][1])):
        return None  # the unfused path reports the mistake
    steps, operands, values, current = [], [], [], 0
    for present, register in ((has_bias, 1), (has_residual, 1 + has_bias)):
        if present:
            steps.append("Add")
            operands += [current, register]
            current = 1 + has_bias + has_residual + len(steps) - 1
    gate = 1 + has_bias + has_residual + len(steps)  # the register of a gate's first step
    if activation == "HardSwish":  # y * HardSigmoid(y, 1/6, 0.5), as its own kernel runs it
        steps += ["HardSigmoid", "Mul"]
        operands += [current, current, gate]
        values = [1 / 6, 0.5]
    elif activation == "Swish":  # y * Sigmoid(y), as the unfused pair's program runs it
        steps += ["Sigmoid", "Mul"]
        operands += [current, current, gate]
    elif activation:
        steps.append(activation)
        operands.append(current)
        values = list(params)
    if not steps:
        return None
    program = elementwise_program(tuple(steps), tuple(operands), tuple(values),
                                  1 + has_bias + has_residual)
    return program if jit_elementwise.compilable(program.steps, np.float32) else None


def _add_and_activate(xp, y, bias, residual, activation: str, params):
    """y += bias, y += residual, then the activation, in place (either addend may be None),
    one array-module call each (the CPU's one compiled pass: ``add_and_activate_cpu``)."""
    if bias is not None:
        y += bias
    if residual is not None:
        y += residual
    return activate(xp, y, activation, params)


def add_and_activate_cpu(y, bias, residual, activation: str, params, replayed=False):
    """:func:`_add_and_activate` on NumPy arrays: one compiled pass over y when
    ops/elementwise/jit_elementwise.py takes the program and these arrays, else one NumPy call
    each. ``replayed``: the epilogue of a node's replayed call (a convolution's), whose
    program compiles at any size when it holds a rational (Swish, Sigmoid, Tanh): as NumPy
    calls, EfficientNet-B0's squeeze-excite SiLU over 8 to 48 values took 15-40 us."""
    # (a compiled pass takes no output under its program's min_elements, at least
    # JIT_MIN_ELEMENTS // COSTLY_DIVISOR: not worth asking below that). Without an
    # activation NumPy's adds are faster: its in-place add of a bias row is one vectorized
    # loop, the generic compiled loop nest indexes every element (BERT's 64 x 256 outputs:
    # 3.5 against 9.7 us)
    if not activation:
        return _add_and_activate(np, y, bias, residual, activation, params)
    program = _epilogue(bias is not None, residual is not None, activation, params)
    any_size = replayed and program is not None and jit_elementwise.costly(program.steps)
    if (any_size or y.size >= jit_elementwise.JIT_MIN_ELEMENTS //
            jit_elementwise.COSTLY_DIVISOR) and _compiled_epilogue(
                program, y, tuple(a for a in (bias, residual) if a is not None), any_size):
        return y
    return _add_and_activate(np, y, bias, residual, activation, params)


def compiled_activation(y, activation: str, params):
    """``activation`` over ``y`` (contiguous, y's own buffer) in one compiled pass, done
    now; returns that pass as a call on an array of y's layout, ``again(array)``, for a
    replay to make (ops/compiled/replay.py), or None, nothing done, where the activation
    has no compiled pass over y."""
    program = _epilogue(False, False, activation, params)
    # at any size: the pass is replayed, so NumPy's smaller dispatch does not pay here
    if not activation or program is None or not y.flags.c_contiguous \
            or not jit_elementwise.suits(program.steps, (), y, program.jit_kernels, True):
        return None
    recorded: dict = {}
    if not jit_elementwise.run(program.steps, (y,), y, 0, program.jit_kernels, recorded):
        return None
    found = recorded.get(replay.KEY)
    if found is None:  # a pass split over the threads records nothing: the full call again
        return lambda array: jit_elementwise.run(program.steps, (array,), array, 0,
                                                 program.jit_kernels)
    return lambda array: found.action(array, array)


def compiled_epilogue(y, bias, residual, activation: str, params):
    """:func:`add_and_activate_cpu` done now as one compiled pass over y, at any size (the
    pass is bound: no dispatch to amortize); returns that pass on these very arrays as a
    call without arguments, or None (nothing done) where it is not one (no activation, or
    no compiled program for these arrays)."""
    if not activation:
        return None
    program = _epilogue(bias is not None, residual is not None, activation, params)
    operands = tuple(a for a in (bias, residual) if a is not None)
    if program is None or not jit_elementwise.suits(program.steps, operands, y,
                                                    program.jit_kernels, any_size=True):
        return None
    recorded: dict = {jit_elementwise.FIXED: None}
    if not jit_elementwise.run(program.steps, (y,) + operands, y, 0, program.jit_kernels,
                               recorded):
        return None
    fixed = recorded.get(jit_elementwise.FIXED)
    if fixed is not None:
        return fixed
    found = recorded.get(replay.KEY)
    if found is None:  # split over the threads: nothing recorded, the full call each time
        return lambda: jit_elementwise.run(program.steps, (y,) + operands, y, 0,
                                           program.jit_kernels)
    action = found.action
    return lambda: action(y, *operands, y)


def _compiled_epilogue(program, y, operands, any_size=False) -> bool:
    """``program`` over (y, *operands) into y in one compiled pass; False (nothing done)
    when that path does not suit these arrays (``any_size``: as ``jit_elementwise.suits``)."""
    if program is None or not jit_elementwise.suits(program.steps, operands, y,
                                                    program.jit_kernels, any_size):
        return False
    return jit_elementwise.run(program.steps, (y,) + operands, y, 0, program.jit_kernels)


def _aliases(xp, out, *arrays) -> bool:
    """``out`` shares memory with one of ``arrays`` (an in-place plan reused an input)."""
    if out is None:
        return False
    if hasattr(xp, "may_share_memory"):
        for a in arrays:
            if a is not None and xp.may_share_memory(out, a):
                return True
        return False
    return any(a is not None and a.data.ptr == out.data.ptr for a in arrays)


def _into(xp, y, out):
    """``y`` moved into ``out`` when the executor gave one."""
    if out is None or y is out:
        return y
    xp.copyto(out, y)
    return out


# -- FusedConv -----------------------------------------------------------------------------------

@op("FusedConv", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_conv(xp, X, W, B=None, Z=None, *, auto_pad="NOTSET", dilations=None, group=1,
               kernel_shape=None, pads=None, strides=None, activation="",
               activation_params=None, out=None, _prepacked=None, _node=None):
    """activation(Conv(X, W, B) + Z): ResNet's conv, folded batch norm, shortcut and Relu,
    through Conv's generic kernel on any device. The CPU's banded form, residual and
    activation applied to each band while it is in cache, is registered beside it
    (``ops/nn/fused_cpu.py``)."""
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    finish = _activation(activation, activation_params)
    y = conv(xp, X, W, B, **attributes)  # a new array: out may be an input's buffer
    if Z is not None:
        xp.add(y, Z, out=y)
    return _into(xp, finish(xp, y), out)


@fused_conv.infer
def _(X, W, B=None, Z=None, **attributes):
    attributes = {k: v for k, v in attributes.items()
                  if k not in ("activation", "activation_params", "out")}
    return conv.kernels[0].infer_fn(X, W, B, **attributes)


# -- FusedGemm, FusedMatMul ---------------------------------------------------------------------

@op("FusedGemm", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_gemm(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="",
               activation_params=None, out=None, _prepacked=None):
    """activation(alpha * A' B' + beta * C), the product written straight into ``out``."""
    if _aliases(xp, out, A, B, C):
        return _into(xp, fused_gemm(xp, A, B, C, alpha=alpha, beta=beta, transA=transA,
                                    transB=transB, activation=activation,
                                    activation_params=activation_params,
                                    _prepacked=_prepacked), out)
    y = xp.matmul(A.T if transA else A, B.T if transB else B, out=out)
    y, C = gemm_terms(y, C, alpha, beta)
    return _add_and_activate(xp, y, C, None, activation, activation_params)


def gemm_terms(y, C, alpha: float, beta: float):
    """Gemm's ``alpha * (A @ B)`` (scaled in place in ``y``) and ``beta * C`` (None where it
    adds nothing)."""
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    if C is None or beta == 0.0:
        return y, None
    return y, C if beta == 1.0 else C * C.dtype.type(beta)


@fused_gemm.infer
def _(A, B, C=None, *, transA=0, transB=0, **_):
    if A.shape is None or B.shape is None:
        return [TensorType(A.dtype, None)]
    rows = A.shape[1] if transA else A.shape[0]
    cols = B.shape[0] if transB else B.shape[1]
    return [TensorType(A.dtype, (rows, cols))]


@op("FusedMatMul", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def fused_mat_mul(xp, A, B, bias=None, Z=None, *, activation="", activation_params=None,
                  out=None, _prepacked=None):
    """activation(A @ B + bias + Z): a transformer's dense layer (and its residual add) in
    one call."""
    if _aliases(xp, out, A, B, bias, Z):
        return _into(xp, fused_mat_mul(xp, A, B, bias, Z, activation=activation,
                                       activation_params=activation_params,
                                       _prepacked=_prepacked), out)
    y = xp.matmul(A, B, out=out)
    return _add_and_activate(xp, y, bias, Z, activation, activation_params)


@fused_mat_mul.infer
def _(A, B, bias=None, Z=None, **_):
    return [TensorType(A.dtype, matmul_shape(A.shape, B.shape))]
