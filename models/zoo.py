"""The 9 "light" zoo models that ship inside the onnx package, with their reference outputs.

They are real ImageNet architectures (ResNet-50, VGG-19, DenseNet-121, Inception v1/v2,
SqueezeNet, ShuffleNet, ZFNet-512, AlexNet) whose weights onnx replaced by constants to keep
the package small; their reference outputs were computed by onnx from the input below.

Constant weights make every output channel of a layer equal, so a kernel that mixed up its
channels, or a fusion that applied a BatchNormalization's statistics to the wrong channel,
would still match those references. :func:`light_model_with_random_weights` gives the same
architectures seeded random weights, for checks against another runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


@dataclass
class ZooModel:
    name: str
    path: Path
    inputs: dict[str, np.ndarray]
    expected: list[np.ndarray]


def light_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_model(name: str) -> ZooModel:
    path = light_dir() / f"light_{name}.onnx"
    model = onnx.load(path, load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    inputs = {v.name: _ramp_input(v) for v in model.graph.input if v.name not in initializers}
    expected = []
    for index in range(len(model.graph.output)):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((light_dir() / f"light_{name}_output_{index}.pb").read_bytes())
        expected.append(numpy_helper.to_array(tensor))
    return ZooModel(name, path, inputs, expected)


def _ramp_input(value: onnx.ValueInfoProto) -> np.ndarray:
    """The deterministic input onnx's backend test used for the reference: a 0..1 ramp."""
    dims = [d.dim_value if d.HasField("dim_value") else 1
            for d in value.type.tensor_type.shape.dim]
    count = int(np.prod(dims))
    return (np.arange(count).reshape(dims) / count).astype(np.float32)


# BatchNormalization's inputs by position: scale, bias, mean, variance
_BATCH_NORM_SCALE, _BATCH_NORM_VARIANCE = 1, 4
_OFFSET_SLOTS = {("Conv", 2), ("Gemm", 2), ("BatchNormalization", 2),
                 ("BatchNormalization", 3)}


def light_model_with_random_weights(name: str, seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """A light zoo model with seeded random weights in place of its constant ones, and its
    logits (the final Softmax's input) as an extra output, where a saturated softmax would
    hide a difference; with the zoo's reference input.

    Weights are He-initialized (by their consumer: Conv, Gemm with or without transB, the
    Reshape before Inception-v1's classifier). BatchNormalization scales are drawn below 1
    and its variances near 1, so activations stay within a few units through ResNet's and
    DenseNet's depth rather than growing by powers of two."""
    zoo = light_model(name)
    model = onnx.load(zoo.path)
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    consumers = {}
    for node in model.graph.node:
        for slot, value in enumerate(node.input):
            consumers.setdefault(value, (node, slot))
    kept = []
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        weight = _random_weight(rng, shape, *consumers[node.output[0]])
        model.graph.initializer.append(numpy_helper.from_array(weight, node.output[0]))
        # IR 3 lists every initializer as a graph input too
        model.graph.input.append(onnx.helper.make_tensor_value_info(
            node.output[0], onnx.TensorProto.FLOAT, shape))
    del model.graph.node[:]
    model.graph.node.extend(kept)
    if kept[-1].op_type == "Softmax":
        model.graph.output.append(onnx.helper.make_tensor_value_info(
            kept[-1].input[0], onnx.TensorProto.FLOAT, None))
    return model, zoo.inputs


def _random_weight(rng, shape, consumer, slot) -> np.ndarray:
    """Drawn in float32 and scaled in place: VGG-19's 143 million weights drawn in float64
    and then converted took ~11 s here, most of it the kernel zeroing the pages of the
    float64 temporaries (a page fault costs ~7 us on this VM), against ~2 s so."""
    kind = (consumer.op_type, slot)
    if kind in _OFFSET_SLOTS:
        return _scaled(rng.standard_normal(shape, dtype=np.float32), 0.1)
    if kind == ("BatchNormalization", _BATCH_NORM_SCALE):
        return _uniform(rng, shape, 0.25, 0.75)
    if kind == ("BatchNormalization", _BATCH_NORM_VARIANCE) or consumer.op_type == "Unsqueeze":
        # DenseNet's Unsqueeze feeds a per-channel Mul: a scale, kept positive
        return _uniform(rng, shape, 0.5, 1.5)
    return _scaled(rng.standard_normal(shape, dtype=np.float32),
                   np.sqrt(2.0 / _fan_in(shape, consumer, slot)))


def _scaled(values: np.ndarray, scale: float, offset: float = 0.0) -> np.ndarray:
    values *= np.float32(scale)
    values += np.float32(offset)
    return values


def _uniform(rng, shape, low: float, high: float) -> np.ndarray:
    return _scaled(rng.random(shape, dtype=np.float32), high - low, low)


def _fan_in(shape, consumer, slot) -> int:
    if consumer.op_type == "Conv":
        return int(np.prod(shape[1:]))
    if consumer.op_type == "Gemm":
        transposed = any(a.name == ("transB" if slot == 1 else "transA") and a.i
                         for a in consumer.attribute)
        return shape[1] if transposed else shape[0]
    return shape[-1]  # a weight reshaped to (outputs, inputs) first
