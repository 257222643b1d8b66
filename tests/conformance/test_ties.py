"""The conformance cases left out as ties (expected_failures.txt, "tie"): their expected
output is a softmax over logits that are all equal in exact arithmetic, so it holds only if
every float32 sum rounds identically. Here the logits themselves are checked against the
same network run in float64: they must agree to float32 precision."""

from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, numpy_helper

import mixrt

from conformance_suite import TIE, expected_failures

TIE_CASES = sorted(name for name, reason in expected_failures().items()
                   if reason.startswith(TIE))
LIGHT = Path(onnx.backend.test.__file__).parent / "data" / "light"


def _logits_model(name: str, dtype) -> bytes:
    """The light model with its final Softmax dropped (its input is the output), in float32
    or with every float tensor widened to float64."""
    model = onnx.load(LIGHT / f"light_{name}.onnx")
    (softmax,) = [n for n in model.graph.node if n.op_type == "Softmax"]
    model.graph.node.remove(softmax)
    model.graph.output[0].name = softmax.input[0]
    if dtype == np.float64:
        for index, tensor in enumerate(model.graph.initializer):
            if tensor.data_type == TensorProto.FLOAT:
                wide = numpy_helper.to_array(tensor).astype(np.float64)
                model.graph.initializer[index].CopyFrom(numpy_helper.from_array(wide,
                                                                                tensor.name))
        for node in model.graph.node:  # the light models' weights come from these
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR and \
                        attribute.t.data_type == TensorProto.FLOAT:
                    # the float32 weight's exact value, in float64
                    wide = numpy_helper.to_array(attribute.t).astype(np.float64)
                    attribute.t.CopyFrom(numpy_helper.from_array(wide))
        for value in list(model.graph.input) + list(model.graph.output):
            if value.type.tensor_type.elem_type == TensorProto.FLOAT:
                value.type.tensor_type.elem_type = TensorProto.DOUBLE
        del model.graph.value_info[:]
    return model.SerializeToString()


def _ramp(model_bytes: bytes, dtype) -> dict:
    """onnx's runner's input for light models: arange(n) / n in the input's shape."""
    model = onnx.load_from_string(model_bytes)
    (value,) = [v for v in model.graph.input
                if v.name not in {t.name for t in model.graph.initializer}]
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    count = int(np.prod(shape))
    return {value.name: (np.arange(count).reshape(shape) / count).astype(np.float32)
            .astype(dtype)}


def test_there_is_a_tie_case():
    assert TIE_CASES == ["test_squeezenet"]


@pytest.mark.parametrize("case", TIE_CASES)
def test_the_logits_before_the_tie_match_float64(case):
    name = case.removeprefix("test_")
    narrow, wide = _logits_model(name, np.float32), _logits_model(name, np.float64)
    (got,) = mixrt.Session(narrow).run(None, _ramp(narrow, np.float32))
    (want,) = mixrt.Session(wide).run(None, _ramp(wide, np.float64))
    assert got.dtype == np.float32 and got.shape == want.shape
    scale = np.abs(want).max()
    assert scale > 1e9  # the magnitude at which one ulp decides the tie
    assert np.abs(got - want).max() <= 1e-6 * scale
