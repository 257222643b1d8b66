"""onnxruntime's quantized lookups (ops/quant/contrib_quant_lookup.py) against onnxruntime:
GatherBlockQuantized over uint8 (2, 4 and 8 bits), int4 and uint4 tables, and
QEmbedLayerNormalization over int8 and uint8 tables; each on one-node models and on the
models onnxruntime's own quantizers write (MatMulNBitsQuantizer with Gather, and
quantize_dynamic of an EmbedLayerNormalization); bad operands named with their node."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                            MatMulNBitsQuantizer)

import mixrt
from mixrt.errors import MixrtError

MS = "com.microsoft"
f32 = np.float32


def node_model(op_type, inputs, outputs, *, constants=(), node_name="lookup", **attrs):
    """One com.microsoft node; ``inputs`` are (name, array or None for an absent optional
    input), those named in ``constants`` become initializers; ``outputs`` (name, dtype)."""
    node = helper.make_node(op_type, [n if v is not None else "" for n, v in inputs],
                            [n for n, _ in outputs], domain=MS, name=node_name, **attrs)
    present = [(n, v) for n, v in inputs if v is not None]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in present if n not in constants],
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), None)
         for n, d in outputs],
        initializer=[numpy_helper.from_array(v, n) for n, v in present if n in constants])
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def run_both(model, feeds):
    data = model.SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = mixrt.Session(data).run(None, feeds)
    return ours, theirs


def assert_same(ours, theirs, atol=0.0):
    assert len(ours) == len(theirs)
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=0,
                                   atol=atol)


# -- GatherBlockQuantized ---------------------------------------------------------------------

def packed(codes, bits):
    """Codes (uint8, below 2^bits) packed along the last axis, low bits first."""
    per_byte = 8 // bits
    width = -(-codes.shape[-1] // per_byte) * per_byte
    padded = np.zeros(codes.shape[:-1] + (width,), np.uint8)
    padded[..., :codes.shape[-1]] = codes
    grouped = padded.reshape(codes.shape[:-1] + (-1, per_byte)).astype(np.uint16)
    return (grouped << (np.arange(per_byte) * bits)).sum(-1).astype(np.uint8)


def uint8_table(rng, rows, columns, bits, block_size, with_zero_points, scale_dtype=f32):
    blocks = -(-columns // block_size)
    codes = rng.integers(0, 1 << bits, (rows, columns)).astype(np.uint8)
    scales = (rng.random((rows, blocks)) * 0.1 + 0.01).astype(scale_dtype)
    zero_points = None
    if with_zero_points:
        zero_codes = rng.integers(0, 1 << bits, (rows, blocks)).astype(np.uint8)
        zero_points = packed(zero_codes, bits) if bits < 8 else zero_codes
    return (packed(codes, bits) if bits < 8 else codes), scales, zero_points


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("with_zero_points", [False, True])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_uint8_tables_match_onnxruntime(bits, with_zero_points, index_dtype):
    rng = np.random.default_rng(bits * 10 + with_zero_points)
    data, scales, zero_points = uint8_table(rng, 11, 48, bits, 16, with_zero_points)
    indices = np.array([[0, 3, -1], [10, 3, 7]], index_dtype)
    model = node_model("GatherBlockQuantized",
                       [("data", data), ("indices", indices), ("scales", scales),
                        ("zero_points", zero_points)], [("y", f32)],
                       constants=("data", "scales", "zero_points"), bits=bits, block_size=16,
                       gather_axis=0, quantize_axis=1)
    ours, theirs = run_both(model, {"indices": indices})
    assert ours[0].shape == (2, 3, 48)
    assert_same(ours, theirs)


def test_a_last_block_shorter_than_block_size_and_float16_scales():
    rng = np.random.default_rng(3)
    data, scales, zero_points = uint8_table(rng, 5, 40, 4, 32, True, scale_dtype=np.float16)
    indices = np.array([4, 0, 2], np.int64)
    model = node_model("GatherBlockQuantized",
                       [("data", data), ("indices", indices), ("scales", scales),
                        ("zero_points", zero_points)], [("y", np.float16)],
                       constants=("data", "scales", "zero_points"), bits=4, block_size=32)
    ours, theirs = run_both(model, {"indices": indices})
    assert ours[0].dtype == np.float16
    assert_same(ours, theirs)


@pytest.mark.parametrize("code_dtype", [ml_dtypes.int4, ml_dtypes.uint4])
@pytest.mark.parametrize("gather_axis, quantize_axis", [(0, 1), (1, 0), (0, 2), (2, 1)])
def test_4_bit_tables_on_any_axes(code_dtype, gather_axis, quantize_axis):
    rng = np.random.default_rng(gather_axis * 3 + quantize_axis)
    low, high = (-8, 8) if code_dtype == ml_dtypes.int4 else (0, 16)
    shape = (6, 20, 5) if 2 in (gather_axis, quantize_axis) else (6, 20)
    data = rng.integers(low, high, shape).astype(code_dtype)
    scale_shape = list(shape)
    scale_shape[quantize_axis] = -(-shape[quantize_axis] // 16)
    scales = (rng.random(scale_shape) * 0.2 + 0.01).astype(f32)
    zero_points = rng.integers(low, high, scale_shape).astype(code_dtype)
    indices = np.array([[1, 0], [-1, 2]], np.int64)
    model = node_model("GatherBlockQuantized",
                       [("data", data), ("indices", indices), ("scales", scales),
                        ("zero_points", zero_points)], [("y", f32)],
                       constants=("data", "scales", "zero_points"), bits=4, block_size=16,
                       gather_axis=gather_axis, quantize_axis=quantize_axis)
    ours, theirs = run_both(model, {"indices": indices})
    assert_same(ours, theirs)


def test_int4_without_zero_points_centres_on_zero():
    data = np.array([[-8, 7] * 8], ml_dtypes.int4)
    scales = np.array([[0.5]], f32)
    indices = np.array([0], np.int64)
    model = node_model("GatherBlockQuantized", [("data", data), ("indices", indices),
                                                ("scales", scales)], [("y", f32)],
                       constants=("data", "scales"), block_size=16)
    ours, theirs = run_both(model, {"indices": indices})
    assert ours[0][0, :2].tolist() == [-4.0, 3.5]
    assert_same(ours, theirs)


def test_an_index_outside_the_table_is_refused_naming_the_node():
    rng = np.random.default_rng(4)
    data, scales, _ = uint8_table(rng, 4, 32, 4, 16, False)
    indices = np.array([1, 4], np.int64)
    model = node_model("GatherBlockQuantized", [("data", data), ("indices", indices),
                                                ("scales", scales)], [("y", f32)],
                       constants=("data", "scales"), block_size=16, node_name="embed_q4")
    session = mixrt.Session(model.SerializeToString())
    with pytest.raises(MixrtError, match="embed_q4.*gathered axis has 4 entries"):
        session.run(None, {"indices": indices})


@pytest.mark.parametrize("attrs, message", [
    (dict(block_size=24), "power of two"),
    (dict(bits=3), "expected 2, 4 or 8"),
    (dict(gather_axis=1, quantize_axis=0), "gather_axis 0"),
])
def test_bad_attributes_are_refused_naming_the_node(attrs, message):
    rng = np.random.default_rng(5)
    data, scales, _ = uint8_table(rng, 4, 32, 4, 16, False)
    indices = np.array([1], np.int64)
    model = node_model("GatherBlockQuantized", [("data", data), ("indices", indices),
                                                ("scales", scales)], [("y", f32)],
                       constants=("data", "scales"), node_name="bad_gather",
                       **{"block_size": 16, **attrs})
    with pytest.raises(MixrtError, match=f"bad_gather.*{message}"):
        mixrt.Session(model.SerializeToString()).run(None, {"indices": indices})


def test_scales_of_the_wrong_shape_are_refused():
    rng = np.random.default_rng(6)
    data, scales, _ = uint8_table(rng, 4, 32, 4, 16, False)
    indices = np.array([1], np.int64)
    model = node_model("GatherBlockQuantized", [("data", data), ("indices", indices),
                                                ("scales", scales[:, :1])], [("y", f32)],
                       constants=("data", "scales"), block_size=16, node_name="short_scales")
    with pytest.raises(MixrtError, match="short_scales.*scales has shape"):
        mixrt.Session(model.SerializeToString()).run(None, {"indices": indices})


def test_the_nbits_quantizer_s_embedding_gather_matches_onnxruntime(tmp_path):
    """A token embedding and an LM head, quantized to 4 bits by onnxruntime's
    MatMulNBitsQuantizer with Gather among the ops, as for a decoder's embedding table."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((50, 64)).astype(f32)
    head = rng.standard_normal((64, 50)).astype(f32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["x"]),
         helper.make_node("MatMul", ["x", "head"], ["logits"])], "lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(head, "head")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False,
                                          op_types_to_quantize=("MatMul", "Gather"),
                                          quant_axes=(("MatMul", 0), ("Gather", 1)))
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    path = tmp_path / "lm_q4.onnx"
    quantizer.model.save_model_to_file(str(path), False)
    written = {node.op_type for node in quantizer.model.model.graph.node}
    assert {"GatherBlockQuantized", "MatMulNBits"} <= written
    ids = rng.integers(0, 50, (2, 7)).astype(np.int64)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"ids": ids})
    ours = mixrt.Session(str(path)).run(None, {"ids": ids})
    assert_same(ours, theirs, atol=2e-5)


# -- QEmbedLayerNormalization -----------------------------------------------------------------

def quantized(rng, shape, dtype):
    info = np.iinfo(dtype)
    codes = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    scale = np.array(rng.random() * 0.02 + 0.005, f32)
    zero_point = np.array(rng.integers(info.min // 4, info.max // 4), dtype)
    return codes, scale, zero_point


def qembed_inputs(rng, dtype, *, batch=2, length=5, vocab=30, hidden=24, segments=True,
                  mask=True):
    ids = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    tables = {"word_embedding": quantized(rng, (vocab, hidden), dtype),
              "position_embedding": quantized(rng, (length + 3, hidden), dtype),
              "segment_embedding": quantized(rng, (2, hidden), dtype),
              "gamma": quantized(rng, (hidden,), dtype),
              "beta": quantized(rng, (hidden,), dtype)}
    if not segments:
        tables["segment_embedding"] = (None, None, None)
    mask_values = (rng.random((batch, length)) > 0.3).astype(np.int32) if mask else None
    suffix = {"word_embedding": "_quant", "position_embedding": "_quant", "gamma": "_quant",
              "beta": "_quant", "segment_embedding": ""}
    codes = [(name + suffix[name], tables[name][0]) for name in tables]
    inputs = [("input_ids", ids),
              ("segment_ids", rng.integers(0, 2, ids.shape).astype(np.int32)
               if segments else None),
              *codes[:3], *codes[3:], ("mask", mask_values)]
    inputs += [(f"{name}_scale", tables[name][1]) for name in tables]
    inputs += [(f"{name}_zero_point", tables[name][2]) for name in tables]
    return inputs


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("segments, mask", [(True, True), (False, True), (True, False)])
def test_qembed_layer_normalization_matches_onnxruntime(dtype, segments, mask):
    rng = np.random.default_rng(8 + segments * 2 + mask)
    inputs = qembed_inputs(rng, dtype, segments=segments, mask=mask)
    constants = tuple(name for name, _ in inputs
                      if name not in ("input_ids", "segment_ids", "mask"))
    model = node_model("QEmbedLayerNormalization", inputs,
                       [("y", f32), ("mask_index", np.int32)], constants=constants,
                       epsilon=1e-12)
    feeds = {n: v for n, v in inputs if v is not None and n not in constants}
    ours, theirs = run_both(model, feeds)
    assert_same(ours[1:], theirs[1:])
    assert_same(ours[:1], theirs[:1])


def test_qembed_an_id_outside_the_table_is_refused_naming_the_node():
    rng = np.random.default_rng(12)
    inputs = qembed_inputs(rng, np.uint8)
    constants = tuple(name for name, _ in inputs
                      if name not in ("input_ids", "segment_ids", "mask"))
    model = node_model("QEmbedLayerNormalization", inputs, [("y", f32), ("m", np.int32)],
                       constants=constants, node_name="qembed")
    feeds = {n: v for n, v in inputs if v is not None and n not in constants}
    feeds["input_ids"] = feeds["input_ids"].copy()
    feeds["input_ids"][1, 2] = 30
    with pytest.raises(MixrtError, match="qembed.*input_ids hold ids from .* to 30; word_embedding has rows 0 to 29"):
        mixrt.Session(model.SerializeToString()).run(None, feeds)


def test_quantize_dynamic_of_bert_embeddings_matches_onnxruntime(tmp_path):
    """An EmbedLayerNormalization model through quantize_dynamic, as onnxruntime's
    quantizer rewrites an optimized BERT's embedding layer."""
    rng = np.random.default_rng(13)
    hidden = 32
    weights = {"word": rng.standard_normal((40, hidden)), "position": rng.standard_normal(
        (16, hidden)), "segment": rng.standard_normal((2, hidden)),
        "gamma": 1 + 0.1 * rng.standard_normal(hidden), "beta": 0.1 * rng.standard_normal(hidden)}
    node = helper.make_node("EmbedLayerNormalization",
                            ["ids", "segments", "word", "position", "segment", "gamma", "beta",
                             "mask"], ["y", "mask_index"], domain=MS, epsilon=1e-12)
    graph = helper.make_graph(
        [node], "embeddings",
        [helper.make_tensor_value_info(n, TensorProto.INT32, ["b", "s"])
         for n in ("ids", "segments", "mask")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("mask_index", TensorProto.INT32, None)],
        initializer=[numpy_helper.from_array(v.astype(f32), n) for n, v in weights.items()])
    source, target = tmp_path / "embed.onnx", tmp_path / "embed_q.onnx"
    model = helper.make_model(graph, ir_version=9, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    source.write_bytes(model.SerializeToString())
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QUInt8)
    assert any(n.op_type == "QEmbedLayerNormalization" for n in onnx.load(target).graph.node)
    feeds = {"ids": rng.integers(0, 40, (3, 9)).astype(np.int32),
             "segments": rng.integers(0, 2, (3, 9)).astype(np.int32),
             "mask": np.array([[1] * 9, [1] * 5 + [0] * 4, [1] * 2 + [0] * 7], np.int32)}
    theirs = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(
        None, feeds)
    ours = mixrt.Session(str(target)).run(None, feeds)
    assert_same(ours[1:], theirs[1:])
    assert_same(ours[:1], theirs[:1])
