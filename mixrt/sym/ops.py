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
"""

from __future__ import annotations

import numpy as np

from mixrt import attribute, name as naming
from mixrt.base.errors import GraphError
from mixrt.op_specs import OPSET, OpSpec, docstring, spec_of  # noqa: F401  (mixrt.sym's OPSET)
from mixrt.ops.ir.registry import REGISTRY
from mixrt.sym.mxnet_arguments import mxnet_arguments
from mixrt.sym import symbol as symbol_module
from mixrt.sym.symbol import (ATTRIBUTES, constant, prefixed, variable_named, Symbol,
                               SymNode)

# the default-domain opset symbols are built at: the newest that export (13..21) and
# onnxruntime both take; ops that exist only at later opsets are built at their first one

# what MXNet calls a layer's parameters, by (op, ONNX input name); other inputs are named
# "<node>_<input in lower case>"
_PARAMETER_NAMES = {
    ("Conv", "W"): "weight", ("Conv", "B"): "bias",
    ("ConvTranspose", "W"): "weight", ("ConvTranspose", "B"): "bias",
    ("Gemm", "B"): "weight", ("Gemm", "C"): "bias", ("MatMul", "B"): "weight",
    ("BatchNormalization", "scale"): "gamma", ("BatchNormalization", "B"): "beta",
    ("BatchNormalization", "input_mean"): "moving_mean",
    ("BatchNormalization", "input_var"): "moving_var",
    ("LayerNormalization", "Scale"): "gamma", ("LayerNormalization", "B"): "beta",
    ("InstanceNormalization", "scale"): "gamma", ("InstanceNormalization", "B"): "beta",
    ("PRelu", "slope"): "alpha",
}
# inputs the op updates (as an output) rather than reads as a parameter: auxiliary states
_AUX_INPUTS = {("BatchNormalization", "input_mean"), ("BatchNormalization", "input_var")}


# -- node names -------------------------------------------------------------------------------

def _node_name(op_type: str, given: str | None, exact: bool = False) -> str:
    return prefixed(given if exact else layer_name(op_type, given))


def layer_name(kind: str, given: str | None) -> str:
    """``given``, or MXNet's automatic name: the kind in lower case and a counter per kind
    (``fullyconnected0``), as the current ``mixrt.name.NameManager`` gives them; without the
    ``sym.prefix`` (call_op adds it)."""
    return naming.current().get(given, kind.lower())


# -- calling an op ------------------------------------------------------------------------------

def call_op(domain: str, op_type: str, args: list, kwargs: dict, *, name: str | None = None,
            num_outputs: int | None = None, exact_name: bool = False) -> Symbol:
    """Add one node: ``args`` positional inputs, ``kwargs`` inputs by name, attributes, or
    MXNet's attributes of any symbol (``attr=``, ``lr_mult=``, ``__layout__=``, ...: stored
    on the node, see :func:`split_symbol_attributes`). ``exact_name``: ``name`` is final
    (a layer's inner node), not one for the name manager."""
    spec = spec_of(domain, op_type)
    node_name = _node_name(op_type, name, exact_name)
    kwargs, symbol_attributes = split_symbol_attributes(kwargs)
    args, kwargs = mxnet_arguments(spec, f"{op_type} {node_name!r}", args, kwargs)
    inputs, attributes = _split_arguments(spec, node_name, args, kwargs)
    count = _output_count(spec, node_name, attributes, num_outputs, inputs)
    entries = [_entry(spec, node_name, i, value, symbol_attributes)
               for i, value in enumerate(inputs)]
    node = SymNode(op_type, node_name, entries, attributes, spec.domain, spec.opset, count)
    if symbol_attributes:
        node.info[ATTRIBUTES] = symbol_attributes
    return Symbol([(node, i) for i in range(count)])


# MXNet's keywords that any operator takes, stored as the attribute ``__<key>__`` (and read
# back under both names)
SYMBOL_KEYWORDS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage")


def split_symbol_attributes(kwargs: dict) -> tuple[dict, dict]:
    """(the operator's own arguments, the symbol's attributes as strings): ``attr=`` (a
    dict), :data:`SYMBOL_KEYWORDS` and ``__<key>__`` keywords, over the current
    ``mixrt.attribute.AttrScope``'s."""
    own, given = {}, {}
    for key, value in kwargs.items():
        if key == "attr":
            given.update(_string_attributes(value))
        elif key in SYMBOL_KEYWORDS:
            given[f"__{key}__"] = str(value)
        elif key.startswith("__") and key.endswith("__") and len(key) > 4:
            given[key] = str(value)
        else:
            own[key] = value
    return own, attribute.current().get(given)


def _string_attributes(attr) -> dict:
    if attr is None:
        return {}
    if not isinstance(attr, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attr.items()):
        raise GraphError(f"attr must be a dict of strings to strings, got {attr!r}")
    return dict(attr)


def _split_arguments(spec: OpSpec, node_name: str, args, kwargs) -> tuple[list, dict]:
    label = f"{spec.op_type} {node_name!r}"
    if len(args) > len(spec.inputs) and not spec.variadic:
        raise GraphError(f"{label} takes at most {len(spec.inputs)} inputs "
                         f"{list(spec.inputs)}; got {len(args)}")
    inputs = list(args)
    attributes = {}
    for key, value in kwargs.items():
        if key in spec.inputs and not (spec.variadic and key == spec.inputs[-1]):
            index = spec.inputs.index(key)
            if index < len(args):
                raise GraphError(f"{label}: input {key!r} given both positionally and by name")
            inputs.extend([None] * (index + 1 - len(inputs)))
            inputs[index] = value
        elif key in spec.attributes or spec.any_attribute:
            attributes[key] = _attribute_value(value)
        else:
            raise GraphError(f"{label}: unknown argument {key!r}; inputs are "
                             f"{list(spec.inputs)}, attributes are {sorted(spec.attributes)}")
    fixed = len(spec.inputs) - (1 if spec.variadic else 0)
    inputs.extend([None] * (fixed - len(inputs)))
    return inputs, attributes


def _attribute_value(value):
    """Attributes as the importer would produce them: lists, Python scalars, arrays."""
    if isinstance(value, tuple):
        return [_attribute_value(v) for v in value]
    if isinstance(value, list):
        return [_attribute_value(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _output_count(spec: OpSpec, node_name: str, attributes: dict, asked, inputs) -> int:
    if "num_outputs" in spec.attributes and attributes.get("num_outputs") is not None:
        asked = asked or int(attributes["num_outputs"])
    if asked is not None:
        if int(asked) < 1:
            raise GraphError(f"{spec.op_type} {node_name!r}: num_outputs must be >= 1")
        return int(asked)
    if spec.default_outputs is None:
        split = inputs[1] if spec.op_type == "Split" and len(inputs) > 1 else None
        if split is not None and not isinstance(split, Symbol):
            return len(np.atleast_1d(np.asarray(split)))
        raise GraphError(f"{spec.op_type} {node_name!r} has a variable number of outputs; "
                         f"say how many with num_outputs=")
    return spec.default_outputs


def _entry(spec: OpSpec, node_name: str, index: int, value, symbol_attributes: dict):
    """One input of the new node: a Symbol's output, a constant, a missing optional input
    or (for a required input left out) a new Variable, with the node's attributes."""
    input_name = spec.inputs[min(index, len(spec.inputs) - 1)]
    if value is None:
        if index < spec.required:
            made = _auto_variable(spec, node_name, input_name)._outputs[0]
            if symbol_attributes:
                made[0].info[ATTRIBUTES] = dict(symbol_attributes)
            return made
        return None
    if isinstance(value, Symbol):
        if len(value) != 1:
            raise GraphError(f"{spec.op_type} {node_name!r}: input {input_name!r} got a "
                             f"symbol with {len(value)} outputs {value.list_outputs()}; "
                             f"index it to pick one")
        return value._outputs[0]
    return constant(value)._outputs[0]


def _auto_variable(spec: OpSpec, node_name: str, input_name: str) -> Symbol:
    role = _PARAMETER_NAMES.get((spec.op_type, input_name), input_name.lower())
    # node_name already carries the prefix
    return variable_named(f"{node_name}_{role}", aux=(spec.op_type, input_name) in _AUX_INPUTS)


# -- generation ---------------------------------------------------------------------------------

def make_function(domain: str, op_type: str):
    """The Symbol function for one op, named after it, documented from the registry."""
    def function(*args, name: str | None = None, num_outputs: int | None = None, **kwargs):
        return call_op(domain, op_type, list(args), kwargs, name=name,
                       num_outputs=num_outputs)

    function.__name__ = function.__qualname__ = op_type
    function.__doc__ = docstring(spec_of(domain, op_type))
    return function


symbol_module.hand_in(call_op=call_op, layer_name=layer_name)
