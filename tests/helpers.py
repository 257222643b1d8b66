"""Small builders for test models."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def add_model(shape=(2, 3), opset=21, dtype=TensorProto.FLOAT, names=("x", "y")):
    """z = x + y: the smallest model that exercises feeds of two inputs."""
    node = helper.make_node("Add", list(names), ["z"], name="add_node")
    inputs = [helper.make_tensor_value_info(n, dtype, list(shape)) for n in names]
    graph = helper.make_graph([node], "add", inputs,
                              [helper.make_tensor_value_info("z", dtype, list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def weighted_model(weight: np.ndarray, external: dict | None = None):
    """y = x * w with ``w`` an initializer, optionally marked external with ``external``."""
    tensor = numpy_helper.from_array(weight, "w")
    if external is not None:
        tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in external.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    node = helper.make_node("Mul", ["x", "w"], ["y"], name="scale")
    graph = helper.make_graph(
        [node], "weighted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(weight.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(weight.shape))],
        initializer=[tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def save(model, path) -> str:
    with open(path, "wb") as handle:
        handle.write(model.SerializeToString())
    return str(path)
