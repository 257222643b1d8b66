"""Checks and small helpers of the graph Module, :mod:`mixrt.module.graph_module` and its
training mixin (``graph_training.py``), kept apart to keep those modules short."""

from __future__ import annotations

import warnings

import numpy as np

from mixrt.base.errors import InputError
from mixrt.ops.device import array_module
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph
from mixrt.runtime.passes.infer import infer_types


def symbol_names(symbol, what: str, names, *, required: bool) -> list[str]:
    """``data_names``/``label_names`` as a list of at most one argument of the symbol."""
    names = [] if names is None else [names] if isinstance(names, str) else list(names)
    if len(names) > 1 or (required and not names):
        count = "one" if required else "at most one"
        raise InputError(f"Module.from_symbol: {what} must name {count} argument of the "
                         f"symbol (a Module feeds one data array and one label); got {names}")
    arguments = symbol.list_arguments()
    for name in names:
        if name not in arguments:
            raise InputError(f"Module.from_symbol: {what} names {name!r}, which is not an "
                             f"argument of the symbol; its arguments are {arguments}")
    return names


def feed_array(value):
    """A batch as given when it is already an array of some device (a CuPy batch skips the
    host), else as a NumPy array."""
    return value if array_module(value) is not np else np.asarray(value)


def static_type(graph: Graph, name: str) -> TensorType:
    found = infer_types(graph).get(name)
    if not isinstance(found, TensorType) or found.shape is None or any(
            not isinstance(d, int) for d in found.shape[1:]):
        raise InputError(f"replace_head: the shape of {name!r} is not known ({found}); the "
                         f"new head needs a static feature size")
    return found


def check_sharding(data, kvstore) -> None:
    """Workers that each train on all the data would count every sample num_workers times."""
    workers = 1 if kvstore is None else kvstore.num_workers
    if workers > 1 and getattr(data, "num_parts", workers) != workers:
        warnings.warn(f"train_data is split into {data.num_parts} part(s) but the "
                      f"{kvstore.type!r} store has {workers} workers; shard it with "
                      f"NDArrayIter(..., num_parts={workers}, part_index={kvstore.rank})",
                      stacklevel=3)


__all__ = ["symbol_names", "feed_array", "static_type", "check_sharding"]
