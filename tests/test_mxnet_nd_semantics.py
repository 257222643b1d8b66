"""mixrt.nd against MXNet 1.9.1's own behaviour: every case of tests/mxnet_nd_cases.py gives
what MXNet gave (tests/mxnet_nd_expected.py, written by tools/mxnet_nd_expected.py with real
MXNet), then what the cases cannot say: views under autograd and the engine, MXNet's binary
NDArray file format byte for byte (the bytes below are files MXNet 1.9.1 wrote), damaged
files, and the errors."""

from __future__ import annotations

import itertools
import pickle
import struct

import numpy as np
import pytest

import mixrt
from mixrt import autograd, nd
from mixrt.errors import GradientError, InputError, ModelLoadError
from mixrt.nd import serialization
from mixrt.ops.device import gpu_available

from mxnet_nd_cases import CASES
from mxnet_nd_expected import EXPECTED


def _described(value):
    if isinstance(value, nd.NDArray):
        return {"shape": value.shape, "dtype": value.dtype.name,
                "values": value.asnumpy().tolist()}
    if isinstance(value, (list, tuple)):
        return [_described(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _assert_same(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{where}: {got!r}"
        assert (got["shape"], got["dtype"]) == (tuple(want["shape"]), want["dtype"]), where
        np.testing.assert_allclose(np.asarray(got["values"], dtype=np.float64),
                                   np.asarray(want["values"], dtype=np.float64),
                                   rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=where)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got!r}"
        for index, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{index}]")
    else:
        assert got == want, where


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_mxnet(name):
    _assert_same(_described(CASES[name](nd, autograd)), EXPECTED[name], name)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
@pytest.mark.parametrize("name", sorted(n for n in CASES if not n.startswith("repr")))
def test_matches_mxnet_on_the_gpu(name):  # (repr names the device: @gpu(0) there)
    with mixrt.gpu(0):  # every array the case makes without ctx= is made there
        got = CASES[name](nd, autograd)
    _assert_same(_described(got), EXPECTED[name], name)


# -- indexing: the keys of MXNet's test_ndarray_indexing ----------------------------------------
# NumPy's results, but (1,) for one element picked by integers; MXNet 1.9.1 gives the same for
# every key here, values, writes and gradients (checked once with MXNet itself)

def _np32(index):
    def cast(v):
        return v if v is None else np.int32(v)
    if isinstance(index, slice):
        return slice(cast(index.start), cast(index.stop), cast(index.step))
    return tuple(slice(cast(e.start), cast(e.stop), cast(e.step)) if isinstance(e, slice)
                 else cast(e) for e in index)


_S, _I32 = slice, np.int32
INDEX_KEYS = [
    0, _I32(0), np.int64(5), -1, _S(5), _np32(_S(1, 5)), _S(1, 5, 2), _S(7, 0, -1), _S(None, 6),
    _S(None, 6, 3), _S(1, None), _S(1, None, 3), _S(None, None, 2), _S(None, None, -1),
    _S(None, None, -2), (_S(None), _S(None), 1, 8), (_S(None), _S(None), -1, -8),
    _np32((_S(None), _S(None), 1, 8)), (_S(None), 2, _S(1, 5), 1), (1, 2, 3), (-1, -2, -3),
    (1, 2, 3, 4), (-4, -3, -2, -1), (_S(None, None, -1), 2, _S(1, 5), 1),
    (_S(None, None, -1), 2, _S(1, 7, 2), 1), (_S(1, 8, 2), _S(14, 2, -2), _S(3, 8), _S(0, 7, 3)),
    (_S(1, 8, 2), 1, _S(3, 8), 2), [1], [1, 2], [2, 1, 3], [7, 5, 0, 3, 6, 2, 1],
    np.array([6, 3], dtype=np.int32), np.array([[3, 4], [0, 6]], dtype=np.int32),
    np.array([[2], [0], [1]], dtype=np.int64), (1, [2, 3]),
    (1, [2, 3], np.array([[3], [0]], dtype=np.int32)),
    (1, [2], np.array([[5], [3]], dtype=np.int32), _S(None)),
    (1, [2, 3], np.array([[6], [0]], dtype=np.int32), _S(2, 5)),
    (1, [2, 3], np.array([[4], [7]], dtype=np.int32), _S(2, 5, 2)),
    (1, [2], np.array([[3]], dtype=np.int32), _S(None, None, -1)),
    (1, [2], np.array([[3]], dtype=np.int32), np.array([[5, 7], [2, 4]], dtype=np.int64)),
    ([1, 1], [2, 3]), ([1], [4], [5]), ([1], [4], [5], [6]), ([[1]], [[2]]),
    ([[1]], [[2]], [[3]], [[4]]), (_S(0, 2), [[1], [6]], _S(0, 2), _S(0, 5, 2)),
    ([[[[1]]]], [[1]], _S(0, 3), [1, 5]), ([[[[1]]]], 3, _S(0, 3), [1, 3]),
    ([[[[1]]]], 3, _S(0, 3), 0), ([[[[1]]]], [[2], [12]], _S(0, 3), _S(None)),
    ([1, 2], _S(3, 5), [2, 3], [3, 4]), ([1, 2], _S(3, 5), (2, 3), [3, 4])]
GRID = np.arange(8 * 16 * 9 * 9, dtype=np.int32).reshape(8, 16, 9, 9)


@pytest.mark.parametrize("key", INDEX_KEYS, ids=[repr(k)[:40] for k in INDEX_KEYS])
def test_indexing_gets_sets_and_differentiates_as_mxnet(key):
    x = nd.array(GRID, dtype=GRID.dtype)
    want = GRID[key]
    assert np.array_equal(x[key].asnumpy(), want.reshape(want.shape or (1,)))
    expected = GRID.copy()
    values = np.arange(want.size, dtype=np.int32).reshape(want.shape) - 50
    x[key] = values
    expected[key] = values
    assert np.array_equal(x.asnumpy(), expected)
    x = nd.array(GRID, dtype=GRID.dtype)
    x.attach_grad()
    with autograd.record():
        y = x[key]
    y.backward()
    hits = nd.zeros_like(x)
    hits[key] = nd.ones_like(y)  # MXNet's own check: ones where the key reads, once each
    assert np.array_equal(x.grad.asnumpy(), hits.asnumpy())


# -- views under autograd ------------------------------------------------------------------------

def _leaf():
    x = nd.array(np.arange(6.0).reshape(3, 2))
    x.attach_grad()
    return x


def test_a_recorded_slice_is_a_view_with_a_gradient():
    x = _leaf()
    with autograd.record():
        y = x[1:2]
        z = (y * 2).sum()
    z.backward()
    assert x.grad.asnumpy().tolist() == [[0, 0], [2, 2], [0, 0]]  # MXNet
    y[:] = 5  # after recording, the view still writes into x, as in MXNet
    assert x.asnumpy().tolist() == [[0, 1], [5, 5], [4, 5]]


def test_writing_a_recorded_view_while_recording_is_refused():
    x = _leaf()
    with autograd.record():
        y = x[1:2]
        with pytest.raises(GradientError, match="in-place write"):
            y[:] = 3  # MXNet: "Assigning to NDArrays that are already in a computational graph"


def test_a_write_through_a_view_invalidates_what_the_tape_saved():
    x = _leaf()
    data = nd.array(np.arange(6.0).reshape(3, 2))
    view = data[0:1]
    with autograd.record():
        loss = (x * data).sum()
    view[:] = 100  # changes `data`, which the product saved
    with pytest.raises(GradientError, match="modified in place"):
        loss.backward()


def test_a_write_to_the_base_invalidates_a_saved_reshape():
    x = _leaf()
    data = nd.array(np.arange(6.0))
    shaped = data.reshape((3, 2))
    with autograd.record():
        loss = (x * shaped).sum()
    data[:] = 0
    with pytest.raises(GradientError, match="modified in place"):
        loss.backward()


def test_a_view_of_a_leaf_taken_outside_recording_may_be_written_while_recording():
    x = _leaf()
    row = x[2]
    with autograd.record():
        row[:] = -1  # MXNet allows it: the view itself is not in the graph
    assert x.asnumpy().tolist() == [[0, 1], [2, 3], [-1, -1]]


@pytest.mark.parametrize("make", [
    lambda x: x.T, lambda x: x.expand_dims(0), lambda x: x.flatten(),
    lambda x: x.reshape((1, 6)).squeeze(), lambda x: nd.slice_axis(x, 1, 0, 2),
    lambda x: x[:, 1], lambda x: x[::-1], lambda x: nd.BlockGrad(x), lambda x: x.copy(),
], ids=["T", "expand_dims", "flatten", "squeeze", "slice_axis", "column", "reversed",
        "BlockGrad", "copy"])
def test_other_results_own_their_memory(make):
    x = nd.array(np.arange(6.0).reshape(2, 3))
    y = make(x)
    before = y.asnumpy().copy()
    x += 1  # MXNet: none of these sees it
    np.testing.assert_array_equal(y.asnumpy(), before)
    y[:] = -7
    assert x.asnumpy().min() == 1


def test_a_recorded_value_written_in_place_is_refused_as_in_mxnet():
    target, value = nd.zeros((3, 2)), _leaf()
    with autograd.record():
        with pytest.raises(GradientError, match=r"Inplace operations \(\+=, -=, x\[:\]=, etc\)"):
            target[0:3] = value * 2  # its gradient would be lost
        with pytest.raises(GradientError, match="Inplace operations"):
            target += value
        target[0:1] = 5  # a number, or an array off the tape, may be written (MXNet)
        target[1:2] = nd.ones((1, 2))


def test_contiguity_is_numpys():
    grid = np.arange(6 * 7 * 8 * 9).reshape(6, 7, 8, 9)
    slices = [slice(None), slice(2), slice(1, 4), slice(None, None, 2), slice(0, 1),
              slice(None, None, -1), slice(3, None, -2), slice(20)]
    for key in itertools.product(slices, repeat=3):
        assert nd.NDArray._basic_indexing_slice_is_contiguous(key, grid.shape) == \
            grid[key].flags.contiguous, key


def test_from_numpy_shares_the_memory_and_locks_the_numpy_array():
    host = np.array([[1, 2], [3, 4]], dtype=np.float32)
    for _ in range(2):  # a second from_numpy of the now read-only array shares it too
        shared = nd.from_numpy(host)
        with pytest.raises(ValueError):
            host[0, 0] = 9
        shared[1, 1] = 100
        assert host[1, 1] == 100
    with pytest.raises(ValueError, match="C-contiguous"):
        nd.from_numpy(np.ones((2, 3)).T)
    copied = nd.from_numpy(np.ones(2), zero_copy=False)
    assert copied.dtype == np.float64


def test_a_view_shares_its_bases_engine_tag():
    x = nd.zeros((4, 3))
    assert x[1:3].engine_var() is x.engine_var()
    assert x.reshape((3, 4)).engine_var() is x.engine_var()


def test_views_of_a_view_hang_from_the_first_base():
    x = nd.zeros((4, 3))
    inner = x[1:3][1]
    inner[:] = 9
    assert x.asnumpy()[2].tolist() == [9, 9, 9]
    assert inner._version == x._version == 1


# -- MXNet's binary NDArray files -------------------------------------------------------------------
# each the bytes MXNet 1.9.1's nd.save wrote

MX_DICT = bytes.fromhex(
    "120100000000000000000000000000000200000000000000c9fa93f90000000002000000020000000000"
    "000002000000000000000100000000000000000000000000803f000000400000404000008040c9fa93f9"
    "000000000100000001000000000000000100000000000000040000000500000002000000000000000100"
    "00000000000077010000000000000062")
MX_DTYPES = bytes.fromhex(
    "120100000000000000000000000000000600000000000000c9fa93f90000000001000000020000000000"
    "0000010000000000000001000000000000000000f83f00000000000000c0c9fa93f90000000001000000"
    "0200000000000000010000000000000002000000003e00c0c9fa93f90000000001000000020000000000"
    "000001000000000000000300000001fec9fa93f900000000010000000200000000000000010000000000"
    "00000500000001fec9fa93f9000000000100000002000000000000000100000000000000060000000100"
    "000000000000feffffffffffffffc9fa93f9000000000100000002000000000000000100000000000000"
    "0700000001010000000000000000")
MX_NP_SHAPE = bytes.fromhex(  # under mx.util.np_shape(True): zeros((0, 3)), array(3.0), ones(2)
    "120100000000000000000000000000000300000000000000cafa93f90000000002000000000000000000"
    "00000300000000000000010000000000000000000000cafa93f900000000000000000100000000000000"
    "0000000000004040cafa93f9000000000100000002000000000000000100000000000000000000000000"
    "803f0000803f0000000000000000")
MX_SCALAR_V2 = bytes.fromhex(  # nd.array(3.0) saved in the default mode (MXNet cannot load it)
    "120100000000000000000000000000000100000000000000c9fa93f900000000000000000100000000"
    "00000000000000000040400000000000000000")
MX_CSR = bytes.fromhex(
    "120100000000000000000000000000000100000000000000c9fa93f90200000001000000000000000000"
    "000002000000020000000000000002000000000000000100000000000000000000000600000001000000"
    "0300000000000000060000000100000002000000000000000000803f0000004000000000000000000100"
    "0000000000000200000000000000010000000000000000000000000000000000000000000000")
MX_ROW_SPARSE = bytes.fromhex(  # [[0, 0], [2, 0]] as row_sparse
    "120100000000000000000000000000000100000000000000c9fa93f90100000002000000000000000000"
    "000002000000000000000200000002000000000000000200000000000000010000000000000000000000"
    "06000000010000000100000000000000000000400000000001000000000000000000000000000000")
MX_STATE = bytes.fromhex(  # nd.array([1, 2]).__getstate__()["handle"]
    "c9fa93f9000000000100000002000000000000000100000000000000000000000000803f00000040")


def test_a_dict_is_written_byte_for_byte_as_mxnet_writes_it(tmp_path):
    data = {"w": nd.array([[1, 2], [3, 4]]), "b": nd.array([5], dtype="int32")}
    nd.save(tmp_path / "model.params", data)
    assert (tmp_path / "model.params").read_bytes() == MX_DICT
    loaded = nd.load(str(tmp_path / "model.params"))
    assert list(loaded) == ["w", "b"]
    assert loaded["w"].asnumpy().tolist() == [[1, 2], [3, 4]] and loaded["b"].dtype == np.int32


def test_every_dtype_mxnet_has_is_written_as_mxnet_writes_it():
    arrays = [nd.array([1.5, -2], dtype=d)
              for d in ["float64", "float16", "uint8", "int8", "int64", "bool"]]
    assert serialization.to_bytes(arrays) == MX_DTYPES
    loaded = nd.load_frombuffer(MX_DTYPES)
    assert [a.dtype.name for a in loaded] == ["float64", "float16", "uint8", "int8", "int64",
                                              "bool"]
    assert [a.asnumpy().tolist() for a in loaded] == [
        [1.5, -2.0], [1.5, -2.0], [1, 254], [1, -2], [1, -2], [True, True]]


def test_files_mxnet_wrote_load():
    shapes = [a.shape for a in nd.load_frombuffer(MX_NP_SHAPE)]
    assert shapes == [(0, 3), (), (2,)]
    scalar, = nd.load_frombuffer(MX_SCALAR_V2)
    assert scalar.shape == () and scalar.asnumpy().item() == 3.0


def test_zero_d_and_empty_arrays_are_written_in_mxnets_numpy_shape_records():
    arrays = [nd.zeros((0, 3)), nd.array(3.0), nd.ones((2,))]
    # MXNet's numpy-shape mode writes version 3 for all three; the last fits version 2,
    # which MXNet's default mode reads too
    v3, v2 = struct.pack("<I", serialization.V3_MAGIC), struct.pack("<I", serialization.V2_MAGIC)
    last = MX_NP_SHAPE.rindex(v3)
    assert serialization.to_bytes(arrays) == MX_NP_SHAPE[:last] + v2 + MX_NP_SHAPE[last + 4:]


@pytest.mark.parametrize("data", [
    [], [nd.array([1.0])], {"a": nd.zeros((2, 3), dtype="int8"), "é": nd.ones((1, 1, 1, 2))},
    nd.arange(6).reshape((2, 3)),
], ids=["empty", "list", "dict", "single"])
def test_round_trips(tmp_path, data):
    nd.save(str(tmp_path / "x"), data)
    loaded = nd.load(str(tmp_path / "x"))
    if isinstance(data, nd.NDArray):
        data = [data]  # MXNet: a single array comes back as a list of one
    pairs = zip(data.values(), loaded.values()) if isinstance(data, dict) else \
        zip(data, loaded)
    assert len(loaded) == len(data)
    for want, got in pairs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


def _legacy_record(version: int) -> bytes:
    """One float32 array of shape (2,) in MXNet's oldest record layouts."""
    if version == 1:
        head = struct.pack("<IIq", serialization.V1_MAGIC, 1, 2)
    else:
        head = struct.pack("<II", 1, 2)  # ndim, uint32 dims
    return head + struct.pack("<iii", 1, 0, 0) + np.array([7, 8], np.float32).tobytes()


@pytest.mark.parametrize("version", [0, 1])
def test_legacy_records_load(version):
    buffer = struct.pack("<QQQ", 0x112, 0, 1) + _legacy_record(version) + struct.pack("<Q", 0)
    loaded, = nd.load_frombuffer(buffer)
    assert loaded.asnumpy().tolist() == [7, 8] and loaded.dtype == np.float32


def test_every_truncation_is_a_model_load_error_naming_the_file(tmp_path):
    for cut in range(len(MX_DICT)):
        path = tmp_path / f"cut{cut}.params"
        path.write_bytes(MX_DICT[:cut])
        with pytest.raises(ModelLoadError, match=f"cut{cut}.params"):
            nd.load(str(path))
    with pytest.raises(ModelLoadError, match="buffer"):
        nd.load_frombuffer(MX_DICT[:-10])


@pytest.mark.parametrize("damage, words", [
    (lambda b: b"\x00" + b[1:], "list magic|0x112"),
    (lambda b: b + b"\x00", "bytes follow"),
    (lambda b: b[:16] + struct.pack("<Q", 1 << 40) + b[24:], "claims"),
    (lambda b: b[:24] + struct.pack("<I", 0xDEADBEEF) + b[28:], "no NDArray record"),
    (lambda b: b[:28] + struct.pack("<i", 9) + b[32:], "storage type 9"),
    (lambda b: b[:60] + struct.pack("<i", 99) + b[64:], "dtype code 99"),
    (lambda b: b[:52] + struct.pack("<i", 4) + b[56:], "device type 4"),
    (lambda b: b[:116] + struct.pack("<Q", 1) + b[124:], "1 names for 2 arrays"),
], ids=["magic", "trailing", "count", "record_magic", "stype", "dtype", "device", "names"])
def test_damaged_files_say_what_was_expected(damage, words):
    with pytest.raises(ModelLoadError, match=words):
        nd.load_frombuffer(damage(MX_DICT))


def test_sparse_records_are_parsed_and_refused_until_mixrt_has_sparse_arrays():
    with pytest.raises(ModelLoadError, match="csr storage"):
        nd.load_frombuffer(MX_CSR)
    seen = []
    serialization.SPARSE_BUILDERS["csr"] = seen.append
    try:
        nd.load_frombuffer(MX_CSR)
    finally:
        del serialization.SPARSE_BUILDERS["csr"]
    record, = seen
    assert record["shape"] == (2, 2) and record["data"].tolist() == [1.0, 2.0]
    assert [a.tolist() for a in record["aux"]] == [[0, 1, 2], [1, 0]]  # indptr, indices
    with pytest.raises(ModelLoadError, match="row_sparse storage"):
        nd.load_frombuffer(MX_ROW_SPARSE)
    serialization.SPARSE_BUILDERS["row_sparse"] = seen.append
    try:
        nd.load_frombuffer(MX_ROW_SPARSE)
    finally:
        del serialization.SPARSE_BUILDERS["row_sparse"]
    assert seen[1]["data"].tolist() == [[2.0, 0.0]] and seen[1]["aux"][0].tolist() == [1]


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        nd.load(str(tmp_path / "nope.params"))


@pytest.mark.parametrize("data, words", [
    (np.ones(2), "NDArray"), ({1: nd.ones(1)}, "str names"), ([nd.ones(1), 3], r"data\[1\]"),
    ([nd.array([1], dtype="complex64")], "complex64"),
])
def test_save_refuses_what_the_format_cannot_hold(tmp_path, data, words):
    with pytest.raises(InputError, match=words):
        nd.save(str(tmp_path / "x"), data)


def test_pickling_uses_mxnets_state():
    x = nd.array([1, 2])
    assert x.__getstate__() == {"handle": MX_STATE}
    y = pickle.loads(pickle.dumps(nd.array(np.arange(6.0).reshape(2, 3), dtype="float64")))
    assert y.dtype == np.float64 and y.asnumpy().tolist() == [[0, 1, 2], [3, 4, 5]]


# -- errors ---------------------------------------------------------------------------------------

def test_truth_of_several_elements_is_ambiguous():
    with pytest.raises(ValueError, match="ambiguous"):
        bool(nd.ones((2, 3)))
    with pytest.raises(InputError):
        bool(nd.ones((2,)))
    assert not bool(nd.zeros((0,)))


def test_shape_and_axis_errors_are_value_errors_as_in_mxnet():
    with pytest.raises(ValueError, match="reshape"):
        nd.zeros((2, 3, 5)).reshape((2, 3))
    for source, destination in [(3, 0), (-4, 0), (0, 5), ([0, 0], [0, 1]), ([0, 1], [1, 1]),
                                (0, [0, 1])]:
        with pytest.raises(ValueError):
            nd.moveaxis(nd.zeros((1, 2, 3)), source, destination)


def test_asscalar_and_len_refuse_what_mxnet_refuses():
    with pytest.raises(ValueError, match="one element"):
        nd.array([1, 2]).asscalar()
    with pytest.raises(TypeError, match="0-d"):
        len(nd.array(3.0))


@pytest.mark.parametrize("call, words", [
    (lambda: nd.moveaxis(nd.zeros((2, 3)), 0, 5), "destination"),
    (lambda: nd.swapaxes(nd.zeros((2, 3)), 0, 2), "dim2"),
    (lambda: nd.pad(nd.zeros((2, 3)), mode="wrap", pad_width=(0, 0, 1, 1)), "mode"),
    (lambda: nd.pad(nd.zeros((2, 3)), pad_width=(1, 1)), "pad_width"),
    (lambda: nd.elemwise_add(nd.zeros((2, 1)), nd.zeros((2, 2))), "same shape"),
    (lambda: nd.Crop(nd.zeros((1, 1, 4, 4)), h_w=(3, 3), offset=(2, 2)), "does not fit"),
    (lambda: nd.split_v2(nd.zeros(5), 2), "equal parts"),
    (lambda: nd.arange(0, 5, repeat=0), "repeat"),
    (lambda: nd.zeros((2, -1)), "negative"),
    (lambda: nd.linalg.potrf(nd.zeros((2, 3))), "square"),
    (lambda: nd.linalg.gelqf(nd.zeros((3, 2))), "no more rows"),
    (lambda: nd.linalg.maketrian(nd.zeros(4)), "triangle"),
    (lambda: nd.moments(nd.zeros(3)), "axes"),
    (lambda: nd.contrib.boolean_mask(nd.zeros((3, 2)), nd.ones(2)), "index"),
    (lambda: nd.ones((2,), out=nd.zeros((3,))), "out"),
    (lambda: nd.zeros((2,), stype="csr"), "2-D"),
    (lambda: nd.zeros((2, 2), stype="dense"), "stype"),
    (lambda: nd.array([1]).tostype("dense"), "stype"),
    (lambda: nd.broadcast_like(nd.ones((1, 2)), nd.ones((3, 2)), lhs_axes=(), rhs_axes=()),
     "at least one axis"),  # MXNet refuses empty axes too
])
def test_bad_arguments_raise_input_errors_naming_them(call, words):
    with pytest.raises(InputError, match=words):
        call()


def test_numpy_functions_on_ndarrays_give_ndarrays_as_with_mxnet():
    scores = nd.array([[0.3, 0.7], [0.0, 1.0], [0.4, 0.6]])
    picked = np.argmax(scores, axis=1)  # NumPy calls NDArray.argmax(axis=1, out=None)
    assert isinstance(picked, nd.NDArray) and picked.asnumpy().tolist() == [1, 1, 1]
    assert isinstance(np.sum(scores, axis=0), nd.NDArray) and np.sum(scores).shape == (1,)


def test_fresh_grad_says_whether_backward_wrote_the_gradient():
    x, y = nd.ones((2, 2)), nd.ones((2, 2))
    dx, dy = nd.zeros_like(x), nd.zeros_like(y)
    autograd.mark_variables([x, y], [dx, dy])
    assert not x._fresh_grad and not y._fresh_grad
    with autograd.record():
        total = x + 2 + y
    total.backward()
    assert x._fresh_grad and y._fresh_grad
    x._fresh_grad = y._fresh_grad = False
    with autograd.record():
        total = (x + 2).detach() + y
    total.backward()
    assert y._fresh_grad and not x._fresh_grad  # MXNet's test_detach_updated_grad


# -- names ---------------------------------------------------------------------------------------

MXNET_NDARRAY_METHODS = [
    "T", "abs", "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctanh", "argmax",
    "argmax_channel", "argmin", "argsort", "as_in_context", "as_nd_ndarray", "asnumpy",
    "asscalar", "astype", "attach_grad", "backward", "broadcast_axes", "broadcast_like",
    "broadcast_to", "cbrt", "ceil", "clip", "context", "copy", "copyto", "cos", "cosh", "ctx",
    "degrees", "depth_to_space", "detach", "diag", "dtype", "exp", "expand_dims", "expm1",
    "fix", "flatten", "flip", "floor", "grad", "log", "log10", "log1p", "log2", "log_softmax",
    "max", "mean", "min", "nanprod", "nansum", "ndim", "norm", "one_hot", "ones_like", "pad",
    "pick", "prod", "radians", "rcbrt", "reciprocal", "relu", "repeat", "reshape",
    "reshape_like", "rint", "round", "rsqrt", "shape", "shape_array", "sigmoid", "sign", "sin",
    "sinh", "size", "size_array", "slice", "slice_axis", "slice_like", "softmax", "softmin",
    "sort", "space_to_depth", "split", "split_v2", "sqrt", "square", "squeeze", "stype", "sum",
    "swapaxes", "take", "tan", "tanh", "tile", "to_dlpack_for_read", "to_dlpack_for_write",
    "topk", "tostype", "transpose", "trunc", "wait_to_read", "writable", "zeros_like"]


def test_ndarray_has_mxnets_methods():
    x = nd.zeros((2, 3))
    assert [name for name in MXNET_NDARRAY_METHODS if not hasattr(x, name)] == []


def test_fluent_methods_match_the_functions():
    x = nd.array(np.abs(np.arange(12.0).reshape(3, 4)) / 13 + 0.01)
    for name in ["sin", "arccos", "expm1", "log2", "rsqrt", "cbrt", "degrees", "nansum",
                 "softmin", "argmax_channel", "shape_array", "size_array"]:
        np.testing.assert_allclose(getattr(x, name)().asnumpy(),
                                   getattr(nd, name)(x).asnumpy(), rtol=1e-6)
    np.testing.assert_allclose(x.swapaxes(0, 1).asnumpy(), nd.swapaxes(x, 0, 1).asnumpy())
