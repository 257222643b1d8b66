"""Convolutions of one pixel into one pixel: a 1x1 kernel over a 1x1 plane, as a
squeeze-excite block's two layers are (MobileNetV3, EfficientNet, RegNet-Y).

Such a convolution is one product of the batch's channel vectors with the weight,
``(N, C) @ (C, M)``, and needs none of the columns, bands or tiles the other forms set up
for a plane: through ``conv_cpu.conv_bands`` a MobileNetV3's 1 x 96 x 1 x 1 squeeze took
~17 us, of which the product is ~2. The call is kept as the node's replay
(``ops/compiled/replay.py``) where the weight is a constant and the output the caller's, so a
bound call (``ops/compiled/bound_calls.py``) makes just the product and its epilogue.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import replay
from mixrt.ops.nn import matmul_cpu


def suits(X, W, group, pads, auto_pad, out) -> bool:
    """Whether Conv(X, W) is one pixel from one pixel with no padding, in one native float
    dtype, into a C-contiguous ``out`` (or a new array)."""
    return X.ndim == 4 and W.ndim == 4 and X.shape[2:] == (1, 1) and W.shape[2:] == (1, 1) \
        and int(group) == 1 and W.shape[1] == X.shape[1] \
        and X.dtype == W.dtype and X.dtype in (np.float32, np.float64) \
        and X.flags.c_contiguous and not any(pads or ()) \
        and auto_pad in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER") \
        and (out is None or out.flags.c_contiguous and out.shape == _shape(X, W)
             and out.dtype == X.dtype)


def conv(X, W, B, Z, out, epilogue, prepacked):
    """``out`` = epilogue(X W' + B, Z): ``epilogue(y, bias, residual)`` adds the (M,) bias
    and the residual to the (N, M) product ``y`` and applies the activation, in place.
    ``prepacked``: the node's dict where W is a constant, else None."""
    if Z is not None and Z.shape != _shape(X, W):
        return None  # a broadcast residual: the planar forms add it
    kept = out is not None and prepacked is not None
    if out is None:
        out = np.empty(_shape(X, W), X.dtype)
    action = _panel_action(X, W, B, out, epilogue, prepacked) or _action(epilogue)
    action(X, W, B, Z, out)
    if kept:
        replay.record(prepacked, (X, W, B, Z, out), action)
    return out


def _panel_action(X, W, B, out, epilogue, prepacked):
    """The product on the packed panels of a constant W (``matmul_cpu.panel_call``, split
    over the native workers as a dense layer's is), the bias added in its tiles, then the
    epilogue; None where the panels do not take it. Through NumPy's matmul the weight was read
    transposed in place and the BLAS woke its own threads beside the native workers, which
    spin through a run: MobileNetV3-small's 144 -> 576 excitation over 8 images took ~100 us
    in a run (onnxruntime 24)."""
    n, c, m = X.shape[0], X.shape[1], W.shape[0]
    if prepacked is None or B is not None and (
            B.shape != (m,) or B.dtype != X.dtype or not B.flags.c_contiguous):
        return None
    weight = W.reshape(m, c).T
    # the panels of W^T under their own key: the conv forms keep other layouts in this dict
    own = prepacked.setdefault("_one_pixel", {})
    if not matmul_cpu.panels_suit(X.reshape(n, c), weight, out.reshape(n, m), own,
                                  min_work=0):
        return None
    product = matmul_cpu.panel_call(X.reshape(n, c), weight, own, B)
    bound = None  # the epilogue as a compiled pass over the first call's arrays, or False

    def run(X, W, B, Z, out):
        nonlocal bound
        y = out.reshape(n, m)
        product(X, y)
        if bound:
            bound()
            return out
        residual = None if Z is None else Z.reshape(n, m)
        if bound is None and hasattr(epilogue, "bind"):
            bound = epilogue.bind(y, None, residual) or False
        else:
            epilogue(y, None, residual)
        return out
    return run


def _action(epilogue):
    bound = None  # the epilogue as a compiled pass over the first call's arrays, or False

    def run(X, W, B, Z, out):
        nonlocal bound
        n, m = out.shape[:2]
        y = out.reshape(n, m)
        np.matmul(X.reshape(n, -1), W.reshape(m, -1).T, out=y)
        if bound:  # a replay: the very arrays the pass was bound to
            bound()
            return out
        residual = None if Z is None else Z.reshape(n, m)
        if bound is None and hasattr(epilogue, "bind"):
            bound = epilogue.bind(y, B, residual) or False  # False: it is not one pass
        else:
            epilogue(y, B, residual)
        return out
    return run


def _shape(X, W) -> tuple:
    return (X.shape[0], W.shape[0], 1, 1)
