"""What a Symbol is made of, as MXNet's queries report it: its name, outputs, arguments,
auxiliary states and attributes (``list_*``, ``attr``, ``attr_dict``, ``_set_attr``), its
internals and children, and the depth-first walk from its outputs that orders them all
(MXNet's order, which binding and saving rely on).

:class:`SymbolStructure` is one of the parts :class:`mixrt.sym.symbol.Symbol` is composed of;
it reads the graph only, building nothing but Symbols over nodes that exist (``type(self)``:
the Symbol class).
"""

from __future__ import annotations

from mixrt import attribute
from mixrt.base.errors import GraphError
from mixrt.sym.symbol_nodes import (_attributes, _inputs_in_listed_order, _layer_inputs,
                                    _listed, _stored_key, ATTRIBUTES, SymNode)


class SymbolStructure:
    """The structural queries of a Symbol (``self._outputs``: its (node, index) pairs)."""

    __slots__ = ()

    @property
    def name(self) -> str | None:
        """The node's name when the symbol has a single output, else None."""
        return self._outputs[0][0].name if len(self._outputs) == 1 else None

    def list_outputs(self) -> list[str]:
        return [node.output_name(index) for node, index in self._outputs]

    def list_arguments(self) -> list[str]:
        """Variables that are not auxiliary states, in the order a depth-first walk from the
        outputs meets them (MXNet's order)."""
        return [n.name for n in self._variables() if not n.info.get("aux")]

    def list_auxiliary_states(self) -> list[str]:
        """Variables the operators update rather than differentiate (BatchNormalization's
        running mean and variance)."""
        return [n.name for n in self._variables() if n.info.get("aux")]

    def list_inputs(self) -> list[str]:
        return [n.name for n in self._variables()]

    def list_attr(self, recursive: bool = False) -> dict:
        """The first output node's attributes as strings (MXNet's): those it was given
        (``attr=``, ``lr_mult=``, an AttrScope's), a variable's ``__shape__`` and
        multipliers, an MXNet layer's parameters (another operator's own attributes); the
        ones MXNet stores as ``__<key>__`` (``__lr_mult__``) also under their plain key.
        ``recursive``: every node's, keyed ``<node>_<key>``."""
        if recursive:
            return {f"{node}_{key}": value for node, found in self.attr_dict().items()
                    for key, value in found.items()}
        if not self._outputs:
            raise GraphError("list_attr needs a symbol with an output")
        return _attributes(self._outputs[0][0])

    def attr(self, key: str):
        """The attribute ``key`` of the output node (a string; ``"name"``: the node's
        name), or None, as for a group of several nodes."""
        nodes = {id(node) for node, _ in self._outputs}
        if len(nodes) != 1:
            return None
        if key == "name":
            return self._outputs[0][0].name
        return self.list_attr().get(key)

    def attr_dict(self) -> dict:
        """{node name: its attributes} for every node that has some (a layer is one node,
        as in MXNet)."""
        found = {}
        for node in self._topological():
            attributes = _attributes(node) if _listed(node) else None
            if attributes:
                found[node.name] = attributes
        return found

    def _set_attr(self, **attributes) -> None:
        """Set attributes (strings) of the single output node, in place, as MXNet does:
        ``name`` renames the node, and MXNet's hidden keys (``lr_mult``) are stored as
        ``__lr_mult__``."""
        node = self._single_node("_set_attr")
        for key, value in attributes.items():
            if not isinstance(value, str):
                raise attribute.AttributeValueError(
                    f"_set_attr: attribute {key!r} must be a string, got "
                    f"{type(value).__name__} {value!r}")
            if key == "name":
                node.name = value
            else:
                node.info.setdefault(ATTRIBUTES, {})[_stored_key(key, value)] = value

    def get_internals(self) -> "Symbol":
        """Every output of every node, in topological order: pick one by name
        (``net.get_internals()["relu1_output"]``) to get a feature extractor. A layer
        (``sym.FullyConnected``) is one node here, as in MXNet; constants are not listed."""
        return type(self)([(node, i) for node in self._topological() if _listed(node)
                           for i in range(node.num_outputs)])

    def get_children(self) -> "Symbol | None":
        """The inputs of the output nodes (of a layer: the layer's inputs), None for a
        variable."""
        inputs, seen = [], set()
        for node, _ in self._outputs:
            if id(node) not in seen:
                seen.add(id(node))
                inputs.extend(_layer_inputs(node))
        return type(self)(inputs) if inputs else None

    def _single_node(self, what: str) -> SymNode:
        if len(self._outputs) != 1:
            raise GraphError(f"{what} needs a symbol with one output; this one has "
                             f"{len(self._outputs)}: {self.list_outputs()}")
        return self._outputs[0][0]

    def _topological(self) -> list[SymNode]:
        """Nodes in dependency order (iterative depth-first post-order, so deep networks do
        not hit Python's recursion limit)."""
        order, seen = [], set()
        for root, _ in self._outputs:
            stack = [(root, False)]
            while stack:
                node, expanded = stack.pop()
                if id(node) in seen:
                    continue
                if expanded:
                    seen.add(id(node))
                    order.append(node)
                    continue
                stack.append((node, True))
                for entry in reversed(_inputs_in_listed_order(node)):
                    if entry is not None and id(entry[0]) not in seen:
                        stack.append((entry[0], False))
        return order

    def _variables(self) -> list[SymNode]:
        return [n for n in self._topological() if n.is_variable]
