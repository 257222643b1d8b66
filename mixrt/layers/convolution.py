"""MXNet's dense and convolution layers: FullyConnected, Convolution, Deconvolution.

Each takes the front end's :class:`~mixrt.layers.call.LayerCall` class first (the front
ends bind it: ``nd.Convolution(data, weight, ...)``, ``sym.Convolution(data, ...)``).
"""

from __future__ import annotations

from mixrt.layers.call import ShapeRule


def FullyConnected(frontend, data=None, weight=None, bias=None, num_hidden=None,
                   no_bias=False, flatten=True, name=None, **unknown):
    """``data @ weight.T + bias`` with ``weight`` (num_hidden, in_units). ``flatten``
    (default) flattens the data to (batch, in_units) first; ``flatten=False`` applies to the
    last axis and keeps the others."""
    layer = frontend("FullyConnected", name, unknown)
    num_hidden = layer.count("num_hidden", num_hidden)
    no_bias, flatten = layer.flag("no_bias", no_bias), layer.flag("flatten", flatten)
    data = layer.data(data)
    if flatten:
        rows = layer.node("Flatten", [data], "flatten", axis=1)
        weight, bias = _dense_parameters(layer, weight, bias, num_hidden, no_bias, None, rows,
                                         1)
        return layer.node("Gemm", [rows, weight] + ([] if no_bias else [bias]), transB=1)
    # the node reading the data, and so the one the parameters' shapes follow
    reader = None if no_bias else "matmul"
    weight, bias = _dense_parameters(layer, weight, bias, num_hidden, no_bias, reader, data,
                                     -1)
    transposed = layer.node("Transpose", [weight], "weight_t", perm=[1, 0])
    product = layer.node("MatMul", [data, transposed], reader)
    return product if no_bias else layer.node("Add", [product, bias])


def _dense_parameters(layer, weight, bias, num_hidden, no_bias, reader, rows, in_axis):
    weight = layer.parameter("weight", weight, shape=(num_hidden, None), rule=ShapeRule(
        reader, rows, (num_hidden, ["axis", in_axis])))
    return weight, _bias(layer, bias, no_bias, num_hidden, reader, rows)


def _bias(layer, bias, no_bias: bool, size: int, reader, of):
    """The bias parameter, or None with ``no_bias``; a bias given with ``no_bias=True`` is
    refused, as MXNet does (``Deconvolution``'s ``no_bias`` is True by default)."""
    if no_bias:
        if bias is not None:
            raise layer.error("bias was given but no_bias=True; pass no_bias=False to use it")
        return None
    return layer.parameter("bias", bias, shape=(size,), rule=ShapeRule(reader, of, (size,)))


def _window(layer, kernel, stride, dilate, pad) -> dict:
    spatial = len(kernel)
    stride = layer.shape("stride", stride, length=spatial, default=1, minimum=1)
    dilate = layer.shape("dilate", dilate, length=spatial, default=1, minimum=1)
    pad = layer.shape("pad", pad, length=spatial, default=0)
    return {"kernel_shape": list(kernel), "strides": list(stride), "dilations": list(dilate),
            "pads": list(pad) * 2}


def _filters(layer, num_filter, num_group) -> tuple[int, int]:
    """Convolution's and Deconvolution's num_filter and num_group: counts, one a multiple
    of the other."""
    num_filter = layer.count("num_filter", num_filter)
    num_group = layer.count("num_group", num_group)
    if num_filter % num_group:
        raise layer.error(f"num_filter={num_filter} is not a multiple of "
                          f"num_group={num_group}")
    return num_filter, num_group


def _filter_arguments(layer, num_filter, num_group, no_bias, layout, kernel, data) -> tuple:
    """What Convolution and Deconvolution read alike: the filter counts, ``no_bias``, the
    layout, and the data with its spatial shape where known (None otherwise)."""
    num_filter, num_group = _filters(layer, num_filter, num_group)
    no_bias = layer.flag("no_bias", no_bias)
    layer.layout(layout, len(kernel))
    data = layer.data(data)
    sizes = layer.spatial_data(data, len(kernel))
    _check_channels(layer, data, num_group)
    return num_filter, num_group, no_bias, data, sizes


def _check_channels(layer, data, num_group: int) -> None:
    shape = layer.known_shape(data)
    if shape is not None and shape[1] % num_group:
        raise layer.error(f"num_group={num_group} must divide the data's channels "
                          f"({shape[1]})")


def Convolution(frontend, data=None, weight=None, bias=None, kernel=None, stride=(),
                dilate=(), pad=(), num_filter=None, num_group=1, no_bias=False, layout=None,
                name=None, **unknown):
    """1-, 2- or 3-d convolution over channels-first data; ``weight`` is
    (num_filter, channels / num_group, *kernel); ``stride`` and ``dilate`` default to 1,
    ``pad`` (both sides of each axis) to 0. ``workspace``, ``cudnn_tune`` and ``cudnn_off``
    are accepted and ignored."""
    layer = frontend("Convolution", name, unknown)
    kernel = layer.kernel(kernel)
    window = _window(layer, kernel, stride, dilate, pad)
    num_filter, num_group, no_bias, data, sizes = _filter_arguments(
        layer, num_filter, num_group, no_bias, layout, kernel, data)
    if sizes is not None:
        _check_fits(layer, sizes, kernel, window)
    weight_dims = (num_filter, ["axis", 1, num_group], *kernel)
    return _filtered(layer, "Conv", data, weight, bias, weight_dims, num_filter, no_bias,
                     group=num_group, **window)


def _check_fits(layer, sizes, kernel, window) -> None:
    pads, dilate = window["pads"], window["dilations"]
    for size, k, d, p in zip(sizes, kernel, dilate, pads):
        if d * (k - 1) + 1 > size + 2 * p:
            raise layer.error(f"kernel={kernel} (dilate={tuple(dilate)}) is larger than the "
                              f"padded data {tuple(sizes)} (pad={tuple(pads[:len(kernel)])})")


def Deconvolution(frontend, data=None, weight=None, bias=None, kernel=None, stride=(),
                  dilate=(), pad=(), adj=(), target_shape=(), num_filter=None, num_group=1,
                  no_bias=True, layout=None, name=None, **unknown):
    """Transposed convolution (ONNX's ``ConvTranspose``); ``weight`` is
    (channels, num_filter / num_group, *kernel). Each output axis is ``(size - 1) * stride
    - 2 * pad + dilate * (kernel - 1) + 1 + adj``. ``target_shape`` (the output's spatial
    shape) replaces ``pad`` and ``adj`` as MXNet does: the surplus is split
    ``pad = ceil(surplus / 2)`` in front, the rest behind. As in MXNet, ``no_bias``
    defaults to True: no bias unless ``no_bias=False``."""
    layer = frontend("Deconvolution", name, unknown)
    kernel = layer.kernel(kernel)
    window = _window(layer, kernel, stride, dilate, pad)
    adj = layer.shape("adj", adj, length=len(kernel), default=0)
    if any(a >= s for a, s in zip(adj, window["strides"])):
        raise layer.error(f"adj={adj} must be smaller than stride={tuple(window['strides'])}"
                          f" on every axis")
    num_filter, num_group, no_bias, data, sizes = _filter_arguments(
        layer, num_filter, num_group, no_bias, layout, kernel, data)
    if target_shape:
        # ONNX's output_shape splits the surplus as MXNet does (the larger half in front)
        window["output_shape"] = list(layer.shape("target_shape", target_shape,
                                                  length=len(kernel), minimum=1))
        del window["pads"]
    elif any(adj):
        window["output_padding"] = list(adj)
    if sizes is not None:
        _check_deconvolution_output(layer, sizes, kernel, window, adj)
    weight_dims = (["axis", 1], num_filter // num_group, *kernel)
    return _filtered(layer, "ConvTranspose", data, weight, bias, weight_dims, num_filter,
                     no_bias, group=num_group, **window)


def _filtered(layer, op_type, data, weight, bias, weight_dims, num_filter, no_bias,
              **attributes):
    """The layer's one node over the data, its weight (of ``weight_dims``, as a
    ``ShapeRule`` reads them) and its bias."""
    known = tuple(d if isinstance(d, int) else None for d in weight_dims)
    weight = layer.parameter("weight", weight, shape=known,
                             rule=ShapeRule(None, data, weight_dims))
    bias = _bias(layer, bias, no_bias, num_filter, None, data)
    inputs = [data, weight] + ([] if no_bias else [bias])
    return layer.node(op_type, inputs, **attributes)


def _check_deconvolution_output(layer, sizes, kernel, window, adj) -> None:
    strides, dilate = window["strides"], window["dilations"]
    largest = [(size - 1) * s + d * (k - 1) + 1
               for size, k, s, d in zip(sizes, kernel, strides, dilate)]
    if "output_shape" in window:
        target = window["output_shape"]
        if any(t > most for t, most in zip(target, largest)):
            raise layer.error(f"target_shape={tuple(target)} is larger than the largest "
                              f"output this kernel and stride make, {tuple(largest)}")
        return
    pads = window["pads"]
    if any(most + a - 2 * p < 1 for most, a, p in zip(largest, adj, pads)):
        raise layer.error(f"pad={tuple(pads[:len(kernel)])} leaves no output for data "
                          f"{tuple(sizes)}")
