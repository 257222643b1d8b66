"""Shape and dtype inference on a Symbol, MXNet's front of it: ``infer_shape``,
``infer_type`` and their ``_partial`` forms, which take argument shapes or dtypes
positionally or by name and report (arguments, outputs, auxiliary states) in MXNet's
notation (0 for an unknown dimension, ``()`` for an unknown rank, None where a partial
answer knows nothing).

The work is ``runtime.passes.infer`` on the lowered graph, alternated with what the graph
says of its variables from the other direction (``partial_shapes``) and the parameter rules
(``parameter_rules``: a weight's shape from its consumer), until nothing new is learned.

:class:`SymbolInference` is one of the parts :class:`mixrt.sym.symbol.Symbol` is composed of.
"""

from __future__ import annotations

import warnings

import numpy as np

from mixrt.base.errors import GraphError, MixrtError, ShapeError
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.passes.infer import infer_types
from mixrt.sym.parameter_rules import declared_shapes, parameter_dtypes, parameter_shapes
from mixrt.sym.partial_shapes import completed_types, is_unknown, learned_shapes, unknown_dim


class SymbolInference:
    """Inference over a Symbol's lowered graph (``self.to_graph``, ``self._distinct``)."""

    __slots__ = ()

    def infer_type(self, *args, **kwargs):
        """(argument dtypes, output dtypes, auxiliary dtypes) from the given argument dtypes
        (positional in ``list_arguments()`` order, or by name) and the declared ones; a
        variable nothing decides is float32 (what ``simple_bind`` allocates it as)."""
        dtypes = self._named("infer_type", args, kwargs)
        types = self._inferred(shapes={}, dtypes=dtypes)
        return self._report(types, lambda t: None if t is None else t.dtype)

    def infer_type_partial(self, *args, **kwargs):
        """Like :meth:`infer_type`, with None for every dtype that depends on a variable
        whose dtype nobody gives or decides (MXNet's): ``Cast(data, dtype="float32")``
        knows its output and a following layer's parameters, not ``data``."""
        dtypes = self._named("infer_type_partial", args, kwargs)
        assumed = self._report(self._inferred(shapes={}, dtypes=dtypes), _dtype_of)
        try:  # what changes with the dtype assumed for undecided variables is unknown
            probed = self._report(
                self._inferred(shapes={}, dtypes=dtypes, undecided=np.dtype(np.float64)),
                _dtype_of)
        except MixrtError:  # an op refusing float64 says nothing of what it depends on
            return assumed
        return tuple([a if a == b else None for a, b in zip(first, second)]
                     for first, second in zip(assumed, probed))

    def infer_shape(self, *args, **kwargs):
        """(argument shapes, output shapes, auxiliary shapes) from the given argument shapes
        and the declared ones. When some shape stays unknown, MXNet's answer: a warning
        naming the arguments still unknown and ``(None, None, None)``; a contradiction is
        a ShapeError."""
        result = self._known_shapes(args, kwargs)
        if all(_complete(shape) for shapes in result for shape in shapes):
            return result
        unknown = _unknown_arguments(self, result[0])
        if not unknown:  # every argument known and still no output shape: they disagree
            given = dict(zip(self.list_arguments(), result[0]))
            raise ShapeError(f"infer_shape: the outputs {self.list_outputs()} have no shape "
                             f"for the argument shapes {given}; their operators do not "
                             f"accept them together")
        warnings.warn(f"infer_shape: cannot decide the shapes of arguments {unknown} (0 "
                      f"is an unknown dimension); give them as inputs", stacklevel=2)
        return None, None, None

    def infer_shape_partial(self, *args, **kwargs):
        """Like :meth:`infer_shape`, reporting what stays unknown as MXNet does: an
        unknown dimension as 0, a shape of unknown rank as ``()``."""
        return tuple([_mxnet_shape(shape) for shape in shapes]
                     for shapes in self._known_shapes(args, kwargs))

    def _known_shapes(self, args, kwargs):
        """Shape inference with None for an unknown dimension and for a shape of unknown
        rank (mixrt's own convention, which its callers read)."""
        shapes = self._named("infer_shape", args, kwargs)
        types = self._inferred(shapes=shapes, dtypes={})
        return self._report(types, lambda t: None if t is None else t.shape)

    def _named(self, what: str, args, kwargs) -> dict:
        arguments = self.list_arguments()
        if len(args) > len(arguments):
            raise GraphError(f"{what}: the symbol has {len(arguments)} arguments "
                             f"{arguments}; got {len(args)} positional values")
        named = dict(zip(arguments, args))
        unknown = set(kwargs) - set(self.list_inputs())
        if unknown:
            raise GraphError(f"{what}: the symbol has no variables {sorted(unknown)}; its "
                             f"variables are {self.list_inputs()}")
        named.update(kwargs)
        return named

    def _inferred(self, shapes: dict, dtypes: dict, undecided=None) -> dict:
        """Types of every value. Forward inference first, each unknown dimension of a
        variable carried as a symbol of its own; then what the graph says of the variables
        from the other direction (``partial_shapes``: operands of one shape, an output's
        shape read back into an input's, parameters whose shape follows from their
        consumer, as BatchNormalization's gamma from the data's channels); variables of no
        given dtype take the one of an operand they must match (float64 data makes
        FullyConnected's weight float64, as in MXNet); and inference runs again.
        ``undecided``: the dtype assumed for variables nothing decides (else float32)."""
        shapes = {name: _unknown_as_none(shape) for name, shape in shapes.items()}
        dtypes = dict(dtypes)
        symbol = self._distinct()
        nodes = symbol._topological()
        variables = [n for n in nodes if n.is_variable]
        free = {n.name for n in variables if "dtype" not in n.info} - set(dtypes)
        while True:
            given = {n.name: shapes.get(n.name, n.info.get("shape")) for n in variables}
            assumed = {name: undecided for name in free} if undecided is not None else {}
            graph = symbol.to_graph(shapes=_with_unknown_dims(given),
                                    dtypes={**assumed, **dtypes})
            types = infer_types(graph)
            declared = declared_shapes(nodes, types)
            found = learned_shapes(nodes, types, given, declared)
            for name, shape in parameter_shapes(nodes, types).items():
                if name not in shapes and not _complete(found.get(name, given[name])):
                    found[name] = shape
            matched = parameter_dtypes(nodes, graph, types, free)
            if not found and not matched:
                return completed_types(nodes, types, declared)
            shapes.update(found)
            dtypes.update(matched)
            free -= set(matched)

    def _report(self, types: dict, pick):
        """What ``types`` (of the graph ``to_graph`` makes) says of each argument, output
        and auxiliary state, by node: two nodes of one name are reported each its own."""
        distinct = self._distinct()

        def of(names):
            return [pick(_known_dims(_tensor(types.get(name)))) for name in names]
        return (of(distinct.list_arguments()), of(distinct.list_outputs()),
                of(distinct.list_auxiliary_states()))


def _tensor(value_type):
    return value_type if isinstance(value_type, TensorType) else None


def _known_dims(value_type):
    """The type with the symbols of unknown dimensions reported as None."""
    if value_type is None or value_type.shape is None:
        return value_type
    return value_type.with_shape(tuple(None if is_unknown(d) else d for d in value_type.shape))


def _unknown_as_none(shape):
    """A shape given to inference or declared by a Variable: 0 and -1 mean unknown (MXNet's
    legacy shapes)."""
    if shape is None:
        return None
    return tuple(None if d is None or d in (0, -1) else int(d) for d in shape)


def _with_unknown_dims(shapes: dict) -> dict:
    """Each variable's unknown dimensions as symbols of their own, for forward inference
    to carry (``partial_shapes.unknown_dim``)."""
    return {name: None if shape is None else tuple(
        unknown_dim(name, axis) if d is None else d for axis, d in enumerate(shape))
        for name, shape in shapes.items()}


def _dtype_of(value_type):
    return None if value_type is None else value_type.dtype


def _mxnet_shape(shape) -> tuple:
    """A shape as MXNet's legacy inference reports it: 0 for an unknown dimension, ``()``
    for an unknown rank."""
    return () if shape is None else tuple(0 if d is None else d for d in shape)


def _unknown_arguments(symbol: "Symbol", arg_shapes: list) -> dict:
    """{argument: its partial shape in MXNet's notation} for those not fully known."""
    return {name: _mxnet_shape(shape) for name, shape in zip(symbol.list_arguments(), arg_shapes)
            if not _complete(shape)}


def _complete(shape) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)
