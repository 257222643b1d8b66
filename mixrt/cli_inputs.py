"""The ``mixrt`` command's values for a model's inputs: ``--input NAME=FILE.npy`` read (with
``allow_pickle=False``: a .npy file never runs code), ``--dim SYMBOL=N`` checked against the
symbolic dimensions the inputs declare, and the feeds ``plan``, ``compile`` and ``warmup``
plan for (the files given, zeros of the declared shapes for the rest). ``run`` and
``check --validate`` read their inputs here too. Apart from the subcommands because several
of them share it and none of it runs a model.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError, ModelLoadError
from mixrt.ops.ir.types import MapType, SequenceType, TensorType
from mixrt.runtime.npz import read_npy  # checks before it reads
from mixrt.runtime.support import check_dim_names


def read_input(spec: str) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise InputError(f"--input {spec!r}: expected NAME=FILE.npy")
    try:
        return name, read_npy(path, "input file")
    except ModelLoadError as exc:
        raise InputError(f"--input {name}: not a plain .npy array: {exc}") from exc


def read_dim(spec: str) -> tuple[str, int]:
    name, sep, text = spec.partition("=")
    if not sep or not name or not text.isdigit():
        raise InputError(f"--dim {spec!r}: expected SYMBOL=N with N a whole number")
    return name, int(text)


def plan_feeds(session, args) -> dict:
    """Feeds to plan for: --input files, else zeros of the declared shapes (--dim values
    for their symbolic dimensions)."""
    feeds = dict(read_input(spec) for spec in args.input)
    symbols = _dim_sizes(session, args)
    for value in session._required:
        if value.name not in feeds:
            feeds[value.name] = _zeros_for(value, symbols)
    return feeds


def _dim_sizes(session, args) -> dict[str, int]:
    """--dim's sizes, each for a symbolic dimension the model's inputs declare."""
    sizes = dict(read_dim(spec) for spec in args.dim)
    check_dim_names(session.graph.feed_inputs(), sizes)
    return sizes


def _zeros_for(value, symbols: dict) -> np.ndarray:
    """A zero feed of the input's declared shape, symbolic dims taken from --dim."""
    value_type = value.type
    element = value_type.element if isinstance(value_type, SequenceType) else value_type
    if isinstance(element, MapType):
        kind = "a sequence of maps" if element is not value_type else "a map"
        raise InputError(f"input {value.name!r} is {kind}, which --input (.npy arrays) "
                         f"cannot give and a memory plan needs; plan it from Python: "
                         f"Session(model).memory_plan(feeds)")
    if not isinstance(value_type, TensorType) or value_type.shape is None \
            or value_type.dtype is None:
        raise InputError(f"input {value.name!r} has no declared tensor shape; give it with "
                         f"--input {value.name}=FILE.npy")
    dims = []
    for axis, dim in enumerate(value_type.shape):
        if isinstance(dim, int):
            dims.append(dim)
        elif isinstance(dim, str) and dim in symbols:
            dims.append(symbols[dim])
        elif dim is None:  # no name to give --dim
            raise InputError(f"input {value.name!r} dimension {axis} has no size and no "
                             f"name; give the input with --input {value.name}=FILE.npy")
        else:
            raise InputError(f"input {value.name!r} dimension {axis} is {dim!r}; give it "
                             f"with --dim {dim}=N or --input {value.name}=FILE.npy")
    return np.zeros(dims, dtype=value_type.dtype)


def open_dims(session, args) -> list[str]:
    """The symbolic input dimensions neither --dim nor --input gives a size."""
    given = {spec.partition("=")[0] for spec in args.input}
    symbols = _dim_sizes(session, args)
    shapes = [(v.name, getattr(v.type, "shape", None)) for v in session._required
              if v.name not in given]
    return [f"{name}[{axis}] {dim!r}" if dim is not None else f"{name}[{axis}] (unnamed)"
            for name, shape in shapes for axis, dim in enumerate(shape or ())
            if dim is None or isinstance(dim, str) and dim not in symbols]


def map_inputs(session) -> list[str]:
    """Inputs that are maps (or sequences of them): their sizes are part of the plan
    signature, and --input reads only arrays, so no stored plan can be made for them."""
    return [f"{v.name} ({v.type})" for v in session._required
            if isinstance(v.type, MapType) or (isinstance(v.type, SequenceType)
                                              and isinstance(v.type.element, MapType))]
