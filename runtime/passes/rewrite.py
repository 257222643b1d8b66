"""Editing a Graph in place: the helpers every optimization pass shares.

Passes rewrite a private copy of the graph (:func:`copy_graph`), so these helpers mutate
freely. Two rules make rewrites safe in the presence of subgraphs:

* a value is *read* by a node's inputs and by any name its subgraphs read from the enclosing
  scope (If/Loop/Scan bodies), so renaming or counting readers always walks subgraphs too;
* a graph's outputs are its interface: a rewrite never drops or renames them.

Which initializers are constants is decided here too. ONNX lets a feed override an
initializer that is also listed as a graph input (IR version 4 on); before IR 4 every
initializer had to be listed as an input, so there the listing says nothing and all
initializers are constants (onnxruntime reads them the same way). A graph whose IR version is
unknown is treated as overridable: never fold what a caller might replace.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

import numpy as np

from mixrt.ops.ir.registry import MIXRT, REGISTRY
from mixrt.runtime.graph import Graph, Node, outer_scope_reads


# -- copying -------------------------------------------------------------------------------

def copy_graph(graph: Graph) -> Graph:
    """A copy whose nodes, values, lists and subgraphs are new objects; initializer arrays
    are shared (no pass mutates an array, it adds new ones)."""
    return Graph(
        name=graph.name,
        inputs=[_copy_value(v) for v in graph.inputs],
        outputs=[_copy_value(v) for v in graph.outputs],
        nodes=[copy_node(n) for n in graph.nodes],
        initializers=dict(graph.initializers),
        value_types=dict(graph.value_types),
        opsets=dict(graph.opsets),
        plans=list(graph.plans),
        metadata=dict(graph.metadata),
    )


def copy_node(node: Node) -> Node:
    attributes = {}
    for key, value in node.attributes.items():
        if isinstance(value, Graph):
            value = copy_graph(value)
        elif isinstance(value, list):  # one type per list attribute (see Node.subgraphs)
            value = ([copy_graph(v) for v in value] if value and isinstance(value[0], Graph)
                     else list(value))
        attributes[key] = value
    return Node(node.op_type, list(node.inputs), list(node.outputs), node.name, node.domain,
                node.opset, attributes)


def _copy_value(value):
    return type(value)(value.name, value.type)


# -- walking -------------------------------------------------------------------------------

def each_graph(graph: Graph) -> Iterator[Graph]:
    """The graph and every subgraph inside it, outermost first."""
    yield graph
    for node in graph.nodes:
        for sub in node.subgraphs():
            yield from each_graph(sub)


def reads(node: Node) -> list[str]:
    """Every name a node reads, one entry per input slot, subgraphs' outer reads included."""
    names = [n for n in node.inputs if n]
    for sub in node.subgraphs():
        names.extend(outer_scope_reads(sub))
    return names


def read_counts(graph: Graph) -> Counter:
    """Name -> how many places read it: node input slots, subgraph outer reads, and one
    more for each time it is a graph output."""
    counts = Counter()
    for node in graph.nodes:
        counts.update(reads(node))
    counts.update(graph.output_names)
    return counts


class GraphIndex:
    """Who writes and who reads each value of one graph: ``counts`` (read_counts),
    ``producers`` (name -> the node writing it) and ``readers`` (name -> the nodes taking it
    as a direct input). A pattern matcher reads it; after a rewrite changes the graph, make
    a new one."""

    def __init__(self, graph: Graph):
        self.counts = read_counts(graph)
        self.producers = {name: node for node in graph.nodes for name in node.outputs if name}
        self.readers: dict[str, list[Node]] = {}
        for node in graph.nodes:
            for name in node.inputs:
                if name:
                    self.readers.setdefault(name, []).append(node)


def consumers(graph: Graph) -> dict[str, list[Node]]:
    """Name -> the nodes of this graph that read it (directly or from a subgraph)."""
    found: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in dict.fromkeys(reads(node)):
            found.setdefault(name, []).append(node)
    return found


def all_names(graph: Graph) -> set[str]:
    """Every value name defined anywhere in the graph, subgraphs included."""
    names = set()
    for g in each_graph(graph):
        names.update(g.input_names, g.output_names, g.initializers, g.value_types)
        for node in g.nodes:
            names.update(n for n in (*node.inputs, *node.outputs) if n)
    return names


class NameMaker:
    """Fresh value names that collide with nothing in the graph."""

    def __init__(self, graph: Graph):
        self._taken = all_names(graph)

    def __call__(self, base: str) -> str:
        name, index = base, 1
        while name in self._taken:
            index += 1
            name = f"{base}_{index}"
        self._taken.add(name)
        return name


# -- constants -----------------------------------------------------------------------------

def overridable_initializers(graph: Graph, ir_version: int | None) -> set[str]:
    """Initializers a feed may replace (see the module docstring)."""
    if ir_version is not None and ir_version < 4:
        return set()
    return set(graph.initializers) & set(graph.input_names)


def constant_initializers(graph: Graph, ir_version: int | None) -> dict[str, np.ndarray]:
    override = overridable_initializers(graph, ir_version)
    return {k: v for k, v in graph.initializers.items() if k not in override}


def constant_scopes(graph: Graph, ir_version: int | None, outer: dict | None = None):
    """(graph, its constants) for the graph and each subgraph; a subgraph sees the constants
    of the scopes around it, unless one of its inputs shadows the name. The dicts are live:
    a pass that adds an initializer adds it to its scope's dict too."""
    constants = dict(outer or {})
    for value in graph.inputs:
        constants.pop(value.name, None)
    constants.update(constant_initializers(graph, ir_version))
    yield graph, constants
    for node in graph.nodes:
        for sub in node.subgraphs():
            yield from constant_scopes(sub, 3, constants)  # a body's initializers are fixed


def replace_matches(graph: Graph, ir_version: int | None, starts, match_at) -> int:
    """A pattern pass's walk: in the graph and each subgraph, every node ``starts(node)``
    picks is offered to ``match_at(g, constants, index, node)``, which returns a match (with
    ``replace()``) or None; the index is made again after each replacement (a failed match
    changes nothing). Returns how many were replaced."""
    replaced = 0
    for g, constants in constant_scopes(graph, ir_version):
        index = GraphIndex(g)
        for node in [n for n in g.nodes if starts(n)]:
            match = match_at(g, constants, index, node)
            if match is not None:
                match.replace()
                replaced += 1
                index = GraphIndex(g)
    return replaced


class PatternMatch:
    """The walk one pattern match makes over graph ``g`` (a fusion pass's ``_Match``):
    its constants, the inferred types and the index, ``covered`` the nodes taken so far,
    and the steps every such pass takes from a value to the node that writes or reads it."""

    def __init__(self, g: Graph, constants: dict, types: dict, index: GraphIndex):
        self.g, self.constants, self.types = g, constants, types
        self.counts, self.producers, self.readers = index.counts, index.producers, index.readers
        self.covered: list[Node] = []

    def _private(self, name: str) -> bool:
        """Read once, by the pattern, and not a graph output."""
        return self.counts[name] == 1 and name not in self.g.output_names

    def _plain(self, node: Node | None, op_type: str) -> bool:
        """A default-domain ``op_type`` node with one output that binding would accept."""
        return (node is not None and not node.domain and node.op_type == op_type
                and len(node.outputs) == 1 and kernel_for(node) is not None)

    def _producer(self, name: str, op_type: str) -> Node | None:
        """The plain ``op_type`` node writing ``name``, when only the pattern reads it."""
        node = self.producers.get(name)
        return node if self._plain(node, op_type) and self._private(name) else None

    def _reader(self, name: str, op_type: str) -> Node | None:
        """The one node reading ``name``, when it is a plain ``op_type`` and ``name`` is
        private."""
        found = self.readers.get(name, [])
        if len(found) != 1 or not self._private(name) or not self._plain(found[0], op_type):
            return None
        return found[0]


def fuse_into_mixrt(graph: Graph, ir_version: int | None, types: dict, start_op: str,
                    matcher) -> int:
    """A pass that fuses patterns into ``mixrt``-domain nodes: every default-domain
    ``start_op`` node is offered to ``matcher(g, constants, types, index).at(node)`` (see
    :func:`replace_matches`), and a graph that gained one imports the mixrt domain. Returns
    how many were replaced."""
    fused = replace_matches(
        graph, ir_version, lambda node: node.op_type == start_op and not node.domain,
        lambda g, constants, index, node: matcher(g, constants, types, index).at(node))
    if fused:
        graph.opsets.setdefault(MIXRT, 1)
    return fused


def constant_ints(constants: dict, name: str) -> list[int] | None:
    """The integers of constant ``name`` (an input such as axes, starts or ends), or None
    when it is absent or not a constant."""
    value = constants.get(name) if name else None
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def default_opset(graph: Graph) -> int:
    """The default-domain opset for nodes a pass creates: the graph's, but at least 7, the
    first with NumPy broadcasting for arithmetic."""
    return max(int(graph.opsets.get("", 7)), 7)


def ir_version_of(graph: Graph) -> int | None:
    version = graph.metadata.get("ir_version")
    return int(version) if version is not None else None


def kernel_for(node: Node, dtype=None):
    """The kernel that would run ``node``, or None when binding would reject it (unknown op
    or opset, an attribute it does not implement, a dtype it does not serve). A pass leaves
    such a node alone, so the same error reaches the user at every optimization level."""
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is None:
        return None
    if set(node.attributes) - kernel.attribute_names and not kernel.accepts_any_attribute:
        return None
    if dtype is not None and not kernel.supports_dtype(np.dtype(dtype).name):
        return None
    return kernel


# -- renaming ------------------------------------------------------------------------------

def replace_reads(graph: Graph, old: str, new: str) -> None:
    """Every read of ``old`` becomes a read of ``new``, in subgraphs too (down to a subgraph
    that defines ``old`` itself, which would shadow the outer name)."""
    for node in graph.nodes:
        node.inputs = [new if n == old else n for n in node.inputs]
        for sub in node.subgraphs():
            if old not in _defined_in(sub):
                replace_reads(sub, old, new)
                sub.outputs = [_renamed(v, old, new) for v in sub.outputs]


def replace_reads_many(graph: Graph, renames: dict[str, str]) -> None:
    """:func:`replace_reads` for every ``old -> new`` of ``renames`` in one walk, chains
    followed (``a -> b`` and ``b -> c`` make reads of ``a`` and ``b`` read ``c``)."""
    final = {old: _followed(renames, old) for old in renames}
    _replace_all(graph, {old: new for old, new in final.items() if old != new})


def _followed(renames: dict[str, str], name: str) -> str:
    for _ in range(len(renames) + 1):  # bounded: a cycle would be a bug upstream
        if name not in renames:
            return name
        name = renames[name]
    raise AssertionError(f"renames form a cycle through {name!r}")


def _replace_all(graph: Graph, final: dict[str, str]) -> None:
    for node in graph.nodes:
        if any(n in final for n in node.inputs):
            node.inputs = [final.get(n, n) for n in node.inputs]
        for sub in node.subgraphs():
            defined = _defined_in(sub)
            inner = {old: new for old, new in final.items() if old not in defined}
            if inner:
                _replace_all(sub, inner)
                sub.outputs = [type(v)(inner[v.name], v.type) if v.name in inner else v
                               for v in sub.outputs]


def _renamed(value, old, new):
    return type(value)(new, value.type) if value.name == old else value


def _defined_in(graph: Graph) -> set[str]:
    names = set(graph.input_names) | set(graph.initializers)
    names.update(o for node in graph.nodes for o in node.outputs if o)
    return names


def rename_output(graph: Graph, producer: Node, old: str, new: str) -> None:
    """``producer`` now writes ``new`` instead of ``old``; readers follow."""
    producer.outputs = [new if n == old else n for n in producer.outputs]
    replace_reads(graph, old, new)
    if old in graph.value_types and new not in graph.value_types:
        graph.value_types[new] = graph.value_types[old]
    graph.value_types.pop(old, None)


def remove_nodes(graph: Graph, doomed) -> None:
    ids = {id(n) for n in doomed}
    graph.nodes = [n for n in graph.nodes if id(n) not in ids]


# -- initializers and dead code --------------------------------------------------------------

def prune_initializers(graph: Graph, ir_version: int | None, *, outermost: bool = True) -> int:
    """Drop initializers nothing reads. One also listed as an input stays unless it is a
    constant (IR < 4) of the outermost graph, where the listing was only the old IR's
    bookkeeping; a subgraph's inputs are positional (Loop, Scan) and never change."""
    needed = set(read_counts(graph))
    keep = set(graph.input_names) if not outermost else \
        overridable_initializers(graph, ir_version)
    unused = [k for k in graph.initializers if k not in needed and k not in keep]
    for name in unused:
        del graph.initializers[name]
    dropped = set(unused)
    graph.inputs = [v for v in graph.inputs if v.name not in dropped]
    for node in graph.nodes:
        for sub in node.subgraphs():
            prune_initializers(sub, ir_version, outermost=False)
    return len(unused)


def eliminate_dead_nodes(graph: Graph) -> int:
    """Remove nodes none of whose outputs reach a graph output (subgraphs included).
    Nodes must be in topological order."""
    live = set(graph.output_names)
    kept, removed = [], 0
    for node in reversed(graph.nodes):
        if not any(o and o in live for o in node.outputs):
            removed += 1
            continue
        for sub in node.subgraphs():
            removed += eliminate_dead_nodes(sub)
        live.update(reads(node))
        kept.append(node)
    graph.nodes = kept[::-1]
    return removed


def static_shape(value_type) -> tuple[int, ...] | None:
    """The shape when every dim is a known int, else None."""
    shape = getattr(value_type, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


def dtype_of(value_type):
    dtype = getattr(value_type, "dtype", None)
    return None if dtype is None else np.dtype(dtype)
