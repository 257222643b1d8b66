"""What onnxruntime loads beyond the spec, and mixrt with it (docs/conformance.md, "What
onnxruntime runs beyond the spec").

Exporters have written models that break the spec in ways onnxruntime tolerates. mixrt loads
each such model as onnxruntime does and says, in one warning naming the node, what it
assumed; where following onnxruntime could change results without anyone noticing, it
refuses instead, naming the node and the reason. Each rule here was checked against what
onnxruntime does with a model that shows it (``tests/test_onnxruntime_leniency.py``).
"""

from __future__ import annotations

import difflib
import inspect
import warnings

import numpy as np

from mixrt.base.errors import GraphError, LenientLoadWarning
from mixrt.ops.ir.registry import REGISTRY
from mixrt.runtime.graph import Graph, Node

# A domain the model uses but its opset_import leaves out: onnxruntime adds every domain its
# schema registry knows at that domain's latest version (onnxruntime/core/graph/model.cc,
# Model::Model: GetLatestOpsetVersions), whatever the model's IR or ai.onnx version.
# ai.onnx.ml's latest is 5 for onnx 1.16 on (onnxruntime 1.18+); com.microsoft has only 1.
UNDECLARED_DOMAIN_VERSIONS = {"com.microsoft": 1, "ai.onnx.ml": 5}

# Ops whose onnxruntime schema does not check attribute names: LayerNormalization was an
# onnxruntime contrib op in the ai.onnx domain before opset 17, and onnxruntime still runs a
# node carrying an attribute no schema has (its optimizer tests' graphs misspell epsilon as
# "epsion"), leaving the attribute out. Every other op there refuses an unknown attribute,
# as mixrt does (ops/ir/registry.lookup_kernel).
UNCHECKED_ATTRIBUTE_OPS = {("", "LayerNormalization")}

# Resize's coordinate_transformation_mode that the spec listed at opset 11 only; onnxruntime
# still computes it at 13 and later, with a warning
TF_HALF_PIXEL_FOR_NN, LAST_OPSET_LISTING_IT = "tf_half_pixel_for_nn", 12

CONSTANT_VALUE_ATTRIBUTES = {
    "value": None, "sparse_value": None, "value_float": np.float32,
    "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64,
    "value_string": object, "value_strings": object}


class UndeclaredDomainWarning(LenientLoadWarning):
    """A node's domain is missing from the model's opset_import; mixrt reads it at the
    version onnxruntime takes (UNDECLARED_DOMAIN_VERSIONS)."""


class IgnoredAttributeWarning(LenientLoadWarning):
    """A node carries an attribute its op does not have, and onnxruntime ignores it; the
    message says which default is used where the name is a misspelling of a real one."""


class RepeatedConstantWarning(LenientLoadWarning):
    """A constant (Constant node or initializer) is defined twice with the same value; the
    first definition is kept."""


class DroppedModeWarning(LenientLoadWarning):
    """An attribute value the spec dropped at the node's opset and onnxruntime still runs."""


# -- undeclared domains -------------------------------------------------------------------

def declare_undeclared_domains(graph_proto, opsets: dict[str, int], first_node_of) -> None:
    """Add each domain of UNDECLARED_DOMAIN_VERSIONS that a node uses and the opset_import
    leaves out, with one warning naming the first such node; any other undeclared domain
    stays an error (importers/onnx.py, ``_convert_node``)."""
    for domain, version in UNDECLARED_DOMAIN_VERSIONS.items():
        if domain in opsets:
            continue
        node = first_node_of(graph_proto, domain)
        if node is None:
            continue
        warnings.warn(f"node {node.name or node.op_type!r} uses domain {domain!r}, which the "
                      f"model's opset_import does not declare; reading it at version "
                      f"{version}, as onnxruntime does", UndeclaredDomainWarning, stacklevel=4)
        opsets[domain] = version


# -- attributes no schema has -------------------------------------------------------------

def drop_ignored_attributes(node: Node) -> None:
    """Remove from ``node`` the attributes onnxruntime ignores (UNCHECKED_ATTRIBUTE_OPS), one
    warning each; on any other op an unknown attribute stays for the binder to refuse."""
    if (node.domain, node.op_type) not in UNCHECKED_ATTRIBUTE_OPS:
        return
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is None or kernel.accepts_any_attribute:
        return
    known = sorted(a for a in kernel.attribute_names if not a.startswith("_"))
    for name in sorted(set(node.attributes) - kernel.attribute_names):
        del node.attributes[name]
        warnings.warn(f"node {node.label!r}: {node.op_type} has no attribute {name!r}"
                      f"{_assumed_default(kernel.fn, name, known, node.attributes)}; ignoring "
                      f"it, as onnxruntime does", IgnoredAttributeWarning, stacklevel=5)


def _assumed_default(fn, name: str, known: list[str], given: dict) -> str:
    """', did you mean 'epsilon'? epsilon keeps its default 1e-05' where ``name`` is close
    to an attribute the node does not set, so a reader sees what the misspelling costs."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if not close or close[0] in given:
        return ""
    default = inspect.signature(fn).parameters[close[0]].default
    return f" (did you mean {close[0]!r}? {close[0]} keeps its default {default!r})"


# -- a constant defined twice -------------------------------------------------------------

def drop_repeated_constants(graph: Graph) -> None:
    """A Constant node whose output an initializer or an earlier Constant node already
    defines: onnxruntime turns Constant nodes into initializers and keeps the last of
    duplicates, for every use, the ones before it in node order too. With equal values that
    is the one value; mixrt keeps the first definition and warns once per name. With
    different values the model means two things, so it is refused naming both."""
    defined = {name: ("initializer", value) for name, value in graph.initializers.items()}
    kept, warned = [], set()
    for node in graph.nodes:
        value = _constant_value(node)
        name = node.outputs[0] if value is not None and node.outputs else ""
        if not name or name not in defined:  # "": not a Constant, or one nobody reads
            if name:
                defined[name] = (f"Constant node {node.label!r}", value)
            kept.append(node)
            continue
        first, first_value = defined[name]
        if not _same_value(first_value, value):
            raise GraphError(f"graph {graph.name!r}: {name!r} is defined by {first} and again "
                             f"by Constant node {node.label!r} with a different value; "
                             f"onnxruntime would use the last for every use, the ones before "
                             f"it too, so mixrt refuses the model rather than guess")
        if name not in warned:
            warned.add(name)
            warnings.warn(f"graph {graph.name!r}: {name!r} is defined by {first} and again by "
                          f"Constant node {node.label!r} with the same value; keeping one, "
                          f"as onnxruntime does", RepeatedConstantWarning, stacklevel=5)
    graph.nodes = kept


def check_repeated_initializer(graph_name: str, name: str, first, second) -> None:
    """Two initializers of one name: onnxruntime keeps the last; equal values warn, different
    ones are refused (as for Constant nodes, ``drop_repeated_constants``)."""
    if not _same_value(first, second):
        raise GraphError(f"graph {graph_name!r}: initializer {name!r} is given twice with "
                         f"different values; onnxruntime would use the last, so mixrt refuses "
                         f"the model rather than guess")
    warnings.warn(f"graph {graph_name!r}: initializer {name!r} is given twice with the same "
                  f"value; keeping one, as onnxruntime does", RepeatedConstantWarning,
                  stacklevel=5)


def _constant_value(node: Node):
    """A Constant node's value as an array, or None for any other node."""
    if node.op_type != "Constant" or node.domain != "" or len(node.attributes) != 1:
        return None
    (key, value), = node.attributes.items()
    if key not in CONSTANT_VALUE_ATTRIBUTES:
        return None
    dtype = CONSTANT_VALUE_ATTRIBUTES[key]
    return np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)


def _same_value(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:
        return a.tolist() == b.tolist()
    return a.tobytes() == b.tobytes()  # bit for bit: NaNs equal, 0.0 and -0.0 not


# -- attribute values the spec dropped ----------------------------------------------------

def warn_dropped_modes(node: Node) -> None:
    """Resize's tf_half_pixel_for_nn after opset 12: computed as at opset 11
    (ops/image/resample.py), as onnxruntime does, with one warning."""
    if node.op_type != "Resize" or node.domain != "" or node.opset <= LAST_OPSET_LISTING_IT:
        return
    if node.attributes.get("coordinate_transformation_mode") == TF_HALF_PIXEL_FOR_NN:
        warnings.warn(f"node {node.label!r}: Resize's coordinate_transformation_mode "
                      f"{TF_HALF_PIXEL_FOR_NN!r} was dropped from the spec at opset 13 (this "
                      f"model is at {node.opset}); computing it as at opset 11, as onnxruntime "
                      f"does", DroppedModeWarning, stacklevel=5)


def lenient_node(node: Node) -> Node:
    """The checks above that look at one node, in the order the importer needs them."""
    drop_ignored_attributes(node)
    warn_dropped_modes(node)
    return node
