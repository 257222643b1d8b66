"""Training programs, Module.fit, checkpoints and resume, data iterators and metrics."""

import numpy as np
import pytest
from helpers import flat_digits, mlp_graph

import mixrt
from mixrt import metric, random as mixrt_random
from mixrt.errors import InputError, ModelLoadError
from mixrt.gluon import Trainer
from mixrt.io import NDArrayIter, read_ahead
from mixrt.module import Module
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available, to_host
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.training.program import LOSSES, TrainingProgram


def mlp(inputs=64, hidden=32, outputs=10, seed=0, dtype=np.float32) -> Graph:
    return mlp_graph(inputs, hidden, outputs, seed, dtype)


@pytest.fixture(scope="module")
def digits():
    return flat_digits()


def test_fit_learns_digits(digits):
    xt, yt, xe, ye = digits
    mixrt_random.seed(1)
    model = Module(mlp())
    history = model.fit(NDArrayIter(xt, yt, 64, shuffle=True), eval_data=NDArrayIter(xe, ye, 128),
                        optimizer="sgd", optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
                        epochs=6, progress=False)
    assert history[-1]["eval_accuracy"] >= 0.93
    assert history[-1]["loss"] < history[0]["loss"]
    assert model.score(NDArrayIter(xe, ye, 100), "acc")[1] == history[-1]["eval_accuracy"]


def _train(graph, data, epochs, *, checkpoint=None, resume=None, seed=5):
    xt, yt = data
    model = Module(graph)
    trainer = Trainer(model.params.trainable(), "adam", {"learning_rate": 0.01})
    iterator = NDArrayIter(xt, yt, 50, shuffle=True, seed=seed)
    model.fit(iterator, epochs=epochs, checkpoint=checkpoint, resume=resume, trainer=trainer,
              progress=False)
    return model


def test_resume_reproduces_uninterrupted_run_bit_for_bit(digits, tmp_path):
    data = digits[:2]
    straight = _train(mlp(), data, 4)
    _train(mlp(), data, 2, checkpoint=tmp_path / "ckpt")
    resumed = _train(mlp(), data, 4, resume=tmp_path / "ckpt.npz")
    for name, param in straight.params.items():
        assert np.array_equal(param.data(), resumed.params[name].data()), name
    with np.load(tmp_path / "ckpt.npz", allow_pickle=False) as stored:
        assert "meta" in stored.files


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
def test_on_the_gpu_fit_matches_the_cpu_and_keeps_the_parameters_there(digits, tmp_path):
    """Parameters, gradients and the optimizer state live on the GPU (a step moves only the
    batch in and the loss and predictions out); in float64 the trained values, predictions
    and export equal the CPU's, and a checkpoint written there resumes there."""
    xt, yt, xe, _ = (a.astype(np.float64) if a.dtype.kind == "f" else a for a in digits)
    models = {}
    for device in ("cpu", "gpu"):
        model = Module(mlp(dtype=np.float64), device=device)
        trainer = Trainer(model.params.trainable(), "sgd",
                          {"learning_rate": 0.1, "momentum": 0.9})
        model.fit(NDArrayIter(xt[:300], yt[:300], 50, shuffle=True, seed=5), epochs=2,
                  trainer=trainer, checkpoint=tmp_path / device, progress=False)
        models[device] = model
    cpu, gpu = models["cpu"], models["gpu"]
    for name, param in gpu.params.items():
        assert param.data().ctx == mixrt.gpu(0) and param.grad().ctx == mixrt.gpu(0)
        np.testing.assert_allclose(to_host(param.raw()), cpu.params[name].raw(), rtol=1e-9,
                                   atol=1e-12, err_msg=name)
    np.testing.assert_allclose(gpu.predict(xe), cpu.predict(xe), rtol=1e-9, atol=1e-12)
    for name, value in gpu.to_graph().initializers.items():
        assert isinstance(value, np.ndarray), name
    resumed = Module(mlp(dtype=np.float64), device="gpu")
    trainer = Trainer(resumed.params.trainable(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    assert resumed.load_checkpoint(tmp_path / "gpu.npz", trainer)[0] == 2
    for name, param in resumed.params.items():
        np.testing.assert_array_equal(to_host(param.raw()), to_host(gpu.params[name].raw()))
    on_gpu = mixrt.gpu(0).device.put  # a batch already on the device is taken as it is
    loss, outputs = resumed.train_step(on_gpu(xt[:50]), on_gpu(yt[:50]), trainer)
    assert np.isfinite(loss) and isinstance(outputs[0], np.ndarray)


def test_checkpoint_errors(tmp_path, digits):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a checkpoint")
    model = Module(mlp())
    trainer = Trainer(model.params.trainable(), "sgd")
    with pytest.raises(ModelLoadError, match="bad.npz"):
        model.load_checkpoint(bad, trainer)


def test_freeze_trains_only_the_rest(digits):
    xt, yt, _, _ = digits
    model = Module(mlp())
    model.freeze(except_=["w2", "b2"])
    before = {n: p.data().copy() for n, p in model.params.items()}
    model.fit(NDArrayIter(xt, yt, 64), epochs=1, progress=False)
    assert np.array_equal(before["w1"], model.params["w1"].data())
    assert not np.array_equal(before["w2"], model.params["w2"].data())
    with pytest.raises(InputError, match="nope"):
        model.freeze(["nope"])


def test_replace_head_gives_a_new_task(digits):
    xt, yt, xe, ye = digits
    mixrt_random.seed(3)
    model = Module(mlp())
    model.replace_head("features", 2)
    assert set(model.params) == {"w1", "b1", "head.weight", "head.bias"}
    parity_t, parity_e = yt % 2, ye % 2
    model.fit(NDArrayIter(xt, parity_t, 64, shuffle=True), epochs=4, progress=False,
              optimizer_params={"learning_rate": 0.1})
    assert model.predict(xe).shape == (len(xe), 2)
    assert (model.predict(xe).argmax(1) == parity_e).mean() > 0.85


@pytest.mark.parametrize("loss", ["mse", "l1", "bce_with_logits", "softmax_cross_entropy"])
def test_loss_gradients_match_finite_differences(loss):
    rng = np.random.default_rng(0)
    graph = mlp(inputs=3, hidden=4, outputs=2, dtype=np.float64)
    x = rng.standard_normal((5, 3))
    label = rng.integers(0, 2, 5) if loss == "softmax_cross_entropy" else \
        rng.uniform(0, 1, (5, 2))
    program = TrainingProgram(graph, LOSSES[loss]("out"), ["w1", "b2"], opt_level=0)
    # random biases keep every output off the kinks of relu and |x| (a zero row of features
    # would put the logits exactly at 0, where finite differences see a half-slope)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in graph.initializers.items()}
    _, _, grads = program.step(params, {"x": x, "label": label})
    for name in ["w1", "b2"]:
        numeric = np.zeros_like(params[name])
        for index in np.ndindex(numeric.shape):
            shifted = {k: v.copy() for k, v in params.items()}
            shifted[name][index] += 1e-6
            up = program.step(shifted, {"x": x, "label": label})[0]
            shifted[name][index] -= 2e-6
            down = program.step(shifted, {"x": x, "label": label})[0]
            numeric[index] = (up - down) / 2e-6
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7)


def test_optimized_program_matches_unoptimized():
    rng = np.random.default_rng(1)
    graph = mlp(inputs=6, hidden=5, outputs=3, dtype=np.float64)
    feeds = {"x": rng.standard_normal((4, 6)), "label": np.array([0, 2, 1, 0])}
    plain = TrainingProgram(graph, LOSSES["softmax_cross_entropy"]("out"), ["w1", "w2"],
                            opt_level=0)
    fused = TrainingProgram(graph, LOSSES["softmax_cross_entropy"]("out"), ["w1", "w2"],
                            opt_level=2)
    a, b = plain.step(graph.initializers, feeds), fused.step(graph.initializers, feeds)
    assert a[0] == pytest.approx(b[0], rel=1e-12)
    for name in ["w1", "w2"]:
        np.testing.assert_allclose(a[2][name], b[2][name], rtol=1e-10)


def test_sharding_gives_equal_disjoint_shares():
    data = np.arange(103)
    parts = [NDArrayIter(data, data, 10, shuffle=True, num_parts=3, part_index=i, seed=9)
             for i in range(3)]
    assert len({len(p) for p in parts}) == 1
    seen = [np.concatenate([b.data[0].asnumpy()[:b.data[0].shape[0] - b.pad] for b in p])
            for p in parts]  # MXNet's batches: lists of NDArrays
    assert sum(len(s) for s in seen) == 3 * (103 // 3)
    assert len(np.unique(np.concatenate(seen))) == 3 * (103 // 3)
    with pytest.raises(InputError, match="part_index"):
        NDArrayIter(data, data, 10, num_parts=2, part_index=2)


def test_padding_and_state_round_trip():
    it = NDArrayIter(np.arange(7), np.arange(7), 3, shuffle=True, seed=1)
    batches = list(it)
    assert [b.pad for b in batches] == [0, 0, 2]
    it.reset()
    next(it)
    saved = it.state()
    rest = [b.data[0].asnumpy().tolist() for b in it]
    again = NDArrayIter(np.arange(7), np.arange(7), 3, shuffle=True, seed=123)
    again.set_state(saved)
    assert [b.data[0].asnumpy().tolist() for b in again] == rest
    assert len(NDArrayIter(np.arange(7), None, 3, last_batch="discard")) == 2


def test_roll_over_carries_the_left_over_samples_into_the_next_epoch():
    data = np.arange(23)
    shards = [NDArrayIter(data, data, 4, shuffle=True, seed=3, last_batch_handle="roll_over",
                          num_parts=2, part_index=rank) for rank in range(2)]
    served = {0: [], 1: []}
    for epoch, expected_batches in enumerate([2, 3, 3]):  # 11 a share: 11, 3+11, 2+11
        for rank, shard in enumerate(shards):
            shard.reset()
            assert len(shard) == expected_batches, (epoch, rank)
            batches = [b.data[0].asnumpy().tolist() for b in shard]
            assert all(len(b) == 4 for b in batches)
            served[rank] += sum(batches, [])
    # nothing is dropped but the one sample the last epoch leaves over
    assert len(served[0]) == len(served[1]) == 3 * 11 - 1
    # a checkpoint taken with samples carried over resumes the same batches
    shards[0].reset()
    next(shards[0])
    saved, rest = shards[0].state(), [b.data[0].asnumpy().tolist() for b in shards[0]]
    again = NDArrayIter(data, data, 4, last_batch="roll_over", num_parts=2, part_index=0)
    again.set_state(saved)
    assert [b.data[0].asnumpy().tolist() for b in again] == rest


def test_last_batch_handle_is_mxnets_name_for_last_batch():
    assert NDArrayIter(np.arange(7), None, 3, last_batch_handle="discard").last_batch == \
        "discard"
    with pytest.raises(InputError, match="disagree"):
        NDArrayIter(np.arange(7), None, 3, last_batch="pad", last_batch_handle="discard")
    with pytest.raises(InputError, match="roll_over"):
        NDArrayIter(np.arange(7), None, 3, last_batch="keep")


def test_read_ahead_passes_items_and_errors():
    def broken():
        yield 1
        raise RuntimeError("reader failed")
    assert list(read_ahead([1, 2, 3])) == [1, 2, 3]
    with pytest.raises(RuntimeError, match="reader failed"):
        list(read_ahead(broken()))


def test_metrics():
    acc = metric.create("acc")
    acc.update(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]]))
    assert acc.get() == ("accuracy", pytest.approx(2 / 3))
    ce = metric.create("ce")  # MXNet's CrossEntropy reads probabilities, not scores
    ce.update(np.array([0]), np.array([[0.5, 0.5]]))
    assert ce.get()[1] == pytest.approx(np.log(2))
    top = metric.TopKAccuracy(2)
    top.update(np.array([2]), np.array([[0.1, 0.5, 0.4]]))
    assert top.get()[1] == 1.0
    with pytest.raises(InputError, match="unknown metric"):
        metric.create("f1-ish")


def conv_bn_net(blocks=4, channels=8) -> Graph:
    rng = np.random.default_rng(2)
    g = Graph(name="cbr", opsets={"": 17})
    g.inputs = [Value("x", TensorType(np.dtype(np.float64), ("N", channels, 12, 12)))]
    current = "x"
    for i in range(blocks):
        g.initializers.update({
            f"w{i}": rng.standard_normal((channels, channels, 3, 3)) * 0.2,
            f"s{i}": rng.uniform(0.5, 1.5, channels), f"b{i}": rng.standard_normal(channels),
            f"m{i}": rng.standard_normal(channels) * 0.1, f"v{i}": rng.uniform(0.5, 1, channels)})
        g.nodes += [
            Node("Conv", [current, f"w{i}"], [f"c{i}"], opset=17, attributes={"pads": [1] * 4}),
            Node("BatchNormalization", [f"c{i}", f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"],
                 opset=17),
            Node("Relu", [f"n{i}"], [f"r{i}"], opset=17)]
        current = f"r{i}"
    g.initializers["fc"] = rng.standard_normal((channels, 3)) * 0.3
    g.nodes += [Node("GlobalAveragePool", [current], ["gap"], opset=17),
                Node("Flatten", ["gap"], ["flat"], opset=17),
                Node("MatMul", ["flat", "fc"], ["out"], opset=17)]
    g.outputs = [Value("out")]
    return g


def test_mirror_recomputes_activations_for_less_memory():
    from mixrt.runtime.passes.autodiff import MIRROR_OPS
    graph = conv_bn_net()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8, 12, 12)),
             "label": np.array([0, 1, 2, 1])}
    trainable = [n for n in graph.initializers if n[0] in "wsb" or n == "fc"]
    kept = TrainingProgram(graph, LOSSES["softmax_cross_entropy"]("out"), trainable)
    mirrored = TrainingProgram(graph, LOSSES["softmax_cross_entropy"]("out"), trainable,
                               mirror=MIRROR_OPS)
    a, b = kept.step(graph.initializers, feeds), mirrored.step(graph.initializers, feeds)
    assert a[0] == b[0]
    for name in trainable:
        np.testing.assert_array_equal(a[2][name], b[2][name])
    plain = kept.memory_report(graph.initializers, feeds)["arena_bytes"]
    recomputed = mirrored.memory_report(graph.initializers, feeds)["arena_bytes"]
    assert recomputed < 0.85 * plain


def _conv_bn_model(tmp_path):
    """A training-mode export's shape: 1x1 Conv, BatchNormalization with training_mode=1
    (its running mean and variance outputs unnamed graph-wise), ReLU, pooling, Gemm."""
    import onnx
    from onnx import TensorProto, helper
    rng = np.random.default_rng(3)
    tensors = {"w": rng.standard_normal((4, 2, 1, 1)), "scale": np.ones(4),
               "bias": np.zeros(4), "mean": rng.standard_normal(4), "var": np.full(4, 2.0),
               "fc_w": rng.standard_normal((3, 4)), "fc_b": np.zeros(3)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["bn", "bn_mean", "bn_var"], training_mode=1, momentum=0.9),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "conv_bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                         ["n", 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor(k, TensorProto.FLOAT, v.shape, v.astype(np.float32).ravel())
         for k, v in tensors.items()])
    path = tmp_path / "conv_bn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, tensors


def test_an_imported_models_running_statistics_are_state_not_parameters(tmp_path):
    """BatchNormalization's running mean and variance in an ONNX model are not trained (the
    optimizer never sees them) and each training step stores their new values, as
    PyTorch updates its buffers: momentum * old + (1 - momentum) * the batch's."""
    path, tensors = _conv_bn_model(tmp_path)
    model = Module.from_onnx(path)
    assert {p.name for p in model.params.trainable()} == {"w", "scale", "bias", "fc_w", "fc_b"}
    trainer = Trainer(model.params.trainable(), "sgd", {"learning_rate": 0.1, "wd": 0.1})
    x = np.random.default_rng(4).standard_normal((6, 2, 5, 5)).astype(np.float32)
    conv = np.einsum("nchw,mc->nmhw", x, tensors["w"][:, :, 0, 0].astype(np.float32))
    loss, outputs = model.train_step(x, np.array([0, 1, 2, 0, 1, 2]), trainer)
    assert np.isfinite(loss) and [o.shape for o in outputs] == [(6, 3)]
    np.testing.assert_allclose(model.params["mean"].data().asnumpy(),
                               0.9 * tensors["mean"] + 0.1 * conv.mean(axis=(0, 2, 3)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.params["var"].data().asnumpy(),
                               0.9 * 2.0 + 0.1 * conv.var(axis=(0, 2, 3)), rtol=1e-5)
    exported = model.to_graph()  # inference and export read the new statistics
    np.testing.assert_array_equal(exported.initializers["mean"],
                                  model.params["mean"].data().asnumpy())
