"""Sliding windows' geometry (Conv's, ConvTranspose's, the pools'): the attributes filled
with ONNX's defaults, each spatial axis's pads and output size, and the output dims shape
inference gives, a symbolic input dim's included (its name for the arithmetic over it)."""

from __future__ import annotations

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# a Conv node's attributes (what FusedConv and FusedConvPool carry over, and ConvGrad)
CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def spatial_attrs(nd, kernel_shape, strides=None, dilations=None):
    """kernel, strides and dilations as int lists of length ``nd`` (ONNX defaults filled)."""
    kernel = [int(k) for k in kernel_shape]
    strides = [1] * nd if not strides else [int(s) for s in strides]
    dilations = [1] * nd if not dilations else [int(d) for d in dilations]
    if not len(kernel) == len(strides) == len(dilations) == nd:
        raise ValueError(f"kernel_shape {kernel}, strides {strides} and dilations {dilations} "
                         f"must each have one value per spatial axis ({nd})")
    return kernel, strides, dilations


def window_geometry(in_dims, kernel, strides, dilations, pads=None, auto_pad="NOTSET",
                    ceil_mode=False):
    """(begin pads, end pads, output sizes) of a sliding window along each spatial axis.

    ``in_dims`` are ints. With ``ceil_mode`` a last partial window is kept unless it would
    start inside the end padding (the PyTorch rule ONNX adopted).
    """
    auto_pad = auto_pad_name(auto_pad)
    nd = len(in_dims)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(in_dims, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, span, in_dims)]
        small = [t // 2 for t in total]
        begin = small if auto_pad == "SAME_UPPER" else [t - h for t, h in zip(total, small)]
        end = [t - b for t, b in zip(total, begin)]
        return begin, end, out
    if auto_pad == "VALID":
        begin = end = [0] * nd
    else:
        pads = [0] * (2 * nd) if not pads else [int(p) for p in pads]
        if len(pads) != 2 * nd:
            raise ValueError(f"pads {pads} must have 2 values per spatial axis ({nd})")
        begin, end = pads[:nd], pads[nd:]
    out = []
    for i, b, e, k, s in zip(in_dims, begin, end, span, strides):
        room = i + b + e - k
        if ceil_mode:
            o = -(-room // s) + 1
            if (o - 1) * s >= i + b:  # the last window would start in the end padding
                o -= 1
        else:
            o = room // s + 1
        out.append(max(o, 0))
    return begin, end, out


def auto_pad_name(auto_pad):
    name = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    name = name or "NOTSET"
    if name not in AUTO_PADS:
        raise ValueError(f"auto_pad must be one of {', '.join(AUTO_PADS)}; got {name!r}")
    return name


def inferred_out_dims(in_dims, kernel, strides, dilations, pads, auto_pad, ceil_mode=False):
    """Output spatial dims for shape inference. A symbolic input dim (a name) gives a
    symbolic output dim, an expression of it (:func:`symbolic_out_dim`); an unknown one
    gives None."""
    if in_dims is None or kernel is None or any(not isinstance(k, int) for k in kernel):
        return None
    nd = len(in_dims)
    kernel, strides, dilations = spatial_attrs(nd, kernel, strides, dilations)
    known = [d if isinstance(d, int) else 1 for d in in_dims]
    begin, end, out = window_geometry(known, kernel, strides, dilations, pads, auto_pad,
                                      ceil_mode)
    auto_pad = auto_pad_name(auto_pad)
    same = auto_pad in ("SAME_UPPER", "SAME_LOWER")
    dims = []
    for axis, (d, o) in enumerate(zip(in_dims, out)):
        if isinstance(d, int):
            dims.append(o)
        elif isinstance(d, str) and d:
            span = (kernel[axis] - 1) * dilations[axis] + 1
            # SAME's pads follow the size, its output is ceil(d / s); otherwise the pads are
            # fixed and the output is floor((d + pads - span) / s) + 1
            room = strides[axis] - 1 if same else begin[axis] + end[axis] - span + strides[axis]
            exact = same or not ceil_mode or (strides[axis] == 1 and end[axis] < span)
            dims.append(symbolic_out_dim(d, room, strides[axis]) if exact else None)
        else:
            dims.append(None)
    return dims


def symbolic_out_dim(dim: str, offset: int, stride: int) -> str:
    """``(dim + offset) // stride`` as the name of a symbolic dim: the same name for the same
    arithmetic over the same input dim, so two values that a model computes alike through
    strided convolutions and pools can be seen to have one shape (the residual Add of a
    ResNet or a MobileNet, fused into the convolution before it only where its two addends
    have one shape). A window that keeps the size (stride 1, pads as wide as the window)
    keeps the name itself."""
    operand = dim if dim.isidentifier() else f"({dim})"
    if stride == 1:
        return dim if offset == 0 else f"{operand}{offset:+d}"
    if offset == 0:
        return f"{operand}//{stride}"
    return f"({dim}{offset:+d})//{stride}"
