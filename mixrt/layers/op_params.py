"""MXNet operator parameters as a symbol file or a call hands them over (a dict of the node's
parameters, its inputs as a list): the checks MXNet's symbol-file translations
(``mixrt/sym/mxnet_json_ops.py``) and the fused RNN (``fused_rnn.py``) share. Each raises
GraphError, which the symbol-file reader turns into a ModelLoadError naming the node.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GraphError

INT64_MAX = np.iinfo(np.int64).max  # "to the end" for ONNX Slice


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_arity(inputs: list, low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(inputs) <= high:
        expected = low if low == high else f"{low} to {high}"
        raise GraphError(f"takes {expected} input(s), the file gives {len(inputs)}")


def required_param(params: dict, key: str):
    if key not in params:
        raise GraphError(f"the parameter {key!r} is missing")
    return params.pop(key)


def no_params(params: dict) -> None:
    if params:
        raise GraphError(f"unknown parameter(s) {sorted(params)}")
