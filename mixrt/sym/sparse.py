"""``mx.sym.sparse``: MXNet 1.x's sparse operators as symbols.

A mixrt graph computes every value densely (storage types are an imperative matter here:
``mixrt/nd/sparse.py``), so each of these is the dense operator of the same name and gives
the values MXNet's sparse kernel would. A variable's storage type is still recorded
(``sym.Variable(name, stype=...)`` sets ``__storage_type__``) for code that reads it back.
``cast_storage`` is therefore the identity.
"""

from __future__ import annotations

from mixrt.base.errors import GraphError

# the operators whose sparse forms MXNet lists in mx.sym.sparse and that mixrt.sym has:
# mixrt/sym/__init__.py hands them in once it has made them (this module is part of it)
SAME_AS_DENSE = ("dot", "elemwise_add", "elemwise_sub", "elemwise_mul", "add_n",
                  "ElementWiseSum", "add", "subtract", "multiply", "divide", "square",
                  "sqrt", "abs", "sign", "negative", "relu", "clip", "sum", "mean", "slice",
                  "floor", "ceil", "round", "rint", "fix", "trunc", "sin", "tan", "arcsin",
                  "arctan", "sinh", "tanh", "arcsinh", "arctanh", "expm1", "log1p",
                  "degrees", "radians", "exp", "log")


def cast_storage(data, stype: str, name=None):
    """``data`` itself: a graph's values are dense whatever the storage type asked."""
    if stype not in ("default", "row_sparse", "csr"):
        raise GraphError(f"cast_storage: stype must be 'default', 'row_sparse' or 'csr', "
                         f"got {stype!r}")
    return data


__all__ = [*SAME_AS_DENSE, "cast_storage"]
