"""Calls of MXNet 1.x's ``mx.nd`` API that ``tests/test_mxnet_nd_semantics.py`` runs on
``mixrt.nd`` and ``tools/mxnet_nd_expected.py`` runs on real MXNet 1.9.1 (which wrote
``tests/mxnet_nd_expected.py``). Each case is ``f(nd, autograd)`` returning an NDArray, a list
of them, or a Python value; nothing here imports either framework, so both run the same code.
"""

import numpy as np

M23 = [[1.5, -2.0, 3.0], [0.0, 4.5, -1.0]]
CUBE = np.arange(24, dtype=np.float64).reshape(2, 3, 4) - 7.5
UNIT = [[0.1, -0.4, 0.7], [0.25, -0.9, 0.5]]  # inside every inverse function's domain
SPD = [[4.0, 1.0, 0.5], [1.0, 3.0, 0.25], [0.5, 0.25, 2.0]]
LOWER = [[2.0, 0.0, 0.0], [1.0, 3.0, 0.0], [-1.0, 0.5, 1.5]]
B32 = [[1.0, 2.0], [3.0, -4.0], [0.5, 1.5]]


def grad_of(nd, autograd, function, values, dtype="float32"):
    """[f(x), d sum(f(x) * w) / dx] for a fixed weight w of f's shape."""
    x = nd.array(values, dtype=dtype)
    x.attach_grad()
    with autograd.record():
        y = function(x)
        weights = nd.array(np.arange(1, y.size + 1, dtype=np.float64).reshape(y.shape) / 7,
                           dtype=dtype)
        total = (y * weights).sum()
    total.backward()
    return [y, x.grad]


def written(key):
    """The base array after ``base[key][:] = -1`` (MXNet's views write through)."""
    def case(nd, autograd):
        base = nd.array(np.arange(24).reshape(2, 3, 4))
        part = base[key]
        part[:] = -1
        return [base, part]
    return case


def _grid(nd):
    return nd.array(np.arange(12).reshape(3, 4))


def view_of_view(nd):
    base = _grid(nd)
    base[1:3][0:1][:] = 0
    return base


def view_sees_base_writes(nd):
    base = _grid(nd)
    part = base[1:2]
    base[:] = 5
    return part


def view_iadd(nd):
    base = _grid(nd)
    part = base[1:2]
    part += 1
    return base


def reshape_is_a_view(nd):
    base = _grid(nd)
    base.reshape((4, 3))[:] = 0
    return base


def setitem_columns_add(nd):
    base = _grid(nd)
    base[:, 1:3] += 1
    return base


def inplace_view(nd, make):
    """[the result, the base after the result was written]."""
    base = _grid(nd)
    made = make(base)
    made[:] = -1
    return [made, base]


def into(out, made):
    """[what a call with out= returned, out]."""
    return [made, out]


def adamw(nd, rescale, out_is_weight, **options):
    weight, grad = nd.array([1.0, 2.0]), nd.array([0.5, -1.0])
    mean, var = nd.array([0.1, 0.2]), nd.array([0.3, 0.4])
    made = nd.contrib.adamw_update(weight, grad, mean, var, rescale_grad=rescale, lr=0.1,
                                   eta=0.5, out=weight if out_is_weight else None, **options)
    return [made, weight, mean, var]


def mp_adamw(nd):
    weight, grad = nd.array([1.0, 2.0], dtype="float16"), nd.array([0.5, -1.0],
                                                                   dtype="float16")
    mean, var, master = nd.zeros(2), nd.zeros(2), nd.array([1.0, 2.0])
    made = nd.contrib.mp_adamw_update(weight, grad, mean, var, master, rescale_grad=1.0,
                                      lr=0.1, eta=0.5, wd=0.1, out=weight)
    return [made, weight, mean, var, master]


CASES = {
    # -- making arrays: float32 unless dtype or an NDArray source says otherwise ------------
    "array_float64_numpy": lambda nd, ag: nd.array(np.array([1.5, 2.25])),
    "array_int64_numpy": lambda nd, ag: nd.array(np.array([1, 2], dtype=np.int64)),
    "array_int32_numpy": lambda nd, ag: nd.array(np.array([1, 2], dtype=np.int32)),
    "array_bool_numpy": lambda nd, ag: nd.array(np.array([True, False])),
    "array_float16_numpy": lambda nd, ag: nd.array(np.array([1, 2], dtype=np.float16)),
    "array_list_of_ints": lambda nd, ag: nd.array([[1, 2], [3, 4]]),
    "array_scalar": lambda nd, ag: nd.array(3),
    "array_ndarray_keeps_dtype": lambda nd, ag: nd.array(nd.array([1, 2], dtype="int32")),
    "array_ndarray_with_dtype": lambda nd, ag: nd.array(nd.array([1.5, 2]), dtype="float16"),
    "array_dtype_given": lambda nd, ag: nd.array(np.array([1.7, -2.2]), dtype="int32"),
    "zeros_int_shape": lambda nd, ag: nd.zeros(3),
    "zeros_dtype": lambda nd, ag: nd.zeros((2, 2), dtype="int64"),
    "ones_dtype": lambda nd, ag: nd.ones((2,), dtype="int32"),
    "full_float": lambda nd, ag: nd.full((2, 2), 3.5),
    "full_int": lambda nd, ag: nd.full((3,), 3.5, dtype="int32"),
    "empty_shape": lambda nd, ag: list(nd.empty((2, 3)).shape),
    "arange_stop": lambda nd, ag: nd.arange(5),
    "arange_repeat": lambda nd, ag: nd.arange(0, 3, repeat=2),
    "arange_float_step": lambda nd, ag: nd.arange(1, 2, 0.3),
    "arange_negative_step": lambda nd, ag: nd.arange(5, 1, -1.5),
    "arange_int32": lambda nd, ag: nd.arange(0, 10000 ** 2, 10001 * 997, dtype="int32"),
    "arange_float64": lambda nd, ag: nd.arange(0.5, 3, 0.7, dtype="float64"),
    "linspace": lambda nd, ag: nd.linspace(0, 1, 5),
    "linspace_no_endpoint": lambda nd, ag: nd.linspace(-1, 2, 4, endpoint=False),
    "eye": lambda nd, ag: nd.eye(3),
    "eye_rectangular_k": lambda nd, ag: nd.eye(2, 4, 1),
    "eye_negative_k": lambda nd, ag: nd.eye(3, k=-1, dtype="int32"),
    "zeros_like_int": lambda nd, ag: nd.zeros_like(nd.array([1, 2], dtype="int32")),
    "ones_like": lambda nd, ag: nd.ones_like(nd.array(M23)),
    "ones_out": lambda nd, ag: (lambda o: into(o, nd.ones((2, 2), out=o)))(nd.zeros((2, 2))),
    "full_out": lambda nd, ag: (lambda o: into(o, nd.full((3,), 2, out=o)))(nd.zeros((3,))),
    # -- views ----------------------------------------------------------------------------
    "view_int": written(1),
    "view_negative_int": written(-1),
    "view_slice": written(slice(1, 2)),
    "view_full_slice": written(slice(None)),
    "view_one_element_step": written(slice(0, 3, 2)),
    "copy_reversed": written(slice(None, None, -1)),
    "view_int_int": written((1, 1)),
    "view_int_slice": written((1, slice(1, 3))),
    "view_slice_slice": written((slice(1, 2), slice(0, 2))),
    "view_three_ints": written((1, 1, 1)),
    "view_int_int_slice": written((1, 1, slice(1, 3))),
    "copy_column": written((1, slice(None), 1)),
    "view_ellipsis": written(Ellipsis),
    "copy_ellipsis_int": written((Ellipsis, 1)),
    "view_int_ellipsis": written((1, Ellipsis)),
    "view_empty_tuple": written(()),
    "view_new_axis": written((None,)),
    "view_int_new_axis": written((1, None)),
    "copy_index_list": written([0, 1]),
    "view_of_view": lambda nd, ag: view_of_view(nd),
    "view_sees_base_writes": lambda nd, ag: view_sees_base_writes(nd),
    "view_iadd": lambda nd, ag: view_iadd(nd),
    "reshape_is_a_view": lambda nd, ag: reshape_is_a_view(nd),
    "setitem_columns_add": lambda nd, ag: setitem_columns_add(nd),
    "vector_int_index": lambda nd, ag: nd.arange(4)[1],
    "matrix_two_ints": lambda nd, ag: nd.array(M23)[1, 2],
    "mask_indexes_as_integers": lambda nd, ag: (lambda m: m[m > 5])(
        nd.array(np.arange(12.0).reshape(3, 4))),
    "bool_numpy_key": lambda nd, ag: nd.array(np.arange(12.0).reshape(3, 4))[
        np.array([True, False, True])],
    "float_ndarray_key": lambda nd, ag: nd.array(np.arange(12.0).reshape(3, 4))[
        nd.array([2, 0])],
    "iterate_vector": lambda nd, ag: [a for a in nd.array([1, 2, 3])],
    "flatten_inplace_is_a_view": lambda nd, ag: inplace_view(nd, lambda x: x.flatten(
        inplace=True)),
    "expand_dims_inplace_is_a_view": lambda nd, ag: inplace_view(nd, lambda x: x.expand_dims(
        1, inplace=True)),
    "squeeze_inplace_is_a_view": lambda nd, ag: inplace_view(nd, lambda x: x.reshape(
        (3, 1, 4)).squeeze(axis=1, inplace=True)),
    "flatten_copy": lambda nd, ag: inplace_view(nd, lambda x: x.flatten()),
    "squeeze_all_ones": lambda nd, ag: nd.ones((1, 1, 1)).squeeze(),
    "squeeze_axes": lambda nd, ag: nd.zeros((2, 1, 3, 1)).squeeze(axis=(1, 3)),
    "int_rounding": lambda nd, ag: [getattr(nd.array([50000001, -3], dtype="int32"), name)()
                                    for name in ("floor", "ceil", "round", "rint", "fix",
                                                 "trunc")],
    "setitem_list_into_an_element": lambda nd, ag: (lambda x: [x.__setitem__(
        (1, 2), [7]), x][1])(nd.zeros((2, 3), dtype="int32")),
    "linspace_int32": lambda nd, ag: nd.linspace(3.7, 50.2, 7, dtype="int32"),
    "linspace_descending": lambda nd, ag: nd.linspace(24, 11, 12),
    "setitem_one_element_array": lambda nd, ag: (lambda b: [b.__setitem__(
        0, np.array([47.844944], dtype=np.float32)), b][1])(nd.zeros(1)),
    "crop_assign": lambda nd, ag: nd._internal._crop_assign(
        nd.ones((2, 3)), nd.zeros((1, 2)), begin=(0, 0), end=(1, 2)),
    "crop_assign_scalar_out": lambda nd, ag: (lambda y: into(y, nd._internal._crop_assign_scalar(
        y, scalar=5, begin=(0, 1), end=(2, 3), out=y)))(nd.ones((2, 3))),
    "transpose_axes_keyword": lambda nd, ag: nd.array(CUBE).transpose(axes=(1, 0, 2)),
    "broadcast_to_numpy_shape": lambda nd, ag: nd.ones((1, 2)).broadcast_to(
        shape=np.array([3, 2])),
    # -- reductions: (1,) over every axis -------------------------------------------------
    "sum_all": lambda nd, ag: nd.array(M23).sum(),
    "mean_all": lambda nd, ag: nd.array(M23).mean(),
    "max_all": lambda nd, ag: nd.array(M23).max(),
    "min_all": lambda nd, ag: nd.array(M23).min(),
    "prod_all": lambda nd, ag: nd.array(M23).prod(),
    "sum_axis": lambda nd, ag: nd.sum(nd.array(CUBE), axis=1),
    "sum_empty_axis": lambda nd, ag: nd.sum(nd.array(CUBE), axis=()),
    "sum_exclude": lambda nd, ag: nd.sum(nd.array(CUBE), axis=1, exclude=True),
    "sum_exclude_keepdims": lambda nd, ag: nd.sum(nd.array(CUBE), axis=-1, keepdims=True,
                                                  exclude=True),
    "sum_keepdims_all": lambda nd, ag: nd.array(M23).sum(keepdims=True),
    "max_positional_axis": lambda nd, ag: nd.array(CUBE).max(1),
    "mean_axes": lambda nd, ag: nd.mean(nd.array(CUBE), axis=(0, 2)),
    "mean_int32": lambda nd, ag: nd.mean(nd.array([1, 2], dtype="int32")),
    "nansum": lambda nd, ag: nd.nansum(nd.array([[1, np.nan], [3, 4]]), axis=0),
    "nanprod_all": lambda nd, ag: nd.nanprod(nd.array([2, np.nan, 3])),
    "norm_all": lambda nd, ag: nd.array(M23).norm(),
    "norm_l1_all": lambda nd, ag: nd.norm(nd.array(M23), ord=1),
    "norm_axis": lambda nd, ag: nd.norm(nd.array(CUBE), axis=1),
    "moments": lambda nd, ag: nd.moments(nd.array(CUBE), axes=(0, 1)),
    "moments_keepdims": lambda nd, ag: nd.moments(nd.array(CUBE), axes=(2,), keepdims=True),
    "dot_vectors": lambda nd, ag: nd.dot(nd.array([1, 2]), nd.array([3, 4])),
    "argmax_all": lambda nd, ag: nd.array(M23).argmax(),
    "argmax_axis": lambda nd, ag: nd.array(M23).argmax(axis=1),
    "argmin_keepdims": lambda nd, ag: nd.argmin(nd.array(M23), axis=0, keepdims=True),
    "argmax_int32": lambda nd, ag: nd.array([[1, 5], [7, 2]], dtype="int32").argmax(axis=0),
    "argmax_float64": lambda nd, ag: nd.argmax(nd.array(M23, dtype="float64"), axis=1),
    "argmax_channel": lambda nd, ag: nd.argmax_channel(nd.array(CUBE)),
    "argsort_default": lambda nd, ag: nd.argsort(nd.array(M23)),
    "topk_default": lambda nd, ag: nd.topk(nd.array(M23, dtype="float64")),
    # -- comparisons: 0/1 in the data's dtype ---------------------------------------------
    "eq": lambda nd, ag: nd.array(M23) == nd.array(np.zeros((2, 3))),
    "ne_scalar": lambda nd, ag: nd.array(M23) != 0,
    "gt_scalar": lambda nd, ag: nd.array(M23) > 1,
    "reflected_lt": lambda nd, ag: 0 < nd.array(M23),
    "ge_int": lambda nd, ag: nd.array([1, 2, 3], dtype="int32") >= 2,
    "le_float64": lambda nd, ag: nd.array([1, 2], dtype="float64") <= 1.5,
    "equal": lambda nd, ag: nd.equal(nd.array([1, 2]), nd.array([1, 3])),
    "not_equal_scalar": lambda nd, ag: nd.not_equal(nd.array([1, 2]), 2),
    "greater_broadcast": lambda nd, ag: nd.greater(nd.array([[1], [3]]), nd.array([2, 0])),
    "greater_equal": lambda nd, ag: nd.greater_equal(nd.array([1, 2]), 2),
    "lesser_reflected": lambda nd, ag: nd.lesser(2, nd.array([1, 3])),
    "lesser_equal": lambda nd, ag: nd.lesser_equal(nd.array([1, 2, 3]), nd.array([3, 2, 1])),
    "logical_and": lambda nd, ag: nd.logical_and(nd.array([0, 1, 2]), nd.array([1, 1, 0])),
    "logical_or": lambda nd, ag: nd.logical_or(nd.array([0, 1, 0]), nd.array([0, 0, 2])),
    "logical_xor": lambda nd, ag: nd.logical_xor(nd.array([0, 1, 2]), nd.array([1, 1, 0])),
    "logical_not": lambda nd, ag: nd.logical_not(nd.array([0, 2, -1])),
    "comparison_sum": lambda nd, ag: (nd.array(M23) > 0).sum(),
    "bool_one": lambda nd, ag: bool(nd.array([3])),
    "bool_zero": lambda nd, ag: bool(nd.zeros((1,))),
    "len": lambda nd, ag: len(nd.zeros((4, 2))),
    "asscalar": lambda nd, ag: float(nd.array([2.5]).asscalar()),
    "repr": lambda nd, ag: repr(nd.array([[1, 2, 3], [4, 5, 6]])),
    "repr_int": lambda nd, ag: repr(nd.array([1, 2], dtype="int32")),
    "stype": lambda nd, ag: nd.array([1]).stype,
    "astype_no_copy_same": lambda nd, ag: (lambda a: a.astype("float32", copy=False) is a)(
        nd.array([1])),
    "astype_copy": lambda nd, ag: (lambda a: a.astype("float32") is a)(nd.array([1])),
    "tostype_default": lambda nd, ag: nd.array(M23).tostype("default"),
    "size_ndim": lambda nd, ag: [nd.zeros((2, 3)).size, nd.zeros((2, 3)).ndim],
    # -- elementwise math -----------------------------------------------------------------
    **{f"math_{name}": (lambda name: lambda nd, ag: getattr(nd, name)(nd.array(UNIT)))(name)
       for name in ["sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
                    "arcsinh", "arctanh", "degrees", "radians", "expm1", "log1p", "cbrt",
                    "reciprocal", "negative", "erf", "softsign", "sign", "abs", "exp",
                    "square", "relu", "sigmoid", "round", "rint", "fix", "floor", "ceil"]},
    **{f"math_{name}": (lambda name: lambda nd, ag: getattr(nd, name)(
        nd.array(np.abs(UNIT) + 0.05)))(name)
       for name in ["log2", "log10", "log", "sqrt", "rsqrt", "rcbrt"]},
    "math_arccosh": lambda nd, ag: nd.arccosh(nd.array(np.abs(UNIT) + 1.5)),
    "method_expm1": lambda nd, ag: nd.array(UNIT).expm1(),
    "method_log1p": lambda nd, ag: nd.array(UNIT).log1p(),
    "method_arctanh": lambda nd, ag: nd.array(UNIT).arctanh(),
    "method_degrees": lambda nd, ag: nd.array(UNIT).degrees(),
    "gamma": lambda nd, ag: nd.gamma(nd.array([0.5, 1, 2.5, 6, -0.5, -1.5, 30])),
    "gammaln": lambda nd, ag: nd.gammaln(nd.array([0.5, 1, 2.5, 6, -0.5, -1.5, 30, 1e-3])),
    "erfinv": lambda nd, ag: nd.erfinv(nd.array([-0.999, -0.5, 0, 1e-4, 0.3, 0.9, 0.99999])),
    "erfinv_float64": lambda nd, ag: nd.erfinv(nd.array([-0.7, 0.2, 0.95], dtype="float64")),
    "grad_gamma": lambda nd, ag: grad_of(nd, ag, nd.gamma, [[0.5, 2.5, -0.5], [1.5, 4, 7]]),
    "grad_gammaln": lambda nd, ag: grad_of(nd, ag, nd.gammaln, [[0.5, 2.5, -0.5], [1.5, 4, 7]]),
    "grad_erfinv": lambda nd, ag: grad_of(nd, ag, nd.erfinv, UNIT),
    "expm1_tiny": lambda nd, ag: nd.expm1(nd.array([1e-7, -3e-6, 0.49, 0.51, -0.6, 4.0])),
    "log1p_tiny": lambda nd, ag: nd.log1p(nd.array([1e-7, -3e-6, 0.49, 0.51, -0.6, 40.0])),
    "hard_sigmoid": lambda nd, ag: nd.hard_sigmoid(nd.array([-3, 0, 1, 3])),
    "smooth_l1": lambda nd, ag: nd.smooth_l1(nd.array([-2, -0.5, 0, 0.3, 3]), scalar=1.5),
    "softmin": lambda nd, ag: nd.softmin(nd.array(M23), axis=0),
    "sin_out": lambda nd, ag: (lambda o: into(o, nd.sin(nd.array([1.0, 2.0]), out=o)))(
        nd.zeros((2,))),
    **{f"grad_{name}": (lambda name: lambda nd, ag: grad_of(
        nd, ag, getattr(nd, name), UNIT))(name)
       for name in ["sin", "cos", "tan", "arcsin", "arccos", "arctan", "sinh", "cosh",
                    "arcsinh", "arctanh", "degrees", "radians", "expm1", "log1p", "cbrt",
                    "reciprocal", "erf", "softsign"]},
    **{f"grad_{name}": (lambda name: lambda nd, ag: grad_of(
        nd, ag, getattr(nd, name), np.abs(UNIT) + 0.05))(name)
       for name in ["log2", "log10", "rsqrt", "rcbrt"]},
    # -- binary names ---------------------------------------------------------------------
    "add_scalar": lambda nd, ag: nd.add(nd.array([1, 2]), 2),
    "add_numbers": lambda nd, ag: nd.add(1, 2),
    "subtract_reflected": lambda nd, ag: nd.subtract(5, nd.array([1, 2])),
    "multiply_broadcast": lambda nd, ag: nd.multiply(nd.array([[1], [2]]), nd.array([3, 4])),
    "divide": lambda nd, ag: nd.divide(nd.array([1, 3]), nd.array([2, 4])),
    "true_divide": lambda nd, ag: nd.true_divide(nd.array([1, 3]), 4),
    "modulo": lambda nd, ag: nd.modulo(nd.array([-3, 5.5]), 2),
    "power": lambda nd, ag: nd.power(nd.array([2, 3]), 2),
    "maximum_scalar": lambda nd, ag: nd.maximum(nd.array([1, 5]), 3),
    "minimum": lambda nd, ag: nd.minimum(nd.array([1, 5]), nd.array([2, 2])),
    "elemwise_add": lambda nd, ag: nd.elemwise_add(nd.array(M23), nd.array(M23)),
    "elemwise_mul": lambda nd, ag: nd.elemwise_mul(nd.array(M23), nd.array(M23)),
    "broadcast_hypot": lambda nd, ag: nd.broadcast_hypot(nd.array([[3], [5]]),
                                                         nd.array([[4, 12]])),
    "broadcast_logical_and": lambda nd, ag: nd.broadcast_logical_and(
        nd.array([[0], [1]]), nd.array([[1, 0]])),
    "broadcast_logical_or": lambda nd, ag: nd.broadcast_logical_or(
        nd.array([[0], [1]]), nd.array([[1, 0]])),
    "broadcast_logical_xor": lambda nd, ag: nd.broadcast_logical_xor(
        nd.array([[0], [1]]), nd.array([[1, 0]])),
    "elementwise_sum": lambda nd, ag: nd.ElementWiseSum(
        *[nd.ones((3,), dtype="int32") * k for k in (1, 2, 4, 8)]),
    "add_n": lambda nd, ag: nd.add_n(nd.array(M23), nd.array(M23), nd.array(M23)),
    "grad_add_n": lambda nd, ag: grad_of(nd, ag, lambda x: nd.add_n(x, x * x), M23),
    # -- shapes ---------------------------------------------------------------------------
    "moveaxis": lambda nd, ag: nd.moveaxis(nd.array(CUBE), 0, 2),
    "moveaxis_negative": lambda nd, ag: nd.moveaxis(nd.array(CUBE), -1, 0),
    "swapaxes": lambda nd, ag: nd.swapaxes(nd.array(CUBE), 0, 2),
    "SwapAxis": lambda nd, ag: nd.SwapAxis(nd.array(CUBE), dim1=1, dim2=2),
    "method_swapaxes": lambda nd, ag: nd.array(CUBE).swapaxes(0, 1),
    "crop": lambda nd, ag: nd.crop(nd.array(CUBE), begin=(0, 1), end=(1, 3)),
    "crop_step": lambda nd, ag: nd.crop(nd.array(CUBE), begin=(None, 0, 3), end=(None, 3, 0),
                                        step=(1, 2, -2)),
    "Crop_offset": lambda nd, ag: nd.Crop(nd.array(np.arange(50.0).reshape(1, 2, 5, 5)),
                                          offset=(1, 2), h_w=(2, 3)),
    "Crop_center": lambda nd, ag: nd.Crop(nd.array(np.arange(25.0).reshape(1, 1, 5, 5)),
                                          h_w=(2, 2), center_crop=True),
    "Crop_like": lambda nd, ag: nd.Crop(nd.array(np.arange(25.0).reshape(1, 1, 5, 5)),
                                        nd.zeros((1, 1, 3, 2)), num_args=2),
    "slice_like": lambda nd, ag: nd.slice_like(nd.array(CUBE), nd.zeros((1, 2, 3))),
    "slice_like_axes": lambda nd, ag: nd.slice_like(nd.array(CUBE), nd.zeros((1, 2, 3)),
                                                    axes=(0, -1)),
    "reshape_like": lambda nd, ag: nd.reshape_like(nd.array(CUBE), nd.zeros((4, 6))),
    "reshape_like_part": lambda nd, ag: nd.reshape_like(
        nd.zeros((30, 7)), nd.zeros((15, 2, 4)), lhs_begin=0, lhs_end=1, rhs_begin=0,
        rhs_end=2),
    "concatenate": lambda nd, ag: nd.concatenate([nd.ones((1, 2)), nd.zeros((2, 2))]),
    "concatenate_axis": lambda nd, ag: nd.concatenate([nd.array(CUBE), nd.array(CUBE)],
                                                      axis=2),
    "pad_constant": lambda nd, ag: nd.pad(nd.ones((1, 1, 2, 2)), mode="constant",
                                          pad_width=(0, 0, 0, 0, 1, 1, 1, 1),
                                          constant_value=5),
    "pad_edge": lambda nd, ag: nd.pad(nd.array(np.arange(4.0).reshape(1, 1, 2, 2)),
                                      mode="edge", pad_width=(0, 0, 0, 0, 1, 0, 0, 1)),
    "pad_reflect": lambda nd, ag: nd.pad(nd.array(np.arange(9.0).reshape(1, 1, 3, 3)),
                                         mode="reflect", pad_width=(0, 0, 0, 0, 1, 1, 1, 1)),
    "diag_vector": lambda nd, ag: nd.diag(nd.array([1, 2])),
    "diag_vector_k": lambda nd, ag: nd.diag(nd.array([1, 2]), k=1),
    "diag_vector_negative_k": lambda nd, ag: nd.diag(nd.array([1, 2, 3]), k=-2),
    "diag_matrix": lambda nd, ag: nd.diag(nd.array([[1, 2], [3, 4]]), k=-1),
    "diag_cube_axes": lambda nd, ag: nd.diag(nd.array(CUBE), k=1, axis1=1, axis2=2),
    "depth_to_space": lambda nd, ag: nd.depth_to_space(
        nd.array(np.arange(16.0).reshape(1, 4, 2, 2)), 2),
    "space_to_depth": lambda nd, ag: nd.space_to_depth(
        nd.array(np.arange(16.0).reshape(1, 1, 4, 4)), 2),
    "split_v2_sections": lambda nd, ag: nd.split_v2(nd.arange(6), 3),
    "split_v2_indices": lambda nd, ag: nd.split_v2(nd.arange(6), (1, 4)),
    "split_v2_squeeze": lambda nd, ag: nd.split_v2(nd.arange(6).reshape((3, 2)), 3, axis=0,
                                                   squeeze_axis=True),
    "shape_array": lambda nd, ag: nd.shape_array(nd.array(CUBE)),
    "size_array": lambda nd, ag: nd.size_array(nd.array(CUBE)),
    "cast": lambda nd, ag: nd.cast(nd.array([1.7, -1.7]), dtype="int32"),
    "cumsum_flat": lambda nd, ag: nd.cumsum(nd.array([[1, 2], [3, 4]])),
    "cumsum_axis_dtype": lambda nd, ag: nd.cumsum(nd.array([[1, 2], [3, 4]]), axis=1,
                                                  dtype="int32"),
    "gather_nd": lambda nd, ag: nd.gather_nd(nd.array([[1, 2], [3, 4]]),
                                             nd.array([[1, 1, 0], [0, 1, 0]])),
    "scatter_nd": lambda nd, ag: nd.scatter_nd(nd.array([2, 3, 0]),
                                               nd.array([[1, 1, 0], [0, 1, 0]]), shape=(2, 2)),
    "unravel_index": lambda nd, ag: nd.unravel_index(nd.array([22, 41, 37]), shape=(7, 6)),
    "ravel_multi_index": lambda nd, ag: nd.ravel_multi_index(
        nd.array([[3, 6, 6], [4, 5, 1]]), shape=(7, 6)),
    "khatri_rao": lambda nd, ag: nd.khatri_rao(nd.array([[1, -1], [2, -3]]),
                                               nd.array([[1, 4], [2, 5], [3, 6]])),
    "choose_element_0index": lambda nd, ag: nd.choose_element_0index(
        nd.array([[1, 2], [3, 4]]), nd.array([1, 0])),
    "fill_element_0index": lambda nd, ag: nd.fill_element_0index(
        nd.array([[1, 2], [3, 4]]), nd.array([9, 8]), nd.array([1, 0])),
    "onehot_encode": lambda nd, ag: (lambda o: into(o, nd.onehot_encode(
        nd.array([1, 0, 3]), o)))(nd.zeros((3, 4))),
    "broadcast_axes": lambda nd, ag: nd.broadcast_axes(nd.ones((1, 2)), axis=0, size=3),
    "slice_assign": lambda nd, ag: (lambda x: into(x, x.slice_assign(
        nd.ones((2, 2)), (0, 1), (2, 3), ())))(nd.zeros((3, 4))),
    "slice_assign_scalar": lambda nd, ag: (lambda x: into(x, x.slice_assign_scalar(
        5, (1, None), (None, 2), (None, None))))(nd.zeros((3, 4))),
    "SliceChannel": lambda nd, ag: nd.SliceChannel(nd.array(CUBE), num_outputs=2, axis=2),
    "Cast_dtype": lambda nd, ag: nd.Cast(nd.array([1.7, -1.2]), dtype="int32"),
    "softmax_cross_entropy": lambda nd, ag: nd.softmax_cross_entropy(
        nd.array([[1, 2, 3], [1, 1, 1]]), nd.array([2, 0])),
    "grad_softmax_cross_entropy": lambda nd, ag: grad_of(
        nd, ag, lambda x: nd.softmax_cross_entropy(x, nd.array([2, 0])), M23),
    "grad_moveaxis": lambda nd, ag: grad_of(nd, ag, lambda x: nd.moveaxis(x, 0, 1), M23),
    "grad_pad": lambda nd, ag: grad_of(nd, ag, lambda x: nd.pad(
        x.reshape((1, 1, 2, 3)), mode="reflect", pad_width=(0, 0, 0, 0, 1, 0, 1, 1)), M23),
    "grad_diag": lambda nd, ag: grad_of(nd, ag, lambda x: nd.diag(x, k=1), M23),
    "grad_crop": lambda nd, ag: grad_of(nd, ag, lambda x: nd.crop(x, begin=(1, 0),
                                                                  end=(2, 2)), M23),
    # -- linalg ---------------------------------------------------------------------------
    "gemm": lambda nd, ag: nd.linalg.gemm(nd.array(LOWER), nd.array(B32), nd.ones((3, 2)),
                                          alpha=2.0, beta=0.5),
    "gemm_transposes": lambda nd, ag: nd.linalg.gemm(nd.array(B32), nd.array(LOWER),
                                                     nd.ones((2, 3)), transpose_a=True,
                                                     transpose_b=True),
    "gemm2": lambda nd, ag: nd.linalg.gemm2(nd.array(B32), nd.array(B32), transpose_a=True,
                                            alpha=0.5),
    "gemm2_batched": lambda nd, ag: nd.linalg.gemm2(nd.array(CUBE), nd.array(CUBE),
                                                    transpose_b=True),
    "syrk": lambda nd, ag: nd.linalg.syrk(nd.array(B32), alpha=2.0),
    "syrk_transpose": lambda nd, ag: nd.linalg.syrk(nd.array(B32), transpose=True),
    "trmm": lambda nd, ag: nd.linalg.trmm(nd.array(LOWER), nd.array(B32), alpha=2.0),
    "trmm_right_transpose": lambda nd, ag: nd.linalg.trmm(
        nd.array(LOWER), nd.array(np.array(B32).T), transpose=True, rightside=True),
    "trmm_upper": lambda nd, ag: nd.linalg.trmm(nd.array(SPD), nd.array(B32), lower=False),
    "trsm": lambda nd, ag: nd.linalg.trsm(nd.array(LOWER), nd.array(B32)),
    "trsm_right_transpose": lambda nd, ag: nd.linalg.trsm(
        nd.array(LOWER), nd.array(np.array(B32).T), transpose=True, rightside=True,
        alpha=0.5),
    "potrf": lambda nd, ag: nd.linalg.potrf(nd.array(SPD)),
    "potri": lambda nd, ag: nd.linalg.potri(nd.linalg.potrf(nd.array(SPD))),
    "inverse": lambda nd, ag: nd.linalg.inverse(nd.array(SPD)),
    "det": lambda nd, ag: nd.linalg.det(nd.array(SPD)),
    "det_batched": lambda nd, ag: nd.linalg.det(nd.array([SPD, LOWER])),
    "slogdet": lambda nd, ag: nd.linalg.slogdet(nd.array([[1.0, 2.0], [3.0, 4.0]])),
    "sumlogdiag": lambda nd, ag: nd.linalg.sumlogdiag(nd.array(SPD)),
    "extractdiag": lambda nd, ag: nd.linalg.extractdiag(nd.array(SPD), offset=1),
    "makediag": lambda nd, ag: nd.linalg.makediag(nd.array([1.0, 2.0]), offset=-1),
    "makediag_batched": lambda nd, ag: nd.linalg.makediag(nd.array([[1.0, 2.0], [3, 4]]),
                                                          offset=1),
    "extracttrian": lambda nd, ag: nd.linalg.extracttrian(nd.array(CUBE[0, :, :3])),
    "extracttrian_upper": lambda nd, ag: nd.linalg.extracttrian(nd.array(CUBE[0, :, :3]),
                                                                lower=False),
    "extracttrian_offsets": lambda nd, ag: [nd.linalg.extracttrian(
        nd.array(CUBE[0, :, :3]), offset=k) for k in (1, -1)],
    "maketrian": lambda nd, ag: [nd.linalg.maketrian(nd.array([1.0, 2, 3]), **kw) for kw in (
        {}, {"lower": False}, {"offset": 1}, {"offset": -1})],
    "gelqf": lambda nd, ag: nd.linalg.gelqf(nd.array(np.array(B32).T)),
    "syevd": lambda nd, ag: nd.linalg.syevd(nd.array(SPD)),
    "flat_linalg_name": lambda nd, ag: nd.linalg_det(nd.array(SPD)),
    "grad_potrf": lambda nd, ag: grad_of(nd, ag, nd.linalg.potrf, SPD),
    "grad_potri": lambda nd, ag: grad_of(nd, ag, nd.linalg.potri, LOWER),
    "grad_trsm": lambda nd, ag: grad_of(nd, ag, lambda x: nd.linalg.trsm(x, nd.array(B32)),
                                        LOWER),
    "grad_trmm": lambda nd, ag: grad_of(nd, ag, lambda x: nd.linalg.trmm(x, nd.array(B32)),
                                        SPD),
    "grad_sumlogdiag": lambda nd, ag: grad_of(nd, ag, nd.linalg.sumlogdiag, SPD),
    "grad_det": lambda nd, ag: grad_of(nd, ag, nd.linalg.det, SPD),
    "grad_inverse": lambda nd, ag: grad_of(nd, ag, nd.linalg.inverse, SPD),
    "grad_syrk": lambda nd, ag: grad_of(nd, ag, nd.linalg.syrk, B32),
    "grad_extracttrian": lambda nd, ag: grad_of(nd, ag, nd.linalg.extracttrian, SPD),
    "grad_maketrian": lambda nd, ag: grad_of(nd, ag, nd.linalg.maketrian, [1.0, 2, 3]),
    "grad_gelqf": lambda nd, ag: grad_of(
        nd, ag, lambda x: (lambda q, l: q.sum(axis=0) + l.sum())(*nd.linalg.gelqf(x)),
        [[1.0, 2, 3], [4, 5, 6.5]]),
    "grad_syevd": lambda nd, ag: grad_of(
        nd, ag, lambda x: (lambda u, lam: u.sum(axis=1) * lam)(*nd.linalg.syevd(x)), SPD),
    # -- contrib --------------------------------------------------------------------------
    "isfinite": lambda nd, ag: nd.contrib.isfinite(nd.array([1, np.inf, -np.inf, np.nan])),
    "isnan": lambda nd, ag: nd.contrib.isnan(nd.array([1, np.inf, np.nan], dtype="float64")),
    "isinf": lambda nd, ag: nd.contrib.isinf(nd.array([1, np.inf, -np.inf, np.nan])),
    "adamw_update": lambda nd, ag: adamw(nd, 1.0, False, wd=0.1),
    "adamw_update_out_clip": lambda nd, ag: adamw(nd, nd.array([2.0]), True, wd=0.1,
                                                  clip_gradient=0.6, beta1=0.8,
                                                  epsilon=1e-6),
    "adamw_update_skipped": lambda nd, ag: adamw(nd, nd.array([np.inf]), True),
    "mp_adamw_update": lambda nd, ag: mp_adamw(nd),
    "boolean_mask": lambda nd, ag: nd.contrib.boolean_mask(nd.array(B32), nd.array([0, 1, 1])),
    "arange_like": lambda nd, ag: nd.contrib.arange_like(nd.zeros((2, 3)), start=1, step=2,
                                                         repeat=2),
    "arange_like_axis": lambda nd, ag: nd.contrib.arange_like(nd.zeros((2, 3), dtype="float64"),
                                                              axis=1),
    "index_copy": lambda nd, ag: nd.contrib.index_copy(nd.zeros((4, 2)), nd.array([3, 0]),
                                                       nd.array([[1, 2], [3, 4]])),
    "index_array": lambda nd, ag: nd.contrib.index_array(nd.zeros((2, 3))),
    "index_array_axes": lambda nd, ag: nd.contrib.index_array(nd.zeros((2, 3)), axes=(1,)),
    "allclose": lambda nd, ag: [nd.contrib.allclose(nd.array([1, 2]), nd.array([1, 2.00001])),
                                nd.contrib.allclose(nd.array([1, 2]), nd.array([1, 2.1]))],
    "div_sqrt_dim": lambda nd, ag: nd.contrib.div_sqrt_dim(nd.array(CUBE)),
    "quadratic": lambda nd, ag: nd.contrib.quadratic(nd.array([1, 2]), a=1, b=2, c=3),
    "grad_boolean_mask": lambda nd, ag: grad_of(nd, ag, lambda x: nd.contrib.boolean_mask(
        x, nd.array([1, 0, 1])), B32),
    "grad_gradientmultiplier": lambda nd, ag: grad_of(
        nd, ag, lambda x: nd.contrib.gradientmultiplier(x, scalar=-0.5), M23),
}
