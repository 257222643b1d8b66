"""The ONNX backend *node* cases as an export round trip: ONNX -> mixrt Graph -> ONNX -> run in
onnxruntime -> compare with the case's expected outputs.

Which cases: every node case mixrt passes today, that is, not in ``expected_failures.txt``.
``roundtrip_exceptions.txt`` lists (case  # reason) those that cannot round-trip; a listed
case that starts passing fails, as with the backend suite.

Each case is exported at its own opset and must pass onnx's full check. onnxruntime loads
models up to some opset (28 for onnxruntime 1.32, 26 for 1.31), and onnx's case generator
stamps many cases with its newest opset; a case above onnxruntime's is exported a second time
at the newest opset onnxruntime loads, which the exporter reaches by relabelling the unchanged
op (or with onnx's version converter), and that model is the one run. Loading an opset is not
having every op's newest version: onnxruntime 1.32 loads opset 28 but has no QuantizeLinear(28)
kernel, for one. Where it names a missing kernel, the case is exported again an opset lower,
down to where the exporter can no longer express it.

onnxruntime's Python API takes and returns NumPy arrays of the types NumPy has; the narrow
types (bfloat16, float8, int4, ...) go in and out as raw bytes here.
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx.backend.test.loader
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.backend.test.runner import Runner
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as MissingKernel

from conformance_suite import expected_failures
from mixrt.errors import ExportError
from mixrt.exporters.onnx import export_model
from mixrt.importers.onnx import import_model
from mixrt.ops.ir.dtypes import ONNX_TYPE_NAMES, to_numpy_dtype, to_onnx_type

EXCEPTIONS_FILE = Path(__file__).with_name("roundtrip_exceptions.txt")


def round_trip_exceptions() -> dict[str, str]:
    """Case name -> why it cannot round-trip, from the committed list."""
    exceptions = {}
    for line in EXCEPTIONS_FILE.read_text().splitlines():
        name, _, reason = line.partition("#")
        if name.strip():
            exceptions[name.strip()] = reason.strip()
    return exceptions


def node_cases() -> list:
    """The backend node cases mixrt passes: not expected failures, nor random draws."""
    failing = expected_failures()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators warn about their own casts
        cases = onnx.backend.test.loader.load_model_tests(kind="node")
    return [case for case in cases if case.name not in failing]


@functools.cache
def session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # errors only reach us as exceptions
    return options


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(),
                                providers=["CPUExecutionProvider"])


@functools.cache
def newest_runnable_opset() -> int:
    """The newest default-domain opset onnxruntime loads (it also caps the IR version)."""
    values = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [1]) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              values[:1], values[1:])
    for opset in range(onnx.defs.onnx_opset_version(), 12, -1):
        imports = [helper.make_opsetid("", opset)]
        model = helper.make_model(graph, opset_imports=imports,
                                  ir_version=helper.find_min_ir_version_for(imports))
        try:
            _session(model)
            return opset
        except Exception:  # noqa: BLE001  (onnxruntime's refusal is the answer)
            continue
    raise RuntimeError("onnxruntime loads no opset from 13 up")


# -- one case ----------------------------------------------------------------------------------

def round_trip(case) -> None:
    """Raise AssertionError (or the failing step's error) unless the case round-trips."""
    graph = import_model(case.model)
    model = export_model(graph)  # at the case's own opset; export_model runs the full check
    if _default_opset(model) > newest_runnable_opset():
        model = export_model(graph, newest_runnable_opset())
    session = _session_with_kernels(graph, model)
    names = [value.name for value in case.model.graph.input]
    for inputs, expected in case.data_sets:
        feeds = {name: _feed(_array(value)) for name, value in zip(names, inputs)}
        outputs = _run(session, feeds)
        Runner.assert_similar_outputs([_array(e) for e in expected], outputs,
                                      rtol=case.rtol, atol=case.atol)


def _session_with_kernels(graph, model: onnx.ModelProto) -> ort.InferenceSession:
    """A session for ``model``, or for ``graph`` exported at the newest lower opset whose
    op versions onnxruntime has kernels for; the first refusal where none has."""
    try:
        return _session(model)
    except MissingKernel as missing:
        for opset in range(_default_opset(model) - 1, 12, -1):
            try:
                return _session(export_model(graph, opset))
            except ExportError:  # the graph is not expressible this low: nothing lower is
                break
            except MissingKernel:
                continue
        raise missing


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _array(value):
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


# -- narrow types through onnxruntime's Python API ----------------------------------------------

_NARROW = {np.dtype(t) for t in (
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz,
    ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e8m0fnu,
    ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.float4_e2m1fn, ml_dtypes.int2, ml_dtypes.uint2)}
_NARROW_TYPE_TEXTS = {f"tensor({ONNX_TYPE_NAMES[to_onnx_type(d)]})" for d in _NARROW}
_BITS = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4,
         np.dtype(ml_dtypes.float4_e2m1fn): 4, np.dtype(ml_dtypes.int2): 2,
         np.dtype(ml_dtypes.uint2): 2}  # ONNX packs these several to a byte, ml_dtypes not


def _feed(value):
    """A NumPy array, or an OrtValue holding a narrow type's bytes."""
    if not isinstance(value, np.ndarray) or value.dtype not in _NARROW:
        return value
    element_type = to_onnx_type(value.dtype)
    bits = _BITS.get(value.dtype)
    if bits is None:
        raw = np.ascontiguousarray(value).view(f"u{value.dtype.itemsize}")
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(raw, element_type)
    # update_inplace counts NumPy elements, so packed bytes are copied in directly
    holder = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), element_type)
    packed = _pack(value, bits)
    ctypes.memmove(holder.data_ptr(), packed.ctypes.data,
                   min(packed.nbytes, holder.tensor_size_in_bytes()))
    return holder


def _run(session: ort.InferenceSession, feeds: dict) -> list:
    if not any(isinstance(v, ort.OrtValue) for v in feeds.values()) and \
            not any(o.type in _NARROW_TYPE_TEXTS for o in session.get_outputs()):
        return session.run(None, feeds)
    feeds = {k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
             for k, v in feeds.items()}
    return [_fetch(v) for v in session.run_with_ort_values(None, feeds)]


def _fetch(value: ort.OrtValue):
    """An output OrtValue as NumPy; narrow types read from its bytes."""
    dtype = to_numpy_dtype(value.element_type()) if value.is_tensor() else None
    if dtype not in _NARROW:
        return value.numpy()
    raw = np.frombuffer(ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()),
                        np.uint8)
    shape = tuple(value.shape())
    if dtype not in _BITS:
        return raw.view(dtype).reshape(shape).copy()
    return _unpack(raw, _BITS[dtype], dtype, shape)


def _pack(value: np.ndarray, bits: int) -> np.ndarray:
    """Sub-byte elements packed as ONNX stores them, the first in the lowest bits.
    ml_dtypes keeps one element per byte, its bit pattern in the low bits."""
    per_byte = 8 // bits
    codes = np.ascontiguousarray(value).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    codes = np.concatenate([codes, np.zeros(-codes.size % per_byte, np.uint8)])
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    return np.bitwise_or.reduce(codes.reshape(-1, per_byte) << shifts, axis=1).astype(np.uint8)


def _unpack(raw: np.ndarray, bits: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
    shifts = np.arange(8 // bits, dtype=np.uint8) * bits
    codes = ((raw[:, None] >> shifts) & ((1 << bits) - 1)).reshape(-1)[:int(np.prod(shape))]
    if "float" in dtype.name:
        return codes.astype(np.uint8).view(dtype).reshape(shape)
    values = codes.astype(np.int8)
    if dtype.name.startswith("int"):  # sign-extend the two's complement pattern
        values = np.where(values >= 1 << (bits - 1), values - (1 << bits), values)
    return values.astype(dtype).reshape(shape)
