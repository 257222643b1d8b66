"""NumPy ``out=`` paths of the elementwise ops that carry most of a network's bytes:
the four arithmetic ops, the float unary functions, Sum, Relu, Tanh and Sigmoid, written into
the arena view the executor hands them, in place over an input whose last reader they are
(the rules: ``ops/compiled/out_arrays.py``). Signatures are the generic kernels' plus
``out``. FusedElementwise's CPU form: its compiled loop or in-place ufunc calls
(``Program.run_cpu``).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import replay
from mixrt.ops.compiled.out_arrays import into, native
from mixrt.ops.compiled.bound_calls import binds, binds_replay, replay_binder
from mixrt.ops.elementwise import elementwise
from mixrt.ops.elementwise.activation import relu, sigmoid, tanh
from mixrt.ops.elementwise.elementwise import add, div, mul, quiet, sub, sum_
from mixrt.ops.elementwise.fused_elementwise import fused_elementwise, node_program
from mixrt.ops.elementwise.simd_cpu import relu_


def _binary(generic, ufunc):
    def fast(xp, A, B, *, out=None):
        if out is None or not native(A, B, out):
            return into(out, generic(xp, A, B))
        return ufunc(A, B, out=out)
    fast.__name__ = f"{generic.__name__}_cpu"

    @binds(fast, feeds=True)  # its planned call, bound once per arena (bound_calls.py)
    def bind(args, out, attributes):
        return (lambda A, B: ufunc(A, B, out=out)) if native(*args, out) else None
    return fast


add.fast("cpu")(_binary(add, np.add))
sub.fast("cpu")(_binary(sub, np.subtract))
mul.fast("cpu")(_binary(mul, np.multiply))
div.fast("cpu")(_binary(div, np.divide))


def _unary(generic, ufunc):
    """The float unary op whose generic kernel is ``ufunc`` on native floats, into ``out``
    (allocating and then copying into the arena cost ~1 us of a small node's ~2)."""
    def fast(xp, X, *, out=None):
        if out is None or not native(X, out):
            return into(out, generic(xp, X))
        with quiet(np):
            return ufunc(X, out)
    fast.__name__ = f"{generic.__name__}_cpu"

    @binds(fast, feeds=True)  # inside a run, whose NumPy error state is quiet already
    def bind(args, out, attributes):
        return (lambda X: ufunc(X, out)) if native(*args, out) else None
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
    if out is None or not native(*data_0, out) or len(data_0) < 2:
        return into(out, sum_(xp, *data_0))
    # the first add may not write over an operand a later add still reads
    if any(np.may_share_memory(out, x) for x in data_0[2:]):
        return into(out, sum_(xp, *data_0))
    np.add(data_0[0], data_0[1], out=out)
    for x in data_0[2:]:
        np.add(out, x, out=out)
    return out


@relu.fast("cpu")
def relu_cpu(xp, X, *, out=None):
    if out is None or not native(X, out):
        return into(out, relu(xp, X))
    return relu_(X, out)


@tanh.fast("cpu")
def tanh_cpu(xp, X, *, out=None):
    if out is None or not native(X, out):
        return into(out, tanh(xp, X))
    return np.tanh(X, out=out)


@sigmoid.fast("cpu")
def sigmoid_cpu(xp, X, *, out=None):
    if out is None or not native(X, out):
        return into(out, sigmoid(xp, X))
    # 1 / (1 + e^-x) = (1 + tanh(x / 2)) / 2: one transcendental, no overflow, in place
    np.multiply(X, X.dtype.type(0.5), out=out)
    np.tanh(out, out=out)
    out += 1
    out *= 0.5
    return out


@fused_elementwise.fast("cpu")
def fused_elementwise_cpu(xp, *inputs, ops=(), operands=(), params=(), out=None, _node=None):
    """The program in one pass where a compiled loop takes it, else as in-place ufunc calls; a
    call into the caller's ``out`` through one compiled loop is kept as the node's replay
    (``_node``, ``ops/compiled/replay.py``): DenseNet's 62 batch-norm-and-Relu nodes spent ~20
    us each choosing that loop again."""
    if out is not None and replay.replayed(_node, inputs + (out,)):
        return out
    replay.forget(_node)
    compiled = node_program(_node, ops, operands, params, len(inputs))
    with quiet(np):
        return compiled.run_cpu(inputs, out, _node if out is not None else None)


# its planned call, bound once per arena (ops/compiled/bound_calls.py): the recorded replay
binds_replay(fused_elementwise_cpu, lambda args, out: tuple(args) + (out,))


@binds(fused_elementwise_cpu)
def _bind_fused_elementwise(args, out, attributes):
    """The compiled loop's replay where the kernel recorded one, else the program's generated
    ufunc routine for these operands (small outputs: a BERT's embeddings sum over 8 tokens
    spent ~12 us of its kernel's asking for a routine of two adds), else nothing."""
    through_replay = replay_binder(fused_elementwise_cpu)(args, out, attributes)
    if through_replay is not None or out is None:
        return through_replay
    program = node_program(attributes.get("_node"), attributes.get("ops", ()),
                           attributes.get("operands", ()), attributes.get("params", ()),
                           len(args))
    routine = program.routine(list(args), out)
    if routine is None:
        return None

    def call(*inputs):
        return routine(*inputs, out)
    return call
