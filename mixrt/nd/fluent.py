"""NDArray's fluent methods (``x.exp()``, ``x.sum(axis=1)``) taking the keywords MXNet
1.9.1's take.

Most of MXNet's fluent methods hand their arguments to the operator of the same name
(``x.exp(*args, **kwargs)`` is ``nd.exp(x, *args, **kwargs)``), so they take every operator's
``out=`` and ``name=``; ``name`` names a symbol's node and means nothing to an array, so it is
accepted and dropped. ``flatten``, ``expand_dims`` and ``squeeze`` have signatures of their
own in MXNet (``inplace=``, no ``out=``); here they also accept ``name=``, so that a
``hybrid_forward`` written for symbols (``x.flatten(name="f")``) runs on arrays too.
"""

from __future__ import annotations

import functools
import inspect

from mixrt.nd.mxnet_math import accepting_out
from mixrt.nd.ndarray import NDArray

# MXNet 1.9.1's NDArray methods that forward to their operator (ndarray.py's "Convenience
# fluent method" list; split_v2 forwards to a Python function without out= or name=)
FORWARDING = [
    "reshape_like", "zeros_like", "ones_like", "broadcast_axes", "repeat", "pad", "swapaxes",
    "split", "slice", "slice_axis", "slice_like", "take", "one_hot", "pick", "sort", "topk",
    "argsort", "argmax", "argmax_channel", "argmin", "clip", "abs", "sign", "shape_array",
    "size_array", "tile", "transpose", "flip", "depth_to_space", "space_to_depth", "diag",
    "sum", "nansum", "prod", "nanprod", "mean", "max", "min", "norm", "round", "rint", "fix",
    "floor", "ceil", "trunc", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "degrees",
    "radians", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "exp", "expm1", "log",
    "log10", "log2", "log1p", "sqrt", "rsqrt", "cbrt", "rcbrt", "square", "reciprocal", "relu",
    "sigmoid", "softmax", "log_softmax", "softmin"]
# MXNet's methods with their own signature, which take name= here as a symbol's do
OWN_SIGNATURE = ["flatten", "expand_dims", "squeeze"]


def _forwarding(method):
    """``method`` taking ``out=`` (written into, then returned) and ignoring ``name=``
    (as it is where it takes both already)."""
    if {"out", "name"} <= set(inspect.signature(method).parameters):
        return method
    with_out = accepting_out(method)

    @functools.wraps(method)
    def fluent(self, *args, name=None, **kwargs):
        return with_out(self, *args, **kwargs)
    return fluent


def _naming(method):
    """``method`` ignoring ``name=``."""
    @functools.wraps(method)
    def fluent(self, *args, name=None, **kwargs):
        return method(self, *args, **kwargs)
    return fluent


def attach() -> None:
    """Wrap NDArray's methods once every module has attached its own."""
    for method in FORWARDING:
        setattr(NDArray, method, _forwarding(getattr(NDArray, method)))
    for method in OWN_SIGNATURE:
        setattr(NDArray, method, _naming(getattr(NDArray, method)))
