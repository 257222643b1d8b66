"""The nodes of a symbol's DAG (:class:`SymNode`), the keys of the records a node keeps in
its ``info``, and how MXNet sees one node: whether its structural queries list it (a layer
is one node to them), the inputs it reads, its attributes as the strings ``list_attr`` shows.

This is the vocabulary every part of ``mixrt.sym`` speaks (the Symbol's queries, its
lowering, the JSON readers and writers, the layers), kept apart from the Symbol class so that
the modules the class is composed of share it without importing the class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mixrt.base.errors import GraphError

DEFAULT_DTYPE = np.dtype(np.float32)  # a variable's dtype when nobody says otherwise
# node.info key of MXNet's symbol attributes (strings: ``attr=``, ``lr_mult``, AttrScope's),
# which list_attr/attr_dict show and operators never read
ATTRIBUTES = "attr"
# node.info key of a node that is part of an MXNet layer (sym.FullyConnected, ...): the layer's
# name, which is its output node's. MXNet's structural queries (get_children, get_internals)
# see the layer as that one node, as MXNet has it.
LAYER = "layer"
# keys of a Variable's ``attr=`` that are mixrt records of its own, not MXNet attributes
_INFO_KEYS = ("shape_from",)
# an operator node's info key: the word its outputs are named by, where MXNet's operator
# names them otherwise than ``<node>_output`` (make_loss: ``<node>_loss``)
OUTPUT_SUFFIX = "output_suffix"
# an operator node's info key: the node is a loss head (make_loss, MakeLoss), whose
# gradient MXNet fixes whatever head gradient backward is given
LOSS_HEAD = "loss_head"
# an operator node's info key: the order (input positions) MXNet's structure lists its
# inputs in, where it is not the node's own (an Embedding's Gather reads the weight first;
# MXNet lists data, then weight)
INPUT_ORDER = "input_order"
# an operator node's info key: the MXNet operator it was made for (``FullyConnected``,
# ``Pooling``), which MXNet's op hook reports; a node without it reports its own op
MXNET_OP = "mxnet_op"
# an operator node's info key: the parameters an MXNet layer was given (strings, as MXNet
# keeps them: ``{"num_hidden": "10"}``), which list_attr shows in place of the node's ONNX
# attributes; MXNet copies them onto the Variables a layer makes for its inputs, so those
# carry them too
MXNET_PARAMS = "mxnet_params"
# MXNet's attributes that it stores as ``__<key>__`` and lists under both names
HIDDEN_KEYS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage")


@dataclass(eq=False)
class SymNode:
    """One node of a symbol's DAG. ``op`` is None for a variable, "" for a constant."""

    op: str | None
    name: str
    inputs: list = field(default_factory=list)  # (SymNode, output index) or None (missing)
    attrs: dict = field(default_factory=dict)  # operator attributes
    domain: str = ""
    opset: int = 0
    num_outputs: int = 1
    # variables: declared shape / dtype / initializer / aux flag / lr and wd multipliers;
    # constants: "value"
    info: dict = field(default_factory=dict)

    @property
    def is_variable(self) -> bool:
        return self.op is None

    @property
    def is_constant(self) -> bool:
        return self.op == ""

    def output_name(self, index: int) -> str:
        if self.is_variable or self.is_constant:
            return self.name
        suffix = self.info.get(OUTPUT_SUFFIX, "output")
        return f"{self.name}_{suffix}" if self.num_outputs == 1 else \
            f"{self.name}_{suffix}{index}"


def _inputs_in_listed_order(node: SymNode) -> list:
    order = node.info.get(INPUT_ORDER)
    return node.inputs if order is None else [node.inputs[i] for i in order]


# -- MXNet's view of the structure: a layer is one node ------------------------------------------

def _listed(node: SymNode) -> bool:
    """Whether MXNet would list the node: not a constant, not a layer's inner node."""
    return not node.is_constant and node.info.get(LAYER, node.name) == node.name


def _layer_inputs(node: SymNode) -> list:
    """The entries ``node`` reads; for a layer's output node, those the layer reads from
    outside (its data and parameters), in the order met walking back from ``node``."""
    layer = node.info.get(LAYER)
    found, seen = [], set()

    def walk(current: SymNode) -> None:
        for entry in current.inputs:
            if entry is None or entry[0].is_constant:
                continue
            inner = layer is not None and entry[0].info.get(LAYER) == layer \
                and not entry[0].is_variable
            if inner:
                walk(entry[0])
            elif (id(entry[0]), entry[1]) not in seen:
                seen.add((id(entry[0]), entry[1]))
                found.append(entry)

    walk(node)
    return found


# -- attributes --------------------------------------------------------------------------------

def _attributes(node: SymNode) -> dict:
    """A node's attributes as MXNet lists them: strings, the keywords MXNet stores as
    ``__<key>__`` under both names."""
    found = {}
    if node.is_variable:
        if node.info.get("shape") is not None:
            found["__shape__"] = str(tuple(0 if d is None else d for d in node.info["shape"]))
        for key in ("lr_mult", "wd_mult"):
            if key in node.info:
                found[f"__{key}__"] = str(node.info[key])
        found.update(node.info.get(MXNET_PARAMS, {}))
    elif MXNET_PARAMS in node.info:
        found.update(node.info[MXNET_PARAMS])
    elif not node.is_constant:
        found.update({key: _attribute_text(value) for key, value in node.attrs.items()})
    for key, value in node.info.get(ATTRIBUTES, {}).items():  # MXNet stores lr_mult so too
        found[f"__{key}__" if key in HIDDEN_KEYS else key] = value
    for key in HIDDEN_KEYS:
        if f"__{key}__" in found:
            found[key] = found[f"__{key}__"]
    return found


def _stored_key(key: str, value: str) -> str:
    """The key MXNet stores an attribute under: a hidden key (``lr_mult``) as
    ``__lr_mult__``; one ending in a hidden key (``fc_lr_mult``) is refused, as MXNet
    refuses it (set it on the Variable instead)."""
    for hidden in HIDDEN_KEYS:
        if key == hidden:
            return f"__{key}__"
        if key.endswith(hidden):
            raise GraphError(f"setting variable attributes with {key} is no longer "
                             f"supported (as in MXNet); use w = Variable(name, {hidden}="
                             f"{value}) and pass w as the layer's input")
    return key


def _attribute_text(value) -> str:
    if isinstance(value, (list, tuple)):
        return str(tuple(value))
    return str(value)

