"""MXNet's ``sym.Custom``: a node running an operator registered with
``mixrt.operator.register`` (the graph op is ``mixrt::Custom``, ``ops/control/custom.py``)."""

from __future__ import annotations

from mixrt import operator
from mixrt.base.errors import GraphError
from mixrt.ops.ir.registry import MIXRT
from mixrt.sym.symbol import call_op, layer_name, prefixed, Symbol, variable_named


def Custom(*inputs, op_type=None, name=None, **kwargs) -> Symbol:
    """A node of the Python operator ``op_type``: inputs positional or named after the
    property's arguments and auxiliary states (a missing one becomes a Variable named
    ``<name>_<input>``, as MXNet names them); the other keyword arguments go to the
    property, as strings. Its outputs are the property's ``list_outputs()``."""
    if op_type is None:
        raise GraphError("Custom: op_type= (the name given to mx.operator.register) is "
                         "required")
    named = {k: v for k, v in kwargs.items() if isinstance(v, Symbol)}
    params = {k: v for k, v in kwargs.items() if k not in named}
    prop = operator.make_prop(op_type, params)
    names = operator.input_names(prop)
    unknown = sorted(set(named) - set(names))
    if unknown or len(inputs) > len(names):
        raise GraphError(f"Custom {op_type!r}: takes the inputs {names}; got "
                         f"{len(inputs)} positional and {sorted(named)} by name")
    node_name = layer_name("custom", name)
    aux = set(prop.list_auxiliary_states())
    entries = list(inputs) + [named.get(n) for n in names[len(inputs):]]
    entries = [variable_named(f"{prefixed(node_name)}_{n}", aux=n in aux) if e is None else e
               for n, e in zip(names, entries)]
    return call_op(MIXRT, "Custom", entries,
                   {"custom_type": op_type, "params": operator.params_text(params),
                    "node_key": node_name},
                   name=node_name, num_outputs=len(prop.list_outputs()))
