"""A Tokenizer whose tokens only a TfIdfVectorizer counts, as one ``mixrt::TokenCounts`` node
(the op, and why: ``ops/text/token_counts.py``)::

    texts = StringNormalizer(raw)                  case change only; or raw texts
    tokens = com.microsoft::Tokenizer(texts)       no marks
    flat = Flatten(tokens)                         axis 1; or the vectorizer reads tokens
    counts = TfIdfVectorizer(flat)                 single items, each its own column

as skl2onnx writes scikit-learn's text vectorizers. The tokens and the flattened tokens
must be read by the pattern alone and not be graph outputs; the vectorizer must count
single strings, each pool entry into a column of its own, with finite weights (what the
fused kernel counts exactly as the two nodes do). The fusion is exact, so it runs with the
exact passes (after ``tfidf_weights``, which may give the vectorizer its weights).
"""

from __future__ import annotations

from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.text.contrib_text import MICROSOFT, _cutter_for
from mixrt.ops.text.string import _CASE_CHANGES, _TfIdf
from mixrt.ops.text.token_counts import COUNTING, CUTTING
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import PatternMatch, fuse_into_mixrt, kernel_for, remove_nodes


def fuse_token_counts(graph: Graph, ir_version: int | None) -> int:
    """Replace each [StringNormalizer ->] Tokenizer -> [Flatten ->] TfIdfVectorizer chain by
    one node; returns how many."""
    return fuse_into_mixrt(graph, ir_version, infer_types(graph), "TfIdfVectorizer", _Match)


class _Match(PatternMatch):
    def at(self, vectorizer: Node) -> "_Match | None":
        if len(vectorizer.inputs) != 1 or len(vectorizer.outputs) != 1 \
                or not _counts_single_items(vectorizer.attributes) \
                or kernel_for(vectorizer) is None:
            return None
        self.vectorizer, self.flatten = vectorizer, None
        tokens = vectorizer.inputs[0]
        producer = self.producers.get(tokens)
        if producer is not None and not producer.domain and producer.op_type == "Flatten":
            if int(producer.attributes.get("axis", 1)) != 1 or not self._private(tokens) \
                    or kernel_for(producer) is None:
                return None
            self.flatten, tokens = producer, producer.inputs[0]
            producer = self.producers.get(tokens)
        if producer is None or producer.domain != MICROSOFT or producer.op_type != "Tokenizer" \
                or len(producer.outputs) != 1 or not self._private(tokens) \
                or not _cuts_without_marks(producer.attributes) or kernel_for(producer) is None:
            return None
        self.tokenizer, self.normalizer = producer, self._case_change(producer.inputs[0])
        return self

    def _case_change(self, texts: str) -> Node | None:
        """The StringNormalizer writing ``texts``, where it only changes case and only the
        Tokenizer reads them."""
        node = self.producers.get(texts)
        if node is None or node.domain or node.op_type != "StringNormalizer" \
                or len(node.outputs) != 1 or not self._private(texts) \
                or node.attributes.get("stopwords") or kernel_for(node) is None:
            return None
        return node if node.attributes.get("case_change_action", "NONE") in _CASE_CHANGES \
            else None

    def replace(self) -> None:
        cutting = {name: value for name, value in self.tokenizer.attributes.items()
                   if name in CUTTING}
        counting = {name: value for name, value in self.vectorizer.attributes.items()
                    if name in COUNTING}
        taken, texts = [self.tokenizer], self.tokenizer.inputs[0]
        if self.normalizer is not None:
            normalizing = self.normalizer.attributes
            counting["case_change_action"] = normalizing.get("case_change_action", "NONE")
            if normalizing.get("locale") is not None:  # (for an export: onnxruntime's default
                counting["locale"] = normalizing["locale"]  # locale may not be installed)
            taken.append(self.normalizer)
            texts = self.normalizer.inputs[0]
        fused = Node("TokenCounts", [texts], list(self.vectorizer.outputs),
                     self.tokenizer.name, MIXRT, 1, {**cutting, **counting})
        self.g.nodes[self.g.nodes.index(self.vectorizer)] = fused
        remove_nodes(self.g, taken + ([self.flatten] if self.flatten else []))


def _counts_single_items(attributes: dict) -> bool:
    """Strings counted one at a time, each pool entry into a column of its own, with finite
    weights (``_TfIdf.unigrams``); attributes the fused op carries, and no others."""
    if attributes.get("pool_strings") is None or set(attributes) - set(COUNTING):
        return False
    try:
        vectorizer = _TfIdf(pool_int64s=None, **{name: attributes.get(name)
                                                  for name in COUNTING})
    except (ValueError, TypeError):
        return False
    return vectorizer.unigrams is not None


def _cuts_without_marks(attributes: dict) -> bool:
    """A valid cutter that puts no marks around a text's tokens."""
    if int(attributes.get("mark", 1)) != 0 or set(attributes) - set(CUTTING) - {"mark"}:
        return False
    try:
        _cutter_for(0, *(attributes.get(name) for name in CUTTING[:4]),
                    attributes.get("tokenexpsplit", 0))
    except (ValueError, TypeError):
        return False
    return True
