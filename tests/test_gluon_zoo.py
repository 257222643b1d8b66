"""The Gluon zoo: every network gives the same outputs, parameter gradients and BatchNorm
statistics imperatively and hybridized (training and predicting), its export runs in
onnxruntime with the same outputs, ResNet has the reference parameter counts, and
get_model names the valid models."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, initializer, nd
from mixrt.errors import InputError
from mixrt.models import gluon_zoo
from mixrt.ops.device import gpu_available

RNG = np.random.default_rng(0)

# name -> (the network, small, and an input shape)
MODELS = {
    "mlp": (lambda: gluon_zoo.get_model("mlp", hidden=(32, 16), classes=5), (2, 12)),
    "lenet": (lambda: gluon_zoo.get_model("lenet"), (2, 1, 28, 28)),
    "resnet18_v1": (lambda: gluon_zoo.get_model("resnet18_v1", classes=10, thumbnail=True),
                    (2, 3, 32, 32)),
    "transformer_encoder": (lambda: gluon_zoo.get_model(
        "transformer_encoder", layers=2, hidden=32, heads=4, ffn=64, dropout=0.0),
        (2, 8, 32)),
}


def fresh(name):
    build, shape = MODELS[name]
    net = build()
    net.initialize(initializer.Xavier())
    x = RNG.standard_normal(shape).astype(np.float32)
    with autograd.pause():  # LeNet's first Dense learns its width from the input
        net(nd.array(x))
    return net, x


def values(net):
    return {n: p.data().asnumpy().copy() for n, p in net.collect_params().items()}


def restore(net, saved):
    for name, param in net.collect_params().items():
        param.set_data(nd.array(saved[name], dtype=saved[name].dtype))


def step(net, x, train, ctx=None):
    """Output, parameter gradients and parameter values after a backward pass from a fixed
    weighted sum of the outputs. Not the plain sum: the transformer ends in LayerNorm, whose
    outputs sum to a constant, so every gradient before it would be rounding noise."""
    with autograd.record(train_mode=train):
        out = net(nd.array(x, ctx=ctx, dtype=x.dtype))
        weights = np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype)
        loss = (out * nd.array(weights, ctx=ctx, dtype=x.dtype)).sum()
    loss.backward()
    grads = {n: p.grad().asnumpy().copy() for n, p in net.collect_params().items()
             if p.grad_req != "null"}
    return out.asnumpy(), grads, values(net)


def assert_close(actual, expected, what, scale=None):
    """To 1e-4, or 1e-5 of ``scale`` (by default the expected array's largest value) where a
    value is near 0. Gradients pass the whole network's largest: some are 0 up to rounding
    (the attention's key bias, which softmax cannot see), and rounding noise of 1e-8 from
    two summation orders must not be held to its own scale."""
    if scale is None:
        scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * max(scale, 1e-6),
                               err_msg=what)


@pytest.mark.parametrize("train", [True, False], ids=["training", "predicting"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hybridized_matches_imperative(name, train):
    net, x = fresh(name)
    start = values(net)
    imperative = step(net, x, train)
    restore(net, start)  # BatchNorm's running statistics moved: start the same again
    net.hybridize()
    hybridized = step(net, x, train)
    assert net._cached, "the hybridized run did not go through the traced graph"
    assert_close(hybridized[0], imperative[0], "output")
    assert hybridized[1].keys() == imperative[1].keys() and imperative[1]
    largest = max(float(np.abs(grad).max()) for grad in imperative[1].values())
    for key, grad in imperative[1].items():
        assert_close(hybridized[1][key], grad, f"gradient of {key}", largest)
    for key, value in imperative[2].items():  # the running statistics, updated alike
        assert_close(hybridized[2][key], value, f"value of {key}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_in_float64_hybridized_matches_imperative_to_rounding(name):
    """Cast to float64, both paths compute in float64 throughout: a traced scalar (the
    attention's 1/sqrt(d)) or a LayerNorm statistic rounded to float32 would show as ~1e-8."""
    net, x = fresh(name)
    net.cast("float64")
    x = x.astype(np.float64)
    start = values(net)
    imperative = step(net, x, True)
    restore(net, start)
    net.hybridize()
    hybridized = step(net, x, True)
    np.testing.assert_allclose(hybridized[0], imperative[0], rtol=1e-12, atol=1e-13)
    for key, grad in imperative[1].items():
        np.testing.assert_allclose(hybridized[1][key], grad, rtol=1e-11, atol=1e-12,
                                   err_msg=f"gradient of {key}")


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_the_gpu_imperative_and_hybridized_match_the_cpu(name):
    """The same network moved to mixrt.gpu(0): outputs, gradients and running statistics
    equal the CPU's, imperatively and hybridized, and its parameters stay on the GPU. Each
    path is compared with itself on the CPU (imperative against hybridized is the test
    above), in float64: the devices' kernels differ, and a sum-of-outputs loss through
    BatchNorm over a batch of 2 cancels enough to turn float32 rounding into 2% of some
    gradients."""
    net, x = fresh(name)
    net.cast("float64")
    x = x.astype(np.float64)
    start = values(net)
    runs = {}
    for device in ("cpu", "gpu"):
        ctx = mixrt.gpu(0) if device == "gpu" else mixrt.cpu()
        net.collect_params().reset_ctx(ctx)
        for hybrid in (False, True):
            restore(net, start)
            net.hybridize(hybrid)
            runs[device, hybrid] = step(net, x, True, ctx)
            assert bool(net._cached) == hybrid
    assert all(p.data().ctx == mixrt.gpu(0) for p in net.collect_params().values())
    for hybrid in (False, True):
        label = "hybridized" if hybrid else "imperative"
        gpu, cpu = runs["gpu", hybrid], runs["cpu", hybrid]
        np.testing.assert_allclose(gpu[0], cpu[0], rtol=1e-9, atol=1e-12,
                                   err_msg=f"{label} output")
        assert gpu[1].keys() == cpu[1].keys() and cpu[1]
        for key in cpu[1]:
            np.testing.assert_allclose(gpu[1][key], cpu[1][key], rtol=1e-9, atol=1e-12,
                                       err_msg=f"{label} gradient of {key}")
        for key in cpu[2]:
            np.testing.assert_allclose(gpu[2][key], cpu[2][key], rtol=1e-9, atol=1e-12,
                                       err_msg=f"{label} value of {key}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_runs_in_onnxruntime(name, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    net, x = fresh(name)
    net.hybridize()
    with autograd.record():  # a training step first: running statistics that are not 0/1
        net(nd.array(x)).sum().backward()
    expected = net(nd.array(x)).asnumpy()
    paths = net.export(str(tmp_path / "m"))
    session = ort.InferenceSession(paths["onnx"], providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name, count", [("resnet18_v1", 11_689_512),
                                         ("resnet34_v1", 21_797_672),
                                         ("resnet50_v1", 25_557_032)])
def test_resnet_parameter_counts_match_the_reference(name, count):
    net = gluon_zoo.get_model(name)  # every shape is known before any call
    assert gluon_zoo.count_parameters(net) == count


def test_unknown_model_names_the_valid_ones():
    with pytest.raises(InputError, match="resnet18_v1.*transformer_encoder"):
        gluon_zoo.get_model("resnet19")
    with pytest.raises(InputError, match="depth 19"):
        gluon_zoo.ResNetV1(19)
    with pytest.raises(InputError, match="not divisible"):
        gluon_zoo.TransformerEncoder(hidden=30, heads=4)


@pytest.mark.parametrize("name, shape, count", [("mlp", (2, 784), 1_863_690),
                                                ("lenet", (2, 1, 28, 28), 44_426)])
def test_same_network_as_the_symbol_zoo(name, shape, count):
    """The same weights, in the same order, give the symbol zoo's outputs."""
    from mixrt.models import get_symbol  # noqa: PLC0415
    from mixrt.runtime.session import Session  # noqa: PLC0415
    net = gluon_zoo.get_model(name)
    net.initialize(initializer.Xavier())
    x = RNG.standard_normal(shape).astype(np.float32)
    expected = net(nd.array(x)).asnumpy()
    assert gluon_zoo.count_parameters(net) == count
    symbol = get_symbol(name)
    weights = dict(zip(symbol.list_arguments()[1:], values(net).values()))
    session = Session(symbol.to_graph(weights, shapes={"data": shape}))
    np.testing.assert_allclose(session.run(None, {"data": x})[0], expected, rtol=1e-4,
                               atol=1e-5)
