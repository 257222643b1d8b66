"""One Symbol function per registered operator, generated from the registry.

The kernel's Python signature is the ONNX spec (see ``ops/ir/registry.py``), so it tells us the
inputs (positional, optional when they have a default, variadic for ``*inputs``) and the
attributes (keyword-only, with their defaults). A generated function takes inputs as
Symbols (or arrays and numbers, which become constants), attributes as keywords, plus:

* ``name=``: the node's name (default: the op in lower case and a counter, ``conv3``);
* ``num_outputs=``: how many outputs to expose, for ops whose extra outputs are optional
  (BatchNormalization's running statistics, Dropout's mask) or variadic (Split).

A required input left out becomes a new Variable named after the node and the input's role,
MXNet's convention (``conv1_weight``, ``fc1_bias``, ``bn1_moving_mean``), so a layer can be
written as ``sym.Conv(data, kernel_shape=[3, 3], name="conv1")`` and its weight declared later
or inferred at bind time.

Each function is one call of :func:`mixrt.sym.symbol.call_op`, which makes the node (its
inputs, attributes, name and outputs checked against the op's spec) and the Symbol of its
outputs, beside the class it makes.
"""

from __future__ import annotations

from mixrt.op_specs import OPSET, docstring, spec_of  # noqa: F401  (mixrt.sym's OPSET)
from mixrt.sym.symbol import call_op


def make_function(domain: str, op_type: str):
    """The Symbol function for one op, named after it, documented from the registry."""
    def function(*args, name: str | None = None, num_outputs: int | None = None, **kwargs):
        return call_op(domain, op_type, list(args), kwargs, name=name,
                       num_outputs=num_outputs)

    function.__name__ = function.__qualname__ = op_type
    function.__doc__ = docstring(spec_of(domain, op_type))
    return function
