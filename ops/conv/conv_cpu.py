"""The CPU fast path of Conv: which form computes a convolution, in the order it is tried.

``conv_cpu`` (Conv's registered CPU kernel) takes a 1x1 node's new image size of 7x7
pixels or more straight to the direct form's call made from its kit where the node has one
(:func:`pointwise_anew`), a single output pixel to ``one_pixel.py``, a small plane's 1x1
convolution to ``pointwise_rows.py``, then
:func:`direct`: taps mostly over padding to ``sparse_taps.py``, narrow groups to
``grouped_cpu.py``, the rest the packed-panel tile takes to ``conv_direct_cpu.py``. Whatever
none of them takes goes to :func:`conv_bands`: depthwise convolutions and narrow groups to
the compiled loops (``jit_depthwise.py``, ``phase_planes.py``), grouped 1x1 ones to one
batched matmul, other dtypes and groups to the generic kernel (conv.py), Winograd
(``winograd_cpu.py``) for a constant weight where it suits, then the matmul forms: several
small images' columns to one product, one product per kernel row (``shifted_cpu.py``), or
one image at a time by bands of im2col columns or shift-and-add (``im2col_cpu.py``), their
padded images kept per thread (``padding_cpu.py``).
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.compiled.bound_calls import binds_replay, padded
from mixrt.ops.compiled import image_routes, replay
from mixrt.ops.compiled.workspace import packed, per_shape
from mixrt.ops.conv import depthwise_common, one_pixel, phase_planes, pointwise_rows
from mixrt.ops.conv import (conv_direct_cpu, grouped_cpu, jit_depthwise, sparse_taps,
                             winograd_cpu)
from mixrt.ops.conv.conv import conv, conv_geometry
from mixrt.ops.conv.windows import auto_pad_name
from mixrt.ops.conv.im2col_cpu import _batches_suit, _conv_batched, _conv_image
# not called here: conv_grad_cpu.py imports them from this module
from mixrt.ops.conv.im2col_cpu import im2col_into  # noqa: F401
from mixrt.ops.conv.padding_cpu import _padded  # noqa: F401
from mixrt.ops.conv.shifted_cpu import _KernelRows, _shift_add_suits


# A node's prepacked dict holding this key (True) asks for sums of products alone: no
# Winograd, whose transforms round where every product and partial sum is an exact integer
# (QLinearConv's float32 route, ops/quant/quantize_cpu.py). Every other form adds products.
EXACT_SUMS = "exact sums"


@conv.fast("cpu")
def conv_cpu(xp, X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1,
             kernel_shape=None, pads=None, strides=None, out=None, _prepacked=None,
             _node=None):
    if out is not None and (replay.replayed(_prepacked, (X, W, B, None, out))
                            or image_routes.ran(_prepacked, X, (W, B), None, out, pads)):
        return out
    replay.forget(_prepacked)
    attributes = dict(auto_pad=auto_pad, dilations=dilations, group=group,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    done = pointwise_anew(X, W, B, None, attributes, conv_direct_cpu.NO_ACTIVATION, out,
                          _prepacked)
    if done is None:
        done = _route(X, W, B, attributes, out, _prepacked, _node)
    image_routes.keep(_prepacked, X, (W, B), None, out, pads)
    return done


def pointwise_anew(X, W, B, Z, attributes: dict, limits, out, prepacked):
    """``out``, computed by the direct form's call at a new image size of a 1x1 convolution
    node (``conv_direct_cpu.pointwise_anew``) where the node is one (stride 1, one group, no
    padding or dilation, a constant weight) and that call takes these arrays; else None,
    nothing computed: the full route decides."""
    if out is None or prepacked is None or X.__class__ is not np.ndarray \
            or not _pointwise_node(W, attributes):
        return None
    return out if conv_direct_cpu.pointwise_anew(X, W, B, Z, out, limits, prepacked) else None


def _pointwise_node(W, attributes: dict) -> bool:
    """A 1x1 convolution of one group with stride 1 and no padding or dilation (as the
    node's attributes, and the pads a call came with, say)."""
    if W.ndim != 4 or W.shape[2] != 1 or W.shape[3] != 1 or int(attributes["group"]) != 1 \
            or attributes["auto_pad"] not in ("NOTSET", "VALID"):
        return False
    # any(), min() and max() over each short list: a C call each, where a generator per
    # list resumed once a value (~16 Python events a convolution, at every new image size)
    pads, strides, dilations = attributes["pads"], attributes["strides"], attributes["dilations"]
    return not (pads and any(pads)) and (not strides or min(strides) == 1 == max(strides)) \
        and (not dilations or min(dilations) == 1 == max(dilations))


def _route(X, W, B, attributes: dict, out, _prepacked, _node):
    """Conv's full route among the CPU forms (:func:`conv_cpu`)."""
    group, pads = attributes["group"], attributes["pads"]
    strides, auto_pad = attributes["strides"], attributes["auto_pad"]
    if one_pixel.suits(X, W, group, pads, auto_pad, out) \
            and (out is None or not np.may_share_memory(out, X)):
        return one_pixel.conv(X, W, B, None, out, _bias_only, _prepacked)
    pointwise_rows.warm_bands(X, W, group, _prepacked)
    if pointwise_rows.suits(X, W, group, pads, strides, auto_pad, out, _prepacked):
        done = pointwise_rows.conv(X, W, B, None, out, _bias_only, _prepacked,
                                   conv_direct_cpu.NO_ACTIVATION)
        if done is not None:
            return done
    done = direct(X, W, B, None, conv_direct_cpu.NO_ACTIVATION, attributes, out, _prepacked,
                  node=_node)
    if done is not None:
        return done
    return conv_bands(X, W, B, out=out, prepacked=_prepacked, **attributes)


def _bias_only(y, bias, residual):
    """A plain Conv's epilogue in the one-pixel and pixel-row forms (no residual there)."""
    if bias is not None:
        np.add(y, bias, out=y)


def conv_bands(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
               pads=None, strides=None, out=None, epilogue=None, prepacked=None):
    """Conv into ``out``; ``epilogue(y, image, start, stop)``, when given, runs on each band
    of output columns ``y`` ((M, stop - start) of image ``image``) right after its matmul,
    while the band is still in cache (FusedConv adds its residual and activation there).
    ``prepacked``: a dict in which the reordered weights of a constant ``W`` are kept between
    runs (:func:`packed`); None when ``W`` may change from one call to the next."""
    xp = np
    # depthwise convolutions and narrow groups take a compiled loop, grouped 1x1 ones one
    # batched matmul; other grouped ones the generic kernel, whose one batched matmul over
    # the groups beats a Python loop of tiny per-group matmuls
    if phase_planes.depthwise_suits(X, W, group) or _narrow_groups(X, W, group, out):
        return _depthwise(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides,
                          out, epilogue, prepacked)
    if _grouped_pointwise(X, W, group, kernel_shape, pads, strides, auto_pad, out):
        return _conv_grouped_pointwise(X, W, B, int(group), out, epilogue)
    if X.dtype not in (np.float32, np.float64) or W.dtype != X.dtype or X.ndim < 3 \
            or int(group) > 1:
        Y = conv(xp, X, W, B, auto_pad=auto_pad, dilations=dilations, group=group,
                 kernel_shape=kernel_shape, pads=pads, strides=strides)
        Y = Y if out is None else _copied(out, Y)
        if epilogue is not None:
            flat = Y.reshape(Y.shape[0], Y.shape[1], -1)
            for image in range(Y.shape[0]):
                epilogue(flat[image], image, 0, flat.shape[2])
        return Y
    kernel, strides, dilations, group, begin, end, out_dims = geometry(
        prepacked, X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    (n, c), m = X.shape[:2], W.shape[0]
    if out is None:
        out = np.empty((n, m) + tuple(out_dims), dtype=X.dtype)
    # only for a constant weight: transforming it took 10x a 256-channel 14x14 convolution
    if prepacked is not None and not prepacked.get(EXACT_SUMS) and \
            winograd_cpu.suits(X, W, kernel, strides, dilations, group, out_dims, out):
        U = packed(prepacked, "winograd", lambda: winograd_cpu.transformed_weights(W))
        return winograd_cpu.conv(X, U, B, out, begin, out_dims, epilogue)
    weights = W.reshape(group, m // group, -1)
    Y = out.reshape(n, group, m // group, -1)
    bias = None if B is None else B.reshape(group, m // group, 1)
    if _batches_suit(kernel, strides, begin, end, out_dims, weights.shape[2], X.itemsize) \
            and not _shift_add_suits(X[0], weights[0], kernel, strides, out_dims) \
            and not _KernelRows.suit(X, W, kernel, strides, out_dims):
        _conv_batched(X, weights[0], Y.reshape(n, m, -1), kernel, strides, dilations, begin,
                      end, out_dims, bias, epilogue)
        return out
    kernel_rows = _KernelRows.suited(X, W, kernel, strides, dilations, out_dims, prepacked)
    for image in range(n):
        for g in range(group):
            channels = X[image, g * (c // group):(g + 1) * (c // group)]

            def finish(y, start, stop, g=g, image=image):
                if bias is not None:
                    y += bias[g]
                if epilogue is not None and group == 1:
                    epilogue(y, image, start, stop)
            if kernel_rows is not None:
                kernel_rows.conv(channels, Y[image, g], begin, end)
                finish(Y[image, g], 0, Y.shape[3])
                continue
            _conv_image(channels, weights[g], Y[image, g], kernel, strides, dilations, begin,
                        end, out_dims, finish, prepacked if group == 1 else None)
        if epilogue is not None and group > 1:
            whole = out[image].reshape(m, -1)
            epilogue(whole, image, 0, whole.shape[1])
    return out


def direct(X, W, B, Z, limits, attributes, out, prepacked, found=None, node=None):
    """``out`` = limits(Conv(X, W, B) + Z) through ops/conv/conv_direct_cpu.py when it suits this
    convolution (None when it does not: nothing is computed). ``limits``: the activation as
    ``conv_direct_cpu.activation_limits`` gives it, or with a gate after it
    (``direct_forms.gated_limits``), which only the direct form's parts apply; ``found``: the
    :func:`geometry`, when the
    caller has it. ``prepacked`` None (W is not a constant): the direct form still takes a
    large enough call, packing W on each, where the session gave the node a ``node`` dict."""
    if X.ndim != 4 or W.ndim != 4 or not isinstance(X, np.ndarray):
        return None
    varying = prepacked is None
    if varying:
        prepacked = conv_direct_cpu.varying_layouts(
            node, X, lambda layouts: geometry(layouts, X, W, **attributes))
        if prepacked is None:
            return None
    if found is None:
        found = geometry(prepacked, X, W, **attributes)
    gated = len(limits) > 3  # (its gate in the direct form's native parts alone)
    if sparse_taps.suits(X, W, attributes["group"], found, out):  # taps mostly over padding
        if gated:
            return None
        done = sparse_taps.conv(X, W, B, Z, limits, out, found,
                                None if varying else prepacked)
        if done is not None:
            return done
    grouped = not varying and grouped_cpu.suits(X, W, attributes["group"], found, out, Z)
    if grouped and gated or not grouped and not conv_direct_cpu.suits(
            X, W, attributes["group"], found, out, prepacked):
        return None
    # only a call into the caller's own out, with a constant W, is kept as the node's replay
    # (ops/compiled/replay.py): a W that varies may change in place, under the same address
    replays = prepacked if out is not None and not varying else None
    if out is None:
        out = np.empty((X.shape[0], W.shape[0], *found[-1]), X.dtype)
    if grouped:
        return grouped_cpu.conv(X, W, B, Z, limits, out, replays)
    return conv_direct_cpu.conv(X, W, B, Z, limits, out, found, prepacked, replays,
                                repack=varying)


def geometry(prepacked, X, W, auto_pad, dilations, group, kernel_shape, pads, strides):
    """``conv_geometry``, kept in the session node's ``prepacked`` dict per input and weight
    shape (a node's attributes never change): computing it again took ~2.5 us of every
    call, as long as a ShuffleNet layer's epilogue. The pads are part of the key: a
    FusedConvPool's bands (ops/conv/fused_conv_pool.py) call one node's kernel with pads of
    their own. The batch is not: the geometry is an image's, and a service's batches of one
    image size share it (and leave the node's layouts kept longer, ``per_shape``). The
    strides and dilations are, as the pads: a kernel called with others at one input size
    (not a graph's node, whose attributes are fixed) took the first call's geometry."""
    key = ("geometry", X.shape[1:], W.shape, None if pads is None else tuple(pads),
           None if strides is None else tuple(strides),
           None if dilations is None else tuple(dilations))
    return per_shape(prepacked, key, lambda: _shared_window(
        X, W, auto_pad, dilations, group, kernel_shape, pads, strides))


# window geometries by image and weight shapes and attributes, for every node: a CNN's
# blocks repeat their convolutions, and each node worked its geometry out again at each new
# image size a service sent (~10 us, cold). Past MAX_GEOMETRIES they are all let go.
_GEOMETRIES: dict = {}
MAX_GEOMETRIES = 1024
# what a geometry holds that the image size does not change, by everything but that size:
# a new image size's geometry is then its output dims' arithmetic (conv_geometry's checks
# and defaults were ~15-25 us a node at each new size of a service, cold: fifty-odd a
# MobileNetV2 size's first run, 2026-12-01)
_WINDOWS: dict = {}


def _shared_window(X, W, auto_pad, dilations, group, kernel_shape, pads, strides):
    """``conv_geometry``, kept for every node by shapes and attributes (_GEOMETRIES)."""
    free = (X.shape[1], W.shape, auto_pad, int(group),  # (no generator: asked a node a size)
            None if dilations is None else tuple(dilations),
            None if kernel_shape is None else tuple(kernel_shape),
            None if pads is None else tuple(pads), None if strides is None else tuple(strides))
    key = (free, X.shape[2:])
    found = _GEOMETRIES.get(key)
    if found is None:
        window = _WINDOWS.get(free)
        if window is None:
            found = conv_geometry(X, W, auto_pad, dilations, group, kernel_shape, pads,
                                  strides)
            window = _Window(found, auto_pad)
            if len(_WINDOWS) >= MAX_GEOMETRIES:
                _WINDOWS.clear()
            _WINDOWS[free] = window
        else:
            found = window.at(X.shape[2:]) or conv_geometry(
                X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
        if len(_GEOMETRIES) >= MAX_GEOMETRIES:
            _GEOMETRIES.clear()
        _GEOMETRIES[key] = found
    return found


class _Window:
    """A node's geometry apart from its image size: its kernel, strides, dilations, group
    and pads, checked against its channels once (``conv_geometry``), and each window's
    span; :meth:`at` gives an image size's geometry as ``conv_geometry`` would."""

    __slots__ = ("fixed", "head", "begin", "end", "spans")

    def __init__(self, found: tuple, auto_pad):
        kernel, strides, dilations, group, begin, end, _ = found
        # auto_pad SAME_*: the pads follow the image size (conv_geometry works them out)
        self.fixed = auto_pad_name(auto_pad) in ("NOTSET", "VALID")
        self.head = (kernel, strides, dilations, group)
        self.begin, self.end = begin, end
        self.spans = tuple(zip([b + e - ((k - 1) * d + 1) for k, d, b, e in
                                zip(kernel, dilations, begin, end)], strides))

    def at(self, in_dims) -> tuple | None:
        """The geometry over an image of ``in_dims``, or None where the pads follow it."""
        if not self.fixed or len(in_dims) != len(self.spans):
            return None
        out = [max((int(i) + room) // stride + 1, 0)
               for i, (room, stride) in zip(in_dims, self.spans)]
        return (*self.head, self.begin, self.end, out)


def _narrow_groups(X, W, group, out) -> bool:
    """A grouped convolution of narrow groups that the compiled loop of
    ``ops/conv/jit_depthwise.py`` takes (its flat form), into ``out`` or a new array; not a
    1x1 one (ShuffleNet's), which ``grouped_cpu`` computes as one product per group."""
    return jit_depthwise.narrow_groups(X, W, group) and X.flags.c_contiguous \
        and 1 < W.shape[2] * W.shape[3] and max(W.shape[2:]) <= depthwise_common.MAX_TAPS \
        and (out is None or (out.dtype == X.dtype and out.flags.c_contiguous
                             and not np.may_share_memory(X, out)))


def depthwise_activated(X, W, B, attributes: dict, activation: tuple, out, prepacked):
    """FusedConv's depthwise (or narrow grouped) convolution without a residual: the bias
    and ``activation`` ((name, params)) applied by the compiled loop of
    ``ops/conv/jit_depthwise.py`` as it stores each output, into ``out`` (made when None);
    None, nothing computed, where that loop does not take it (the caller then adds them in
    a pass of its own)."""
    if not (phase_planes.depthwise_suits(X, W, attributes["group"])
            or _narrow_groups(X, W, attributes["group"], out)) \
            or depthwise_common.activation_constants(*activation, X.dtype) is None:
        return None
    kernel, strides, dilations, _, begin, _, out_dims = geometry(prepacked, X, W, **attributes)
    shape = (X.shape[0], W.shape[0]) + tuple(out_dims)
    replays = prepacked if out is not None else None  # only a call into the caller's out
    if out is None:
        out = np.empty(shape, X.dtype)
    if out.shape != shape or not depthwise_common.suits(X, W, out, kernel):
        return None
    return jit_depthwise.depthwise_conv(X, W, B, out, kernel, strides, dilations, begin,
                                        out_dims, replays, activation)


def _depthwise(X, W, B, auto_pad, dilations, group, kernel_shape, pads, strides, out,
               epilogue, prepacked=None):
    """ShuffleNet's and MobileNet's depthwise convolutions, by the direct compiled loop of
    ``ops/conv/jit_depthwise.py`` or else the phase-plane one of ``ops/compiled/jit_cpu.py``
    (3-4x the generic kernel's batched 1x9 matmuls on ShuffleNet)."""
    kernel, strides, dilations, _, begin, _, out_dims = geometry(
        prepacked, X, W, auto_pad, dilations, group, kernel_shape, pads, strides)
    # a call into the caller's out with nothing after it is the node's whole call: replayable
    replays = prepacked if epilogue is None and out is not None else None
    if out is None:
        out = np.empty((X.shape[0], W.shape[0]) + tuple(out_dims), dtype=X.dtype)
    if depthwise_common.suits(X, W, out, kernel):
        jit_depthwise.depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims,
                                     replays)
    else:
        phase_planes.depthwise_conv(X, W, B, out, kernel, strides, dilations, begin, out_dims)
    if epilogue is not None:
        flat = out.reshape(out.shape[0], out.shape[1], -1)
        for image in range(out.shape[0]):
            epilogue(flat[image], image, 0, flat.shape[2])
    return out


def _grouped_pointwise(X, W, group, kernel_shape, pads, strides, auto_pad, out) -> bool:
    """A grouped 1x1 convolution with stride 1 and no padding (ShuffleNet's): with no columns
    to build it is one batched matmul over the groups, straight into ``out``."""
    if int(group) < 2 or X.dtype not in (np.float32, np.float64) or W.dtype != X.dtype \
            or X.ndim < 3 or not X.flags.c_contiguous or W.shape[1] * int(group) != X.shape[1]:
        return False
    if W.ndim != X.ndim or any(k != 1 for k in W.shape[2:]) or W.shape[0] % int(group):
        return False
    if kernel_shape is not None and any(int(k) != 1 for k in kernel_shape):
        return False
    if any(int(p) for p in pads or ()) or any(int(t) != 1 for t in strides or ()):
        return False
    if out is not None and not (out.flags.c_contiguous and out.dtype == X.dtype):
        return False
    # SAME_* with a 1x1 kernel and stride 1 pads nothing; VALID and NOTSET neither (an
    # unknown name goes to the generic kernel, which reports it)
    name = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    return name in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


def _conv_grouped_pointwise(X, W, B, group, out, epilogue):
    (n, c), m = X.shape[:2], W.shape[0]
    if out is None:
        out = np.empty((n, m) + X.shape[2:], dtype=X.dtype)
    length = math.prod(X.shape[2:])
    products = out.reshape(n, group, m // group, length)
    if np.may_share_memory(out, X):
        products[...] = np.matmul(W.reshape(group, m // group, c // group),
                                  X.reshape(n, group, c // group, length))
    else:
        np.matmul(W.reshape(group, m // group, c // group),
                  X.reshape(n, group, c // group, length), out=products)
    flat = out.reshape(n, m, length)
    for image in range(n):
        if B is not None:
            flat[image] += B.reshape(m, 1)
        if epilogue is not None:
            epilogue(flat[image], image, 0, length)
    return out


def _copied(out, Y):
    np.copyto(out, Y)
    return out


# its planned call, bound once per arena (ops/compiled/bound_calls.py): the recorded replay
binds_replay(conv_cpu, lambda args, out: padded(args, 3) + (None, out), "_prepacked")
