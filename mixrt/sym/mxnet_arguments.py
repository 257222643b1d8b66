"""MXNet's argument names on the ONNX operators whose names MXNet uses too.

``sym.Flatten(data=x)``, ``sym.Cast(data=x, dtype="float16")``,
``sym.Concat(a, b, num_args=2, dim=1)``: MXNet 1.x code calls these with MXNet's
arguments; here they become the ONNX operator's (``input``, ``to``, ``axis``). Every op takes
MXNet's names for its data operands: ``data`` (and ``lhs``) for the first input, ``rhs`` for
the second, where the op's own inputs are named otherwise.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GraphError
from mixrt.ops.ir.dtypes import to_onnx_type

# MXNet's operand keywords -> the position of the input they name
OPERAND_KEYWORDS = {"data": 0, "lhs": 0, "rhs": 1}


def mxnet_arguments(spec, label: str, args: list, kwargs: dict) -> tuple[list, dict]:
    """``args``/``kwargs`` with MXNet's names put as the op ``spec`` names them."""
    args, kwargs = list(args), dict(kwargs)
    adapt = _BY_OP.get(spec.op_type) if not spec.domain else None
    if adapt is not None:
        adapt(label, args, kwargs)
    for keyword, position in OPERAND_KEYWORDS.items():
        if keyword in kwargs and keyword not in spec.inputs and keyword not in spec.attributes \
                and position < len(spec.inputs):
            if position < len(args) and args[position] is not None:
                raise GraphError(f"{label}: {keyword}= names input {position} "
                                 f"({spec.inputs[position]!r}), also given positionally")
            args.extend([None] * (position + 1 - len(args)))
            args[position] = kwargs.pop(keyword)
    return args, kwargs


def _cast(label: str, args: list, kwargs: dict) -> None:
    """MXNet's ``dtype=`` (a NumPy dtype or its name) is ONNX's ``to``."""
    if "dtype" in kwargs:
        if "to" in kwargs:
            raise GraphError(f"{label}: give the target type as dtype= or to=, not both")
        dtype = kwargs.pop("dtype")
        try:
            kwargs["to"] = to_onnx_type(np.dtype(dtype))
        except TypeError:
            raise GraphError(f"{label}: dtype {dtype!r} is not a NumPy dtype or its name "
                             f"('float32', 'float16', 'int32', ...)") from None


def _concat(label: str, args: list, kwargs: dict) -> None:
    """MXNet's ``dim=`` is ONNX's ``axis`` (which ONNX requires; MXNet's default is 1);
    ``num_args`` must count the inputs."""
    if "dim" in kwargs:
        if "axis" in kwargs:
            raise GraphError(f"{label}: give the axis as dim= or axis=, not both")
        kwargs["axis"] = int(kwargs.pop("dim"))
    if "num_args" in kwargs:
        num_args = kwargs.pop("num_args")
        if int(num_args) != len(args):
            raise GraphError(f"{label}: num_args={num_args} but {len(args)} inputs given")
    kwargs.setdefault("axis", 1)


_BY_OP = {"Cast": _cast, "Concat": _concat}
