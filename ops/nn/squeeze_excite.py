"""``mixrt::SqueezeExcite``: a squeeze-excite block (MobileNetV3, EfficientNet, RegNet-Y) as one
node.

    s = GlobalAveragePool(X)                      (N, C, 1, 1)
    h = activation1(Conv1x1(s, W1, B1))           (N, R, 1, 1)
    g = activation2(Conv1x1(h, W2, B2))           (N, C, 1, 1)
    Y = X * g

The optimizer makes it at opt_level 2 (``runtime/passes/fuse_squeeze_excite.py``) from the
four nodes the product fusion leaves (a pool, two FusedConvs, a Mul). Its sizes are a
request's smallest: a MobileNetV3-small at 96 x 160 spends ~20 us on each of its nine
blocks as four nodes, most of it the nodes' own dispatch, and a new image size took each of
those four nodes' full routes (~150 us a block). The CPU's compiled form is
``squeeze_excite_cpu.py``; this generic kernel runs on any device, through ``xp``.

Attributes are plain ONNX kinds, so a ``.mxr`` file or an ONNX export carries the node:
``activation1`` and ``activation2`` name one of ``fused.ACTIVATIONS`` ("" for none), their
``*_params`` hold its constants in the order listed there.
"""

from __future__ import annotations

from mixrt.ops.ir.dtypes import FUSED_DTYPES
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.nn.fused import _into, activate


@op("SqueezeExcite", since=1, domain=MIXRT, dtypes=FUSED_DTYPES)
def squeeze_excite(xp, X, W1, B1=None, W2=None, B2=None, *, activation1="",
                   activation1_params=None, activation2="", activation2_params=None,
                   out=None, _prepacked=None):
    """X * activation2(W2 activation1(W1 mean(X) + B1) + B2), the means over X's plane."""
    n, c = X.shape[:2]
    squeezed = X.reshape(n, c, -1).mean(axis=2)
    hidden = _dense(xp, squeezed, W1, B1, activation1, activation1_params)
    gates = _dense(xp, hidden, W2, B2, activation2, activation2_params)
    gates = gates.reshape((n, c) + (1,) * (X.ndim - 2))
    return _into(xp, xp.multiply(X, gates.astype(X.dtype, copy=False)), out)


def _dense(xp, values, W, B, activation: str, params):
    """activation(values @ W' + B) for the 1x1 convolution's weight W (M, K, 1, 1)."""
    y = xp.matmul(values, W.reshape(W.shape[0], -1).T)
    if B is not None:
        y += B.reshape(1, -1)
    return activate(xp, y, activation, params)


@squeeze_excite.infer
def _(X, W1, B1=None, W2=None, B2=None, **_):
    return [TensorType(X.dtype, X.shape)]
