"""mixrt.nd as MXNet users know it: making arrays, operators, indexing, the common methods,
leaving mixrt (asnumpy, DLPack without copies), and devices that never meet silently.
GPU tests skip cleanly on a machine without one."""

import time

import mixrt
from mixrt import autograd, nd
from mixrt.context import Context
from mixrt.errors import DeviceMismatchError, ExecutionError, GradientError, InputError
from mixrt.nd import NDArray
from mixrt.ops.device import gpu_available

import numpy as np
import pytest

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")


def _close(got: NDArray, expected, **tolerance):
    np.testing.assert_allclose(got.asnumpy(), np.asarray(expected), **tolerance)


# -- making arrays -------------------------------------------------------------------------

@pytest.mark.parametrize("source, dtype, expected", [
    ([[1, 2], [3, 4]], None, np.float32),  # lists and numbers: float32, as in MXNet
    (3, None, np.float32),
    ([True, False], None, np.float32),
    (np.arange(3), None, np.float32),  # NumPy data too, as MXNet 1.9.1 does
    (np.ones(2, np.float64), None, np.float32),
    (np.ones(2, np.float16), None, np.float32),
    (np.ones(2, np.float64), np.float64, np.float64),
    ([1, 2], np.int32, np.int32),  # dtype= wins
    (np.ones(2, np.float64), "float32", np.float32),
])
def test_array_dtype_rules(source, dtype, expected):
    a = nd.array(source, dtype=dtype)
    assert a.dtype == expected
    np.testing.assert_array_equal(a.asnumpy(), np.asarray(source).astype(expected))
    assert a.context == mixrt.cpu() == a.ctx


def test_array_copies_its_source():
    source = np.zeros(3, np.float32)
    a = nd.array(source)
    source[0] = 5
    assert a.asnumpy()[0] == 0
    b = nd.array(a, dtype=np.float64)
    a[1] = 7
    assert b.dtype == np.float64 and b.asnumpy()[1] == 0


def test_filled_arrays():
    assert nd.zeros((2, 3)).dtype == np.float32
    np.testing.assert_array_equal(nd.zeros((2, 3)).asnumpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(nd.ones(4, dtype="int64").asnumpy(), np.ones(4, np.int64))
    assert nd.ones(4, dtype="int64").dtype == np.int64
    full = nd.full((2, 2), 7, dtype=np.int32)
    assert full.dtype == np.int32 and full.asnumpy().tolist() == [[7, 7], [7, 7]]
    assert nd.full(3, 0.5).asnumpy().tolist() == [0.5, 0.5, 0.5]
    empty = nd.empty((3, 2))
    assert empty.shape == (3, 2) and empty.dtype == np.float32
    x = nd.array([[1, 2]], dtype=np.int64)
    assert nd.zeros_like(x).dtype == np.int64 and nd.zeros_like(x).asnumpy().tolist() == [[0, 0]]
    assert nd.ones_like(x).asnumpy().tolist() == [[1, 1]]


def test_arange():
    np.testing.assert_array_equal(nd.arange(5).asnumpy(), np.arange(5, dtype=np.float32))
    assert nd.arange(5).dtype == np.float32
    np.testing.assert_array_equal(nd.arange(2, 8, 2).asnumpy(), [2, 4, 6])
    np.testing.assert_array_equal(nd.arange(0, 1, 0.25).asnumpy(), [0, 0.25, 0.5, 0.75])
    a = nd.arange(1, 5, dtype="int64")
    assert a.dtype == np.int64 and a.asnumpy().tolist() == [1, 2, 3, 4]


def test_properties():
    a = nd.zeros((2, 3, 4))
    assert (a.shape, a.size, a.ndim, len(a)) == ((2, 3, 4), 24, 3, 2)
    assert a.stype == "default" and a.context == a.device == mixrt.cpu(0)
    assert "<NDArray 2x3x4 @cpu(0)>" in repr(a)


# -- operators -----------------------------------------------------------------------------

A = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
B = np.array([0.5, -1.0, 2.0], np.float32)


@pytest.mark.parametrize("name, ours, expected", [
    ("add", lambda a, b: a + b, A + B),
    ("sub", lambda a, b: a - b, A - B),
    ("mul", lambda a, b: a * b, A * B),
    ("div", lambda a, b: a / b, A / B),
    ("pow", lambda a, b: a ** b, A ** B),
    ("matmul", lambda a, b: a @ b.reshape(3, 1), A @ B.reshape(3, 1)),
    ("add_scalar", lambda a, b: a + 1, A + 1),
    ("radd_scalar", lambda a, b: 1 + a, 1 + A),
    ("rsub_scalar", lambda a, b: 10 - a, 10 - A),
    ("rmul_scalar", lambda a, b: 2.5 * a, 2.5 * A),
    ("rdiv_scalar", lambda a, b: 1 / a, 1 / A),
    ("rpow_scalar", lambda a, b: 2 ** a, 2 ** A),
    ("pow_scalar", lambda a, b: a ** 2, A ** 2),
    ("mod_scalar", lambda a, b: a % 4, np.fmod(A, 4)),
    ("neg", lambda a, b: -a, -A),
    ("abs", lambda a, b: abs(-a), A),
    ("pos", lambda a, b: +a, A),
    ("numpy_left", lambda a, b: np.float32(2) * a, 2 * A),
    ("numpy_array_left", lambda a, b: np.ones(3, np.float32) + a, 1 + A),
])
def test_arithmetic(name, ours, expected):
    got = ours(nd.array(A), nd.array(B))
    assert isinstance(got, NDArray), name
    assert got.dtype == np.float32, name
    _close(got, expected, rtol=1e-6)


def test_scalars_keep_the_array_dtype():
    ints = nd.array([1, 2, 3], dtype=np.int64)
    assert (ints + 2).dtype == np.int64 and (ints * 2).asnumpy().tolist() == [2, 4, 6]
    doubles = nd.array(np.ones(2), dtype="float64")
    assert (doubles * 0.1).dtype == np.float64
    _close(doubles * 0.1, [0.1, 0.1], rtol=1e-15)  # the scalar was not rounded to float32


@pytest.mark.parametrize("ours, expected", [
    (lambda a: a == 2, A == 2),
    (lambda a: a != 2, A != 2),
    (lambda a: a > 2, A > 2),
    (lambda a: a >= 2, A >= 2),
    (lambda a: a < 2, A < 2),
    (lambda a: a <= 2, A <= 2),
    (lambda a: 2 < a, A > 2),  # reflected
    (lambda a: a == a, np.ones_like(A, bool)),
])
def test_comparisons(ours, expected):
    got = ours(nd.array(A))
    np.testing.assert_array_equal(got.asnumpy().astype(bool), expected)


def test_inplace_operators_write_into_the_same_array():
    a = nd.array(A)
    data = a._data
    a += 1
    a -= nd.array(B)
    a *= 2
    a /= 4
    assert a._data is data
    _close(a, (A + 1 - B) * 2 / 4, rtol=1e-6)
    with pytest.raises(InputError, match="shape"):
        a_row = nd.ones(3)
        a_row += nd.ones((2, 3))  # broadcasting may not grow the target


def test_inplace_on_a_recorded_array_raises_gradient_error():
    x = nd.array(A)
    x.attach_grad()
    with autograd.record():
        y = x * 2
        with pytest.raises(GradientError, match="in-place"):
            y += 1
        with pytest.raises(GradientError, match="autograd.pause"):
            x += 1
    with autograd.pause():
        x += 1
    _close(x, A + 1)


# -- indexing ------------------------------------------------------------------------------

M = np.arange(24, dtype=np.float32).reshape(4, 6)


@pytest.mark.parametrize("key", [
    1, -1, (2, 3), (-1, -2), slice(1, 3), (slice(None), slice(None, None, 2)),
    (slice(None, None, -1), 2), (Ellipsis, 1), None, (1, slice(-3, None)),
    np.array([3, 0, 3]), (np.array([0, 2]), np.array([1, 5])),
], ids=repr)
def test_getitem_matches_numpy(key):
    got = nd.array(M)[key]
    np.testing.assert_array_equal(got.asnumpy(), M[key])


def test_getitem_with_index_arrays_and_masks():
    m = nd.array(M)
    rows = nd.array([2, 0], dtype=np.int64)
    np.testing.assert_array_equal(m[rows].asnumpy(), M[[2, 0]])
    # MXNet 1.9.1: a mask's 0/1 values index rows 0 and 1 (they do not select)
    np.testing.assert_array_equal(m[m > 20].asnumpy(), M[(M > 20).astype(int)])
    np.testing.assert_array_equal(m[nd.array([1], dtype=np.int64)[0]].asnumpy(), M[[1]])


def test_getitem_of_a_row_is_a_view_as_in_mxnet():
    m = nd.array(M)
    row = m[1]
    row[:] = 0
    expected = M.copy()
    expected[1] = 0
    np.testing.assert_array_equal(m.asnumpy(), expected)
    column = m[:, 1]  # not contiguous: a copy, as in MXNet
    column[:] = -5
    np.testing.assert_array_equal(m.asnumpy(), expected)


@pytest.mark.parametrize("key, value", [
    (0, 5.0), (-1, np.arange(6)), ((1, 2), -3.0), ((slice(None), 0), 9.0),
    (slice(1, 3), np.ones((2, 6))), (np.array([0, 2]), 7.0), ((Ellipsis, -1), 1.5),
], ids=repr)
def test_setitem_matches_numpy(key, value):
    m, expected = nd.array(M), M.copy()
    m[key] = value
    expected[key] = value
    np.testing.assert_array_equal(m.asnumpy(), expected)


def test_setitem_with_arrays():
    m, expected = nd.array(M), M.copy()
    m[1:3, 2] = nd.array([10, 20])
    m[nd.array([0], dtype=np.int64)] = nd.full((1, 6), -1)
    m[:] = m * 2
    expected[1:3, 2] = [10, 20]
    expected[[0]] = -1
    np.testing.assert_array_equal(m.asnumpy(), expected * 2)


def test_iterating_gives_rows():
    rows = list(nd.array(M))
    assert len(rows) == 4
    np.testing.assert_array_equal(rows[2].asnumpy(), M[2])


# -- common methods ------------------------------------------------------------------------

def test_reshape_spellings():
    a = nd.array(M)
    assert a.reshape(3, 8).shape == (3, 8)
    assert a.reshape((2, -1)).shape == (2, 12)
    assert a.reshape([24]).shape == (24,)
    assert nd.reshape(a, (6, 4)).shape == (6, 4)
    np.testing.assert_array_equal(a.reshape(2, 3, 4).asnumpy(), M.reshape(2, 3, 4))
    assert a.flatten().shape == (4, 6) and nd.zeros((2, 3, 4)).flatten().shape == (2, 12)
    assert a.expand_dims(1).shape == (4, 1, 6)
    assert nd.zeros((1, 3, 1)).squeeze().shape == (3,)
    assert nd.zeros((1, 3, 1)).squeeze(axis=0).shape == (3, 1)


def test_transpose_and_T():
    a = nd.array(M.reshape(2, 3, 4))
    np.testing.assert_array_equal(a.T.asnumpy(), M.reshape(2, 3, 4).T)
    np.testing.assert_array_equal(a.transpose(1, 0, 2).asnumpy(),
                                  M.reshape(2, 3, 4).transpose(1, 0, 2))
    np.testing.assert_array_equal(nd.transpose(a, (2, 0, 1)).asnumpy(),
                                  M.reshape(2, 3, 4).transpose(2, 0, 1))


@pytest.mark.parametrize("method, axis, keepdims", [
    ("sum", None, False), ("sum", 1, False), ("sum", (0, 1), True), ("sum", -1, True),
    ("mean", None, False), ("mean", 0, True), ("max", None, False), ("max", 1, False),
    ("min", 0, False), ("prod", 1, False),
])
def test_reductions(method, axis, keepdims):
    values = M / 10 + 1
    got = getattr(nd.array(values), method)(axis=axis, keepdims=keepdims)
    expected = getattr(values, method)(axis=axis, keepdims=keepdims)
    assert got.shape == (np.shape(expected) or (1,))  # MXNet: (1,) where NumPy gives ()
    _close(got, expected, rtol=1e-5)


def test_module_level_reductions_and_norm():
    a = nd.array(M)
    _close(nd.sum(a, axis=0), M.sum(0))
    _close(nd.mean(a), M.mean())
    _close(nd.max(a, axis=1), M.max(1))
    _close(a.norm(), np.linalg.norm(M), rtol=1e-6)


def test_argmax_argmin():
    values = np.array([[1, 9, 3], [7, 2, 8]], np.float32)
    a = nd.array(values)
    assert a.argmax(axis=1).asnumpy().tolist() == [1, 2]
    assert a.argmax(axis=0).asnumpy().tolist() == [1, 0, 1]
    assert a.argmin(axis=1, keepdims=True).asnumpy().tolist() == [[0], [1]]


def test_astype():
    a = nd.array([1.7, -2.2, 3.0])
    ints = a.astype(np.int32)
    assert ints.dtype == np.int32 and ints.asnumpy().tolist() == [1, -2, 3]
    assert a.astype("float64").dtype == np.float64
    assert a.astype(np.float32, copy=False) is a
    same = a.astype(np.float32)
    assert same is not a and same.dtype == np.float32


def test_copy_owns_its_memory():
    a = nd.array(M)
    b = a.copy()
    b += 1
    np.testing.assert_array_equal(a.asnumpy(), M)
    np.testing.assert_array_equal(b.asnumpy(), M + 1)
    assert not np.shares_memory(a._data, b._data)


def test_copyto_an_array_and_a_context():
    a = nd.array(M)
    target = nd.zeros((4, 6))
    assert a.copyto(target) is target
    np.testing.assert_array_equal(target.asnumpy(), M)
    moved = a.copyto(mixrt.cpu())
    assert moved is not a and not np.shares_memory(moved._data, a._data)
    np.testing.assert_array_equal(moved.asnumpy(), M)
    with pytest.raises(InputError, match="shapes differ"):
        a.copyto(nd.zeros(3))


def test_as_in_context():
    a = nd.array(M)
    assert a.as_in_context(mixrt.cpu(0)) is a
    other = a.as_in_context(Context("cpu", 1))
    assert other.ctx == Context("cpu", 1)
    np.testing.assert_array_equal(other.asnumpy(), M)


def test_everyday_functions():
    a, b = nd.array(A), nd.array(B)
    _close(nd.dot(a, a, transpose_b=True), A @ A.T)
    _close(nd.dot(a, a, transpose_a=True), A.T @ A)
    _close(nd.relu(a - 3), np.maximum(A - 3, 0))
    _close(nd.sigmoid(a), 1 / (1 + np.exp(-A)), rtol=1e-6)
    _close(nd.tanh(a), np.tanh(A), rtol=1e-6)
    _close(nd.exp(a), np.exp(A), rtol=1e-6)
    _close(nd.log(a), np.log(A), rtol=1e-6)
    _close(nd.sqrt(a), np.sqrt(A), rtol=1e-6)
    _close(nd.square(a), A * A)
    _close(a.softmax(), np.exp(A) / np.exp(A).sum(1, keepdims=True), rtol=1e-6)
    _close(nd.log_softmax(a, axis=0), A - np.log(np.exp(A).sum(0)), rtol=1e-6)
    _close(nd.clip(a, 2, 5), np.clip(A, 2, 5))
    _close(nd.maximum(a, b), np.maximum(A, B))
    _close(nd.minimum(a, b), np.minimum(A, B))
    _close(nd.concat(a, a, dim=0), np.concatenate([A, A], 0))
    _close(nd.stack(b, b, axis=1), np.stack([B, B], 1))
    _close(nd.where(a > 3, a, nd.zeros_like(a)), np.where(A > 3, A, 0))


def test_numbers_beside_a_condition_take_the_values_dtype():
    ints = nd.array([1, 2, 3], dtype=np.int32)
    chosen = nd.where(ints > 1, ints, 5)
    assert chosen.dtype == np.int32 and chosen.asnumpy().tolist() == [5, 2, 3]
    floats = nd.array([1.0, 2.0, 3.0])
    assert nd.where(floats > 1, 7, floats).asnumpy().tolist() == [1, 7, 7]
    assert nd.where(floats > 2, 0.5, -1.5).asnumpy().tolist() == [-1.5, -1.5, 0.5]
    assert nd.maximum(2, floats).asnumpy().tolist() == [2, 2, 3]
    assert nd.minimum(floats, 2).asnumpy().tolist() == [1, 2, 2]


def test_dot_of_higher_rank_arrays():
    a, b = np.ones((2, 3, 4), np.float32), np.arange(20, dtype=np.float32).reshape(4, 5)
    _close(nd.dot(nd.array(a), nd.array(b)), a @ b)
    _close(nd.array(a[0, 0]).dot(nd.array(b)), a[0, 0] @ b)


def test_registered_ops_take_sym_arguments():
    x = nd.array(np.arange(12, dtype=np.float32).reshape(3, 4))
    w = nd.array(np.ones((2, 4), np.float32))
    _close(nd.Gemm(x, w, nd.array([1.0, 2.0]), transB=1, alpha=2.0),
           2 * np.arange(12).reshape(3, 4) @ np.ones((4, 2)) + [1, 2])
    first, second = nd.Split(x, axis=1, num_outputs=2)
    _close(second, np.arange(12).reshape(3, 4)[:, 2:])
    out = nd.zeros((3, 4))
    assert nd.Relu(x - 5, out=out) is out
    _close(out, np.maximum(np.arange(12).reshape(3, 4) - 5, 0))
    with pytest.raises(InputError, match="unknown argument 'transC'"):
        nd.Gemm(x, w, transC=1)
    with pytest.raises(InputError, match="required input"):
        nd.Gemm(x)


def test_an_imperative_op_gets_the_node_state_a_session_node_gets(monkeypatch):
    """A registered op that keeps state per session node (a convolution's packed layouts)
    gets one dict per op and attributes imperatively too, so it takes the same kernels as in
    a hybridized graph; another dict for other attributes."""
    from mixrt import dispatch
    from mixrt.ops.conv import conv_cpu
    seen = []
    real = conv_cpu.direct
    monkeypatch.setattr(conv_cpu, "direct", lambda *a, **k: seen.append(k["node"]) or
                        real(*a, **k))
    x = nd.array(np.ones((2, 8, 32, 32), np.float32))
    w = nd.array(np.ones((8, 8, 3, 3), np.float32))
    first = nd.Conv(x, w, pads=[1, 1, 1, 1])
    nd.Conv(x, w, pads=[1, 1, 1, 1])
    nd.Conv(x, w, pads=[0, 0, 0, 0])
    assert seen[0] is seen[1] and seen[0] is not seen[2] and isinstance(seen[0], dict)
    assert "varying" in seen[0]  # the direct path kept its layouts there
    _close(first[:, :, 1:-1, 1:-1], np.full((2, 8, 30, 30), 72.0))
    assert len(dispatch._node_states) >= 2


# -- leaving mixrt -------------------------------------------------------------------------

def test_asnumpy_asscalar_float():
    a = nd.array(M)
    host = a.asnumpy()
    host[0, 0] = 100
    assert a.asnumpy()[0, 0] == 0  # asnumpy is a copy
    assert nd.array([2.5]).asscalar() == 2.5
    assert float(nd.array([[2.5]])) == 2.5 and int(nd.array([3.7])) == 3
    assert nd.array([7], dtype=np.int64).asscalar() == 7
    assert a.sum().asscalar() == M.sum()
    assert bool(nd.array([1])) and not bool(nd.array([0]))
    assert a.tolist() == M.tolist()
    np.testing.assert_array_equal(np.asarray(a), M)
    copied = np.array(a)  # NumPy's copy=True must give a copy, not the array's memory
    copied[0, 0] = 100
    assert a.asnumpy()[0, 0] == 0
    assert np.array(a, dtype=np.float64).dtype == np.float64
    with pytest.raises(InputError, match="one element"):
        a.asscalar()


def test_waitall():
    a = nd.array(M)
    b = (a * 2).sum()
    nd.waitall()
    assert b.wait_to_read() is b
    assert b.asscalar() == 2 * M.sum()


def test_reads_wait_for_pushed_engine_writes_and_waitall_raises_their_errors():
    from mixrt.errors import EngineError
    from mixrt.runtime.engine import get_engine
    a = nd.zeros(3)

    def fill():
        time.sleep(0.05)
        a._data[:] = 7

    get_engine().push(fill, writes=[a.engine_var()], name="fill")
    assert a.asnumpy().tolist() == [7, 7, 7]  # the read waited for the write

    def fail():
        raise ValueError("boom")

    get_engine().push(fail, writes=[nd.zeros(1).engine_var()], name="failing_fill")
    with pytest.raises(EngineError, match="failing_fill"):
        nd.waitall()
    nd.waitall()  # raised once, then cleared


def test_from_dlpack_of_numpy_shares_memory():
    host = np.zeros((2, 3), np.float32)
    a = nd.from_dlpack(host)
    assert a.ctx == mixrt.cpu() and np.shares_memory(a._data, host)
    host[0, 1] = 5  # write through NumPy, see through mixrt
    assert a.asnumpy()[0, 1] == 5
    a[1, 2] = 7  # write through mixrt, see through NumPy
    assert host[1, 2] == 7


def test_numpy_from_dlpack_of_ndarray_shares_memory():
    a = nd.array(M)
    view = np.from_dlpack(a)
    assert np.shares_memory(view, a._data)
    view[0, 0] = -1
    assert a.asnumpy()[0, 0] == -1
    a[3, 5] = -2
    assert view[3, 5] == -2


def test_torch_dlpack_both_ways_shares_memory():
    torch = pytest.importorskip("torch")
    a = nd.array(M)
    tensor = torch.from_dlpack(a)
    assert tensor.data_ptr() == a._data.ctypes.data
    tensor[0, 0] = -1
    assert a.asnumpy()[0, 0] == -1
    a[1, 1] = -2
    assert tensor[1, 1].item() == -2

    source = torch.arange(6, dtype=torch.float64)
    b = nd.from_dlpack(source)
    assert b.dtype == np.float64 and b._data.ctypes.data == source.data_ptr()
    source[0] = 42
    assert b.asnumpy()[0] == 42


# -- devices -------------------------------------------------------------------------------

def _elsewhere(values):
    """An array on a second context, without needing a second device to exist."""
    return NDArray(np.asarray(values, np.float32), Context("cpu", 1))


@pytest.mark.parametrize("op_type, call", [
    ("Add", lambda a, b: a + b),
    ("Mul", lambda a, b: a * b),
    ("MatMul", lambda a, b: a.reshape(1, 3) @ b.reshape(3, 1)),
    ("Gemm", lambda a, b: nd.Gemm(a.reshape(1, 3), b.reshape(1, 3), transB=1)),
    ("Concat", lambda a, b: nd.concat(a, b, dim=0)),
])
def test_host_contexts_mix_as_in_mxnet(op_type, call):
    """cpu(1) and cpu(0) are both host memory: MXNet 1.9.1 runs the op and puts the result
    on the first input's context (a cpu_shared or cpu_pinned one's on cpu of its id). A GPU
    and the host do not mix (test_gpu_and_cpu_arrays_never_meet)."""
    there, here = _elsewhere([1, 2, 3]), nd.ones(3)
    assert call(there, here).context == Context("cpu", 1)
    assert call(here, there).context == Context("cpu", 0)
    shared = nd.ones(3, ctx=Context("cpu_shared", 1))
    assert call(shared, here).context == Context("cpu", 1)


def test_device_mismatch_in_indexing_and_setitem():
    here = nd.zeros(3)
    with pytest.raises(DeviceMismatchError, match=r"setitem.*cpu\(1\).*cpu\(0\)"):
        here[:] = _elsewhere([1, 2, 3])
    index = NDArray(np.array([0]), Context("cpu", 1))
    with pytest.raises(DeviceMismatchError, match=r"index.*cpu\(1\).*cpu\(0\)"):
        here[index]


def test_as_in_context_moves_across_and_gradients_come_back():
    there = _elsewhere([1, 2, 3])
    there.attach_grad()
    with autograd.record():
        here = there.as_in_context(mixrt.cpu(0))
        y = (here * nd.array([1, 10, 100])).sum()
    assert here.ctx == mixrt.cpu(0)
    y.backward()
    assert there.grad.ctx == Context("cpu", 1)
    _close(there.grad, [1, 10, 100])


def test_default_context_scope():
    with Context("cpu", 1):
        assert nd.zeros(2).ctx == Context("cpu", 1)
        assert nd.array([1]).ctx == Context("cpu", 1)
    assert nd.zeros(2).ctx == mixrt.cpu(0)
    assert mixrt.cpu(1) == Context("cpu", 1) and mixrt.cpu(1) != mixrt.cpu(0)
    assert hash(mixrt.gpu(0)) == hash(Context("gpu", 0)) and repr(mixrt.gpu(2)) == "gpu(2)"
    with pytest.raises(InputError, match="context type"):
        Context("tpu", 0)


@pytest.mark.skipif(gpu_available(), reason="checks the error on a machine without a GPU")
def test_gpu_without_a_gpu_is_a_clear_error():
    from mixrt.errors import DeviceUnavailableError
    with pytest.raises(DeviceUnavailableError):
        with mixrt.gpu(0):
            pass
    with pytest.raises(DeviceUnavailableError):
        mixrt.context.gpu_memory_info(0)


@needs_gpu
def test_gpu_results_match_the_cpu():
    values = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    here, there = nd.array(values), nd.array(values, ctx=mixrt.gpu(0))
    assert there.ctx == mixrt.gpu(0)
    for f in (lambda a: (a @ a.T + 1).relu(), lambda a: a.softmax().sum(axis=0),
              lambda a: a[1:3] * 2 - a[0], lambda a: nd.Gemm(a, a, transB=1)):
        got = f(there)
        assert got.ctx == mixrt.gpu(0)
        np.testing.assert_allclose(got.asnumpy(), f(here).asnumpy(), rtol=1e-5, atol=1e-6)
    free, total = mixrt.context.gpu_memory_info(0)
    assert 0 < free <= total


@needs_gpu
def test_an_out_of_range_index_on_the_gpu_raises_at_its_op():
    """CuPy would wrap it around; the imperative op checks on the device and says so."""
    table = nd.array(np.arange(6, dtype=np.float32).reshape(3, 2), ctx=mixrt.gpu(0))
    rows = nd.Gather(table, nd.array([2, -3], ctx=mixrt.gpu(0), dtype="int64"), axis=0)
    assert rows.asnumpy().tolist() == [[4, 5], [0, 1]]
    for bad in ([0, 3], [-4, 0]):
        with pytest.raises(ExecutionError, match=r"Gather.*index within \[-3, 3\)"):
            nd.Gather(table, nd.array(bad, ctx=mixrt.gpu(0), dtype="int64"), axis=0)


@needs_gpu
def test_gpu_and_cpu_arrays_never_meet():
    with pytest.raises(DeviceMismatchError, match=r"gpu\(0\).*cpu\(0\)|cpu\(0\).*gpu\(0\)"):
        nd.ones(3, ctx=mixrt.gpu(0)) + nd.ones(3)
    with pytest.raises(DeviceMismatchError, match=r"^Concat: .*as_in_context"):
        nd.concat(nd.ones(3), nd.ones(3, ctx=mixrt.gpu(0)), dim=0)


@needs_gpu
def test_gpu_gradients_match_the_cpu():
    values = np.random.default_rng(1).standard_normal((3, 4))
    grads = []
    for ctx in (mixrt.cpu(), mixrt.gpu(0)):
        x = nd.array(values, ctx=ctx)
        x.attach_grad()
        with autograd.record():
            y = (x.sigmoid() * x).sum()
        y.backward()
        assert x.grad.ctx == ctx
        grads.append(x.grad.asnumpy())
    # float32 on both: the GPU's expf may round a last bit differently from NumPy's
    assert grads[0].dtype == grads[1].dtype == np.float32
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6)


@needs_gpu
def test_gpu_dlpack_with_cupy_shares_memory():
    cupy = pytest.importorskip("cupy")
    source = cupy.arange(6, dtype=cupy.float32)
    a = nd.from_dlpack(source)
    assert a.ctx == mixrt.gpu(source.device.id) and a._data.data.ptr == source.data.ptr
    source[0] = 9
    assert a.asnumpy()[0] == 9
    back = cupy.from_dlpack(a)
    assert back.data.ptr == source.data.ptr


@needs_gpu
def test_gpu_dlpack_with_torch_shares_memory():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    a = nd.array(M, ctx=mixrt.gpu(0))
    tensor = torch.from_dlpack(a)
    assert tensor.is_cuda and tensor.data_ptr() == a._data.data.ptr
    tensor[0, 0] = -1
    assert a.asnumpy()[0, 0] == -1
    b = nd.from_dlpack(torch.ones(3, device="cuda"))
    assert b.ctx == mixrt.gpu(0) and b.asnumpy().tolist() == [1, 1, 1]


@pytest.mark.parametrize("make", [lambda x: nd.BlockGrad(x), lambda x: nd.Identity(x),
                                  lambda x: nd.Dropout(x, 0.5), lambda x: x.astype("float32")],
                         ids=["BlockGrad", "Identity", "Dropout-not-training", "same-astype"])
def test_an_op_that_returns_its_input_gives_a_new_array(make):
    """Writing into the result of an identity op must not change its input (the kernels
    return the input itself; MXNet's ops give a new array)."""
    x = nd.array(np.ones(3, np.float32))
    y = make(x)
    y[:] = 5
    np.testing.assert_array_equal(x.asnumpy(), [1, 1, 1])
    np.testing.assert_array_equal(y.asnumpy(), [5, 5, 5])
