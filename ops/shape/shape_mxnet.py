"""MXNet's reshape codes as one op, ``mixrt::MXReshape(data; shape, reverse)``.

MXNet's reshape target may hold, beside sizes, ``0`` (copy a dimension), ``-1`` (infer one),
``-2`` (copy all the rest), ``-3`` (merge two), ``-4 a b`` (split one in two, either of them
-1), and ``reverse=1`` matches them from the right. ONNX's Reshape knows only 0 and -1, and
its 0 and -1 already depend on the input's shape. An imperative array resolves the codes
against its known shape (``mixrt.nd``); a hybridized block has no shape to resolve them
against when it is traced, so it writes this op, which resolves them when it runs.

The codes are first turned into a :class:`Plan` that depends only on the input's rank: one
recipe per output dimension ("input dim 2", "dims 1 times 2", "dim 0 divided by 3", ...).
Running the op, inferring its shape (symbolic dims included) and exporting it as standard
ONNX (``exporters/decompose.py``: Shape, Gather, Mul, Div, Concat, Reshape) all read the
same plan, so they cannot disagree. The semantics mirror MXNet 1.9's ``InferReshapeShape``,
checked against MXNet itself in tests/test_mx_reshape.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape import _inferred_dim, _product, typed
from mixrt.ops.shape.shape_grad import reshape_like

# what each output dimension is made of
COPY, FIXED, INFER, MERGE, DIVIDE = "copy", "fixed", "infer", "merge", "divide"


@dataclass(frozen=True)
class Piece:
    """One output dimension: input dim ``index`` (COPY), ``value`` (FIXED), the inferred
    one (INFER), dims ``index`` and ``index + 1`` multiplied (MERGE), or dim ``index``
    divided by ``value`` (DIVIDE, the -1 of a -4 pair)."""
    kind: str
    index: int = 0
    value: int = 0


@dataclass
class Plan:
    pieces: list[Piece]
    # each -4: (the input dim split, the output positions of its two parts), whose product
    # must be that dim
    splits: list[tuple[int, int, int]] = field(default_factory=list)


def reshape_plan(rank: int, codes, reverse: bool = False) -> Plan:
    """The plan for an input of ``rank`` dimensions; ValueError when the codes do not fit
    any input of that rank (say why)."""
    codes = [int(c) for c in codes]
    plan = _forward_plan(rank, codes[::-1] if reverse else codes)
    return _mirrored(plan, rank) if reverse else plan


def _forward_plan(rank: int, codes: list[int]) -> Plan:
    pieces, splits, at, i = [], [], 0, 0
    while i < len(codes):
        code = codes[i]
        if code == 0 or code > 0:
            if code == 0 and at >= rank:
                raise ValueError("0 copies a dimension the input does not have")
            pieces.append(Piece(COPY, at) if code == 0 else Piece(FIXED, value=code))
            at += 1
        elif code == -1:
            if any(p.kind == INFER for p in pieces):
                raise ValueError("only one dimension can be -1")
            pieces.append(Piece(INFER))
            at += 1
        elif code == -2:
            pieces.extend(Piece(COPY, j) for j in range(at, rank))
            at = max(at, rank)
        elif code == -3:
            if at + 1 >= rank:
                raise ValueError("-3 merges two dimensions the input does not have")
            pieces.append(Piece(MERGE, at))
            at += 2
        elif code == -4:
            if i + 2 >= len(codes) or at >= rank:
                raise ValueError("-4 needs the two dimensions to split into")
            splits.append((at, len(pieces), len(pieces) + 1))
            pieces.extend(_split_pieces(at, codes[i + 1], codes[i + 2]))
            at += 1
            i += 2
        else:
            raise ValueError(f"{code} is not a dimension or one of 0, -1, -2, -3, -4")
        i += 1
    return Plan(pieces, splits)


def _split_pieces(index: int, first: int, second: int) -> list[Piece]:
    if first == -1 and second == -1:
        raise ValueError("-4 cannot split into two -1")
    if first < -1 or second < -1:
        raise ValueError(f"-4 splits into sizes (or one -1), not {first} and {second}")
    if first == -1:
        return [Piece(DIVIDE, index, second), Piece(FIXED, value=second)]
    if second == -1:
        return [Piece(FIXED, value=first), Piece(DIVIDE, index, first)]
    return [Piece(FIXED, value=first), Piece(FIXED, value=second)]


def _mirrored(plan: Plan, rank: int) -> Plan:
    """A plan made over the reversed input and codes, read in the original order."""
    last = len(plan.pieces) - 1
    pieces = [Piece(p.kind, rank - 2 - p.index if p.kind == MERGE else rank - 1 - p.index,
                    p.value) if p.kind in (COPY, MERGE, DIVIDE) else p
              for p in reversed(plan.pieces)]
    splits = [(rank - 1 - dim, last - b, last - a) for dim, a, b in plan.splits]
    return Plan(pieces, splits)


# -- the output shape ---------------------------------------------------------------------

def _times(a, b):
    return a * b if isinstance(a, int) and isinstance(b, int) else None


def _divided(whole, by: int):
    if not isinstance(whole, int):
        return None
    return whole // by if by else 0  # MXNet's rule for a zero-sized partner


def planned_dims(plan: Plan, source) -> list:
    """The output dims from input dims ``source``, which may be symbolic (str) or unknown
    (None); so may the result's. ValueError when known sizes do not fit."""
    dims = [source[p.index] if p.kind == COPY else
            p.value if p.kind == FIXED else
            _times(source[p.index], source[p.index + 1]) if p.kind == MERGE else
            _divided(source[p.index], p.value) if p.kind == DIVIDE else -1
            for p in plan.pieces]
    for dim, a, b in plan.splits:
        whole, product = source[dim], _times(dims[a], dims[b])
        if isinstance(whole, int) and product is not None and product != whole:
            raise ValueError(f"-4 splits dimension {whole} into {dims[a]} x {dims[b]}")
    if -1 in dims:
        at = dims.index(-1)
        dims[at] = _inferred(source, dims[:at] + dims[at + 1:])
    _check_size(source, dims)
    return dims


def _inferred(source, others: list):
    size, rest = _product(source), _product(others)
    if size is not None and rest is not None:
        if rest == 0 or size % rest:
            raise ValueError(f"{size} elements do not divide into the other dimensions")
        return size // rest
    return _inferred_dim(list(source), others)  # a symbolic dim on both sides cancels


def _check_size(source, dims) -> None:
    size, result = _product(source), _product(dims)
    if size is not None and result is not None and size != result:
        raise ValueError(f"{size} elements are not {result}")


def mxnet_shape(source: tuple, codes, reverse: bool = False) -> tuple:
    """The shape MXNet's reshape makes of ``source`` from ``codes``; ValueError naming the
    shape and codes when they do not fit."""
    source = tuple(int(d) for d in source)
    try:
        return tuple(planned_dims(reshape_plan(len(source), codes, reverse), source))
    except ValueError as exc:
        raise ValueError(f"cannot reshape {source} to {tuple(int(c) for c in codes)}"
                         f"{' (reverse=True)' if reverse else ''}: {exc}") from None


# -- the op ----------------------------------------------------------------------------------

@op("MXReshape", since=1, domain=MIXRT)
def mx_reshape(xp, data, *, shape, reverse=0):
    """``data`` reshaped by MXNet's codes (0 copy, -1 infer, -2 copy the rest, -3 merge
    two, -4 a b split one), matched from the right when ``reverse`` is 1. A view where the
    array library can make one, as Reshape."""
    return data.reshape(mxnet_shape(data.shape, shape, bool(reverse)))


@mx_reshape.infer
def _(data, *, shape, reverse=0, **_):
    if data.shape is None:
        return [typed(data.dtype, None)]
    plan = reshape_plan(len(data.shape), shape, bool(reverse))
    return [typed(data.dtype, planned_dims(plan, data.shape))]


@mx_reshape.grad
def _(b, node, dy):
    # the elements keep their order, as for every reshape: dX is dY in X's shape
    return [reshape_like(b, dy[0], node.inputs[0])]
