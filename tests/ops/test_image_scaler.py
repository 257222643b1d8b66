"""ImageScaler (ai.onnx opsets 1-9, experimental, dropped from the spec; onnxruntime runs it,
and WinML's style-transfer and SqueezeNet exports carry it): against onnxruntime, in front
of a convolution as those exports have it, and refused with the node named where its bias
does not give one value per channel."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mixrt
from mixrt import errors


def _model(bias, scale, channels=3, conv=False):
    nodes = [helper.make_node("ImageScaler", ["x"], ["scaled"], name="preprocess",
                              bias=bias, scale=scale)]
    initializers, out = [], "scaled"
    if conv:
        weight = np.random.default_rng(0).standard_normal((4, channels, 3, 3)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, "w"))
        nodes.append(helper.make_node("Conv", ["scaled", "w"], ["y"], pads=[1, 1, 1, 1]))
        out = "y"
    graph = helper.make_graph(
        nodes, "scaler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, channels, 8, 8])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)


@pytest.mark.parametrize("bias, scale, conv", [([0.5, -1.0, 2.0], 0.25, False),
                                               ([-123.68, -116.78, -103.94], 1.0, True),
                                               ([0.0, 0.0, 0.0], 1 / 255, True)])
@pytest.mark.parametrize("batch", [1, 2])
def test_image_scaler_matches_onnxruntime(bias, scale, conv, batch):
    model = _model(bias, scale, conv=conv)
    x = (np.random.default_rng(batch).random((batch, 3, 8, 8)) * 255).astype(np.float32)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})
    session = mixrt.Session(model)
    for _ in range(2):  # the first run and a planned one
        mine = session.run(None, {"x": x})
        np.testing.assert_allclose(mine[0], theirs[0], rtol=1e-5, atol=1e-4)


def test_a_bias_that_is_not_one_value_per_channel_is_refused_naming_the_node():
    model = _model([0.5, -1.0], 1.0)
    with pytest.raises(errors.MixrtError, match="preprocess") as caught:
        mixrt.Session(model).run(None, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    assert "one per channel" in str(caught.value)
