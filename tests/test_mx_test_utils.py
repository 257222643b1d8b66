"""mixrt.test_utils, MXNet's testing helpers: the tolerances and results MXNet 1.9.1's
``mxnet.test_utils`` gives (read from it on 2026-11-24), and checks that pass on right
values and fail on wrong ones."""

import os
import random

import numpy as np
import pytest

import mixrt as mx
import mixrt.test_utils as tu
from mixrt.test_utils import compare
from mixrt.errors import InputError, MixrtError


def test_star_import_gives_what_mxnet_tests_use():
    names = {}
    exec("from mixrt.test_utils import *", names)  # noqa: S102  (the import MXNet's tests do)
    for name in ("np", "mx", "sys", "array", "assert_almost_equal", "rand_ndarray", "same",
                 "check_numeric_gradient", "compare_optimizer", "default_context"):
        assert name in names, name
    assert names["mx"] is mx and names["array"] is mx.nd.array


def test_tolerance_tables_are_mxnets():
    assert tu.default_rtols()[np.dtype(np.float16)] == 1e-2
    assert tu.default_atols()[np.dtype(np.float32)] == 1e-3
    assert tu.default_atols()[np.dtype(np.float64)] == 1e-20
    assert tu.default_rtols()[np.dtype(np.int32)] == 0
    assert tu.default_numeric_eps()[np.dtype(np.float32)] == 2.0 ** -9
    assert tu.get_tols(np.ones(1), np.ones(1)) == (1e-5, 1e-20)
    assert tu.get_tols(mx.nd.ones(1), np.ones(1)) == (1e-4, 1e-3)  # the looser dtype wins
    assert tu.get_tols(np.ones(1, np.float16), np.ones(1, np.float16)) == (1e-2, 1e-1)


def test_almost_equal_keeps_mxnets_fixed_defaults():
    one = np.ones(3, np.float32)
    assert tu.almost_equal(one, one * (1 + 1e-6))
    assert not tu.almost_equal(one, one * (1 + 1e-4))  # rtol 1e-5 whatever the dtype
    assert tu.almost_equal(np.array([1, 2]), np.array([[1, 2], [1, 2]]))
    assert not tu.almost_equal(np.array([1, 2]), np.array([[1, 2]]), use_broadcast=False)
    assert not tu.almost_equal(np.array([np.nan]), np.array([np.nan]))
    assert tu.almost_equal(np.array([np.nan]), np.array([np.nan]), equal_nan=True)


def test_assert_almost_equal_takes_tolerances_from_dtypes():
    tu.assert_almost_equal(mx.nd.ones(3), mx.nd.ones(3) * 1.0009)  # float32: 1e-4, 1e-3
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(mx.nd.ones(3), mx.nd.ones(3) * 1.003)
    with pytest.raises(AssertionError):
        tu.assert_almost_equal(np.ones(3), np.ones(3) * 1.0001)  # float64: 1e-5, 1e-20
    tu.assert_almost_equal(np.ones(3), np.ones(3) * 1.0001, rtol=1e-3)


def test_assert_almost_equal_reports_the_worst_element():
    with pytest.raises(AssertionError) as failure:
        tu.assert_almost_equal(np.array([1.0, 2, 3]), np.array([1, 2.5, 3]), names=("x", "y"))
    message = str(failure.value)
    assert "Error 20000.000000 exceeds tolerance rtol=1.000000e-05" in message
    assert "mismatch 33.333333%" in message
    assert "Location of maximum error: (1,), x=2.00000000, y=2.50000000" in message
    with pytest.raises(AssertionError, match="shape"):
        tu.assert_almost_equal(np.ones(3), np.ones((1, 3)), use_broadcast=False)


def test_same_and_same_array():
    x = mx.nd.ones((2, 2))
    assert tu.same(x, np.ones((2, 2))) and not tu.same(x, np.ones(4))
    assert tu.same_array(x, x) and not tu.same_array(x, x.copy())
    assert tu.same(x, np.ones((2, 2)))  # same_array leaves the values as they were


def test_np_reduce_reduces_axis_by_axis():
    data = np.arange(24).reshape(2, 3, 4)
    assert tu.np_reduce(data, (0, 2), True, np.sum).shape == (1, 3, 1)
    assert tu.np_reduce(data, None, False, np.sum) == 276
    np.testing.assert_array_equal(tu.np_reduce(data, -1, False, np.argmax), np.full((2, 3), 3))


def test_random_shapes_stay_in_mxnets_bounds():
    random.seed(0)
    np.random.seed(0)
    shapes_2d = [tu.rand_shape_2d(3, 3) for _ in range(500)]
    assert {s[0] for s in shapes_2d} == {1, 2, 3}  # the bound itself is drawn
    shapes_nd = [tu.rand_shape_nd(2, 3) for _ in range(500)]
    assert {s[1] for s in shapes_nd} == {1, 2, 3}
    assert 0 in {s[0] for s in (tu.rand_shape_3d(2, allow_zero_size=True) for _ in range(200))}


def test_random_arrays_and_rand_ndarray():
    assert tu.random_arrays((2, 3)).dtype == np.float32
    assert isinstance(tu.random_arrays((2,), (3,)), list)
    assert tu.random_arrays(()).shape == ()
    made = tu.rand_ndarray((3, 4), dtype="float64")
    assert isinstance(made, mx.nd.NDArray) and made.dtype == np.float64
    assert len(tu.random_sample([1, 2, 3, 4, 5], 2)) == 2


def test_environment_sets_and_restores():
    os.environ.pop("MIXRT_TEST_UTILS_PROBE", None)
    with tu.environment("MIXRT_TEST_UTILS_PROBE", "1"):
        assert os.environ["MIXRT_TEST_UTILS_PROBE"] == "1"
        with tu.environment({"MIXRT_TEST_UTILS_PROBE": None}):
            assert "MIXRT_TEST_UTILS_PROBE" not in os.environ
        assert os.environ["MIXRT_TEST_UTILS_PROBE"] == "1"
    assert "MIXRT_TEST_UTILS_PROBE" not in os.environ
    with pytest.raises(InputError):
        with tu.environment("A", "1", "B"):
            pass


def test_retry_reruns_until_a_pass():
    calls = []

    @tu.retry(3)
    def flaky():
        calls.append(1)
        assert len(calls) == 2
    flaky()
    assert len(calls) == 2

    @tu.retry(2)
    def failing():
        raise AssertionError("always")
    with pytest.raises(AssertionError, match="always"):
        failing()


def test_assert_exception():
    tu.assert_exception(int, ValueError, "x")
    with pytest.raises(AssertionError):
        tu.assert_exception(int, ValueError, "1")


def test_use_np_refuses_when_the_decorated_code_runs():
    @tu.use_np
    def numpy_semantics_test():
        return 1
    with pytest.raises(MixrtError, match="NumPy"):
        numpy_semantics_test()
    assert not mx.util.is_np_array() and not mx.is_np_shape()
    with mx.np_shape(False):
        pass
    with pytest.raises(MixrtError):
        with mx.np_shape(True):
            pass


@pytest.mark.parametrize("decorator", ["use_np", "use_np_shape", "use_np_array"])
def test_numpy_semantics_decorators_define_and_refuse_when_run(decorator):
    """MXNet's test modules decorate tests and classes with these at import time; defining
    works, running refuses naming the decorator."""
    @getattr(mx, decorator)
    def numpy_semantics_test():
        return 1

    @getattr(mx.util, decorator)
    class NumpySemantics:
        pass
    for call in (numpy_semantics_test, NumpySemantics):
        with pytest.raises(MixrtError, match=f"{decorator} on .*NumPy"):
            call()


def test_the_global_numpy_switches_stay_off():
    assert mx.set_np_shape(False) is False and not mx.is_np_shape()
    with pytest.raises(MixrtError, match=r"set_np_shape\(True\)"):
        mx.set_np_shape(True)
    with mx.np_array(False):
        pass
    with pytest.raises(MixrtError, match=r"np_array\(True\)"):
        with mx.np_array(True):
            pass


def _product_with_sine():
    a, b = mx.sym.Variable("a"), mx.sym.Variable("b")
    return a * b + mx.sym.sin(a)


def test_symbolic_forward_and_backward_checks():
    sym = _product_with_sine()
    x, y = np.random.rand(2, 3), np.random.rand(2, 3)
    outputs = tu.check_symbolic_forward(sym, [x, y], [x * y + np.sin(x)])
    assert outputs[0].shape == (2, 3)
    expected = {"a": y + np.cos(x), "b": x}
    tu.check_symbolic_backward(sym, {"a": x, "b": y}, [np.ones((2, 3))], expected)
    tu.check_symbolic_backward(sym, {"a": x, "b": y}, [np.ones((2, 3))], expected,
                               grad_req="add")
    with pytest.raises(AssertionError, match="BACKWARD_b"):
        tu.check_symbolic_backward(sym, [x, y], [np.ones((2, 3))], {"a": expected["a"], "b": y})
    with pytest.raises(AssertionError, match="FORWARD_"):
        tu.check_symbolic_forward(sym, [x, y], [x * y])
    np.testing.assert_allclose(tu.simple_forward(sym, a=x, b=y), x * y + np.sin(x), rtol=1e-6)


def test_numeric_gradient_check():
    sym = _product_with_sine()
    x, y = np.random.rand(2, 3), np.random.rand(2, 3)
    tu.check_numeric_gradient(sym, [x, y], dtype=np.float64)
    tu.check_numeric_gradient(sym, {"a": x, "b": y}, grad_nodes=["a"], rtol=1e-2, atol=1e-3)


def test_consistency_across_dtypes():
    sym = _product_with_sine()
    spec = {"ctx": mx.cpu(), "a": (2, 3), "b": (2, 3)}
    wide = dict(spec, type_dict={"a": np.float64, "b": np.float64})
    truth = tu.check_consistency([sym, sym], [spec, wide])
    assert sorted(truth) == ["a_grad", sym.list_outputs()[0], "b_grad"]
    assert truth["a_grad"].dtype == np.float64  # the most precise entry is the reference


def test_compare_optimizer_matches_and_catches_a_difference():
    tu.compare_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                         mx.optimizer.SGD(learning_rate=0.1, momentum=0.9), (3, 4), np.float32)
    with pytest.raises(AssertionError):
        tu.compare_optimizer(mx.optimizer.SGD(learning_rate=0.1),
                             mx.optimizer.SGD(learning_rate=0.2), (3, 4), np.float32)


def test_generator_checks():
    scipy_stats = pytest.importorskip("scipy.stats")
    buckets, probs = tu.gen_buckets_probs_with_ppf(lambda q: q * 2, 4)
    assert buckets == [(0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0)] and probs == [0.25] * 4
    np.random.seed(1)
    normal, probs = tu.gen_buckets_probs_with_ppf(lambda q: scipy_stats.norm.ppf(q), 5)
    assert len(tu.verify_generator(lambda n: np.random.normal(size=n), normal, probs,
                                   nsamples=20000)) == 5
    with pytest.raises(AssertionError, match="chi-square"):
        tu.verify_generator(lambda n: np.random.uniform(-1, 1, size=n), normal, probs,
                            nsamples=20000)
    p_value, observed, _ = tu.chi_square_check(lambda n: np.arange(n) % 3, [0, 1, 2],
                                               [1 / 3] * 3, nsamples=3000)
    assert p_value == pytest.approx(1.0) and observed.tolist() == [1000] * 3


def test_discard_stderr_silences_file_descriptor_2(capfd):
    with tu.discard_stderr():
        os.write(2, b"hidden\n")
    os.write(2, b"shown\n")
    assert capfd.readouterr().err == "shown\n"


def test_numpy_api_module_imports_and_refuses_every_name():
    import mixrt.numpy as mx_np  # MXNet 1.x files import it at the top
    assert mx.np is mx_np
    with pytest.raises(AttributeError, match="NumPy-compatible array API"):
        mx_np.random  # noqa: B018
    assert not hasattr(mx_np, "__path__")  # a module, not a package, to the import system


def test_compare_optimizer_gives_the_second_optimizer_one_multi_tensor_call():
    calls = []

    class Recording(mx.optimizer.SGD):
        def update_multi_precision(self, index, weight, grad, state):
            calls.append((self.tag, index))
            return super().update_multi_precision(index, weight, grad, state)

    reference, aggregated = Recording(momentum=0.9), Recording(momentum=0.9)
    reference.tag, aggregated.tag = "reference", "aggregated"
    tu.compare_optimizer(reference, aggregated, [(2, 3), (4,)], np.float32, ntensors=2)
    assert calls == [("reference", 0), ("reference", 1), ("aggregated", [0, 1])]


def test_assert_almost_equal_compares_large_arrays_a_chunk_at_a_time(monkeypatch):
    """Arrays over compare.CHUNK elements are compared in chunks: the same verdict, and an
    element off in the last chunk is still found and reported."""
    monkeypatch.setattr(compare, "CHUNK", 7)
    a = np.linspace(0, 1, 60, dtype=np.float32).reshape(3, 4, 5)
    compare.assert_almost_equal(a, a + 1e-8, rtol=1e-5, atol=1e-6)
    b = a.copy()
    b[2, 3, 4] += 1
    with pytest.raises(AssertionError, match=r"Location of maximum error: \(2, 3, 4\)"):
        compare.assert_almost_equal(a, b, rtol=1e-5, atol=1e-6)
