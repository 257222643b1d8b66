"""A classifier's labels as scikit-learn's exporter spells them, folded into one lookup.

skl2onnx ends a classifier that scores its classes in the graph (an MLP, a voting or
stacking ensemble) with::

    index = ArgMax(probabilities, axis=1)                  (N, 1) int64
    label = ArrayFeatureExtractor(classes, index)          classes a constant (C,)
    label = Reshape(label, [-1])                           (N,)
    label = Cast(label, to=T)                              (optional)

four nodes for what is ``Gather(classes as T, ArgMax(probabilities, axis=1, keepdims=0))``,
and only the ArgMax where the classes are 0..C-1 and T is int64 (the ArgMax's own output).
On a one-row request the three extra nodes cost more than the network before them (~10 us of
a 36 us run). The rewrite is exact: the same indices pick the same values, cast once at load
instead of on every run, and it is made only where the cast is exact for every class.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import GraphIndex, NameMaker, remove_nodes, replace_matches

ML = "ai.onnx.ml"  # ArrayFeatureExtractor's domain
_ONNX_TYPES = {1: np.float32, 6: np.int32, 7: np.int64, 11: np.float64, 8: np.str_}


def fold_class_labels(graph: Graph, ir_version: int | None) -> int:
    """Fold every label lookup of the form above; returns how many."""
    types, names = infer_types(graph), NameMaker(graph)
    return replace_matches(
        graph, ir_version, lambda node: node.op_type == "ArgMax" and not node.domain,
        lambda g, constants, index, argmax: _Lookup(g, constants, types, index, names).at(argmax))


class _Lookup:
    def __init__(self, g: Graph, constants: dict, types: dict, index: GraphIndex,
                 names: NameMaker):
        self.g, self.constants, self.types, self.index = g, constants, types, index
        self.names = names
        self.covered: list[Node] = []

    def _only_reader(self, name: str, op_type: str, domain: str = "") -> Node | None:
        """The one node reading ``name``, when it is of ``op_type`` and ``name`` is no graph
        output."""
        found = self.index.readers.get(name, [])
        if len(found) != 1 or self.index.counts[name] != 1 or name in self.g.output_names:
            return None
        node = found[0]
        return node if node.op_type == op_type and node.domain == domain else None

    def at(self, argmax: Node) -> "_Lookup | None":
        scores = self.types.get(argmax.inputs[0])
        if scores is None or scores.shape is None or len(scores.shape) != 2 \
                or argmax.attributes.get("axis", 0) not in (1, -1) \
                or argmax.attributes.get("keepdims", 1) != 1:
            return None
        extract = self._only_reader(argmax.outputs[0], "ArrayFeatureExtractor", ML)
        if extract is None or list(extract.inputs) != [extract.inputs[0], argmax.outputs[0]]:
            return None
        classes = self.constants.get(extract.inputs[0])
        reshape = self._only_reader(extract.outputs[0], "Reshape")
        if classes is None or classes.ndim != 1 or reshape is None \
                or not _is_flat(self.constants.get(reshape.inputs[1])):
            return None
        cast = self._only_reader(reshape.outputs[0], "Cast")
        labels = _cast_exactly(classes, cast)
        if labels is None:
            return None
        self.argmax, self.labels = argmax, labels
        self.covered = [extract, reshape] + ([cast] if cast is not None else [])
        self.output = self.covered[-1].outputs[0]
        return self

    def replace(self) -> None:
        position = self.g.nodes.index(self.argmax)
        direct = self.labels.dtype == np.int64 and np.array_equal(
            self.labels, np.arange(len(self.labels)))  # the index is the label
        index = self.output if direct else self.argmax.outputs[0]
        self.g.nodes[position] = Node("ArgMax", self.argmax.inputs, [index], self.argmax.name,
                                      "", self.argmax.opset,
                                      dict(self.argmax.attributes, keepdims=0))
        if not direct:
            table = self.names(f"{self.output}/classes")
            self.g.initializers[table] = self.labels
            self.constants[table] = self.labels
            # Gather along axis 0 means the same at every opset: the ArgMax's serves
            self.g.nodes.insert(position + 1, Node("Gather", [table, index], [self.output],
                                                   self.covered[0].name, "",
                                                   self.argmax.opset, {"axis": 0}))
        remove_nodes(self.g, self.covered)


def _is_flat(shape) -> bool:
    return shape is not None and shape.ndim == 1 and shape.tolist() == [-1]


def _cast_exactly(classes: np.ndarray, cast: Node | None) -> np.ndarray | None:
    """The classes as the Cast makes them, when casting each class is exact (a round trip
    gives it back) and the kinds agree (numbers to numbers, text to text); None otherwise."""
    if cast is None:
        return classes
    target = _ONNX_TYPES.get(cast.attributes.get("to"))
    if target is None or (classes.dtype.kind in "OUS") != (np.dtype(target).kind == "U"):
        return None
    if np.dtype(target).kind == "U":
        return classes if classes.dtype == object else classes.astype(object)
    labels = classes.astype(target)
    return labels if np.array_equal(labels.astype(classes.dtype), classes) else None
