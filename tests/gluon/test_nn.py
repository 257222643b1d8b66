"""mixrt.gluon.nn: every layer against PyTorch with the same weights, imperative and
hybridized runs agreeing on outputs and parameter gradients, BatchNorm's running statistics,
Dropout, deferred shapes, MXNet's names and errors, and export to onnxruntime."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, initializer, nd
from mixrt.errors import InputError
from mixrt.gluon import nn

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


def rand(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def run(net, x, head):
    """Output, input gradient and parameter gradients of ``sum(net(x) * head)``."""
    x = nd.array(x)
    x.attach_grad()
    with autograd.record():
        out = net(x)
        loss = (out * nd.array(head)).sum()
    loss.backward()
    grads = {_role(net, name): p.grad().asnumpy().copy()
             for name, p in net.collect_params().items() if p.grad_req != "null"}
    return out.asnumpy(), x.grad.asnumpy().copy(), grads


def run_both(net, x, head=None):
    """``run`` imperatively and hybridized; asserts they agree and returns the first."""
    if head is None:
        with autograd.pause():
            head = rand(*net(nd.array(x)).shape)
    net.hybridize(False)
    imperative = run(net, x, head)
    net.hybridize()
    hybridized = run(net, x, head)
    assert net._cached, "the hybridized run did not go through the traced graph"
    np.testing.assert_allclose(hybridized[0], imperative[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(hybridized[1], imperative[1], rtol=1e-5, atol=1e-6)
    assert hybridized[2].keys() == imperative[2].keys()
    for name, grad in imperative[2].items():
        np.testing.assert_allclose(hybridized[2][name], grad, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    return imperative, head


def _role(net, name):
    return name[len(net.prefix):]


def torch_run(module, x, head):
    xt = torch.tensor(x, requires_grad=True)
    out = module(xt)
    (out * torch.tensor(head)).sum().backward()
    grads = {n: p.grad.numpy() for n, p in module.named_parameters() if p.grad is not None}
    return out.detach().numpy(), xt.grad.numpy(), grads


def copy_to_torch(net, module, names):
    """Our parameter values into ``module``'s, ``names``: ours -> torch's."""
    params = {_role(net, n): p for n, p in net.collect_params().items()}
    with torch.no_grad():
        for ours, theirs in names.items():
            module.get_parameter(theirs).copy_(torch.tensor(params[ours].data().asnumpy()))


WEIGHTS = {"weight": "weight", "bias": "bias"}

# (our layer, torch module, input shape, our parameter -> torch's)
CASES = {
    "dense": (lambda: nn.Dense(5), lambda: torch.nn.Linear(7, 5), (4, 7), WEIGHTS),
    "dense_flatten": (lambda: nn.Dense(3, use_bias=False),
                      lambda: torch.nn.Sequential(torch.nn.Flatten(),
                                                  torch.nn.Linear(12, 3, bias=False)),
                      (2, 3, 4), {"weight": "1.weight"}),
    "dense_no_flatten": (lambda: nn.Dense(4, flatten=False, in_units=6),
                         lambda: torch.nn.Linear(6, 4), (2, 3, 6), WEIGHTS),
    "dense_tanh": (lambda: nn.Dense(4, activation="tanh"),
                   lambda: torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh()),
                   (5, 3), {"weight": "0.weight", "bias": "0.bias"}),
    "conv1d": (lambda: nn.Conv1D(4, 3, strides=2, padding=1),
               lambda: torch.nn.Conv1d(2, 4, 3, stride=2, padding=1), (2, 2, 9), WEIGHTS),
    "conv2d": (lambda: nn.Conv2D(6, (3, 2), strides=(2, 1), padding=(1, 0), dilation=(1, 2),
                                 groups=2),
               lambda: torch.nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0),
                                       dilation=(1, 2), groups=2), (2, 4, 7, 8), WEIGHTS),
    "conv2d_relu": (lambda: nn.Conv2D(3, 3, padding=1, activation="relu", in_channels=2),
                    lambda: torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3, padding=1),
                                                torch.nn.ReLU()), (1, 2, 5, 5),
                    {"weight": "0.weight", "bias": "0.bias"}),
    "conv3d": (lambda: nn.Conv3D(2, 2), lambda: torch.nn.Conv3d(3, 2, 2), (1, 3, 3, 4, 4),
               WEIGHTS),
    "conv2d_transpose": (lambda: nn.Conv2DTranspose(4, 3, strides=2, padding=1,
                                                    output_padding=1),
                         lambda: torch.nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1,
                                                          output_padding=1), (2, 3, 4, 5),
                         WEIGHTS),
    "conv1d_transpose_groups": (lambda: nn.Conv1DTranspose(4, 2, strides=2, groups=2),
                                lambda: torch.nn.ConvTranspose1d(2, 4, 2, stride=2, groups=2),
                                (2, 2, 5), WEIGHTS),
    "layernorm": (lambda: nn.LayerNorm(), lambda: torch.nn.LayerNorm(6), (3, 4, 6),
                  {"gamma": "weight", "beta": "bias"}),
    "maxpool1d": (lambda: nn.MaxPool1D(), lambda: torch.nn.MaxPool1d(2), (2, 3, 9), {}),
    "maxpool2d_ceil": (lambda: nn.MaxPool2D(3, 2, 1, ceil_mode=True),
                       lambda: torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 2, 8, 7), {}),
    "avgpool2d": (lambda: nn.AvgPool2D(3, 2, 1),
                  lambda: torch.nn.AvgPool2d(3, 2, 1), (2, 2, 7, 6), {}),
    "avgpool2d_exclude_pad": (lambda: nn.AvgPool2D(2, 1, 1, count_include_pad=False),
                              lambda: torch.nn.AvgPool2d(2, 1, 1, count_include_pad=False),
                              (1, 2, 4, 5), {}),
    "avgpool1d": (lambda: nn.AvgPool1D(3), lambda: torch.nn.AvgPool1d(3), (2, 2, 9), {}),
    "global_avg": (lambda: nn.GlobalAvgPool2D(), lambda: torch.nn.AdaptiveAvgPool2d(1),
                   (2, 3, 4, 5), {}),
    "global_max": (lambda: nn.GlobalMaxPool2D(), lambda: torch.nn.AdaptiveMaxPool2d(1),
                   (2, 3, 4, 5), {}),
    "flatten": (lambda: nn.Flatten(), lambda: torch.nn.Flatten(), (2, 3, 4), {}),
    "relu": (lambda: nn.Activation("relu"), lambda: torch.nn.ReLU(), (3, 5), {}),
    "sigmoid": (lambda: nn.Activation("sigmoid"), lambda: torch.nn.Sigmoid(), (3, 5), {}),
    "tanh": (lambda: nn.Activation("tanh"), lambda: torch.nn.Tanh(), (3, 5), {}),
    "softrelu": (lambda: nn.Activation("softrelu"), lambda: torch.nn.Softplus(), (3, 5), {}),
    "softsign": (lambda: nn.Activation("softsign"), lambda: torch.nn.Softsign(), (3, 5), {}),
    "leaky_relu": (lambda: nn.LeakyReLU(0.1), lambda: torch.nn.LeakyReLU(0.1), (3, 5), {}),
    "prelu": (lambda: nn.PReLU(), lambda: torch.nn.PReLU(), (3, 5), {"alpha": "weight"}),
    "prelu_channels": (lambda: nn.PReLU(in_channels=3), lambda: torch.nn.PReLU(3),
                       (2, 3, 4, 4), {"alpha": "weight"}),
    "elu": (lambda: nn.ELU(0.5), lambda: torch.nn.ELU(0.5), (3, 5), {}),
    "selu": (lambda: nn.SELU(), lambda: torch.nn.SELU(), (3, 5), {}),
    "gelu": (lambda: nn.GELU(), lambda: torch.nn.GELU(), (3, 5), {}),
    "gelu_tanh": (lambda: nn.GELU("tanh"), lambda: torch.nn.GELU("tanh"), (3, 5), {}),
    "swish": (lambda: nn.Swish(), lambda: torch.nn.SiLU(), (3, 5), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_torch_in_both_modes(case):
    make, make_torch, shape, names = CASES[case]
    net, module = make(), make_torch()
    net.initialize(initializer.Uniform(0.5))
    x = rand(*shape)
    (out, dx, grads), head = run_both(net, x)
    copy_to_torch(net, module, names)
    t_out, t_dx, t_grads = torch_run(module, x, head)
    np.testing.assert_allclose(out, t_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dx, t_dx, rtol=1e-4, atol=1e-5)
    assert set(grads) == set(names)
    for ours, theirs in names.items():
        np.testing.assert_allclose(grads[ours], t_grads[theirs], rtol=1e-4, atol=1e-5,
                                   err_msg=ours)


def test_embedding_matches_torch_in_both_modes():
    net, module = nn.Embedding(10, 4), torch.nn.Embedding(10, 4)
    net.initialize()
    copy_to_torch(net, module, {"weight": "weight"})
    indices = np.array([[1, 2, 9], [3, 1, 1]], dtype=np.float32)  # MXNet feeds floats
    head = rand(2, 3, 4)
    for hybrid in (False, True):
        net.hybridize(hybrid)
        x = nd.array(indices)
        with autograd.record():
            loss = (net(x) * nd.array(head)).sum()
        loss.backward()
        out = net(x).asnumpy()
        t_out = module(torch.tensor(indices, dtype=torch.int64))
        module.zero_grad()
        (t_out * torch.tensor(head)).sum().backward()
        np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(net.weight.grad().asnumpy(), module.weight.grad.numpy(),
                                   rtol=1e-6)


# -- BatchNorm -------------------------------------------------------------------------------

def _fresh_batchnorm(**options):
    net = nn.BatchNorm(**options)
    net.initialize()
    net(nd.array(rand(2, 3, 4, 4)))  # settles the deferred channel count
    net.gamma.set_data(rand(3) + 1)
    net.beta.set_data(rand(3))
    return net


@pytest.mark.parametrize("hybrid", [False, True])
def test_batchnorm_training_matches_torch(hybrid):
    net = _fresh_batchnorm(momentum=0.8)
    net.hybridize(hybrid)
    module = torch.nn.BatchNorm2d(3, momentum=0.2, eps=1e-5)  # torch: 1 - MXNet's momentum
    copy_to_torch(net, module, {"gamma": "weight", "beta": "bias"})
    x = rand(4, 3, 5, 5, scale=2.0) + 1.0
    head = rand(*x.shape)
    with autograd.record():
        out = net(nd.array(x))
        (out * nd.array(head)).sum().backward()
    t_out, _, t_grads = torch_run(module, x, head)
    np.testing.assert_allclose(out.asnumpy(), t_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(net.gamma.grad().asnumpy(), t_grads["weight"], rtol=1e-4)
    np.testing.assert_allclose(net.beta.grad().asnumpy(), t_grads["bias"], rtol=1e-4)
    np.testing.assert_allclose(net.running_mean.data().asnumpy(),
                               module.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    # the ONNX kernel updates with the population variance (torch: the unbiased one)
    expected_var = 0.8 + 0.2 * x.var(axis=(0, 2, 3))
    np.testing.assert_allclose(net.running_var.data().asnumpy(), expected_var, rtol=1e-5)


def test_batchnorm_running_statistics_identical_in_both_modes():
    x = rand(4, 3, 4, 4) * 3 + 2
    stats = []
    for hybrid in (False, True):
        net = nn.BatchNorm(in_channels=3)
        net.initialize()
        net.hybridize(hybrid)
        for _ in range(2):
            with autograd.record():
                net(nd.array(x)).sum().backward()
        stats.append((net.running_mean.data().asnumpy(), net.running_var.data().asnumpy()))
        with autograd.predict_mode():  # inference reads the running statistics
            out = net(nd.array(x)).asnumpy()
        mean, var = stats[-1]
        expected = (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(stats[1][0], stats[0][0], rtol=1e-6)
    np.testing.assert_allclose(stats[1][1], stats[0][1], rtol=1e-6)
    np.testing.assert_allclose(stats[0][0], 0.19 * x.mean(axis=(0, 2, 3)), rtol=1e-5)


def test_batchnorm_other_axis_and_global_stats():
    x = rand(4, 5, 3)  # channels last
    net = nn.BatchNorm(axis=-1)
    net.initialize()
    (out, _, grads), _ = run_both(net, x)
    expected = (x - x.mean(axis=(0, 1))) / np.sqrt(x.var(axis=(0, 1)) + 1e-5)
    # run_both records in training mode: the batch's statistics
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert net.gamma.shape == (3,) and set(grads) == {"gamma", "beta"}
    frozen = nn.BatchNorm(use_global_stats=True, in_channels=5)
    frozen.initialize()
    frozen.running_mean.set_data(np.arange(5, dtype=np.float32))
    (out, _, _), _ = run_both(frozen, x)  # trained, yet with the running statistics
    expected = (x - np.arange(5)[:, None]) / np.sqrt(1 + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(frozen.running_mean.data().asnumpy(), np.arange(5))


def test_batchnorm_and_layernorm_without_scale_and_shift():
    x = rand(3, 4, 2)
    for net in (nn.BatchNorm(center=False, scale=False), nn.LayerNorm(center=False,
                                                                       scale=False)):
        net.initialize()
        (out, _, grads), _ = run_both(net, x)
        assert grads == {}
        axes = (0, 2) if isinstance(net, nn.BatchNorm) else (2,)
        expected = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(
            x.var(axis=axes, keepdims=True) + 1e-5)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_layernorm_over_another_axis():
    x = rand(2, 4, 3)
    net = nn.LayerNorm(axis=1)
    net.initialize()
    net(nd.array(x))
    net.gamma.set_data(np.arange(1, 5, dtype=np.float32))
    (out, _, grads), _ = run_both(net, x)
    normalized = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True)
                                                               + 1e-5)
    np.testing.assert_allclose(out, normalized * np.arange(1, 5)[:, None], rtol=1e-4,
                               atol=1e-5)
    assert grads["gamma"].shape == (4,)


# -- Dropout ------------------------------------------------------------------------------------

@pytest.mark.parametrize("hybrid", [False, True])
def test_dropout_identity_when_predicting_and_scaled_when_training(hybrid):
    net = nn.Dropout(0.25)
    net.hybridize(hybrid)
    x = nd.array(rand(200, 50) + 3.0)
    np.testing.assert_array_equal(net(x).asnumpy(), x.asnumpy())
    x.attach_grad()
    with autograd.record():
        out = net(x)
        out.sum().backward()
    values, base = out.asnumpy(), x.asnumpy()
    kept = values != 0
    np.testing.assert_allclose(values[kept], base[kept] / 0.75, rtol=1e-6)
    assert 0.2 < 1 - kept.mean() < 0.3
    np.testing.assert_allclose(x.grad.asnumpy(), kept / 0.75, rtol=1e-6)
    with autograd.record(train_mode=False):
        np.testing.assert_array_equal(net(x).asnumpy(), base)


# -- shapes, names, errors ----------------------------------------------------------------------

def test_deferred_shapes_settle_on_first_call_in_both_modes():
    for hybrid in (False, True):
        net = nn.HybridSequential()
        with net.name_scope():
            net.add(nn.Conv2D(4, 3), nn.BatchNorm(), nn.Dense(6), nn.LayerNorm(),
                    nn.Dense(2, flatten=False))
        net.initialize()
        assert net[0].weight.shape == (4, 0, 3, 3) and not net[0].weight.is_initialized()
        net.hybridize(hybrid)
        assert net(nd.array(rand(2, 3, 5, 5))).shape == (2, 2)
        shapes = {_role(net, n): p.shape for n, p in net.collect_params().items()}
        assert shapes["conv0_weight"] == (4, 3, 3, 3)
        assert shapes["batchnorm0_running_var"] == (4,)
        assert shapes["dense0_weight"] == (6, 36)
        assert shapes["layernorm0_gamma"] == (6,)
        assert shapes["dense1_weight"] == (2, 6)


def test_mxnet_names_and_parameter_roles():
    net = nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(nn.Dense(3, in_units=2), nn.Conv2D(2, 1, in_channels=1), nn.BatchNorm(),
                nn.MaxPool2D(), nn.Embedding(4, 2))
    names = list(net.collect_params())
    assert names == ["net_dense0_weight", "net_dense0_bias", "net_conv0_weight",
                     "net_conv0_bias", "net_batchnorm0_gamma", "net_batchnorm0_beta",
                     "net_batchnorm0_running_mean", "net_batchnorm0_running_var",
                     "net_embedding0_weight"]
    assert net[3].name == "net_pool0"
    bn = net[2]
    assert bn.running_mean.grad_req == "null" and not bn.running_mean.differentiable
    assert list(nn.Dense(2, use_bias=False, prefix="d_").collect_params()) == ["d_weight"]


def test_errors_name_the_valid_choices():
    with pytest.raises(InputError, match=r"\['relu', 'sigmoid', 'softrelu', 'softsign', "
                                         r"'tanh'\]"):
        nn.Activation("swish")
    with pytest.raises(InputError, match="valid activations"):
        nn.Dense(3, activation="gelu")
    with pytest.raises(InputError, match="layout 'NCWH'.*'NCHW'"):
        nn.Conv2D(3, 3, layout="NCWH")  # MXNet takes NCHW and NHWC only
    with pytest.raises(InputError, match="layout"):
        nn.MaxPool1D(layout="WNC")
    with pytest.raises(InputError, match="groups"):
        nn.Conv2D(3, 3, groups=2)
    with pytest.raises(InputError, match="kernel_size"):
        nn.Conv2D(3, (3, 3, 3))
    with pytest.raises(InputError, match="rate"):
        nn.Dropout(1.5)
    with pytest.raises(InputError, match="output_padding"):
        nn.Conv2D(3, 3, output_padding=1)


def test_lambdas_and_sequential_reexports():
    assert nn.Sequential is mixrt.gluon.Sequential and nn.HybridBlock is mixrt.gluon.HybridBlock
    net = nn.HybridSequential()
    net.add(nn.HybridLambda("relu"), nn.HybridLambda(lambda F, x: x * 2))
    net.initialize()
    (out, _, _), _ = run_both(net, np.array([[-1.0, 2.0]], dtype=np.float32))
    np.testing.assert_array_equal(out, [[0.0, 4.0]])
    assert nn.Lambda("tanh")(nd.array([0.0])).asnumpy()[0] == 0.0


# -- a whole network, and export -----------------------------------------------------------------

def _small_cnn():
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Conv2D(4, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.MaxPool2D(), nn.Conv2D(6, 3, strides=2, activation="relu"),
                nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dropout(0.5), nn.Dense(3))
    net.initialize(initializer.Xavier())
    return net


def test_small_cnn_same_gradients_in_both_modes():
    net = _small_cnn()
    net[7]._rate = 0.0  # randomness aside, the whole network trains the same in both modes
    (out, _, grads), _ = run_both(net, rand(3, 2, 8, 8))
    assert out.shape == (3, 3) and len(grads) == 8  # two statistics have none


def test_export_small_cnn_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    net = _small_cnn()
    net.hybridize()
    x = rand(2, 2, 8, 8)
    with autograd.record():  # a training step first: running statistics that are not 0/1
        net(nd.array(x)).sum().backward()
    expected = net(nd.array(x)).asnumpy()
    paths = net.export(str(tmp_path / "cnn"))
    session = ort.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    np.testing.assert_allclose(session.run(None, {name: x})[0], expected, rtol=1e-4,
                               atol=1e-5)
    other = rand(5, 2, 8, 8)  # any batch size
    np.testing.assert_allclose(session.run(None, {name: other})[0],
                               net(nd.array(other)).asnumpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("layer, shape", [
    ("LSTM", (3, 2, 4)), ("GRU", (3, 2, 4)), ("Embedding", None), ("Dense", (2, 5)),
    ("Conv2D", (2, 2, 5, 5))])
def test_float64_data_trains_float32_parameters(layer, shape, hybridize):
    """NumPy's default float64 data into float32 layers: forward promotes, and backward
    gives every parameter a float32 gradient (it used to fail with a dtype mismatch in the
    backward plan of LSTM, GRU and Embedding)."""
    from mixrt.gluon import loss, rnn
    make = {"LSTM": lambda: rnn.LSTM(5), "GRU": lambda: rnn.GRU(5),
            "Embedding": lambda: nn.Embedding(10, 4), "Dense": lambda: nn.Dense(3),
            "Conv2D": lambda: nn.Conv2D(4, 3)}[layer]
    net = make()
    net.initialize()
    if hybridize:
        net.hybridize()
    rng = np.random.default_rng(3)
    data = rng.integers(0, 10, (2, 2)).astype(np.float64) if shape is None else \
        rng.standard_normal(shape)
    x = nd.array(data, dtype="float64")
    with autograd.record():
        y = net(x)
        y = y[0] if isinstance(y, (list, tuple)) else y
        value = loss.L2Loss()(y, nd.zeros(y.shape, dtype="float64"))
    value.backward()
    grads = [p.grad() for p in net.collect_params().values() if p.grad_req != "null"]
    assert grads and all(g.dtype == np.float32 for g in grads)
    assert all(np.isfinite(g.asnumpy()).all() for g in grads)
    assert any(np.abs(g.asnumpy()).sum() > 0 for g in grads)


@pytest.mark.parametrize("hybridize", [False, True])
def test_dropout_masks_repeat_after_mixrt_random_seed(hybridize):
    import mixrt.random

    def masks():
        mixrt.random.seed(5)
        net = nn.HybridSequential()
        net.add(nn.Dropout(0.5))
        net.initialize()
        if hybridize:
            net.hybridize()
        x = nd.array(np.ones((8, 16), np.float32))
        with autograd.record():
            return [net(x).asnumpy() for _ in range(2)]
    first, again = masks(), masks()
    assert all((a == b).all() for a, b in zip(first, again))
    assert (first[0] != first[1]).any()
