"""The gradient of Resize and Upsample (every version) with respect to X.

Resize is linear in X and separable: along each resized axis the output is a small matrix
``A`` (output length x input length, a few taps per row) applied to the input, so dX is dY
with each ``A^T`` applied, the axes taken in reverse order. The backward kernel ResizeGrad
rebuilds the forward's tables (``image.resize_taps``) and transposes them on the host into a
table of taps per input position (the outputs that read it, with their weights); the device
then applies it as one matrix product (short axes) or tap by tap (long ones).

roi, scales and sizes get no gradient; nor does an integer X. Outputs that
tf_crop_and_resize sampled outside the input hold extrapolation_value, a constant: they pass
no gradient back.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.image import image
from mixrt.ops.ir.dtypes import accumulation_dtype
from mixrt.ops.training.grad_support import MIXRT, shaped_like_second
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape_grad import input_or_none
from mixrt.ops.ir.types import TensorType


@op("ResizeGrad", since=1, domain=MIXRT)
def resize_grad(xp, dY, like, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
                coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
                exclude_outside=0, keep_aspect_ratio_policy="stretch", mode="nearest",
                nearest_mode="round_prefer_floor"):
    """dX of a Resize of ``like`` (its shape is all that is read) whose output gradient is
    ``dY``; the attributes are the forward's (Resize-19's names and defaults)."""
    tables = image.resize_taps(
        like.shape, roi, scales, sizes, axes, mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside,
        nearest_mode=nearest_mode, antialias=antialias,
        keep_aspect_ratio_policy=keep_aspect_ratio_policy)
    compute_dtype = accumulation_dtype(dY.dtype)
    grad = dY
    for taps in reversed(tables):
        grad = _adjoint(xp, grad, taps, like.shape[taps.axis], compute_dtype)
    return xp.ascontiguousarray(grad.astype(dY.dtype, copy=False))


resize_grad.infer(shaped_like_second)


# A short axis is transposed with one matrix product (BLAS beats a gather there); a long one
# tap by tap, whose cost grows with the taps per input position instead of with the input
# length. Measured on NumPy: the product wins while out_len is below ~140 times the taps.
_DENSE_OUTPUTS_PER_TAP = 128
_DENSE_MAX_ENTRIES = 1 << 22


def _adjoint(xp, grad, taps: image.AxisTaps, in_len: int, dtype):
    """``A^T`` of one axis applied to ``grad`` along ``taps.axis``."""
    axis = taps.axis
    if taps.out_len == 0:  # an empty output passes nothing back
        return xp.zeros(grad.shape[:axis] + (in_len,) + grad.shape[axis + 1:], dtype=dtype)
    sources, weights = _transposed(taps, in_len)
    depth = sources.shape[1]
    if taps.out_len <= _DENSE_OUTPUTS_PER_TAP * depth \
            and taps.out_len * in_len <= _DENSE_MAX_ENTRIES:
        matrix = np.zeros((taps.out_len, in_len))
        np.add.at(matrix, (sources, np.arange(in_len)[:, None]), weights)
        product = xp.tensordot(grad.astype(dtype, copy=False), xp.asarray(matrix, dtype=dtype),
                               axes=([axis], [0]))
        return xp.moveaxis(product, -1, axis)
    return image.weighted_takes(xp, grad.astype(dtype, copy=False), axis, sources, weights)


def _transposed(taps: image.AxisTaps, in_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``A^T`` of one axis as taps: (in_len, k') output indices and weights, where k' is the
    most outputs any input position feeds. Repeated (output, input) pairs (taps clamped onto
    an edge) are summed first, and zero weights (excluded or extrapolated outputs) dropped,
    so that k' stays small; rows with fewer entries are padded with weight 0."""
    out_len, width = taps.idx.shape
    weights = np.ones(taps.idx.shape) if taps.weights is None else taps.weights
    if taps.inside is not None:
        weights = weights * taps.inside[:, None]
    outputs = np.repeat(np.arange(out_len, dtype=np.int64), width)
    key = taps.idx.reshape(-1) * out_len + outputs
    kept = weights.reshape(-1) != 0
    pairs, where = np.unique(key[kept], return_inverse=True)
    summed = np.bincount(where.reshape(-1), weights=weights.reshape(-1)[kept],
                         minlength=len(pairs))
    nonzero = summed != 0
    pairs, summed = pairs[nonzero], summed[nonzero]
    inputs, outputs = pairs // max(out_len, 1), pairs % max(out_len, 1)
    counts = np.bincount(inputs, minlength=in_len)
    depth = max(int(counts.max(initial=0)), 1)
    # pairs are sorted by input, then output: each entry's slot is its rank within its input
    slot = np.arange(len(pairs)) - np.repeat(np.cumsum(counts) - counts, counts)
    sources = np.zeros((in_len, depth), dtype=np.int64)
    table = np.zeros((in_len, depth))
    sources[inputs, slot] = outputs
    table[inputs, slot] = summed
    return sources, table


@resize_grad.grad
def _(b, node, dd):
    """Linear in dY: its adjoint is the forward Resize (at opset 19, which takes all of
    ResizeGrad's attributes; extrapolated outputs read nothing, so they get zeros)."""
    roi, scales, sizes = (input_or_none(node, k) for k in (2, 3, 4))
    return [b.emit("Resize", dd[0], roi, scales, sizes, opset=19, **node.attributes),
            None, None, None, None]


# -- the gradient functions -------------------------------------------------------------------

_RESIZE_ATTRIBUTES = ("antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a",
                      "exclude_outside", "keep_aspect_ratio_policy", "mode", "nearest_mode")


def _backward(b, node, dy: str, roi, scales, sizes, **attributes):
    x = node.inputs[0]
    if dy is None or not b.differentiable(x):
        return None
    return b.emit("ResizeGrad", dy, x, roi, scales, sizes, domain=MIXRT, **attributes)


def _resize_grad(b, node, dy):
    """Resize 11 to 19: the attributes go to ResizeGrad as they are."""
    attributes = {k: v for k, v in node.attributes.items() if k in _RESIZE_ATTRIBUTES}
    return [_backward(b, node, dy[0], input_or_none(node, 1), input_or_none(node, 2),
                      input_or_none(node, 3), **attributes), None, None, None]


image.resize.grad(_resize_grad)
image.resize_11.grad(_resize_grad)


def _pre_11_attributes(node) -> dict:
    """Upsample and Resize-10 as Resize-19 spells them (see image.upsample)."""
    mode = node.attributes.get("mode", "nearest")
    return dict(mode="linear" if mode == "bilinear" else mode,
                coordinate_transformation_mode="asymmetric", nearest_mode="floor")


@image.upsample.grad
def _(b, node, dy):
    return [_backward(b, node, dy[0], None, node.inputs[1], None, **_pre_11_attributes(node)),
            None]


@image.upsample_7.grad
def _(b, node, dy):
    scales = node.attributes.get("scales")
    if scales is None:
        raise GradientError(f"node {node.label!r}: Upsample-7 requires the 'scales' attribute",
                            node=node.label, op_type=node.op_type)
    return [_backward(b, node, dy[0], None, _float32_constant(b, scales), None,
                      **_pre_11_attributes(node))]


def _float32_constant(b, values) -> str:
    """Upsample-7's scales as the float32 tensor its forward makes of them: the output length
    floor(in * scale) must be computed from the same rounded scale."""
    array = np.asarray(values, dtype=np.float32)
    name = b.fresh("grad_scales")
    b.constants[name] = array
    b.types[name] = TensorType(array.dtype, tuple(array.shape), value=array)
    return name
