"""The symbol model zoo: shapes and parameter counts against the reference architectures,
gradients against finite differences, exports against onnxruntime, and a real training run."""

from __future__ import annotations

import numpy as np
import pytest

import mixrt
from mixrt import sym
from mixrt.models import get_symbol
from mixrt.models.digits import load_digits, split
from mixrt.models.layers import with_loss
from mixrt.optimizer import create as create_optimizer

from helpers import central_difference


def parameter_count(symbol, **shapes) -> int:
    args, _, _ = symbol.infer_shape(**shapes)
    return sum(int(np.prod(shape)) for name, shape in zip(symbol.list_arguments(), args)
               if name not in shapes)


@pytest.mark.parametrize("name, shapes, outputs, count", [
    ("mlp", {"data": (2, 784)}, (2, 10), 1_863_690),
    ("lenet", {"data": (2, 1, 28, 28)}, (2, 10), 44_426),
    # torchvision's resnet18 / resnet50 have exactly these many parameters
    ("resnet18", {"data": (2, 3, 224, 224)}, (2, 1000), 11_689_512),
    ("resnet50", {"data": (2, 3, 224, 224)}, (2, 1000), 25_557_032),
    ("transformer", {"data": (2, 128)}, (2, 2), 3_514_626),
])
def test_zoo_shapes_and_parameter_counts(name, shapes, outputs, count):
    symbol = get_symbol(name)
    assert symbol.infer_shape(**shapes)[1] == [outputs]
    assert parameter_count(symbol, **shapes) == count


def test_resnet50_running_statistics_are_auxiliary_states():
    symbol = get_symbol("resnet50")
    aux = symbol.list_auxiliary_states()
    assert len(aux) == 2 * 53 and all(n.endswith(("moving_mean", "moving_var")) for n in aux)


def test_unknown_zoo_name():
    with pytest.raises(ValueError, match="resnet18"):
        get_symbol("resnet19")


def _bind(symbol, dtype, **shapes):
    """simple_bind with every float argument and state in ``dtype`` (declared int64 ones,
    token ids and labels, stay int64), initialized."""
    names = symbol.list_arguments() + symbol.list_auxiliary_states()
    arg_types, _, aux_types = symbol.infer_type()
    types = {n: (dtype if t == np.float32 else t) for n, t in zip(names, arg_types + aux_types)}
    executor = symbol.simple_bind("cpu", type_dict=types, **shapes)
    executor.init_params()
    return executor


def test_transformer_gradients_match_finite_differences():
    """A one-layer, two-head encoder in float64 (layer-norm statistics too): embeddings
    (Gather), attention (MatMul, Reshape, Transpose, Softmax), GELU, LayerNormalization, the
    pooler and the loss."""
    mixrt.random.seed(0)
    symbol = with_loss(get_symbol("transformer", vocab=11, seq=5, hidden=8, heads=2,
                                  layers=1, ffn=12, classes=3, stash_type=11))
    executor = _bind(symbol, np.float64, data=(3, 5), label=(3,))
    rng = np.random.default_rng(1)
    feeds = {"data": rng.integers(0, 11, (3, 5)), "label": np.array([0, 2, 1])}
    executor.forward(is_train=True, **feeds)
    executor.backward()
    for name in ("word_embedding_weight", "layer0_query_weight", "layer0_key_bias",
                 "layer0_ffn_in_weight", "layer0_attention_norm_gamma", "pooler_weight"):
        array, grad = executor.arg_dict[name], executor.grad_dict[name]
        for index in list(np.ndindex(array.shape))[::max(1, array.size // 6)]:
            numeric = central_difference(executor, feeds, array, index)
            assert grad[index] == pytest.approx(numeric, rel=1e-5, abs=1e-9), (name, index)


@pytest.mark.parametrize("name, options, shapes", [
    ("resnet18", {"classes": 10}, {"data": (2, 3, 32, 32)}),
    ("transformer", {"vocab": 50, "seq": 16, "hidden": 32, "heads": 4, "layers": 2},
     {"data": (2, 16)}),
    ("lenet", {"size": 8, "pad": 2}, {"data": (2, 1, 8, 8)}),
])
def test_trained_zoo_model_exports_to_onnxruntime(tmp_path, name, options, shapes):
    ort = pytest.importorskip("onnxruntime")
    mixrt.random.seed(0)
    logits = get_symbol(name, **options)
    symbol = with_loss(logits)
    batch = shapes["data"][0]
    executor = _bind(symbol, np.float32, label=(batch,), **shapes)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 50, shapes["data"]) if name == "transformer" else \
        rng.standard_normal(shapes["data"]).astype(np.float32)
    optimizer = create_optimizer("sgd", learning_rate=0.05, momentum=0.9)
    for _ in range(2):  # train a little: BatchNorm statistics and weights move
        executor.forward(is_train=True, data=data, label=np.arange(batch) % 2)
        executor.backward()
        for key, grad in executor.grad_dict.items():
            optimizer.step(key, executor.arg_dict[key], grad)
    path = tmp_path / f"{name}.onnx"
    executor.export_onnx(path, outputs=[logits.list_outputs()[0]])
    reference = ort.InferenceSession(str(path)).run(None, {"data": data})[0]
    ours = executor.forward(is_train=False, data=data, label=np.arange(batch) % 2)[1]
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)


def test_lenet_learns_the_digits():
    """A real training run: LeNet from the zoo on the 8x8 digits, SGD with momentum,
    through Executor.forward/backward; the held-out accuracy must pass 90%."""
    mixrt.random.seed(0)
    (train_x, train_y), (test_x, test_y) = split(*load_digits())
    symbol = with_loss(get_symbol("lenet", size=8, pad=2))
    executor = symbol.simple_bind("cpu", data=(64, 1, 8, 8), label=(64,),
                                  type_dict={"label": np.int64})
    executor.init_params()
    optimizer = create_optimizer("sgd", learning_rate=0.1, momentum=0.9)
    order = np.random.default_rng(0).permutation
    for _ in range(8):
        shuffled = order(len(train_x))
        for start in range(0, len(shuffled) - 63, 64):
            batch = shuffled[start:start + 64]
            executor.forward(is_train=True, data=train_x[batch], label=train_y[batch])
            executor.backward()
            for key, grad in executor.grad_dict.items():
                optimizer.step(key, executor.arg_dict[key], grad)
    logits = executor.forward(data=test_x, label=test_y)[1]
    accuracy = float((logits.argmax(axis=1) == test_y).mean())
    assert accuracy >= 0.9, accuracy


def test_symbols_save_and_load_the_zoo(tmp_path):
    for name in ("resnet18", "transformer"):
        symbol = get_symbol(name)
        path = tmp_path / f"{name}.json"
        symbol.save(path)
        loaded = sym.load(path)
        assert loaded.list_arguments() == symbol.list_arguments()
        assert loaded.tojson() == symbol.tojson()
