"""Gradients of gradients: ``autograd.grad(..., create_graph=True)`` (mixrt/tape/replay.py).

Before, create_graph=True was a GradientError, so a gradient penalty (WGAN-GP), a
Hessian-vector product or a double-backward test could not be written. Each check below is
against a closed form or against central differences of the first-order gradient, in
float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import mixrt  # noqa: F401  (before NumPy's heavy use: it picks the BLAS kernels)
from mixrt import autograd, gluon, nd
from mixrt.errors import GradientError
from mixrt.ops.device import gpu_available


def _nd(value, **kwargs):
    """``nd.array`` keeping a NumPy array's dtype (these checks compute in float64);
    ``nd.array``'s own default is float32, as MXNet's."""
    return nd.array(value, dtype=getattr(value, "dtype", None), **kwargs)

X = np.array([0.3, -1.2, 2.0, 0.7])


def variable(values, ctx=None) -> nd.NDArray:
    x = _nd(np.asarray(values, dtype=np.float64), ctx=ctx) if ctx else \
        _nd(np.asarray(values, dtype=np.float64))
    x.attach_grad()
    return x


def derivatives(f, values, order: int) -> list[np.ndarray]:
    """[f', f'', ..., f^(order)] of an elementwise ``f`` at ``values``, each by differentiating
    the previous one, the last by backward()."""
    x = variable(values)
    found = []
    with autograd.record():
        current = f(x)
        for _ in range(order - 1):
            current = autograd.grad(current, [x], create_graph=True)[0]
            found.append(current.asnumpy())
    current.backward()
    return found + [x.grad.asnumpy()]


t = np.tanh(X)
s = 1 / (1 + np.exp(-X))
CLOSED_FORMS = {  # name: (f, [f', f'', f'''])
    "tanh": (nd.tanh, [1 - t**2, -2 * t * (1 - t**2), -2 * (1 - t**2) ** 2 + 4 * t**2 * (1 - t**2)]),
    "sin_times_x": (lambda x: nd.Sin(x) * x, [np.cos(X) * X + np.sin(X),
                                              2 * np.cos(X) - np.sin(X) * X,
                                              -3 * np.sin(X) - np.cos(X) * X]),
    "sigmoid": (nd.sigmoid, [s * (1 - s), s * (1 - s) * (1 - 2 * s),
                             s * (1 - s) * (1 - 6 * s + 6 * s**2)]),
    "exp_half": (lambda x: nd.exp(x * 0.5), [0.5 * np.exp(X / 2), 0.25 * np.exp(X / 2),
                                             0.125 * np.exp(X / 2)]),
    "cube": (lambda x: x**3, [3 * X**2, 6 * X, np.full_like(X, 6.0)]),
    "reciprocal": (lambda x: 1 / (x * x + 1), [-2 * X / (X**2 + 1) ** 2,
                                               (6 * X**2 - 2) / (X**2 + 1) ** 3,
                                               24 * X * (1 - X**2) / (X**2 + 1) ** 4]),
    "sqrt": (lambda x: nd.sqrt(x * x + 1), [X / np.sqrt(X**2 + 1), (X**2 + 1) ** -1.5,
                                            -3 * X * (X**2 + 1) ** -2.5]),
    "relu_square": (lambda x: nd.relu(x) * x, [2 * np.maximum(X, 0), 2.0 * (X > 0),
                                               np.zeros_like(X)]),
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_second_and_third_derivatives_match_the_closed_forms(name):
    f, expected = CLOSED_FORMS[name]
    for order, want in enumerate(expected, start=1):
        if name == "relu_square" and order == 3:
            break  # (relu x) x has no third derivative to speak of at the recorded ops
        got = derivatives(f, X, order)[-1]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12,
                                   err_msg=f"{name}: derivative {order}")


# -- a gradient penalty: d/dθ of |d f / d x|², against central differences -------------------------

def seeded_net(seed: int, scale: float, *layers):
    """A float64 HybridSequential of ``layers`` with Normal(``scale``) weights drawn after
    seeding (layers draw nothing until initialized)."""
    mixrt.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(*layers)
    net.initialize(mixrt.initializer.Normal(scale))
    net.cast("float64")
    return net


def mlp():
    return seeded_net(5, 0.7, gluon.nn.Dense(5, activation="tanh"),
                      gluon.nn.Dense(4, activation="relu"), gluon.nn.Dense(1))


def cnn():
    return seeded_net(6, 0.5, gluon.nn.Conv2D(3, kernel_size=3, padding=1, strides=2,
                                              activation="tanh"),
                      gluon.nn.Conv2D(2, kernel_size=2), gluon.nn.Flatten(), gluon.nn.Dense(1))


def pooled_cnn():
    return seeded_net(7, 0.5, gluon.nn.Conv2D(3, kernel_size=3, padding=1, activation="tanh"),
                      gluon.nn.MaxPool2D(pool_size=2, strides=2),
                      gluon.nn.Conv2D(2, kernel_size=1),
                      gluon.nn.AvgPool2D(pool_size=2, strides=1, padding=1),
                      gluon.nn.Flatten(), gluon.nn.Dense(1))


def penalty(net, data: np.ndarray):
    """|d net(x) / d x|² summed over the batch, plus the slopes' mean (a linear term), with
    its graph; returns (x, the penalty)."""
    x = variable(data)
    with autograd.record():
        scores = net(x).sum()
        slope = autograd.grad(scores, [x], create_graph=True)[0]
        total = (slope * slope).sum() + slope.mean()
    return x, total


def _penalty_number(net, data) -> float:
    """The same penalty from first-order gradients only (what central differences move)."""
    x = variable(data)
    with autograd.record():
        scores = net(x).sum()
    slope = autograd.grad(scores, [x])[0].asnumpy()
    return float((slope**2).sum() + slope.mean())


def normalized_mlp():
    return seeded_net(9, 0.6, gluon.nn.Dense(6), gluon.nn.LayerNorm(),
                      gluon.nn.Activation("tanh"), gluon.nn.Dense(4), gluon.nn.GELU(),
                      gluon.nn.Dense(1))


def generator_like():
    """ConvTranspose, BatchNorm with the batch's statistics (recording trains), an
    upsampling Resize, a cropping slice and a global max: a GAN's critic on a generator."""
    upsample = gluon.nn.HybridLambda(
        lambda F, x: nd.Resize(x, None, _nd(np.array([1, 1, 2, 2], np.float32)),
                               mode="linear")[:, :, 1:-1, 1:-1])
    return seeded_net(10, 0.5, gluon.nn.Conv2DTranspose(3, kernel_size=2, strides=2),
                      gluon.nn.BatchNorm(), gluon.nn.Activation("tanh"), upsample,
                      gluon.nn.Conv2D(2, kernel_size=3), gluon.nn.GlobalMaxPool2D(),
                      gluon.nn.Flatten(), gluon.nn.Dense(1))


def recurrent():
    """A bidirectional LSTM and a GRU (fused ONNX layers, differentiated twice through
    their unrolled expansion, ops/rnn/rnn_expansion.py)."""
    return seeded_net(11, 0.5, gluon.rnn.LSTM(3, layout="NTC", bidirectional=True),
                      gluon.rnn.GRU(2, layout="NTC"), gluon.nn.Flatten(), gluon.nn.Dense(1))


@pytest.mark.parametrize("build, shape", [(mlp, (3, 6)), (cnn, (2, 1, 6, 6)),
                                          (pooled_cnn, (2, 1, 6, 6)),
                                          (normalized_mlp, (3, 5)),
                                          (generator_like, (2, 1, 3, 3)),
                                          (recurrent, (2, 4, 2))],
                         ids=["mlp", "cnn", "cnn_with_pools", "layer_norm_mlp",
                              "generator_like", "recurrent"])
def test_a_gradient_penalty_has_the_gradient_central_differences_give(build, shape):
    net = build()
    data = np.random.default_rng(1).standard_normal(shape)
    x, total = penalty(net, data)
    total.backward()
    assert np.isclose(float(total), _penalty_number(net, data), rtol=1e-12)
    rng = np.random.default_rng(2)
    checked = 0
    for name, param in net.collect_params().items():
        if param.grad_req == "null":  # BatchNorm's running statistics
            continue
        grad = param.grad().asnumpy()
        values = param.data().asnumpy()
        for flat in rng.choice(values.size, size=min(3, values.size), replace=False):
            moved = []
            for step in (1e-6, -1e-6):
                shifted = values.copy()
                shifted.flat[flat] += step
                param.set_data(_nd(shifted))
                moved.append(_penalty_number(net, data))
            param.set_data(_nd(values))
            numeric = (moved[0] - moved[1]) / 2e-6
            assert np.isclose(grad.flat[flat], numeric, rtol=1e-5, atol=1e-7), \
                f"{name}[{flat}]: {grad.flat[flat]} vs {numeric}"
            checked += 1
    assert checked >= 12
    # and with respect to the data itself
    for flat in rng.choice(data.size, size=4, replace=False):
        moved = []
        for step in (1e-6, -1e-6):
            shifted = data.copy()
            shifted.flat[flat] += step
            moved.append(_penalty_number(net, shifted))
        numeric = (moved[0] - moved[1]) / 2e-6
        assert np.isclose(x.grad.asnumpy().flat[flat], numeric, rtol=1e-5, atol=1e-7)


def test_a_hessian_vector_product():
    rng = np.random.default_rng(3)
    a, v, values = rng.standard_normal((4, 3)), rng.standard_normal(3), rng.standard_normal(3)
    x = variable(values)
    with autograd.record():
        f = nd.tanh(nd.dot(_nd(a), x)).sum()
        g = autograd.grad(f, [x], create_graph=True)[0]
        directional = (g * _nd(v)).sum()
    directional.backward()
    z = np.tanh(a @ values)
    hessian = a.T @ np.diag(-2 * z * (1 - z**2)) @ a
    np.testing.assert_allclose(x.grad.asnumpy(), hessian @ v, rtol=1e-10)


def test_first_order_gradients_are_unchanged_and_free_the_graph():
    x = variable(X)
    with autograd.record():
        y = (nd.tanh(x) * x).sum()
    g = autograd.grad(y, [x])[0]
    assert g._entry is None  # a plain array: nothing recorded
    with pytest.raises(GradientError, match="freed"):
        autograd.grad(y, [x])


def test_create_graph_keeps_the_graph_for_another_backward():
    x = variable(X)
    with autograd.record():
        y = (nd.tanh(x) ** 2).sum()
        g = autograd.grad(y, [x], create_graph=True)[0]
    again = autograd.grad(y, [x])[0]
    np.testing.assert_allclose(again.asnumpy(), g.asnumpy(), rtol=1e-14)


# -- Hessian-vector products through the ops whose backward is a fused kernel -----------------

def _fixed(*shape, seed=8):
    return _nd(np.random.default_rng(seed).standard_normal(shape))


_INDICES = _nd(np.array([2, 0, 2, 1]))
_SCALES = _nd(np.array([1, 1, 2, 1.5], dtype=np.float32))
_THROUGH = {  # name: (f, input shape); each backward kernel's gradient or its op's expansion
    "gather": (lambda x: nd.tanh(nd.Gather(x, _INDICES, axis=0)), (3, 4)),
    "indexing": (lambda x: nd.tanh(x[1:3, ::2]) * x[0, 1], (4, 5)),
    "reflect_pad": (lambda x: nd.tanh(nd.Pad(x, _nd(np.array([1, 1, 0, 2])),
                                             mode="reflect")), (4, 5)),
    "layer_norm": (lambda x: nd.LayerNorm(x, _fixed(5), _fixed(5, seed=9)), (4, 5)),
    "instance_norm": (lambda x: nd.InstanceNormalization(x, _fixed(2), _fixed(2, seed=9)),
                      (2, 2, 5)),
    "rms_norm": (lambda x: nd.RMSNormalization(x, _fixed(5), stash_type=11), (3, 5)),
    "log_sum_exp": (lambda x: nd.ReduceLogSumExp(x, axes=[1]), (4, 5)),
    "l2_normalize": (lambda x: nd.LpNormalization(x, axis=1), (4, 5)),
    "cubic_resize": (lambda x: nd.Resize(x, None, _SCALES, mode="cubic"), (1, 1, 3, 4)),
    "top_k_cumsum": (lambda x: nd.CumSum(nd.TopK(x, _nd(np.array([2])))[0] ** 2,
                                         _nd(np.array(1))), (3, 4)),
}


def _weighted_gradient(f, values, weights, direction=None):
    """d/dx of sum(W1 f(x) + W2 f(x)^2); with ``direction``, the derivative of <that, v>
    (a Hessian-vector product) through create_graph instead."""
    x = variable(values)
    with autograd.record():
        y = f(x)
        loss = (y * _nd(weights[0])).sum() + (y * y * _nd(weights[1])).sum()
        grad = autograd.grad(loss, [x], create_graph=direction is not None)[0]
        if direction is None:
            return grad.asnumpy()
        (grad * _nd(direction)).sum().backward()
    return x.grad.asnumpy()


@pytest.mark.parametrize("name", sorted(_THROUGH))
def test_hessian_vector_products_through_fused_backward_kernels(name):
    f, shape = _THROUGH[name]
    rng = np.random.default_rng(5)
    values, direction = rng.standard_normal(shape), rng.standard_normal(shape)
    out_shape = f(_nd(values)).shape
    weights = (rng.standard_normal(out_shape), rng.standard_normal(out_shape))
    got = _weighted_gradient(f, values, weights, direction)
    step = 1e-6
    numeric = (_weighted_gradient(f, values + step * direction, weights)
               - _weighted_gradient(f, values - step * direction, weights)) / (2 * step)
    np.testing.assert_allclose(got, numeric, rtol=1e-5, atol=1e-6 * np.abs(numeric).max())


# -- what is refused, and how it says so ---------------------------------------------------------

def test_a_hybridized_block_says_how_to_differentiate_its_gradient():
    net = mlp()
    net.hybridize()
    x = variable(np.ones((2, 6)))
    with autograd.record():
        with pytest.raises(GradientError, match=r"hybridize\(False\)"):
            autograd.grad(net(x).sum(), [x], create_graph=True)


def test_a_backward_kernel_without_a_gradient_is_named_at_the_second_backward():
    # LpPool with ceil_mode is one of the ops whose backward kernel has no gradient and no
    # expansion (AveragePool does not count the overhang as padding); the recurrent layers'
    # are the others (tests/grad/test_grad_recurrent.py)
    x = variable(np.random.default_rng(4).standard_normal((1, 1, 5, 5)))
    with autograd.record():
        pooled = nd.LpPool(x, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)
        g = autograd.grad((pooled * pooled).sum(), [x], create_graph=True)[0]
        total = (g * g).sum()
    with pytest.raises(GradientError, match="LpPoolGrad"):
        total.backward()


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
def test_second_derivatives_on_the_gpu():
    x = variable(X, ctx=mixrt.gpu(0))
    with autograd.record():
        g = autograd.grad(nd.tanh(x).sum(), [x], create_graph=True)[0]
        total = g.sum()
    total.backward()
    assert x.grad.ctx == mixrt.gpu(0)
    np.testing.assert_allclose(x.grad.asnumpy(), CLOSED_FORMS["tanh"][1][1], rtol=1e-10)
