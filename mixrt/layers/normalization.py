"""MXNet's ``BatchNorm``."""

from __future__ import annotations

from mixrt.layers.call import ShapeRule

_BOOL = 9  # onnx.TensorProto.BOOL


def BatchNorm(frontend, data=None, gamma=None, beta=None, moving_mean=None, moving_var=None,
              eps=1e-3, momentum=0.9, fix_gamma=True, use_global_stats=False,
              output_mean_var=False, axis=1, min_calib_range=None, max_calib_range=None,
              name=None, **unknown):
    """Batch normalization over channel ``axis``. In training (``autograd.record()`` or
    ``train_mode()`` on NDArrays; ``is_train``/fit for a symbol) it normalizes by the
    batch's mean and (biased) variance and updates the running statistics
    (``moving_mean``, ``moving_var``: ``moving = momentum * moving + (1 - momentum) *
    batch``), otherwise it uses them. ``fix_gamma`` (MXNet's default) scales by 1 and gives
    ``gamma`` a zero gradient; ``use_global_stats`` uses the running statistics in training
    too and leaves them as they are. ``output_mean_var=True`` (NDArrays only) returns
    ``[out, mean, 1 / sqrt(var + eps)]``, MXNet's values (its third is the inverse standard
    deviation, not the variance its documentation names). ``cudnn_off`` and the
    calibration ranges are accepted and ignored."""
    layer = frontend("BatchNorm", name, unknown)
    eps = layer.number("eps", eps, positive=True)
    momentum = layer.number("momentum", momentum)
    fix_gamma = layer.flag("fix_gamma", fix_gamma)
    use_global_stats = layer.flag("use_global_stats", use_global_stats)
    output_mean_var = layer.flag("output_mean_var", output_mean_var)
    axis = layer.integer("axis", axis)
    data = layer.data(data)
    axis = _checked_axis(layer, data, axis)
    plain = axis == 1 and not use_global_stats  # ONNX's BatchNormalization as it is
    x = data if plain else _channels_in_middle(layer, data, axis)
    # MXNet keeps a BatchNorm's parameters float32 for float16 data
    rule = ShapeRule(None if plain else "channels_middle", data, (["axis", axis],),
                     min_float_bits=32)
    gamma = layer.parameter("gamma", gamma, rule=rule)
    beta = layer.parameter("beta", beta, rule=rule)
    mean = layer.parameter("moving_mean", moving_mean, rule=rule, aux=True)
    var = layer.parameter("moving_var", moving_var, rule=rule, aux=True)
    scale = _fixed_ones(layer, gamma) if fix_gamma else gamma
    if use_global_stats:
        normalized = _normalized_by(layer, x, scale, beta, mean, var, eps)
        extra = _given_statistics(layer, mean, var, eps) if output_mean_var else []
    else:
        normalized, extra = layer.batch_normalization(
            x, scale, beta, mean, var, eps, momentum, output_mean_var,
            role=None if plain else "norm")
    out = normalized if plain else layer.node("Reshape", [normalized, layer.node(
        "Shape", [data], "shape")])
    return [out, *extra] if output_mean_var else out


def _checked_axis(layer, data, axis: int) -> int:
    shape = layer.known_shape(data)
    if shape is None:
        return axis
    if len(shape) < 2:
        raise layer.error(f"data must have at least 2 dimensions (batch, channel, ...), got "
                          f"shape {shape}")
    if not -len(shape) <= axis < len(shape):
        raise layer.error(f"axis={axis} is out of range for data of {len(shape)} "
                          f"dimensions")
    return axis % len(shape)


def _fixed_ones(layer, gamma):
    """Ones in gamma's place whose gradient to gamma is 0 (so a gradient buffer of gamma is
    written with zeros, as MXNet's ``fix_gamma`` does, rather than left as it was)."""
    always = layer.node("Cast", [layer.ints([1])], "always", to=_BOOL)
    return layer.node("Where", [always, layer.scalar(1.0, gamma, "one"), gamma],
                      "gamma_fixed")


def _channels_in_middle(layer, data, axis: int):
    """The data as (before, channels, after), computed from its shape (its rank may not be
    known here)."""
    before = layer.node("ReduceProd", [layer.node("Shape", [data], "shape_before", end=axis)],
                        "before", keepdims=1)
    channels = layer.node("Shape", [data], "shape_channels", start=axis,
                          **({} if axis == -1 else {"end": axis + 1}))
    target = layer.node("Concat", [before, channels, layer.ints([-1])], "middle_shape",
                        axis=0)
    return layer.node("Reshape", [data, target], "channels_middle")


def _column(layer, value, role):
    return layer.node("Reshape", [value, layer.ints([-1, 1])], f"{role}_column")


def _normalized_by(layer, middle, scale, beta, mean, var, eps):
    """(x - mean) / sqrt(var + eps) * scale + beta with the given statistics, on data
    shaped (before, channels, after)."""
    centered = layer.node("Sub", [middle, _column(layer, mean, "mean")], "centered")
    spread = layer.node("Sqrt", [layer.node("Add", [_column(layer, var, "var"), layer.scalar(
        eps, var, "eps")], "var_eps")], "std")
    scaled = layer.node("Mul", [layer.node("Div", [centered, spread], "standard"),
                                _column(layer, scale, "scale")], "scaled")
    return layer.node("Add", [scaled, _column(layer, beta, "beta")], "norm")


def _given_statistics(layer, mean, var, eps) -> list:
    """``output_mean_var``'s outputs from the running statistics: a copy of the mean and
    ``1 / sqrt(var + eps)``."""
    std = layer.node("Sqrt", [layer.node("Add", [var, layer.scalar(eps, var, "eps_out")],
                                         "var_eps_out")], "std_out")
    return [layer.node("Identity", [mean], "mean_out"),
            layer.node("Reciprocal", [std], "inverse_std")]
