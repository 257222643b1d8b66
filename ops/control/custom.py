"""``mixrt::Custom`` and ``mixrt::CustomGrad``: an operator written in Python (MXNet's
``Custom``, registered with ``mixrt.operator.register``) as a node of a graph.

The op only knows the registered name (``custom_type``, MXNet's ``op_type``), the keyword
arguments its property class is made with (``params``, a JSON object of strings, as MXNet hands them over) and a
``node_key`` that tells one Custom node of a graph from another (so each node keeps its own
operator instance between its forward and its backward, as MXNet's executor does). What the
Python code does is the frontend's business: ``mixrt.operator`` hands in a runner
(:func:`use_runner`) as it loads, because ``ops/`` may not import a frontend. A graph holding
a Custom node can therefore only run in a process where its op_type was registered.

CustomGrad's inputs are the head gradients (one per output), the forward's inputs and its
outputs, in that order; it outputs one gradient per forward input.
"""

from __future__ import annotations

from mixrt.base.errors import UnsupportedOperatorError
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType

# the ops that call back into this process's Python code (no child process can run them)
IN_PROCESS_OPS = frozenset({"Custom", "CustomGrad"})

_RUNNER: list = []


def use_runner(runner) -> None:
    """``runner`` has ``forward(xp, op_type, params, node_key, inputs, count)``,
    ``backward(xp, op_type, params, node_key, out_grads, in_data, out_data)`` and
    ``infer(op_type, params, input_types)``."""
    _RUNNER[:] = [runner]


def _runner(op_type: str):
    if not _RUNNER:
        raise UnsupportedOperatorError(
            f"Custom: op_type {op_type!r} is a Python operator, and none is registered in "
            f"this process; import mixrt.operator and register it first",
            domain=MIXRT, op_type="Custom")
    return _RUNNER[0]


@op("Custom", domain=MIXRT)
def custom(xp, *inputs, custom_type: str = "", params: str = "{}", node_key: str = "",
           _outputs=1):
    results = _runner(custom_type).forward(xp, custom_type, params, node_key, list(inputs), _outputs)
    return tuple(results)


@custom.infer
def _(*inputs, custom_type: str = "", params: str = "{}", **_):
    if not _RUNNER:
        return None
    return _RUNNER[0].infer(custom_type, params, list(inputs))


@custom.grad
def _(b, node, dy):
    """Every output's head gradient (zeros where none reaches it), then the forward's inputs
    and outputs, into one CustomGrad node with a gradient per input."""
    heads = [g if g else b.emit("Mul", out, b.constant(0.0, like=out))
             for g, out in zip(dy, node.outputs)]
    grads = b.emit("CustomGrad", *heads, *node.inputs, *node.outputs, domain=MIXRT,
                   outputs=len(node.inputs), num_outputs=len(node.outputs),
                   **{key: node.attributes[key] for key in ("custom_type", "params", "node_key")
                      if key in node.attributes})
    return list(grads) if isinstance(grads, tuple) else [grads]


@op("CustomGrad", domain=MIXRT)
def custom_grad(xp, *values, custom_type: str = "", params: str = "{}", node_key: str = "",
                num_outputs: int = 1, _outputs=1):
    out_grads = list(values[:num_outputs])
    in_data = list(values[num_outputs:len(values) - num_outputs])
    out_data = list(values[len(values) - num_outputs:])
    grads = _runner(custom_type).backward(xp, custom_type, params, node_key, out_grads, in_data,
                                      out_data)
    return tuple(grads)


@custom_grad.infer
def _(*values, num_outputs: int = 1, **_):
    inputs = values[num_outputs:len(values) - num_outputs]
    return [TensorType(t.dtype, t.shape) for t in inputs]
