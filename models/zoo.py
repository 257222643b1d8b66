"""The 9 "light" zoo models that ship inside the onnx package, with their reference outputs.

They are real ImageNet architectures (ResNet-50, VGG-19, DenseNet-121, Inception v1/v2,
SqueezeNet, ShuffleNet, ZFNet-512, AlexNet) whose weights onnx replaced by constants to keep
the package small; their reference outputs were computed by onnx from the input below.
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
