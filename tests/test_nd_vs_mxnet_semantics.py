"""mixrt.nd and mixrt.autograd against MXNet 1.9.1's imperative API, where a differential
audit found mixrt silently returning something else. The expected values are MXNet's, as it
printed them (written down here: MXNet is not needed to run these). Full reductions,
comparisons, views from indexing and argmax's dtype follow MXNet since 2026-11-24
(tests/test_mxnet_nd_semantics.py); the differences left are listed in
mixrt/nd/ndarray.py's module docstring."""

import numpy as np
import pytest

from mixrt import autograd, nd
from mixrt.errors import InputError

X = [[1.5, -2.0, 3.0], [0.0, 4.5, -1.0]]
XI = [[7, -7, 3], [0, 5, -2]]


def _x():
    return nd.array(X)


def _xi():
    return nd.array(XI, dtype="int32")


def _same(got, expected, dtype):
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    np.testing.assert_allclose(got.asnumpy(), np.asarray(expected), rtol=1e-6)


# -- comparison results in arithmetic --------------------------------------------------------
# MXNet's comparisons give 0/1 in the input's dtype, so masks are arithmetic:
#   (x > 0).sum() -> [3.] float32; (x == x).mean() -> [1.]; (x > 0) + 1 -> 2/1 float32.
# mixrt's are bool (documented); NumPy's bool arithmetic made these True/False (logical),
# and `(x > 0) * x` dropped out of the tape.

def test_comparison_masks_sum_and_average_as_numbers():
    x = _x()
    _same((x > 0).sum(), 3.0, "float32")  # MXNet: [3.] (shape (1,))
    _same((x == x).mean(), 1.0, "float32")  # MXNet: [1.]
    _same((x > 0).mean(), 0.5, "float32")


@pytest.mark.parametrize("expr, expected, dtype", [
    (lambda x, xi: (x > 0) + 1, [[2, 1, 2], [1, 2, 1]], "float32"),
    (lambda x, xi: 1 - (x > 0), [[0, 1, 0], [1, 0, 1]], "float32"),
    (lambda x, xi: (x > 0) - (x < 0), [[1, -1, 1], [0, 1, -1]], "float32"),
    (lambda x, xi: (x > 0) * x, [[1.5, 0, 3], [0, 4.5, 0]], "float32"),
    (lambda x, xi: (xi > 0) * xi, [[7, 0, 3], [0, 5, 0]], "int32"),  # MXNet: int32
], ids=["plus_one", "one_minus", "sign", "mask_times_x", "int_mask"])
def test_comparison_masks_in_arithmetic(expr, expected, dtype):
    _same(expr(_x(), _xi()), expected, dtype)


def test_gradient_flows_through_a_mask_on_the_left():
    # MXNet: d/dx ((x > 0) * x + x).sum() = (x > 0) + 1 = [[2,1,2],[1,2,1]]; mixrt gave all
    # ones (the product was not recorded because its first input was bool)
    x = _x()
    x.attach_grad()
    with autograd.record():
        y = ((x > 0) * x + x).sum()
    y.backward()
    _same(x.grad, [[2, 1, 2], [1, 2, 1]], "float32")
    with autograd.record():
        y = (x * (x > 1)).sum()
    y.backward()
    _same(x.grad, [[1, 0, 1], [0, 1, 0]], "float32")  # MXNet


def test_where_with_only_numbers_beside_the_condition_is_float32():
    floats = nd.array([1.0, 2.0, 3.0])
    _same(nd.where(floats > 2, 0.5, -1.5), [-1.5, -1.5, 0.5], "float32")


# -- Python numbers beside integer arrays ------------------------------------------------------
# MXNet casts the scalar to the array's dtype (as mixrt.sym's CastLike does): int32 + 1.5 is
# int32 + 1. mixrt gave float64 (NumPy promoting int32 with a float32 scalar).

@pytest.mark.parametrize("expr, expected, dtype", [
    (lambda xi: xi + 1.5, [[8, -6, 4], [1, 6, -1]], "int32"),
    (lambda xi: xi * 0.5, [[0, 0, 0], [0, 0, 0]], "int32"),
    (lambda xi: 3.5 / nd.array([1, 2], dtype="int32"), [3, 1], "int32"),
    (lambda xi: nd.array([1, 4], dtype="int32") ** 0.5, [1, 1], "int32"),
    (lambda xi: nd.array([1, 2, 5], dtype="int32").clip(1.5, 4.5), [1, 2, 4], "int32"),
    (lambda xi: nd.array([1, 2], dtype="uint8") + 300, [45, 46], "uint8"),  # wraps
    (lambda xi: xi / 2, [[3, -3, 1], [0, 2, -1]], "int32"),
    (lambda xi: 10 / nd.array([3, -3, 4], dtype="int32"), [3, -3, 2], "int32"),
    (lambda xi: nd.ones((2,), dtype="float16") * 2.5, [2.5, 2.5], "float16"),
], ids=["add", "mul", "rdiv", "pow", "clip", "uint8_wrap", "div", "rdiv_int", "float16"])
def test_numbers_take_the_arrays_dtype(expr, expected, dtype):
    _same(expr(_xi()), expected, dtype)


def test_inplace_add_of_a_float_number_to_ints():
    xi = _xi()
    xi += 1.7  # MXNet: [[8,-6,4],[1,6,-1]]; mixrt gave [[8,-5,4],[1,6,0]] (added in float)
    _same(xi, [[8, -6, 4], [1, 6, -1]], "int32")


def test_comparing_ints_with_a_float_number_truncates_it_as_mxnet():
    got = nd.array([1, 2], dtype="int32") >= 1.5  # MXNet: [1, 1] (1.5 cast to 1)
    assert got.asnumpy().tolist() == [True, True]


@pytest.mark.parametrize("left, right", [
    (nd.array([1, 2], dtype="int32"), nd.array([1.0, 2.0])),
    (nd.array([1, 2], dtype="int64"), nd.array([1, 2], dtype="int32")),
])
def test_arrays_of_different_non_float_dtypes_raise(left, right):
    # MXNet raises (dtype mismatch); mixrt returned float64 / int64 silently
    with pytest.raises(InputError, match="different dtypes"):
        left + right
    with pytest.raises(InputError, match="different dtypes"):
        nd.maximum(left, right)


# -- % -----------------------------------------------------------------------------------------
# MXNet's mod takes the divisor's sign for floats as for ints (Python's rule), and x % 0 is 0;
# mixrt used C's fmod for floats, had no __rmod__/__imod__, and no gradient.

@pytest.mark.parametrize("expr, expected, dtype", [
    (lambda x: x % 2, [[1.5, 0, 1], [0, 0.5, 1]], "float32"),
    (lambda x: nd.array([-3.5, 3.5, -1.0, 4.0]) % nd.array([2.0, -2.0, 3.0, -3.0]),
     [0.5, -0.5, 2.0, -2.0], "float32"),
    (lambda x: 5 % nd.array([2.0, 3.0, -3.0]), [1, 2, -1], "float32"),
    (lambda x: x % 0, [[0, 0, 0], [0, 0, 0]], "float32"),
    (lambda x: x % nd.array([[2.0], [-3.0]]), [[1.5, 0, 1], [0, -1.5, -1]], "float32"),
    (lambda x: nd.array([-7, 7, -7], dtype="int32") % nd.array([3, -3, -3], dtype="int32"),
     [2, -2, -1], "int32"),
    (lambda x: _xi() % 3, [[1, 2, 0], [0, 2, 1]], "int32"),
    (lambda x: _xi() % 2.5, [[1, 1, 1], [0, 1, 0]], "int32"),  # 2.5 cast to 2
], ids=["scalar", "signs", "rmod", "by_zero", "broadcast", "ints", "int_scalar",
        "int_float_scalar"])
def test_mod_follows_the_divisors_sign(expr, expected, dtype):
    _same(expr(_x()), expected, dtype)


def test_inplace_mod():
    x = _x()
    data = x._data
    x %= 2
    assert x._data is data
    _same(x, [[1.5, 0, 1], [0, 0.5, 1]], "float32")


def test_mod_gradient():
    # MXNet: d(a % b)/da = 1, d(a % b)/db = -floor(a / b), summed over broadcast axes
    x, b = _x(), nd.array([2.0, -3.0, 1.5])
    x.attach_grad()
    b.attach_grad()
    with autograd.record():
        y = x % b
    y.backward()
    _same(y, [[1.5, -2.0, 0.0], [0.0, -1.5, 0.5]], "float32")
    _same(x.grad, np.ones((2, 3)), "float32")
    _same(b.grad, [0, 2, -1], "float32")
    with autograd.record():
        y = 7 % (x + 10)
    y.backward()
    _same(y, np.full((2, 3), 7.0), "float32")
    _same(x.grad, np.zeros((2, 3)), "float32")


# -- reshape's special codes -------------------------------------------------------------------
# MXNet: 0 copies a dim, -1 infers, -2 copies the rest, -3 merges two, -4 splits one,
# reverse=True matches from the right. mixrt passed them to ONNX Reshape, which took any
# negative number as "infer": (-2,) of (2, 3, 4) gave (24,) silently, reverse was ignored.

@pytest.mark.parametrize("source, codes, reverse, expected", [
    ((2, 3, 4), (0, -1), False, (2, 12)),
    ((2, 3, 4), (-2,), False, (2, 3, 4)),
    ((2, 3, 4), (0, -2), False, (2, 3, 4)),
    ((2, 3, 4), (-3, 4), False, (6, 4)),
    ((2, 3, 4), (2, -3), False, (2, 12)),
    ((2, 3, 4), (-4, 1, 2, -2), False, (1, 2, 3, 4)),
    ((2, 3, 4), (-4, -1, 1, 3, 4), False, (2, 1, 3, 4)),
    ((2, 3, 4), (-4, -1, 2, -2), False, (1, 2, 3, 4)),
    ((2, 3, 4), (-1, 0), True, (6, 4)),
    ((10, 5, 4), (-1, 0), True, (50, 4)),
    ((10, 5, 4), (-1, 0), False, (40, 5)),
    ((2, 3), (-1, 0), True, (2, 3)),
    ((2, 3, 4, 5), (0, -2), False, (2, 3, 4, 5)),
    ((2, 3, 4, 5), (-3, -2), False, (6, 4, 5)),
    ((2, 3, 4), (0, 0, -1), False, (2, 3, 4)),
])
def test_reshape_special_codes(source, codes, reverse, expected):
    values = np.arange(int(np.prod(source)), dtype=np.float32).reshape(source)
    got = nd.array(values).reshape(codes, reverse=reverse)
    assert got.shape == expected
    np.testing.assert_array_equal(got.asnumpy(), values.reshape(expected))
    assert nd.reshape(nd.array(values), shape=codes, reverse=reverse).shape == expected


def test_reshape_keyword_and_bad_codes():
    x = _x()
    assert x.reshape(shape=(3, 2)).asnumpy().tolist() == [[1.5, -2.0], [3.0, 0.0],
                                                          [4.5, -1.0]]  # MXNet
    for bad in [(-1, -1), (-4, 4, -1, 3), (4,), (-5,)]:  # MXNet raises for each
        with pytest.raises(InputError, match="reshape"):
            x.reshape(bad)


def test_reshape_is_recorded():
    x = nd.array(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    x.attach_grad()
    with autograd.record():
        y = (x.reshape((-3, -2)) * 2).sum()
    y.backward()
    _same(x.grad, np.full((2, 3, 4), 2.0), "float32")


# -- argmax / argmin defaults ------------------------------------------------------------------
# MXNet: axis=None is over the flattened array (x.argmax() -> [4.]); mixrt defaulted to axis
# 0 and returned one index per column, shape (3,). (Indices stay int64: documented.)

def test_argmax_argmin_default_to_the_flattened_array():
    x = _x()
    assert x.argmax().asnumpy().tolist() == [4] and x.argmax().shape == (1,)  # MXNet [4.]
    assert x.argmax().dtype == np.float32
    assert x.argmin().asnumpy().tolist() == [1]  # MXNet [1.]
    assert x.argmax(keepdims=True).shape == (1, 1)  # MXNet (1, 1)
    assert x.argmax(axis=1).asnumpy().tolist() == [2, 1]
    assert nd.array([1, 3, 3, 0]).argmax().asnumpy().tolist() == [1]  # first of the ties
    cube = nd.array(np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11.5)
    assert cube.argmin().asnumpy().tolist() == [0] and cube.argmax().asnumpy().tolist() == [23]


# -- where with a 1-D condition ---------------------------------------------------------------
# MXNet: a 1-D condition beside matrices picks rows. NumPy broadcasting picked columns
# (silently, for a square matrix) or failed.

def test_where_with_a_vector_condition_picks_rows():
    s = nd.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    _same(nd.where(nd.array([1, 0, 1]), s, -s), [[1, 2, 3], [-4, -5, -6], [7, 8, 9]],
          "float32")
    _same(nd.where(nd.array([1, 0]), _x(), -_x()), [[1.5, -2, 3], [0, -4.5, 1]], "float32")
    with pytest.raises(InputError, match="picks rows"):
        nd.where(nd.array([1, 0, 1]), _x(), -_x())  # MXNet raises too


# -- indexing ----------------------------------------------------------------------------------

def test_float_index_arrays_index_by_value():
    # MXNet: x[nd.array([1, 0])] takes rows 1 and 0 (index arrays are float32 by default)
    x = _x()
    _same(x[nd.array([1, 0])], [[0, 4.5, -1], [1.5, -2, 3]], "float32")
    _same(x[nd.array([1, 0]), nd.array([2, 2])], [-1, 3], "float32")
    x[nd.array([1])] = 5
    _same(x, [[1.5, -2, 3], [5, 5, 5]], "float32")


def test_bad_indexing_raises_typed_errors():
    x = _x()
    with pytest.raises(InputError, match="out of bounds") as caught:
        x[5]  # MXNet: IndexError
    assert isinstance(caught.value, IndexError)
    with pytest.raises(IndexError):
        x[5] = 1
    with pytest.raises(InputError):
        x[1.5]  # MXNet: ValueError
    with pytest.raises(InputError, match="setitem"):
        x[:] = nd.array([1, 2])  # MXNet: ValueError (cannot broadcast)


# -- typed errors at creation ------------------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: nd.array([[1, 2], [3]]),  # MXNet: TypeError
    lambda: nd.array("abc"),  # MXNet: TypeError
    lambda: nd.zeros((-1, 2)),  # MXNet: MXNetError
    lambda: nd.ones(-3),
    lambda: nd.empty((2, -2)),
    lambda: nd.array([1.0]).astype("notadtype"),  # MXNet: TypeError
], ids=["ragged", "string", "zeros_negative", "ones_negative", "empty_negative", "astype"])
def test_bad_creation_raises_input_error(make):
    with pytest.raises(InputError):
        make()
