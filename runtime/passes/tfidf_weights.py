"""A term-frequency vectorizer's column weights, folded into the vectorizer.

scikit-learn's ``TfidfVectorizer`` exports (through skl2onnx) as raw counts times the
inverse document frequencies::

    counts = TfIdfVectorizer(tokens, mode="TF")            (its weights, if any, unused)
    scores = Mul(counts, idf)                              idf a constant, one per column

which ONNX's TfIdfVectorizer computes in one node: ``mode="TFIDF"`` multiplies each count
by its pool entry's weight. The fold gives pool entry k the weight ``idf[ngram_indexes[k]]``
(the column it counts into). It is exact: a count (a small integer, exact in float32) times
its weight is the same single rounding either way, and a column no n-gram reaches is 0 in
both, since the weights must be finite and not negative (0 * inf, or a -0.0, would differ).
A text classifier's one-row request spent ~2 us of its ~30 on the Mul.
"""

from __future__ import annotations

import numpy as np

from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import GraphIndex, replace_matches


def fold_tfidf_weights(graph: Graph, ir_version: int | None) -> int:
    """Fold every constant column weighting of a TF-mode TfIdfVectorizer; returns how
    many."""
    types = infer_types(graph)
    return replace_matches(
        graph, ir_version,
        lambda node: node.op_type == "TfIdfVectorizer" and not node.domain,
        lambda g, constants, index, node: _Fold(g, constants, types, index).at(node))


class _Fold:
    def __init__(self, g: Graph, constants: dict, types: dict, index: GraphIndex):
        self.g, self.constants, self.types, self.index = g, constants, types, index

    def at(self, vectorizer: Node) -> "_Fold | None":
        attributes = vectorizer.attributes
        # (TF mode reads no weights: skl2onnx writes ones there, which the fold replaces)
        if attributes.get("mode") != "TF" or attributes.get("ngram_indexes") is None \
                or len(vectorizer.outputs) != 1:
            return None
        counts = vectorizer.outputs[0]
        readers = self.index.readers.get(counts, [])
        if len(readers) != 1 or self.index.counts[counts] != 1 \
                or counts in self.g.output_names:
            return None
        mul = readers[0]
        if mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2:
            return None
        weights = self._column_weights(mul, counts, attributes["ngram_indexes"])
        if weights is None:
            return None
        self.vectorizer, self.mul, self.weights = vectorizer, mul, weights
        return self

    def _column_weights(self, mul: Node, counts: str, indexes) -> np.ndarray | None:
        """The Mul's other operand as one finite, non-negative float32 weight per column
        (shape (width,) or (1, width), so the product keeps the counts' shape)."""
        other = mul.inputs[1] if mul.inputs[0] == counts else mul.inputs[0]
        value = self.constants.get(other)
        shape = getattr(self.types.get(counts), "shape", None)
        width = int(max(indexes)) + 1
        if value is None or value.dtype != np.float32 or shape is None or not shape \
                or shape[-1] != width or value.shape not in ((width,), (1, width)) \
                or (value.ndim > len(shape)) or not np.all(np.isfinite(value)) \
                or np.any(value < 0):
            return None
        return value.reshape(-1)[np.asarray(indexes, dtype=np.int64)].astype(np.float32)

    def replace(self) -> None:
        vectorizer = self.vectorizer
        attributes = dict(vectorizer.attributes, mode="TFIDF",
                          weights=[float(w) for w in self.weights])
        fused = Node(vectorizer.op_type, list(vectorizer.inputs), list(self.mul.outputs),
                     vectorizer.name, vectorizer.domain, vectorizer.opset, attributes)
        self.g.nodes[self.g.nodes.index(self.mul)] = fused
        self.g.nodes.remove(vectorizer)
