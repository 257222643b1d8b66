"""mixrt.serve.tensors: the Open Inference Protocol's tensors checked against a model's
declared inputs, decoded from JSON and binary data, and outputs encoded back (no MLServer:
the module does not need it)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.base.errors import InputError
from mixrt.serve.tensors import (DATATYPES, TensorSpec, datatype_of, decode, encode,
                                 encode_binary)

NUMERIC = [name for name in DATATYPES if name != "BYTES"]


def sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    """Distinct values of ``datatype`` including its extremes where it has them."""
    dtype = DATATYPES[datatype]
    count = int(np.prod(shape))
    if dtype == np.bool_:
        values = np.arange(count) % 3 == 0
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = np.arange(count, dtype=np.int64) % 100
        values = values.astype(dtype)
        values[0], values[-1] = info.min, info.max
    else:
        values = (np.arange(count) - 2.5).astype(dtype) / 3
        values[0] = np.finfo(dtype).max
        values[-1] = np.finfo(dtype).tiny
    return values.reshape(shape)


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def refused(spec, datatype, shape, data, *fragments):
    with pytest.raises(InputError) as caught:
        decode(spec, datatype, shape, data)
    message = str(caught.value)
    assert f"'{spec.name}'" in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_flat_list_round_trip(datatype):
    want = sample(datatype)
    spec = TensorSpec("x", datatype, (-1, 3))
    got = decode(spec, datatype, [2, 3], want.reshape(-1).tolist())
    same(got, want)
    assert encode(got) == (datatype, [2, 3], want.reshape(-1).tolist())


@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_nested_list_round_trip(datatype):
    want = sample(datatype, (2, 2, 3))
    spec = TensorSpec("x", datatype, (-1, 2, 3))
    same(decode(spec, datatype, [2, 2, 3], want.tolist()), want)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_binary_round_trip(datatype):
    want = sample(datatype)
    spec = TensorSpec("x", datatype, (-1, 3))
    raw = want.astype(want.dtype.newbyteorder("<")).tobytes()
    same(decode(spec, datatype, [2, 3], raw), want)
    same(decode(spec, datatype, [2, 3], bytearray(raw)), want)
    same(decode(spec, datatype, [2, 3], memoryview(raw)), want)
    assert encode_binary(want) == (datatype, [2, 3], raw)
    encoded_type, shape, data = encode_binary(want)
    same(decode(spec, encoded_type, shape, data), want)


def test_scalar_and_empty_tensors():
    same(decode(TensorSpec("s", "FP32", ()), "FP32", [], [1.5]), np.array(1.5, np.float32))
    same(decode(TensorSpec("s", "FP32", ()), "FP32", [], 1.5), np.array(1.5, np.float32))
    same(decode(TensorSpec("e", "INT32", (-1, 4)), "INT32", [0, 4], []),
         np.zeros((0, 4), np.int32))
    same(decode(TensorSpec("e", "INT32", (-1, 4)), "INT32", [0, 4], b""),
         np.zeros((0, 4), np.int32))


def test_bytes_json_round_trip():
    want = np.array([["a", "héllo"], ["", "z" * 40]], dtype=object)
    spec = TensorSpec("text", "BYTES", (-1, 2))
    got = decode(spec, "BYTES", [2, 2], ["a", "héllo", "", "z" * 40])
    assert got.dtype == object and got.shape == (2, 2) and got.tolist() == want.tolist()
    assert decode(spec, "BYTES", [2, 2], want.tolist()).tolist() == want.tolist()
    # bytes items (a codec's raw strings) come back as text
    assert decode(spec, "BYTES", [1, 2], [b"a", "b"]).tolist() == [["a", "b"]]
    assert encode(got) == ("BYTES", [2, 2], ["a", "héllo", "", "z" * 40])


def test_bytes_length_prefixed_binary_round_trip():
    items = ["a", "héllo", "", "z" * 300]
    raw = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in items)
    spec = TensorSpec("text", "BYTES", (-1,))
    got = decode(spec, "BYTES", [4], raw)
    assert got.dtype == object and got.tolist() == items
    assert encode_binary(got) == ("BYTES", [4], raw)
    assert decode(spec, *encode_binary(np.array(items, dtype=object))).tolist() == items
    assert decode(spec, "BYTES", [0], b"").shape == (0,)


# -- refusals, each naming the input ----------------------------------------------------------

def test_refuses_another_datatype():
    refused(TensorSpec("pixels", "FP32", (-1, 3)), "FP64", [1, 3], [1.0, 2.0, 3.0],
            "FP32", "FP64")


def test_refuses_an_unknown_datatype():
    refused(TensorSpec("pixels", "FP32", (-1, 3)), "FLOAT", [1, 3], [1.0, 2.0, 3.0],
            "unknown datatype", "'FLOAT'")
    refused(TensorSpec("pixels", "FP32", (-1, 3)), "BF16", [1, 3], b"\0" * 6, "'BF16'")


def test_refuses_the_wrong_rank():
    spec = TensorSpec("pixels", "FP32", (-1, 3))
    refused(spec, "FP32", [3], [1.0, 2.0, 3.0], "[-1, 3]", "[3]")
    refused(spec, "FP32", [1, 1, 3], [1.0, 2.0, 3.0], "[-1, 3]", "[1, 1, 3]")


def test_refuses_a_fixed_dimension_mismatch():
    refused(TensorSpec("pixels", "FP32", (-1, 3)), "FP32", [2, 2], [1.0] * 4,
            "[-1, 3]", "[2, 2]")
    refused(TensorSpec("pixels", "FP32", (2, -1)), "FP32", [1, 4], [1.0] * 4, "[2, -1]")


def test_refuses_a_negative_or_non_integer_dimension():
    spec = TensorSpec("pixels", "FP32", (-1, 3))
    refused(spec, "FP32", [-1, 3], [1.0] * 3, "not a count")
    refused(spec, "FP32", [1.0, 3], [1.0] * 3, "not a count")


def test_refuses_too_few_or_too_many_values():
    spec = TensorSpec("pixels", "FP32", (-1, 3))
    refused(spec, "FP32", [2, 3], [1.0] * 5, "5 values", "holds 6")
    refused(spec, "FP32", [2, 3], [1.0] * 7, "7 values", "holds 6")
    refused(spec, "FP32", [2, 3], [[1.0, 2.0, 3.0], [4.0, 5.0]], "5 values")
    strings = TensorSpec("text", "BYTES", (-1,))
    refused(strings, "BYTES", [3], ["a", "b"], "2 strings", "holds 3")
    refused(strings, "BYTES", [1], ["a", "b"], "2 strings", "holds 1")


def test_refuses_binary_data_of_the_wrong_length():
    spec = TensorSpec("pixels", "FP32", (-1, 3))
    refused(spec, "FP32", [2, 3], b"\0" * 23, "23 bytes", "24")
    refused(spec, "FP32", [2, 3], b"\0" * 28, "28 bytes", "24")
    refused(TensorSpec("ids", "INT64", (-1,)), "INT64", [2], np.arange(3).tobytes(),
            "24 bytes", "16")


def test_refuses_truncated_bytes_binary():
    spec = TensorSpec("text", "BYTES", (-1,))
    whole = struct.pack("<I", 5) + b"hello" + struct.pack("<I", 3) + b"abc"
    refused(spec, "BYTES", [2], whole[:-1], "runs past the end")
    refused(spec, "BYTES", [2], whole[:11], "ends inside a length")
    refused(spec, "BYTES", [1], struct.pack("<I", 1 << 20) + b"x", "runs past the end")
    # whole but not as many strings as the shape holds
    refused(spec, "BYTES", [3], whole, "2 strings", "holds 3")


def test_refuses_data_that_is_not_the_datatype():
    refused(TensorSpec("pixels", "FP32", (-1,)), "FP32", [2], ["a", "b"], "not FP32")
    refused(TensorSpec("ids", "INT64", (-1,)), "INT64", [2], [1, "x"], "not INT64")
    refused(TensorSpec("small", "UINT8", (-1,)), "UINT8", [1], [300], "not UINT8")
    refused(TensorSpec("pixels", "FP32", (-1,)), "FP32", [2], [1.0, [2.0]])
    refused(TensorSpec("text", "BYTES", (-1,)), "BYTES", [2], [1, 2])


# -- a real session's declared inputs and outputs -----------------------------------------

def _session_model() -> bytes:
    nodes = [helper.make_node("Identity", ["x"], ["y"]),
             helper.make_node("Cast", ["ids"], ["ids_out"], to=TensorProto.INT32),
             helper.make_node("Identity", ["text"], ["text_out"]),
             helper.make_node("SequenceConstruct", ["x", "x"], ["seq"])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [2, "n"]),
         helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("ids_out", TensorProto.INT32, [2, "n"]),
         helper.make_tensor_value_info("text_out", TensorProto.STRING, ["batch"]),
         helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    return model.SerializeToString()


def test_specs_of_a_sessions_node_args():
    session = mixrt.load(_session_model())
    inputs = {arg.name: TensorSpec.of(arg) for arg in session.get_inputs()}
    assert inputs == {"x": TensorSpec("x", "FP32", (-1, 3)),
                      "ids": TensorSpec("ids", "INT64", (2, -1)),
                      "text": TensorSpec("text", "BYTES", (-1,))}
    assert inputs["x"].batched and not inputs["ids"].batched
    assert inputs["x"].metadata() == {"name": "x", "datatype": "FP32", "shape": [-1, 3]}
    outputs = session.get_outputs()
    assert [TensorSpec.of(arg) for arg in outputs[:3]] == [
        TensorSpec("y", "FP32", (-1, 3)), TensorSpec("ids_out", "INT32", (2, -1)),
        TensorSpec("text_out", "BYTES", (-1,))]
    with pytest.raises(InputError, match=r"'seq' is a seq\(tensor\(float\)\).*tensors"):
        TensorSpec.of(outputs[3])
    # a request decoded against the specs runs
    x = decode(inputs["x"], "FP32", [2, 3], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    ids = decode(inputs["ids"], "INT64", [2, 1], np.array([7, 8], "<i8").tobytes())
    text = decode(inputs["text"], "BYTES", [2], ["p", "q"])
    y, ids_out, text_out = session.run(["y", "ids_out", "text_out"],
                                       {"x": x, "ids": ids, "text": text})
    assert encode(y) == ("FP32", [2, 3], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert encode(ids_out) == ("INT32", [2, 1], [7, 8])
    assert encode(text_out) == ("BYTES", [2], ["p", "q"])


def test_spec_of_an_unranked_or_unknown_type():
    class Arg:
        def __init__(self, name, type_, shape):
            self.name, self.type, self.shape = name, type_, shape

    assert TensorSpec.of(Arg("u", "tensor(float)", None)) == TensorSpec("u", "FP32", ())
    assert TensorSpec.of(Arg("d", "tensor(double)", [None, "s", 4])).shape == (-1, -1, 4)
    with pytest.raises(InputError, match="'b' is a tensor\\(bfloat16\\)"):
        TensorSpec.of(Arg("b", "tensor(bfloat16)", [2]))
    with pytest.raises(InputError, match="'m' is a map"):
        TensorSpec.of(Arg("m", "map(int64,tensor(float))", None))


# -- outputs ----------------------------------------------------------------------------------

def test_encode_float16_bool_int64_strings():
    half = np.array([[0.5, -2.0], [65504.0, 6.1e-5]], np.float16)
    assert encode(half) == ("FP16", [2, 2], [0.5, -2.0, 65504.0, float(np.float16(6.1e-5))])
    assert encode_binary(half) == ("FP16", [2, 2], half.astype("<f2").tobytes())
    flags = np.array([True, False, True])
    assert encode(flags) == ("BOOL", [3], [True, False, True])
    assert encode_binary(flags) == ("BOOL", [3], b"\x01\x00\x01")
    big = np.array([[-(2 ** 63), 2 ** 63 - 1]], np.int64)
    assert encode(big) == ("INT64", [1, 2], [-(2 ** 63), 2 ** 63 - 1])
    assert encode_binary(big) == ("INT64", [1, 2], struct.pack("<qq", -(2 ** 63),
                                                                2 ** 63 - 1))
    words = np.array(["ab", "", "ü"], dtype=object)
    assert encode(words) == ("BYTES", [3], ["ab", "", "ü"])
    assert encode_binary(words) == ("BYTES", [3], b"\x02\0\0\0ab" + b"\0\0\0\0"
                                    + b"\x02\0\0\0" + "ü".encode())
    assert encode(np.array(["ab", "c"])) == ("BYTES", [2], ["ab", "c"])  # a "<U" array
    assert encode_binary(np.array([b"ab", b"c"])) == ("BYTES", [2],
                                                      b"\x02\0\0\0ab\x01\0\0\0c")
    # non-contiguous arrays are encoded row-major
    grid = np.arange(6, dtype=np.int64).reshape(2, 3).T
    assert encode(grid) == ("INT64", [3, 2], [0, 3, 1, 4, 2, 5])
    assert encode_binary(grid)[2] == np.array([0, 3, 1, 4, 2, 5], "<i8").tobytes()


def test_encode_refuses_a_dtype_without_a_datatype():
    with pytest.raises(InputError, match="complex64"):
        encode(np.zeros(2, np.complex64))
    with pytest.raises(InputError, match="no Open Inference Protocol datatype"):
        datatype_of(np.dtype("datetime64[s]"))


def test_encode_bytes_elements_as_their_text():
    assert encode(np.array([b"ab", "c"], dtype=object)) == ("BYTES", [2], ["ab", "c"])


@pytest.mark.parametrize("datatype, data, told", [
    ("INT32", [1.5, 2.7], "fractions"), ("FP32", [None, 1.0], "null"),
    ("BOOL", ["x", ""], "strings"), ("UINT8", [300, 1], "outside UINT8's range"),
    ("INT64", [True, False], "booleans")])
def test_json_values_of_another_kind_are_refused_not_converted(datatype, data, told):
    refused(TensorSpec("v", datatype, (-1,)), datatype, [2], data, f"not {datatype}", told)


def test_a_boolean_is_not_a_dimension():
    refused(TensorSpec("v", "FP32", (-1,)), "FP32", [True], [1.0], "not a count")


def test_bytes_that_are_not_utf8_are_refused_not_altered():
    refused(TensorSpec("s", "BYTES", (-1,)), "BYTES", [1], [b"\xff\xfe"], "not UTF-8")
    refused(TensorSpec("s", "BYTES", (-1,)), "BYTES", [1],
            struct.pack("<I", 2) + b"\xff\xfe", "not UTF-8")
