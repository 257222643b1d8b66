"""MXNet's ``mx.sym.contrib``: the contrib functions written over other symbols
(``rand_zipfian``, ``SparseEmbedding``; ``mixrt.nd.contrib`` has the imperative ones)."""

from __future__ import annotations

import math

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.sym.random import uniform
from mixrt.sym.symbol import call_op, Symbol
from mixrt.sym.symbol_layers import Embedding


def rand_zipfian(true_classes, num_sampled, range_max):
    """``num_sampled`` classes in [0, range_max) drawn with replacement from the approximate
    Zipfian distribution, P(k) = log((k + 2) / (k + 1)) / log(range_max + 1), and the
    expected counts (float64) of ``true_classes`` and of the drawn classes among
    ``num_sampled`` draws: three symbols, as ``nd.contrib.rand_zipfian`` gives arrays."""
    if not isinstance(true_classes, Symbol):
        raise GraphError(f"rand_zipfian: true_classes must be a Symbol, got "
                         f"{type(true_classes).__name__}")
    for name, value in (("num_sampled", num_sampled), ("range_max", range_max)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphError(f"rand_zipfian: {name} must be a positive int, got {value!r}")
    log_range = math.log(range_max + 1)
    draws = uniform(0, log_range, shape=(num_sampled,), dtype="float64")
    # each draw is below range_max already; the remainder keeps it so, as MXNet's does
    sampled = call_op("", "Mod", [(draws.exp() - 1).astype("int64"),
                                  np.array(range_max, dtype=np.int64)], {})
    return (sampled, _expected_count(true_classes, log_range, num_sampled),
            _expected_count(sampled, log_range, num_sampled))


def _expected_count(classes: Symbol, log_range: float, num_sampled: int) -> Symbol:
    classes = classes.astype("float64")  # in float64: int classes would divide as ints
    return ((classes + 2.0) / (classes + 1.0)).log() / log_range * num_sampled


__all__ = ["rand_zipfian"]


def SparseEmbedding(data=None, weight=None, input_dim=None, output_dim=None, dtype="float32",
                    deterministic=False, name=None, **attributes):
    """MXNet's ``contrib.SparseEmbedding``: ``Embedding`` with ``sparse_grad=True``, the
    rows of ``weight`` at the indices in ``data``. MXNet gives the weight a row_sparse
    gradient; here it is dense, of the same values. ``deterministic`` (the order MXNet's
    GPU kernel adds gradient rows in) changes nothing."""
    del deterministic
    return Embedding(data=data, weight=weight, input_dim=input_dim, output_dim=output_dim,
                     dtype=dtype, sparse_grad=True, name=name, **attributes)
