"""MXNet's ``mx.sym._internal``: operators MXNet's own Python code and tests call by their
internal names."""

from __future__ import annotations

from mixrt.sym.shape_free import identity_with_attr_like_rhs as _identity_with_attr_like_rhs
from mixrt.sym.shape_free import square_sum as _square_sum

__all__ = ["_identity_with_attr_like_rhs", "_square_sum"]
