"""Gradients of the remaining elementwise ops and activations (elementwise.py,
activation.py): the trigonometric family and Erf, the step functions, Max/Min, Clip and the
activations beyond Relu/Sigmoid/Tanh. Where an activation's derivative is cheaper to read
from its output than to recompute (Elu, Selu, Celu, Tan), it is.

At a kink the one-sided choice follows PyTorch: the branch taken by the forward's own
comparison (LeakyRelu's and Elu's x >= 0, Selu's x > 0, HardSwish inclusive of +-3). Ties
in Max/Min split the gradient equally between the tied inputs (PyTorch's torch.maximum
rule); Clip passes the gradient where min <= x <= max, bounds included.
See runtime/passes/autodiff.py for the calling convention.
"""

from __future__ import annotations

import inspect
import math

from mixrt.ops.elementwise import activation as act
from mixrt.ops.elementwise import elementwise as ew


def _const(b, value: float, like: str) -> str:
    return b.constant(value, like=like)


def _times(b, grad: str, factor: str) -> list[str]:
    return [b.mul(grad, factor)]


def _square(b, x: str) -> str:
    return b.mul(x, x)


def _attribute(node, forward, name: str) -> float:
    """The node's attribute, else the default in the forward kernel's signature (the one
    place ONNX's defaults are written down)."""
    if name in node.attributes:
        return float(node.attributes[name])
    return float(inspect.signature(forward.fn).parameters[name].default)


# -- trigonometric and hyperbolic functions, Erf ----------------------------------------------

@ew.sin.grad
def _(b, node, dy):
    return _times(b, dy[0], b.emit("Cos", node.inputs[0]))


@ew.cos.grad
def _(b, node, dy):
    return _times(b, dy[0], b.neg(b.emit("Sin", node.inputs[0])))


@ew.tan.grad
def _(b, node, dy):
    """d tan = (1 + tan^2) dx, from the output."""
    y = node.outputs[0]
    return _times(b, dy[0], b.emit("Add", _const(b, 1.0, y), _square(b, y)))


def _over_sqrt(b, grad: str, radicand: str) -> str:
    return b.emit("Div", grad, b.emit("Sqrt", radicand))


@ew.asin.grad
def _(b, node, dy):
    """d asin = dx / sqrt(1 - x^2)."""
    x = node.inputs[0]
    return [_over_sqrt(b, dy[0], b.emit("Sub", _const(b, 1.0, x), _square(b, x)))]


@ew.acos.grad
def _(b, node, dy):
    """d acos = -dx / sqrt(1 - x^2)."""
    x = node.inputs[0]
    return [_over_sqrt(b, b.neg(dy[0]), b.emit("Sub", _const(b, 1.0, x), _square(b, x)))]


@ew.atan.grad
def _(b, node, dy):
    """d atan = dx / (1 + x^2)."""
    x = node.inputs[0]
    return [b.emit("Div", dy[0], b.emit("Add", _const(b, 1.0, x), _square(b, x)))]


@ew.sinh.grad
def _(b, node, dy):
    return _times(b, dy[0], b.emit("Cosh", node.inputs[0]))


@ew.cosh.grad
def _(b, node, dy):
    return _times(b, dy[0], b.emit("Sinh", node.inputs[0]))


@ew.asinh.grad
def _(b, node, dy):
    """d asinh = dx / sqrt(x^2 + 1)."""
    x = node.inputs[0]
    return [_over_sqrt(b, dy[0], b.emit("Add", _square(b, x), _const(b, 1.0, x)))]


@ew.acosh.grad
def _(b, node, dy):
    """d acosh = dx / sqrt(x^2 - 1)."""
    x = node.inputs[0]
    return [_over_sqrt(b, dy[0], b.emit("Sub", _square(b, x), _const(b, 1.0, x)))]


@ew.atanh.grad
def _(b, node, dy):
    """d atanh = dx / (1 - x^2)."""
    x = node.inputs[0]
    return [b.emit("Div", dy[0], b.emit("Sub", _const(b, 1.0, x), _square(b, x)))]


def _scaled_gaussian(b, x: str, scale: float) -> str:
    """scale * exp(-x^2)."""
    return b.mul(_const(b, scale, x), b.emit("Exp", b.neg(_square(b, x))))


@ew.erf.grad
def _(b, node, dy):
    """d erf = 2 / sqrt(pi) exp(-x^2) dx."""
    return _times(b, dy[0], _scaled_gaussian(b, node.inputs[0], 2 / math.sqrt(math.pi)))


# -- step functions ---------------------------------------------------------------------------

def _no_gradient(b, node, dy):
    """Piecewise constant: the derivative is 0 wherever it exists, so nothing flows back
    (autodiff gives an input reached only through them a zero gradient)."""
    return [None]


for _step in (ew.floor, ew.ceil, ew.round_, ew.sign):
    _step.grad(_no_gradient)


# -- Max, Min, Clip ---------------------------------------------------------------------------

def _extreme_grad(b, node, dy):
    """Each input gets dY where it equals the result, split equally among tied inputs."""
    y = node.outputs[0]
    if len(node.inputs) == 1:
        return [dy[0]]
    hits = [b.emit("CastLike", b.emit("Equal", x, y), y) for x in node.inputs]
    share = b.emit("Div", dy[0], b.emit("Sum", *hits))
    return [b.sum_to(b.mul(share, hit), x) if b.differentiable(x) else None
            for x, hit in zip(node.inputs, hits)]


ew.max_.grad(_extreme_grad)
ew.min_.grad(_extreme_grad)


def _clip_grad(b, node, dy):
    """dY where the output is the input itself (min <= x <= max), 0 where it was clipped;
    this holds for the attribute and the input conventions alike. The bounds get none."""
    x, y = node.inputs[0], node.outputs[0]
    kept = b.emit("Equal", x, y)
    return [b.emit("Where", kept, dy[0], _const(b, 0.0, dy[0])), None, None]


ew.clip.grad(_clip_grad)
ew.clip_6.grad(_clip_grad)


# -- piecewise-linear activations -------------------------------------------------------------

def _where(b, condition: str, then: str, otherwise: str) -> str:
    return b.emit("Where", condition, then, otherwise)


@act.leaky_relu.grad
def _(b, node, dy):
    x = node.inputs[0]
    slope = b.mul(dy[0], _const(b, _attribute(node, act.leaky_relu, "alpha"), x))
    return [_where(b, b.emit("GreaterOrEqual", x, _const(b, 0.0, x)), dy[0], slope)]


@act.prelu.grad
def _(b, node, dy):
    """dX = dY (x >= 0) or dY slope (x < 0); dSlope = dY x over the negative x, summed
    over the axes the slope was broadcast along."""
    x, slope = node.inputs
    negative = b.emit("Less", x, _const(b, 0.0, x))
    zero = _const(b, 0.0, x)
    d_x = _where(b, negative, b.mul(dy[0], slope), dy[0])
    d_slope = b.sum_to(_where(b, negative, b.mul(dy[0], x), zero), slope)
    return [d_x, d_slope]


@act.thresholded_relu.grad
def _(b, node, dy):
    x = node.inputs[0]
    alpha = _attribute(node, act.thresholded_relu, "alpha")
    above = b.emit("Greater", x, _const(b, alpha, x))
    return [_where(b, above, dy[0], _const(b, 0.0, x))]


@act.shrink.grad
def _(b, node, dy):
    """Shrink moves |x| > lambd by a constant and zeroes the rest."""
    x = node.inputs[0]
    lambd = _attribute(node, act.shrink, "lambd")
    moved = b.emit("Greater", b.emit("Abs", x), _const(b, lambd, x))
    return [_where(b, moved, dy[0], _const(b, 0.0, x))]


@act.hard_sigmoid.grad
def _(b, node, dy):
    """alpha where 0 < alpha x + beta < 1, read from the output; 0 where it saturated."""
    y = node.outputs[0]
    inside = b.emit("And", b.emit("Greater", y, _const(b, 0.0, y)),
                    b.emit("Less", y, _const(b, 1.0, y)))
    scaled = b.mul(dy[0], _const(b, _attribute(node, act.hard_sigmoid, "alpha"), y))
    return [_where(b, inside, scaled, _const(b, 0.0, y))]


@act.hard_swish.grad
def _(b, node, dy):
    """0 below -3, 1 above 3, x / 3 + 1 / 2 in between."""
    x = node.inputs[0]
    ramp = b.emit("Add", b.mul(x, _const(b, 1 / 3, x)), _const(b, 0.5, x))
    inner = _where(b, b.emit("Greater", x, _const(b, 3.0, x)), dy[0], b.mul(dy[0], ramp))
    return [_where(b, b.emit("Less", x, _const(b, -3.0, x)), _const(b, 0.0, x), inner)]


# -- exponential activations (derivatives read from the output) ---------------------------

@act.elu.grad
def _(b, node, dy):
    """1 for x >= 0, alpha e^x = y + alpha below."""
    x, y = node.inputs[0], node.outputs[0]
    alpha = _const(b, _attribute(node, act.elu, "alpha"), y)
    below = b.mul(dy[0], b.emit("Add", y, alpha))
    return [_where(b, b.emit("GreaterOrEqual", x, _const(b, 0.0, x)), dy[0], below)]


@act.selu.grad
def _(b, node, dy):
    """gamma for x > 0, gamma alpha e^x = y + gamma alpha below."""
    x, y = node.inputs[0], node.outputs[0]
    alpha = _attribute(node, act.selu, "alpha")
    gamma = _attribute(node, act.selu, "gamma")
    above = b.mul(dy[0], _const(b, gamma, y))
    below = b.mul(dy[0], b.emit("Add", y, _const(b, gamma * alpha, y)))
    return [_where(b, b.emit("Greater", x, _const(b, 0.0, x)), above, below)]


@act.celu.grad
def _(b, node, dy):
    """1 for x > 0, e^(x/alpha) = y / alpha + 1 below."""
    x, y = node.inputs[0], node.outputs[0]
    alpha = _attribute(node, act.celu, "alpha")
    below = b.mul(dy[0], b.emit("Add", b.mul(y, _const(b, 1 / alpha, y)), _const(b, 1.0, y)))
    return [_where(b, b.emit("Greater", x, _const(b, 0.0, x)), dy[0], below)]


# -- smooth activations -----------------------------------------------------------------------

@act.softplus.grad
def _(b, node, dy):
    """d log(1 + e^x) = sigmoid(x) dx."""
    return _times(b, dy[0], b.emit("Sigmoid", node.inputs[0]))


@act.softsign.grad
def _(b, node, dy):
    """d x / (1 + |x|) = dx / (1 + |x|)^2."""
    x = node.inputs[0]
    denominator = b.emit("Add", _const(b, 1.0, x), b.emit("Abs", x))
    return [b.emit("Div", dy[0], _square(b, denominator))]


@act.gelu.grad
def _(b, node, dy):
    x = node.inputs[0]
    if node.attributes.get("approximate", "none") == "tanh":
        return _times(b, dy[0], _gelu_tanh_derivative(b, x))
    return _times(b, dy[0], _gelu_derivative(b, x))


def _gelu_derivative(b, x: str) -> str:
    """d x Phi(x) = Phi(x) + x phi(x), with z = x / sqrt 2: Phi(x) = (1 + erf(z)) / 2 and
    phi(x) = exp(-z^2) / sqrt(2 pi)."""
    z = b.mul(x, _const(b, 1 / math.sqrt(2), x))
    cdf = b.mul(_const(b, 0.5, x), b.emit("Add", _const(b, 1.0, x), b.emit("Erf", z)))
    density = _scaled_gaussian(b, z, 1 / math.sqrt(2 * math.pi))
    return b.emit("Add", cdf, b.mul(x, density))


def _gelu_tanh_derivative(b, x: str) -> str:
    """y = x (1 + t) / 2 with t = tanh(u), u = c (x + k x^3):
    dy/dx = (1 + t) / 2 + x (1 - t^2) c (1 + 3 k x^2) / 2."""
    c, k = math.sqrt(2 / math.pi), 0.044715
    x_squared = _square(b, x)
    inner = b.mul(_const(b, c, x), b.mul(x, b.emit("Add", _const(b, 1.0, x),
                                                   b.mul(_const(b, k, x), x_squared))))
    t = b.emit("Tanh", inner)
    one = _const(b, 1.0, x)
    du = b.mul(_const(b, c, x), b.emit("Add", one, b.mul(_const(b, 3 * k, x), x_squared)))
    slope = b.mul(b.mul(x, b.emit("Sub", one, _square(b, t))), du)
    return b.mul(_const(b, 0.5, x), b.emit("Add", b.emit("Add", one, t), slope))


@act.swish.grad
def _(b, node, dy):
    """d x s(a x) = s + a x s (1 - s), s = sigmoid(a x)."""
    x = node.inputs[0]
    alpha = _const(b, _attribute(node, act.swish, "alpha"), x)
    s = b.emit("Sigmoid", b.mul(alpha, x))
    one_minus = b.emit("Sub", _const(b, 1.0, x), s)
    return _times(b, dy[0], b.emit("Add", s, b.mul(b.mul(alpha, x), b.mul(s, one_minus))))


@act.mish.grad
def _(b, node, dy):
    """d x tanh(softplus(x)) = t + x (1 - t^2) sigmoid(x), t = tanh(softplus(x))."""
    x = node.inputs[0]
    t = b.emit("Tanh", b.emit("Softplus", x))
    one_minus = b.emit("Sub", _const(b, 1.0, x), _square(b, t))
    return _times(b, dy[0], b.emit("Add", t, b.mul(x, b.mul(one_minus, b.emit("Sigmoid", x)))))
