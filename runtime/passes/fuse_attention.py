"""Self-attention as exported models spell it, fused into ``mixrt::FusedAttention``
(opt_level 2; the op and its exact meaning: ``ops/attention/fused_attention.py``).

The pattern, walked back from each Softmax over the last axis::

    S = MatMul(Transpose(Q, [0,2,1,3]), Transpose*(K))
    S = Mul(S, c) or Div(S, c), c a scalar constant        (optional)
    S = Add(S, mask), in either order                      (optional)
    Y = Transpose(MatMul(Softmax(S, axis=-1), Transpose(V, [0,2,1,3])), [0,2,1,3])

K's side may be one Transpose [0,2,3,1] or a run of Transposes that composes to it (PyTorch
exports ``k.transpose(1, 2)`` then ``.transpose(-1, -2)``). PyTorch's
``scaled_dot_product_attention`` exports its own spelling, taken too: each operand of the
scores MatMul may be scaled by a scalar (the root of the scale, on Q and on K^T); Q, K and V
may come heads first, (batch, heads, seq, size), with no Transpose of their own (a KV cache's
Concat), K^T then being a Transpose [0,1,3,2] or the dynamo exporter's Reshape to 3-D,
Transpose [0,2,1] and Reshape back; ``Where(IsNaN(P), 0, P)`` may follow the Softmax; and a
Reshape that keeps the product's shape may precede the last Transpose. K and V may repeat
their heads for grouped-query attention as Llama's ``repeat_kv`` spells it (Reshape of an
Expand of an Unsqueeze at axis 2, both with one repeat), which the fused node reads from
its source instead (``kv_repeat``). The fused node says which inputs come heads first
(``heads_first``) and whether the guard is there (``nan_to_zero``). Every value inside the pattern
must have the pattern as its only reader and must not be a graph output; Q, K, V and the mask
are what the fused node reads. The pass runs before ``fuse_products``, which would otherwise
take a scores MatMul followed by its mask Add as a MatMul with a residual.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT
from mixrt.ops.attention.fused_attention import HEADS_FIRST_KEY_PERM, KEY_PERM, QUERY_PERM
from mixrt.runtime.graph import Graph, Node
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.rewrite import (GraphIndex, PatternMatch, constant_ints,
                                          constant_scopes, dtype_of, eliminate_dead_nodes,
                                          fuse_into_mixrt, kernel_for, remove_nodes)


def fuse_attention(graph: Graph, ir_version: int | None) -> int:
    """Replace each attention pattern by one FusedAttention node; returns how many."""
    fused = fuse_into_mixrt(graph, ir_version, infer_types(graph), "Softmax", _Match)
    if fused:
        eliminate_dead_nodes(graph)  # the shape arithmetic of the Reshapes fused away
        for g, _ in constant_scopes(graph, ir_version):
            _absorb_input_transposes(g)
    return fused


def _absorb_input_transposes(g: Graph) -> None:
    """A FusedAttention input that comes heads first from a Transpose [0, 2, 1, 3] of its
    own (the transformers exporter's Q, K and V, which a Shape read too until the fusion
    took the shape arithmetic away) read as the Transpose's input, sequence first: the
    compiled heads read that layout where it lies, where a heads-first input cost the
    Transpose's copy and the kernel's copy back (GPT-2: six a layer)."""
    index = GraphIndex(g)
    doomed = []
    for node in g.nodes:
        if node.domain != MIXRT or node.op_type != "FusedAttention" \
                or int(node.attributes.get("kv_repeat", 1)) != 1:
            continue
        flags = [int(f) for f in node.attributes.get("heads_first", (0, 0, 0))]
        for position in range(3):
            transpose = index.producers.get(node.inputs[position])
            if not flags[position] or transpose is None or transpose.domain \
                    or transpose.op_type != "Transpose" \
                    or tuple(transpose.attributes.get("perm", ())) != QUERY_PERM \
                    or index.counts[transpose.outputs[0]] != 1 \
                    or transpose.outputs[0] in g.output_names:
                continue
            node.inputs[position], flags[position] = transpose.inputs[0], 0
            doomed.append(transpose)
        if any(flags):
            node.attributes["heads_first"] = flags
        else:
            node.attributes.pop("heads_first", None)
    remove_nodes(g, doomed)


class _Match(PatternMatch):
    """One attention pattern in graph ``g``: the nodes it covers and what the fused node
    reads."""

    def __init__(self, g: Graph, constants: dict, types: dict, index: GraphIndex):
        super().__init__(g, constants, types, index)
        self.scale, self.mask, self.nan_to_zero = 1.0, "", 0
        self.heads_first = [0, 0, 0]
        self.key_group = None  # (K's source, repeat, nodes) when K^T was reshaped from it

    # -- walking ---------------------------------------------------------------------------

    def _transposed(self, name: str, perm: tuple) -> str | None:
        """The tensor that a run of private Transposes ending in ``name`` permutes by
        ``perm`` (their composition), recording them as covered."""
        run, composed = [], tuple(range(len(perm)))
        node = self._producer(name, "Transpose")
        while node is not None:
            step = node.attributes.get("perm")
            if step is None or len(step) != len(perm):
                return None
            # the run's output axis i is axis composed[i] of this node's output, which is
            # axis step[composed[i]] of its input
            composed = tuple(step[axis] for axis in composed)
            run.append(node)
            if composed == perm:
                self.covered.extend(run)
                return node.inputs[0]
            node = self._producer(node.inputs[0], "Transpose")
        return None

    def _scalar(self, name: str) -> float | None:
        value = self.constants.get(name)
        if value is None or value.size != 1 or value.ndim > 4:
            return None
        return float(np.asarray(value).reshape(-1)[0])

    def _rank4(self, name: str) -> bool:
        found = self.types.get(name)
        return found is not None and found.shape is not None and len(found.shape) == 4

    def _shape(self, name: str) -> tuple | None:
        """The static shape of ``name`` when every dim is known (an int or a named dim)."""
        found = self.types.get(name)
        if found is None or found.shape is None or any(d is None for d in found.shape):
            return None
        return tuple(found.shape)

    # -- the pattern -----------------------------------------------------------------------

    def at(self, softmax: Node) -> "_Match | None":
        if not self._last_axis(softmax):
            return None
        scores = self._scores_product(softmax.inputs[0])
        if scores is None:
            return None
        unscaled_q = self._unscaled(scores.inputs[0])
        q, q_first = self._heads(unscaled_q)
        k, k_first = self._key(self._unscaled(scores.inputs[1]))
        probabilities = self._guarded(softmax.outputs[0])
        product = None if probabilities is None else self._reader(probabilities, "MatMul")
        if q is None or k is None or product is None or product.inputs[0] != probabilities:
            return None
        v, v_first = self._heads(product.inputs[1])
        # tensors of the heads-first Q's shape (batch, heads, seq, size), and of V's
        self.alike = {"q": {scores.inputs[0], unscaled_q}, "v": {product.inputs[1]}}
        last = self._output_transpose(product.outputs[0])
        if v is None or last is None:
            return None
        grouped = self._grouped_heads(k, v, k_first and v_first)
        if grouped is None:
            return None
        k, v, self.kv_repeat = grouped
        self.covered += [scores, softmax, product, last]
        self.inputs = [q, k, v] + ([self.mask] if self.mask else [])
        self.heads_first = [q_first, k_first, v_first]
        if not all(dtype_of(self.types.get(name)) in _DTYPES and
                   dtype_of(self.types.get(name)) == dtype_of(self.types.get(q))
                   for name in self.inputs):
            return None
        self.name, self.output = scores.name, last.outputs[0]
        return self

    def _last_axis(self, softmax: Node) -> bool:
        """Softmax over the last of 4 axes (before opset 13 ``axis`` flattens from there on,
        which for the last axis is the same)."""
        if len(softmax.outputs) != 1 or kernel_for(softmax) is None:
            return False
        axis = softmax.attributes.get("axis", -1 if softmax.opset >= 13 else 1)
        return axis in (-1, 3)

    def _scores_product(self, name: str) -> Node | None:
        """The MatMul behind Softmax's input, through an optional Add(mask) and an optional
        Mul/Div by a scalar constant; sets ``mask`` and ``scale``."""
        node = self._producer(name, "Add")
        if node is not None:
            for side in (0, 1):
                found = self._scaled_product(node.inputs[side])
                if found is not None and node.inputs[1 - side]:
                    self.mask = node.inputs[1 - side]
                    self.covered.append(node)
                    return found
            return None
        return self._scaled_product(name)

    def _scaled_product(self, name: str) -> Node | None:
        return self._producer(self._unscaled(name), "MatMul")

    def _unscaled(self, name: str) -> str:
        """What a private Mul or Div by a scalar constant scales into ``name`` (its factor
        taken into ``scale``), else ``name``. PyTorch's ``scaled_dot_product_attention``
        scales Q and K^T each by the root of the scale before their product."""
        for op_type in ("Mul", "Div"):
            node = self._producer(name, op_type)
            if node is None:
                continue
            for side in ((0, 1) if op_type == "Mul" else (0,)):
                factor = self._scalar(node.inputs[1 - side])
                if factor is not None and factor != 0.0:
                    self.scale *= factor if op_type == "Mul" else 1.0 / factor
                    self.covered.append(node)
                    return node.inputs[side]
        return name

    def _heads(self, name: str) -> tuple:
        """(the input, heads first?) for an operand of the products, (batch, heads, seq,
        size): the (batch, seq, heads, size) tensor a run of private Transposes made it from,
        else the operand itself; (None, None) when it is not 4-D."""
        source = self._transposed(name, QUERY_PERM)
        if source is not None:
            return source, 0
        return (name, 1) if self._rank4(name) else (None, None)

    def _key(self, name: str) -> tuple:
        """(K, heads first?) for K^T, (batch, heads, size, keys): Transposes of K by
        [0, 2, 3, 1] (K sequence first) or [0, 1, 3, 2] (heads first), or the dynamo
        exporter's Reshape to 3-D, Transpose [0, 2, 1] and Reshape back."""
        source = self._transposed(name, KEY_PERM)
        if source is not None:
            return source, 0
        source = self._transposed(name, HEADS_FIRST_KEY_PERM) or self._reshaped_key(name)
        if source is None or not self._rank4(source):
            return None, None
        return self._heads(source)

    def _reshaped_key(self, name: str) -> str | None:
        """K (b, h, s, d) behind Reshape(Transpose(Reshape(K, (b*h, s, d)), [0, 2, 1]),
        (b, h, d, s)), each private; the shapes must say so."""
        last = self._producer(name, "Reshape")
        middle = None if last is None else self._producer(last.inputs[0], "Transpose")
        if middle is None or list(middle.attributes.get("perm", ())) != [0, 2, 1]:
            return None
        first = self._producer(middle.inputs[0], "Reshape")
        if first is None:
            return None
        key, flat, result = (self._shape(n) for n in (first.inputs[0], first.outputs[0], name))
        source, group = first.inputs[0], None
        if key is not None and len(key) == 5:  # heads repeated (grouped-query attention)
            group = self._repeated(first.inputs[0])
            if group is None:
                return None
            source, repeat, _ = group
            base = self._shape(source)
            key = (base[0], base[1] * repeat, base[2], base[3])
        if key is None or flat is None or result is None or len(key) != 4 or len(flat) != 3 \
                or flat[1:] != key[2:] or result != (key[0], key[1], key[3], key[2]):
            return None
        self.covered += [first, middle, last]
        self.key_group = group
        return source

    def _grouped_heads(self, k: str, v: str, heads_first: bool) -> tuple | None:
        """(K, V, kv_repeat) as the fused node reads them: the sources of Llama's
        ``repeat_kv`` when K and V both come through it with one repeat (those nodes then
        covered), else K and V as found with 1; None where K's repeated heads exist only
        inside the dynamo exporter's reshapes and V's do not match them."""
        v_group = self._repeated_heads(v) if heads_first else None
        k_group = self.key_group or (self._repeated_heads(k) if heads_first else None)
        if k_group is None or v_group is None or k_group[1] != v_group[1]:
            return None if self.key_group is not None else (k, v, 1)
        self.covered = k_group[2] + v_group[2] + self.covered  # they run before the rest
        return k_group[0], v_group[0], k_group[1]

    def _repeated_heads(self, name: str) -> tuple | None:
        """(source, repeat, nodes) when ``name``, (b, h * repeat, s, d), is
        Reshape(Expand(Unsqueeze(source, [2]), (b, h, repeat, s, d))), each private."""
        reshape = self._producer(name, "Reshape")
        group = None if reshape is None else self._repeated(reshape.inputs[0])
        if group is None:
            return None
        source, repeat, nodes = group
        base = self._shape(source)
        if self._shape(name) != (base[0], base[1] * repeat, base[2], base[3]):
            return None
        return source, repeat, nodes + [reshape]

    def _repeated(self, name: str) -> tuple | None:
        """(source, repeat, [Unsqueeze, Expand]) when ``name``, (b, h, repeat, s, d), is
        Expand(Unsqueeze(source, [2])) of a heads-first (b, h, s, d) source, each private."""
        expand = self._producer(name, "Expand")
        unsqueeze = None if expand is None else self._producer(expand.inputs[0], "Unsqueeze")
        if unsqueeze is None or self._unsqueezed_axes(unsqueeze) not in ([2], [-3]):
            return None
        source = unsqueeze.inputs[0]
        base, grown = self._shape(source), self._shape(name)
        if base is None or grown is None or len(base) != 4 or not isinstance(base[1], int) \
                or not isinstance(grown[2], int) \
                or grown != (base[0], base[1], grown[2], base[2], base[3]):
            return None
        return source, grown[2], [unsqueeze, expand]

    def _unsqueezed_axes(self, node: Node) -> list | None:
        if node.opset < 13:
            axes = node.attributes.get("axes")
            return None if axes is None else [int(a) for a in axes]
        return constant_ints(self.constants, node.inputs[1]) if len(node.inputs) > 1 else None

    def _guarded(self, name: str) -> str | None:
        """What the values product reads of the probabilities ``name``: ``name`` itself, or
        ``Where(IsNaN(name), 0, name)`` (``scaled_dot_product_attention``'s guard, then
        ``nan_to_zero``); None when something else reads them."""
        readers = self.readers.get(name, [])
        if len(readers) == 1:
            return name
        if len(readers) != 2 or self.counts[name] != 2 or name in self.g.output_names:
            return None
        by_type = {node.op_type: node for node in readers if not node.domain}
        isnan, where = by_type.get("IsNaN"), by_type.get("Where")
        if isnan is None or where is None or kernel_for(where) is None \
                or self._reader(isnan.outputs[0], "Where") is not where \
                or list(where.inputs) != [isnan.outputs[0], where.inputs[1], name] \
                or self._scalar(where.inputs[1]) != 0.0:
            return None
        self.covered += [isnan, where]
        self.nan_to_zero = 1
        return where.outputs[0]

    def _output_transpose(self, name: str) -> Node | None:
        """The Transpose [0, 2, 1, 3] that reads the values product, through an optional
        Reshape that keeps its shape: the Llama exports' (the shapes say so), or one to a
        shape made of the product's own dims (:meth:`_own_shape_reshape`)."""
        reshape = self._reader(name, "Reshape")
        if reshape is not None:
            shape = self._shape(name)
            if shape is None or shape != self._shape(reshape.outputs[0]):
                return None
            self.covered.append(reshape)
            name = reshape.outputs[0]
        else:
            name = self._own_shape_reshape(name) or name
        last = self._reader(name, "Transpose")
        if last is None or tuple(last.attributes.get("perm", ())) != QUERY_PERM:
            return None
        return last

    def _own_shape_reshape(self, name: str) -> str | None:
        """The output of a Reshape of the values product ``name`` (batch, heads, seq, size)
        to a shape made of its own dims, which the transformers exporter writes as
        ``Reshape(P, Concat(Shape(P)[0], -1, Shape(Q)[2], Shape(V)[3]))`` (BERT, GPT-2,
        DistilBERT since 2025): the Reshape, and the Shape of ``name`` that makes its
        target, covered. None (nothing covered) unless ``name``'s readers are that Reshape
        and Shapes whose every use ends in its target."""
        readers = self.readers.get(name, [])
        reshapes = [n for n in readers if n.op_type == "Reshape"]
        shapes = [n for n in readers if n.op_type == "Shape"]
        if len(reshapes) != 1 or len(reshapes) + len(shapes) != len(readers) \
                or name in self.g.output_names or not self._plain(reshapes[0], "Reshape") \
                or reshapes[0].inputs[0] != name \
                or any(n.domain or n.attributes or n.inputs != [name] for n in shapes):
            return None
        reshape = reshapes[0]
        target = self._producer(reshape.inputs[1], "Concat")
        chain = [] if target is None else self._own_dims(target, name)
        if chain is None or target is None:
            return None
        inside = {id(n) for n in chain + [target]}
        # every Shape of the product feeds the target alone: it goes with the pattern
        for shape in shapes:
            if id(shape) not in inside:
                return None
        self.covered += chain + [target, reshape]
        return reshape.outputs[0]

    def _own_dims(self, target: Node, name: str) -> list | None:
        """The nodes (Shape, Gather, Unsqueeze) of ``target``'s pieces that read ``name``'s
        dims, when ``target`` (a Concat on axis 0) lists the product's dims in order, each
        read from its own shape, from Q's (its sequence) or from V's (its size), and at most
        one left -1; else None."""
        if target.attributes.get("axis") != 0 or len(target.inputs) != 4:
            return None
        chain, open_dims = [], 0
        for axis, piece in enumerate(target.inputs):
            if constant_ints(self.constants, piece) == [-1]:
                open_dims += 1
                continue
            found = self._dim_piece(piece)
            if found is None:
                return None
            source, index, nodes = found
            if not (source == name and index == axis or index == axis == 2
                    and source in self.alike["q"] or index == axis == 3
                    and source in self.alike["v"]):
                return None
            # a piece that reads another tensor's shape stays (its nodes die unread later)
            chain += nodes if source == name else []
        return chain if open_dims <= 1 else None

    def _dim_piece(self, name: str) -> tuple | None:
        """(tensor, axis, nodes) when ``name`` is one dim of a tensor's shape as a 1-element
        vector: Unsqueeze(Gather(Shape(tensor), axis), [0]) or Gather(Shape(tensor),
        [axis]), each node private."""
        unsqueeze = self._producer(name, "Unsqueeze")
        gathered = name if unsqueeze is None else unsqueeze.inputs[0]
        if unsqueeze is not None and self._unsqueezed_axes(unsqueeze) not in ([0], [-1]):
            return None
        gather = self._producer(gathered, "Gather")
        if gather is None or gather.attributes.get("axis", 0) != 0:
            return None
        index = constant_ints(self.constants, gather.inputs[1])
        value = self.constants.get(gather.inputs[1])
        if index is None or len(index) != 1 or index[0] < 0 \
                or (np.asarray(value).ndim == 0) != (unsqueeze is not None):
            return None
        shape = self._producer(gather.inputs[0], "Shape")
        if shape is None or shape.attributes:
            return None
        return shape.inputs[0], index[0], [shape, gather] + ([unsqueeze] if unsqueeze else [])

    # -- rewriting -------------------------------------------------------------------------

    def replace(self) -> None:
        attributes = {"scale": self.scale} if self.scale != 1.0 else {}
        if any(self.heads_first):
            attributes["heads_first"] = self.heads_first
        if self.nan_to_zero:
            attributes["nan_to_zero"] = 1
        if self.kv_repeat > 1:
            attributes["kv_repeat"] = self.kv_repeat
        fused = Node("FusedAttention", self.inputs, [self.output], self.name, MIXRT, 1,
                     attributes)
        last = self.covered[-1]  # the output Transpose runs after everything it reads
        self.g.nodes[self.g.nodes.index(last)] = fused
        remove_nodes(self.g, self.covered[:-1])


_DTYPES = tuple(np.dtype(name) for name in sorted(FUSED_DTYPES))
