"""MXNet's random API (``mx.random``, ``mx.nd.random``, ``mx.sym.random``, the flat
``random_*``/``sample_*`` names) against MXNet 1.9.1's documented behaviour.

The shapes, dtypes, defaults and refusals written down here are what MXNet 1.9.1 gave for
the same calls (checked 2026-11-24; MXNet is not needed to run these). Statistics are checked
on large seeded samples with tolerances of many standard errors, so they cannot flake: a
different seed would pass too.
"""

import math

import numpy as np
import pytest

import mixrt
from mixrt import autograd, nd, sym
from mixrt.errors import GradientError, GraphError, InputError
from mixrt.ops import REGISTRY
from mixrt.ops.device import gpu_available

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
mx = mixrt  # the calls below read as MXNet code: mx.nd.random.uniform(...)


def _values(x) -> np.ndarray:
    return np.asarray(x.asnumpy() if hasattr(x, "asnumpy") else x, dtype=np.float64)


# -- shapes, dtypes and defaults, as MXNet 1.9.1 gives them ------------------------------------
# (expression, shape, dtype); ``p`` is [[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]] and ``a``, ``b``
# are float32 arrays of shape (3,)

SHAPES = [
    ("mx.nd.random.uniform()", (1,), "float32"),
    ("mx.nd.random.uniform(shape=(2, 3))", (2, 3), "float32"),
    ("mx.nd.random.uniform(-1, 1, shape=[2, 3])", (2, 3), "float32"),
    ("mx.nd.random.uniform(shape=2, dtype='float64')", (2,), "float64"),
    ("mx.nd.random.uniform(shape=2, dtype='float16')", (2,), "float16"),
    ("mx.nd.random.uniform(a, b, shape=(2, 4))", (3, 2, 4), "float32"),
    ("mx.nd.random.uniform(a, b)", (3,), "float32"),
    ("mx.nd.random.uniform(a.astype('float64'), b.astype('float64'), shape=2)", (3, 2),
     "float32"),
    ("mx.nd.random.uniform(a, b, shape=2, dtype='float64')", (3, 2), "float64"),
    ("mx.nd.random.normal()", (1,), "float32"),
    ("mx.nd.random.normal(shape=2, dtype=np.float64)", (2,), "float64"),
    ("mx.nd.random.randn(2, 3)", (2, 3), "float32"),
    ("mx.nd.random.randn(2, 3, loc=5, scale=0.1)", (2, 3), "float32"),
    ("mx.nd.random.randn(2, dtype='float64')", (2,), "float64"),
    ("mx.nd.random.randint(0, 10, shape=(2, 3))", (2, 3), "int32"),
    ("mx.nd.random.randint(0, 10)", (1,), "int32"),
    ("mx.nd.random.randint(0, 10, shape=3, dtype='int64')", (3,), "int64"),
    ("mx.nd.random.poisson(3, shape=4)", (4,), "float32"),
    ("mx.nd.random.exponential(2, shape=4)", (4,), "float32"),
    ("mx.nd.random.exponential(a, shape=4)", (3, 4), "float32"),
    ("mx.nd.random.gamma(2, 3, shape=4)", (4,), "float32"),
    ("mx.nd.random.negative_binomial(3, 0.4, shape=4)", (4,), "float32"),
    ("mx.nd.random.generalized_negative_binomial(3, 0.4, shape=4)", (4,), "float32"),
    ("mx.nd.random.multinomial(p)", (2,), "int32"),
    ("mx.nd.random.multinomial(mx.nd.array([0.1, 0.9]))", (1,), "int32"),
    ("mx.nd.random.multinomial(p, shape=(2, 5))", (2, 2, 5), "int32"),
    ("mx.nd.random.multinomial(mx.nd.array([0.1, 0.9]), shape=3)", (3,), "int32"),
    ("mx.nd.random.multinomial(p, dtype='float32')", (2,), "float32"),
    ("mx.nd.random.multinomial(p, dtype='uint8')", (2,), "uint8"),
    ("mx.nd.random.multinomial(p, dtype='float16')", (2,), "float16"),
    ("mx.nd.random.multinomial(p, shape=3, get_prob=True)[1]", (2, 3), "float32"),
    ("mx.nd.random.multinomial(mx.nd.array([0.5, 0.5], dtype='float64'), get_prob=True)[1]",
     (1,), "float64"),
    ("mx.nd.random.shuffle(mx.nd.arange(10))", (10,), "float32"),
    ("mx.nd.random.shuffle(mx.nd.arange(4, dtype='int32'))", (4,), "int32"),
    ("mx.nd.random.uniform_like(mx.nd.zeros((2, 3), dtype='float64'), low=1, high=2)",
     (2, 3), "float64"),
    ("mx.nd.random.normal_like(mx.nd.zeros((2, 3)), loc=1, scale=2)", (2, 3), "float32"),
    ("mx.nd.random.gamma_like(mx.nd.zeros((2, 3)))", (2, 3), "float32"),
    ("mx.nd.random.exponential_like(mx.nd.zeros((2, 3)), lam=3)", (2, 3), "float32"),
    ("mx.nd.random.poisson_like(mx.nd.zeros((2, 3), dtype='float16'), lam=3)", (2, 3),
     "float16"),
    ("mx.nd.random_uniform(shape=(2,))", (2,), "float32"),
    ("mx.nd.uniform(low=1, high=2, shape=3)", (3,), "float32"),
    ("mx.nd.normal(loc=1, scale=2, shape=3)", (3,), "float32"),
    ("mx.nd.random_normal(shape=3, dtype='float64')", (3,), "float64"),
    ("mx.nd.random_exponential(lam=2, shape=3)", (3,), "float32"),
    ("mx.nd.random_randint(low=0, high=5, shape=3)", (3,), "int32"),
    ("mx.nd.random_gamma(shape=3)", (3,), "float32"),
    ("mx.nd.random_poisson(shape=3)", (3,), "float32"),
    ("mx.nd.random_negative_binomial(shape=3)", (3,), "float32"),
    ("mx.nd.random_generalized_negative_binomial(shape=3)", (3,), "float32"),
    ("mx.nd.sample_uniform(a, b, shape=3)", (3, 3), "float32"),
    ("mx.nd.sample_uniform(a, b)", (3,), "float32"),
    ("mx.nd.sample_normal(mu=a, sigma=b, shape=(3, 2))", (3, 3, 2), "float32"),
    ("mx.nd.sample_exponential(a.astype('float64'), shape=3)", (3, 3), "float32"),
    ("mx.nd.sample_exponential(a.astype('float64'), shape=3, dtype='float16')", (3, 3),
     "float16"),
    ("mx.nd.sample_poisson(a, shape=3)", (3, 3), "float32"),
    ("mx.nd.sample_gamma(mx.nd.array([[1, 2]]), mx.nd.array([[1, 2]]), shape=(1, 3))",
     (1, 2, 1, 3), "float32"),
    ("mx.nd.sample_negative_binomial(a, b / 4, shape=3)", (3, 3), "float32"),
    ("mx.nd.sample_generalized_negative_binomial(a, b, shape=3)", (3, 3), "float32"),
    ("mx.nd.sample_multinomial(mx.nd.array([[0.5, 0.5]]), shape=3)", (1, 3), "int32"),
    ("mx.nd.sample_multinomial(mx.nd.array([[0.5, 0.5]]), shape=3, get_prob=True)[1]",
     (1, 3), "float32"),
    ("mx.nd.shuffle(mx.nd.arange(5))", (5,), "float32"),
    ("mx.nd.random.uniform(out=mx.nd.zeros((2, 3), dtype='float64'))", (2, 3), "float64"),
    ("mx.nd.random.gamma(a, b, shape=3, out=mx.nd.zeros((3, 3)))", (3, 3), "float32"),
    ("mx.random.uniform(shape=(2, 2))", (2, 2), "float32"),
    ("mx.random.normal(0, 1, shape=5)", (5,), "float32"),
]


def _environment():
    return dict(mx=mx, np=np, a=nd.array([1.0, 2.0, 3.0]), b=nd.array([2.0, 3.0, 4.0]),
                p=nd.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]))


@pytest.mark.parametrize("expression, shape, dtype", SHAPES, ids=[s[0] for s in SHAPES])
def test_shapes_and_dtypes_are_mxnets(expression, shape, dtype):
    got = eval(expression, _environment())  # noqa: S307  (our own table)
    assert isinstance(got, nd.NDArray)
    assert got.shape == shape and got.dtype == np.dtype(dtype), (got.shape, got.dtype)


def test_mx_random_holds_the_nd_samplers_and_the_seed():
    for name in ("uniform", "normal", "randn", "randint", "poisson", "exponential", "gamma",
                 "negative_binomial", "generalized_negative_binomial", "multinomial",
                 "shuffle"):
        assert getattr(mx.random, name) is getattr(nd.random, name)
    assert nd.uniform is nd.random_uniform and nd.normal is nd.random_normal


# -- moments ----------------------------------------------------------------------------------

N = 200_000


def _moments(draws):
    values = _values(draws)
    return values.mean(), values.std()


def _close(got, want, sigma, what):
    """Within 6 standard errors of a sample of N (a seeded draw: this never flakes)."""
    assert abs(got - want) <= 6 * sigma / math.sqrt(N) + 1e-9, f"{what}: {got} vs {want}"


DISTRIBUTIONS = {
    # name: (call, mean, standard deviation)
    "uniform": (lambda: nd.random.uniform(-1.5, 3.0, shape=N), 0.75, 4.5 / math.sqrt(12)),
    "normal": (lambda: nd.random.normal(10.0, 0.5, shape=N), 10.0, 0.5),
    "randn": (lambda: nd.random.randn(N, loc=-2.0, scale=3.0), -2.0, 3.0),
    "gamma": (lambda: nd.random.gamma(9.0, 0.5, shape=N), 4.5, math.sqrt(9.0) * 0.5),
    "gamma, alpha < 1": (lambda: nd.random.gamma(0.5, 2.0, shape=N), 1.0, math.sqrt(0.5) * 2),
    "exponential": (lambda: nd.random.exponential(0.25, shape=N), 0.25, 0.25),
    "poisson": (lambda: nd.random.poisson(4.0, shape=N), 4.0, 2.0),
    "negative binomial": (lambda: nd.random.negative_binomial(3, 0.4, shape=N),
                          3 * 0.6 / 0.4, math.sqrt(3 * 0.6) / 0.4),
    "generalized negative binomial": (
        lambda: nd.random.generalized_negative_binomial(2.0, 0.3, shape=N), 2.0,
        math.sqrt(2.0 + 0.3 * 4.0)),
    "generalized negative binomial, alpha 0": (
        lambda: nd.random.generalized_negative_binomial(3.0, 0.0, shape=N), 3.0,
        math.sqrt(3.0)),
    "randint": (lambda: nd.random.randint(-3, 7, shape=N), 1.5, math.sqrt((10 ** 2 - 1) / 12)),
    "random_exponential (a rate)": (lambda: nd.random_exponential(lam=4.0, shape=N), 0.25,
                                    0.25),
}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_moments(name):
    call, mean, std = DISTRIBUTIONS[name]
    mx.random.seed(128)
    got_mean, got_std = _moments(call())
    _close(got_mean, mean, std, "mean")
    # the sample standard deviation's own standard error is about std / sqrt(2N) (normal
    # data); heavier tails need more: 4 times that covers the skewed ones here
    assert abs(got_std - std) <= 4 * 6 * std / math.sqrt(2 * N), (got_std, std)


def test_uniform_stays_in_its_half_open_interval_and_integers_in_theirs():
    mx.random.seed(3)
    u = _values(nd.random.uniform(2.0, 2.5, shape=N, dtype="float64"))
    assert u.min() >= 2.0 and u.max() < 2.5
    k = nd.random.randint(-2, 3, shape=N).asnumpy()
    assert set(np.unique(k)) == {-2, -1, 0, 1, 2}
    counts = _values(nd.random.poisson(0.7, shape=1000))
    assert (counts == np.round(counts)).all() and counts.min() >= 0


def test_array_parameters_draw_per_element():
    """MXNet's own test's parameters (tests/python/unittest/test_random.py): one set of
    samples per element, each with its own moments; alpha 0 gives a gamma of zeros."""
    mx.random.seed(128)
    cases = [
        (nd.random.normal, dict(loc=[[0.0, 2.5], [-9.75, -7.0]], scale=[[1.0, 3.7], [4.2, 1.5]]),
         lambda loc, scale: (loc, scale)),
        (nd.random.uniform, dict(low=[[0.0, 2.5], [-9.75, -1.0]], high=[[1.0, 3.7], [4.2, 10.5]]),
         lambda low, high: ((low + high) / 2, (high - low) / math.sqrt(12))),
        (nd.random.gamma, dict(alpha=[[0.0, 2.5], [9.75, 11.0]], beta=[[1.0, 0.7], [0.5, 0.3]]),
         lambda alpha, beta: (alpha * beta, math.sqrt(alpha) * beta)),
        (nd.random.exponential, dict(scale=[[1.0, 1 / 8.5], [1 / 2.7, 2.0]]),
         lambda scale: (scale, scale)),
        (nd.random.poisson, dict(lam=[[25.0, 8.5], [2.7, 0.5]]),
         lambda lam: (lam, math.sqrt(lam))),
        (nd.random.negative_binomial, dict(k=[[3, 4], [5, 6]], p=[[0.4, 0.77], [0.5, 0.84]]),
         lambda k, p: (k * (1 - p) / p, math.sqrt(k * (1 - p)) / p)),
        (nd.random.generalized_negative_binomial,
         dict(mu=[[2.0, 2.5], [1.3, 1.9]], alpha=[[1.0, 0.1], [0.2, 0.5]]),
         lambda mu, alpha: (mu, math.sqrt(mu + alpha * mu ** 2))),
    ]
    for sampler, params, moments in cases:
        arrays = {k: nd.array(v) for k, v in params.items()}
        draws = _values(sampler(**arrays, shape=N))
        assert draws.shape == (2, 2, N)
        for i in range(2):
            for j in range(2):
                mean, std = moments(*(params[k][i][j] for k in params))
                _close(draws[i, j].mean(), mean, max(std, 1e-3), f"{sampler.__name__}[{i},{j}]")


def test_sample_operators_take_rates_and_arrays():
    mx.random.seed(5)
    draws = _values(nd.sample_exponential(nd.array([1.0, 4.0]), shape=N))  # rates
    _close(draws[0].mean(), 1.0, 1.0, "rate 1")
    _close(draws[1].mean(), 0.25, 0.25, "rate 4")
    normal = _values(nd.sample_normal(mu=nd.array([0.0, 5.0]), sigma=nd.array([1.0, 0.1]),
                                      shape=N))
    _close(normal[1].mean(), 5.0, 0.1, "mu 5")
    assert abs(normal[1].std() - 0.1) < 0.01


def test_multinomial_frequencies_and_log_probabilities():
    mx.random.seed(7)
    probs = [0.1, 0.2, 0.3, 0.05, 0.15, 0.2]
    for dtype in ("float16", "float32", "float64"):
        data = nd.array(probs, dtype=dtype)
        draws = nd.random.multinomial(data, shape=N).asnumpy()
        assert draws.dtype == np.int32 and draws.shape == (N,)
        frequencies = np.bincount(draws, minlength=6) / N
        np.testing.assert_allclose(frequencies, np.asarray(probs, dtype=dtype), atol=0.006)
    batch = nd.array([[0.0, 0.1, 0.9], [1.0, 0.0, 0.0]])
    samples, log_p = nd.random.multinomial(batch, shape=1000, get_prob=True)
    picked = samples.asnumpy()
    assert (picked[1] == 0).all() and set(np.unique(picked[0])) <= {1, 2}
    np.testing.assert_allclose(log_p.asnumpy(), np.log(batch.asnumpy()[[[0], [1]], picked]),
                               rtol=1e-6)


def test_many_classes_take_the_binary_search_and_agree_with_the_probabilities():
    mx.random.seed(9)
    probs = np.full(300, 1.0 / 600)
    probs[17] = 0.5
    draws = nd.random.multinomial(nd.array(probs), shape=20_000).asnumpy()
    assert abs((draws == 17).mean() - 0.5) < 0.02 and draws.max() < 300


def test_shuffle_moves_whole_rows_and_every_order_is_equally_likely():
    data = nd.arange(0, 18).reshape((3, 2, 3))
    mx.random.seed(11)
    for _ in range(20):
        got = nd.random.shuffle(data).asnumpy()
        assert sorted(got[:, 0, 0].tolist()) == [0, 6, 12]
        for row in got:
            np.testing.assert_array_equal(row.ravel(), np.arange(row.flat[0], row.flat[0] + 6))
    orders = {}
    for _ in range(6000):
        key = tuple(nd.random.shuffle(nd.arange(3)).asnumpy().astype(int))
        orders[key] = orders.get(key, 0) + 1
    assert len(orders) == 6 and all(abs(c / 6000 - 1 / 6) < 0.03 for c in orders.values())
    np.testing.assert_array_equal(data.asnumpy().ravel(), np.arange(18))  # not modified


# -- seeding ----------------------------------------------------------------------------------

SEEDED_CALLS = [
    lambda: nd.random.uniform(-1, 1, shape=(50,)),
    lambda: nd.random.gamma(nd.array([1.0, 2.0]), nd.array([1.0, 1.0]), shape=10),
    lambda: nd.random.multinomial(nd.array([0.25, 0.25, 0.5]), shape=50),
    lambda: nd.random.shuffle(nd.arange(50)),
    lambda: nd.random.randint(0, 1000, shape=50),
    lambda: nd.random.poisson(4, shape=50),
]


@pytest.mark.parametrize("call", SEEDED_CALLS)
def test_the_same_seed_repeats_the_draws_and_another_changes_them(call):
    mx.random.seed(128)
    first = call().asnumpy()
    mx.random.seed(128)
    np.testing.assert_array_equal(call().asnumpy(), first)
    mx.random.seed(129)
    assert not np.array_equal(call().asnumpy(), first)


def test_seeding_the_cpu_repeats_cpu_draws_and_seeding_a_gpu_leaves_them_alone():
    mx.random.seed(5)
    first = nd.random.uniform(shape=20).asnumpy()
    mx.random.seed(5, ctx=mx.cpu())
    np.testing.assert_array_equal(nd.random.uniform(shape=20).asnumpy(), first)
    mx.random.seed(5)
    nd.random.uniform(shape=20)
    mx.random.seed(6, ctx=mx.gpu(0))  # MXNet too: no error, the CPU's stream goes on
    assert not np.array_equal(nd.random.uniform(shape=20).asnumpy(), first)
    mx.random.seed(5, ctx="cpu")
    np.testing.assert_array_equal(nd.random.uniform(shape=20).asnumpy(), first)


def test_seed_takes_any_int_and_refuses_the_rest():
    for value in (-1, 0, 2 ** 40, np.int64(7)):
        mx.random.seed(value)
    with pytest.raises(InputError, match="seed: seed_state must be an int"):
        mx.random.seed(1.5)
    with pytest.raises(InputError, match="seed: seed_state"):
        mx.random.seed("a")
    with pytest.raises(InputError, match="seed: ctx must be"):
        mx.random.seed(1, ctx="tpu")
    with pytest.raises(InputError, match="seed: ctx must be"):
        mx.random.seed(1, ctx=3)


def test_the_seed_also_fixes_numpy_and_the_initializers():
    mx.random.seed(21)
    first = (np.random.rand(3), mixrt.random.generator().random(3))
    mx.random.seed(21)
    np.testing.assert_array_equal(np.random.rand(3), first[0])
    np.testing.assert_array_equal(mixrt.random.generator().random(3), first[1])


# -- out= --------------------------------------------------------------------------------------

def test_out_receives_the_samples_and_lends_its_shape_and_dtype():
    out = nd.zeros((2, 3), dtype="float64")
    got = nd.random.uniform(5, 6, out=out)
    assert got is out and out.dtype == np.float64
    assert (out.asnumpy() >= 5).all()
    counts = nd.zeros((4,), dtype="int64")
    assert nd.random.randint(0, 3, out=counts) is counts and counts.asnumpy().max() < 3
    target = nd.zeros((5,))
    assert nd.random.shuffle(nd.arange(5), out=target) is target
    assert sorted(target.asnumpy()) == [0, 1, 2, 3, 4]


def test_out_of_another_shape_or_dtype_is_refused():
    with pytest.raises(InputError, match=r"uniform: out is float32\[2, 3\]"):
        nd.random.uniform(shape=(2, 2), out=nd.zeros((2, 3)))
    with pytest.raises(InputError, match="uniform: out holds float32 and the samples are "
                                         "float16"):
        nd.random.uniform(shape=(2, 3), dtype="float16", out=nd.zeros((2, 3)))


# -- bad arguments: typed errors naming the function and the argument ------------------------

REFUSED = [
    # MXNet's own checks (its message in the comment)
    ("mx.nd.random.uniform(2, 1, shape=2)", "uniform: low must be <= high"),  # high >= low
    ("mx.nd.random.normal(0, -1, shape=3)", "normal: scale must be > 0"),  # scale > 0
    ("mx.nd.random.normal(0, 0, shape=3)", "normal: scale must be > 0"),
    ("mx.nd.random.poisson(-3, shape=4)", "poisson: lam must be >= 0"),
    ("mx.nd.random.exponential(-1, shape=4)", "exponential: scale must be > 0"),
    ("mx.nd.random.exponential(0, shape=4)", "exponential: scale must be > 0"),
    ("mx.nd.random.gamma(-2, 3, shape=4)", "gamma: alpha must be > 0"),
    ("mx.nd.random.gamma(0, 3, shape=4)", "gamma: alpha must be > 0"),
    ("mx.nd.random.gamma(2, -3, shape=4)", "gamma: beta must be > 0"),
    ("mx.nd.random.negative_binomial(-3, 0.4, shape=4)", "negative_binomial: k must be >= 0"),
    ("mx.nd.random.generalized_negative_binomial(-3, 0.4, shape=4)",
     "generalized_negative_binomial: mu must be >= 0"),
    ("mx.nd.random.generalized_negative_binomial(3, -0.4, shape=4)",
     "generalized_negative_binomial: alpha must be >= 0"),
    ("mx.nd.random.randint(10, 0, shape=3)", "randint: low must be < high"),
    # MXNet refuses these when it infers shapes or reads dtypes
    ("mx.nd.random.uniform(shape=2, dtype='int32')", r"uniform: dtype='int32' is not one of"),
    ("mx.nd.random.uniform(shape=2, dtype='foo')", "uniform: dtype='foo' is not a dtype"),
    ("mx.nd.random.poisson(3, shape=4, dtype='int32')", "poisson: dtype='int32' is not"),
    ("mx.nd.random.randint(0, 10, shape=3, dtype='float32')",
     r"randint: dtype='float32' is not one of \['int32', 'int64'\]"),
    ("mx.nd.random.randint(0.5, 10.5, shape=3)", "randint: low must be an int"),
    ("mx.nd.random.multinomial(p, dtype='int64')", "multinomial: dtype='int64' is not one of"),
    ("mx.nd.random.multinomial(mx.nd.array([1, 0], dtype='int32'))",
     "multinomial: data must hold floating-point probabilities"),
    ("mx.nd.random.uniform(shape=())", r"uniform: shape must have at least one dimension"),
    ("mx.nd.random.uniform(shape=(0, 3))", r"uniform: every dimension of shape must be > 0"),
    ("mx.nd.random.randint(0, 5, shape=(-1,))", "randint: every dimension of shape"),
    ("mx.nd.random.randn()", "randn: shape is required"),
    ("mx.nd.random_uniform()", "random_uniform: shape is required"),
    ("mx.nd.random.uniform(a, b[:2], shape=2)",
     r"uniform: the parameter arrays must have one shape"),
    ("mx.nd.random.shuffle(mx.nd.array(3.0))", "shuffle: data must have at least one axis"),
    # MXNet's asserts and ValueErrors
    ("mx.nd.random.uniform(a, 3, shape=2)", "uniform: the distribution's parameters must all "
                                            "be numbers or all be NDArrays"),
    ("mx.nd.random.uniform('a', 3, shape=2)", "uniform: the distribution's parameters"),
    ("mx.nd.sample_gamma(1.0, 2.0)", "sample_gamma: alpha must be an NDArray"),
    ("mx.nd.random.uniform(shape=2, foo=1)", "uniform: unknown argument 'foo'"),
    ("mx.nd.random.uniform(shape=2, out=np.zeros(2))", "uniform: out must be an NDArray"),
    # MXNet gives zeros, garbage or a wrapped-around index for these
    ("mx.nd.random.multinomial(mx.nd.zeros(300), dtype='uint8')",
     "multinomial: 300 classes do not all fit exactly in dtype='uint8'"),
    ("mx.nd.random.negative_binomial(3, 1.4, shape=4)",
     r"negative_binomial: p must be in \(0, 1\]"),
    ("mx.nd.random.negative_binomial(3, 0, shape=4)", r"negative_binomial: p must be in"),
]


@pytest.mark.parametrize("expression, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_arguments_raise_input_error_naming_function_and_argument(expression, message):
    # number parameters are checked as the sampler runs, as in MXNet: at the next wait
    with pytest.raises(mixrt.MXNetError, match=message) as caught:
        eval(expression, _environment())  # noqa: S307  (our own table)
        nd.waitall()
    error = caught.value
    assert isinstance(error, InputError) or isinstance(error.__cause__, InputError)


def test_symbols_refuse_bad_arguments_with_graph_error():
    with pytest.raises(GraphError, match="normal: scale must be > 0"):
        sym.random.normal(0, -1, shape=3)
    with pytest.raises(GraphError, match="uniform: shape is required"):
        sym.random.uniform()
    with pytest.raises(GraphError, match="gamma: the distribution's parameters must all be "
                                         "numbers or all be Symbols"):
        sym.random.gamma(sym.var("a"), 2.0, shape=3)
    with pytest.raises(GraphError, match="sample_uniform: low must be a Symbol"):
        sym.sample_uniform(0.0, sym.var("h"))


# -- autograd ---------------------------------------------------------------------------------

def test_parameters_get_a_zero_gradient_as_in_mxnet():
    """MXNet 1.9.1: the gradients of loc and scale through nd.random.normal are 0, and so
    for uniform, gamma, exponential and poisson."""
    for sampler, values in [(nd.random.normal, ([1.0, 2.0], [1.0, 3.0])),
                            (nd.random.uniform, ([0.0, 1.0], [1.0, 3.0])),
                            (nd.random.gamma, ([2.0, 3.0], [1.0, 2.0])),
                            (nd.random.exponential, ([1.0, 2.0],)),
                            (nd.random.poisson, ([1.0, 2.0],))]:
        params = [nd.array(v) for v in values]
        for param in params:
            param.attach_grad()
        with autograd.record():
            y = sampler(*params, shape=3)
        y.backward()
        for param in params:
            np.testing.assert_array_equal(param.grad.asnumpy(), 0)


def test_multinomial_log_probabilities_send_their_gradient_to_the_probabilities():
    """MXNet's get_prob gradient (its test_sample_multinomial): dY / p at each drawn class."""
    probs = nd.array([[0.0, 0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1, 0.0]])
    probs.attach_grad()
    with autograd.record():
        samples, log_p = nd.random.multinomial(probs, shape=2000, get_prob=True)
        (log_p * 5).backward()
    picked, p = samples.asnumpy(), probs.asnumpy()
    expected = np.zeros_like(p)
    for row in range(2):
        np.add.at(expected[row], picked[row], 5.0 / p[row, picked[row]])
    np.testing.assert_allclose(probs.grad.asnumpy(), expected, rtol=1e-5)


def test_shuffle_has_no_gradient_as_in_mxnet():
    x = nd.array([1.0, 2.0, 3.0])
    x.attach_grad()
    with autograd.record():
        y = nd.random.shuffle(x)
    with pytest.raises(GradientError, match="Shuffle"):
        y.backward()


# -- symbols ----------------------------------------------------------------------------------

def test_symbols_infer_shapes_types_and_names_as_mxnet():
    s = sym.random.uniform(low=0, high=1, shape=(2, 3))
    assert s.list_arguments() == [] and s.infer_shape()[1] == [(2, 3)]
    assert s.infer_type()[1] == [np.float32]
    params = sym.random.normal(sym.var("a"), sym.var("b"), shape=4)
    assert params.infer_shape(a=(2, 3), b=(2, 3))[1] == [(2, 3, 4)]
    draws = sym.random.multinomial(sym.var("p"), shape=3)  # get_prob: True for symbols
    assert len(draws.list_outputs()) == 2
    assert draws.infer_shape(p=(2, 5))[1] == [(2, 3), (2, 3)]
    assert draws.infer_type(p="float32")[1] == [np.int32, np.float32]
    assert len(sym.random.multinomial(sym.var("p"), get_prob=False).list_outputs()) == 1
    assert sym.random.randint(0, 10, shape=(3,)).infer_type()[1] == [np.int32]
    assert sym.random.exponential(scale=sym.var("s"), shape=2).list_arguments() == ["s"]
    assert sym.random.gamma_like(sym.var("d")).infer_type(d="float64")[1] == [np.float64]
    assert sym.random.gamma(shape=2).name.startswith("_random_gamma")
    assert sym.random.gamma(sym.var("a"), sym.var("b"), shape=2).name.startswith("_sample_gamma")
    assert sym.random.normal(shape=2, name="noise").name == "noise"
    assert sym.random.shuffle(sym.var("a")).name.startswith("_shuffle")


SYMBOL_SAMPLERS = {
    "uniform": lambda: sym.random.uniform(shape=(2, 2)),
    "gamma": lambda: sym.random.gamma(2, 3, shape=(2, 2)),  # constants: a mixrt op
    "poisson": lambda: sym.random.poisson(4, shape=(2, 2)),
    "randint": lambda: sym.random.randint(0, 1000, shape=(2, 2)).astype("float32"),
}


def _bound(make):
    x, x_grad = nd.zeros((2, 2)), nd.zeros((2, 2))
    return (make() + sym.var("X")).bind(mx.cpu(), {"X": x}, {"X": x_grad}), x_grad


@pytest.mark.parametrize("name", SYMBOL_SAMPLERS)
def test_a_bound_executor_draws_afresh_at_every_forward_and_the_seed_repeats_it(name):
    """Nothing folds the sampler into a constant, even with constant parameters."""
    executor, _ = _bound(SYMBOL_SAMPLERS[name])
    first = _values(executor.forward()[0])
    assert not np.array_equal(_values(executor.forward()[0]), first)
    mx.random.seed(128)
    drawn = _values(executor.forward()[0])
    mx.random.seed(128)
    np.testing.assert_array_equal(_values(executor.forward()[0]), drawn)


@pytest.mark.parametrize("name", SYMBOL_SAMPLERS)
def test_mxnets_symbolic_seed_check(name):
    """MXNet's test_random, symbolic part: seed, a training forward and backward (the
    gradient of X is the output), seed again, an inference forward: the same draws. (Each is
    its session's first run, which draws twice: discovery, then the planned run.)"""
    executor, x_grad = _bound(SYMBOL_SAMPLERS[name])
    mx.random.seed(128)
    executor.forward(is_train=True)
    executor.backward(executor.outputs[0])
    drawn = _values(executor.outputs[0])
    np.testing.assert_array_equal(x_grad.asnumpy(), drawn)
    mx.random.seed(128)
    np.testing.assert_array_equal(_values(executor.forward()[0]), drawn)


def test_symbol_parameters_draw_per_element_in_an_executor():
    mx.random.seed(128)
    alpha, beta = [[0.5, 2.5], [9.75, 11.0]], [[1.0, 0.7], [0.5, 0.3]]
    draws = sym.random.gamma(sym.var("v1"), sym.var("v2"), shape=(N // 4,))
    executor = draws.bind(mx.cpu(), {"v1": nd.array(alpha), "v2": nd.array(beta)})
    got = _values(executor.forward()[0])
    assert got.shape == (2, 2, N // 4)
    for i in range(2):
        for j in range(2):
            mean, std = alpha[i][j] * beta[i][j], math.sqrt(alpha[i][j]) * beta[i][j]
            assert abs(got[i, j].mean() - mean) <= 6 * std / math.sqrt(N // 4)


def test_symbol_shuffle_and_multinomial_run():
    a = sym.var("a")
    twice = sym.random.shuffle(data=sym.random.shuffle(a), name="c")
    got = _values(twice.eval(a=nd.arange(6))[0])
    assert sorted(got) == [0, 1, 2, 3, 4, 5]
    draws = sym.random.multinomial(sym.var("P"), shape=1000, get_prob=False)
    executor = draws.bind(mx.cpu(), {"P": nd.array([0.0, 0.0, 1.0])})
    np.testing.assert_array_equal(_values(executor.forward()[0]), 2)
    uniform = sym.random.uniform_like(sym.var("d"), low=2, high=3).eval(d=nd.zeros((2, 2)))[0]
    assert ((_values(uniform) >= 2) & (_values(uniform) < 3)).all()


def test_flat_symbol_names():
    for name in ("random_uniform", "random_normal", "random_gamma", "random_exponential",
                 "random_poisson", "random_negative_binomial",
                 "random_generalized_negative_binomial", "random_randint", "sample_uniform",
                 "sample_normal", "sample_gamma", "sample_exponential", "sample_poisson",
                 "sample_negative_binomial", "sample_generalized_negative_binomial",
                 "sample_multinomial", "shuffle", "uniform", "normal"):
        assert callable(getattr(sym, name)) and callable(getattr(nd, name))
    s = sym.sample_uniform(sym.var("lo"), sym.var("hi"), shape=3)
    assert s.infer_shape(lo=(2,), hi=(2,))[1] == [(2, 3)]


# -- the GPU: each device its own stream ----------------------------------------------------------

@needs_gpu
def test_the_onnx_random_ops_draw_on_the_gpu_from_its_own_stream():
    for op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"):
        kernel = REGISTRY.find("", op_type, 22)
        assert kernel.for_device("gpu") is kernel.fast["gpu"] is not kernel.fn


@needs_gpu
@pytest.mark.parametrize("call", SEEDED_CALLS[:1] + [
    lambda: nd.random.normal(2, 3, shape=50, ctx=mx.gpu(0)),
    lambda: nd.random.gamma(2, 3, shape=50, ctx=mx.gpu(0)),
    lambda: nd.random.randint(0, 1000, shape=50, ctx=mx.gpu(0)),
    lambda: nd.random.multinomial(nd.array([0.25, 0.75], ctx=mx.gpu(0)), shape=50),
    lambda: nd.random.shuffle(nd.arange(50, ctx=mx.gpu(0))),
])
def test_seeding_a_gpu_repeats_its_draws(call):
    with mx.gpu(0):
        mx.random.seed(128, ctx=mx.gpu(0))
        first = call()
        assert first.ctx == mx.gpu(0)
        mx.random.seed(128, ctx=mx.gpu(0))
        np.testing.assert_array_equal(call().asnumpy(), first.asnumpy())


@needs_gpu
def test_samplers_on_the_gpu_have_their_moments():
    mx.random.seed(1)
    gamma = nd.random.gamma(nd.array([9.0], ctx=mx.gpu(0)), nd.array([0.5], ctx=mx.gpu(0)),
                            shape=N)
    assert gamma.ctx == mx.gpu(0)
    _close(_values(gamma).mean(), 4.5, 1.5, "gamma on the GPU")
    uniform = nd.random.uniform(-1, 1, shape=N, ctx=mx.gpu(0))
    _close(_values(uniform).mean(), 0.0, 2 / math.sqrt(12), "uniform on the GPU")
    nb = nd.random.negative_binomial(3, 0.4, shape=N, ctx=mx.gpu(0))
    _close(_values(nb).mean(), 4.5, math.sqrt(1.8) / 0.4, "negative binomial on the GPU")


# -- densities: random_pdf_* ----------------------------------------------------------------------
# MXNet 1.9.1's values and gradients (d sum(out) / d input) for these samples and parameters

PDF_SAMPLE = [[0.5, 1.0, 2.0], [1.5, 0.25, 3.0]]
DIRICHLET_SAMPLE = [[[0.2, 0.3, 0.5]], [[0.1, 0.1, 0.8]]]
PDF_PARAMETERS = {
    "uniform": ([0., 1.], [3., 4.]), "normal": ([0., 1.], [1., 2.]),
    "gamma": ([2., 3.], [1., 2.]), "exponential": ([2., 3.],), "poisson": ([2., 3.],),
    "negative_binomial": ([2., 3.], [0.4, 0.5]),
    "generalized_negative_binomial": ([2., 3.], [0.4, 0.5]),
    "dirichlet": ([[1., 2., 3.], [2., 2., 2.]],),
}
MXNET_PDFS = {
    ("uniform", False): ([[0.3333333, 0.3333333, 0.3333333], [0.3333333, 0.3333333, 0.3333333]], [[0., 0., 0.], [0., 0., 0.]], [[0.3333333, 0.3333333], [-0.3333333, -0.3333333]]),  # noqa: E501
    ("uniform", True): ([[-1.0986123, -1.0986123, -1.0986123], [-1.0986123, -1.0986123, -1.0986123]], [[0., 0., 0.], [0., 0., 0.]], [[1., 1.], [-1., -1.]]),  # noqa: E501
    ("normal", False): ([[0.3520653, 0.2419707, 0.053991], [0.1933341, 0.1859275, 0.1209854]], [[-0.1760327, -0.2419707, -0.1079819], [-0.0241668, 0.0348614, -0.0604927]], [[0.5259853, 0.049798], [-0.1020761, -0.1705161]]),  # noqa: E501
    ("normal", True): ([[-1.0439385, -1.4189385, -2.9189386], [-1.6433357, -1.6823982, -2.1120858]], [[-0.5, -1., -2.], [-0.125, 0.1875, -0.5]], [[3.5, 0.4375], [2.25, -0.8984375]]),  # noqa: E501
    ("gamma", False): ([[0.3032653, 0.3678795, 0.2706706], [0.4480836, 0.1516327, 0.0892351]], [[0.3032653, 0., -0.1353353], [-0.2987224, 0.909796, -0.1189801]], [[-0.4207777, -0.0886993], [0.8227775, 0.0556882]]),  # noqa: E501
    ("gamma", True): ([[-1.1931472, -1., -1.3068528], [-0.8027754, -1.8862944, -2.416481]], [[1., 0., -0.5], [-0.6666666, 6., -1.3333333]], [[-1.268353, -0.5711284], [2.5, -0.25]]),  # noqa: E501
    ("exponential", False): ([[7.3575890e-01, 2.7067056e-01, 3.6631279e-02], [3.3326991e-02, 1.4170997e+00, 3.7022942e-04]], [[-1.4715178e+00, -5.4134113e-01, -7.3262557e-02], [-9.9980973e-02, -4.2512989e+00, -1.1106883e-03]], [[-0.1902822, 0.0782229]]),  # noqa: E501
    ("exponential", True): ([[-0.3068528, -1.3068528, -3.3068528], [-3.4013877, 0.3486123, -7.9013877]], [[-2., -2., -2.], [-3., -3., -3.]], [[-2., -3.75]]),  # noqa: E501
    ("poisson", False): ([[0.2159639, 0.2706706, 0.2706706], [0.1946087, 0.0722896, 0.2240418]], [[0., 0., 0.], [0., 0., 0.]], [[-0.2973082, -0.1635698]]),  # noqa: E501
    ("poisson", True): ([[-1.5326442, -1.3068528, -1.3068528], [-1.6367644, -2.6270752, -1.4959226]], [[0., 0., 0.], [0., 0., 0.]], [[-1.25, -1.4166667]]),  # noqa: E501
    ("negative_binomial", False): ([[0.1859032, 0.192, 0.1728], [0.1933495, 0.1478138, 0.15625]], [[0., 0., 0.], [0., 0., 0.]], [[-0.2124821, -0.1183421], [1.7025969, 1.3930247]]),  # noqa: E501
    ("negative_binomial", True): ([[-1.6825291, -1.6502599, -1.7556204], [-1.6432558, -1.9118017, -1.856298]], [[0., 0., 0.], [0., 0., 0.]], [[-1.1351663, -0.7358148], [9.166667, 8.5]]),  # noqa: E501
    ("generalized_negative_binomial", False): ([[0.2603612, 0.255609, 0.198807], [0.1859032, 0.1760224, 0.13824]], [[0., 0., 0.], [0., 0., 0.]], [[-0.1794864, -0.1017222], [-0.1200219, 0.0124355]]),  # noqa: E501
    ("generalized_negative_binomial", True): ([[-1.3456854, -1.3641062, -1.6154206], [-1.6825291, -1.7371442, -1.9787638]], [[0., 0., 0.], [0., 0., 0.]], [[-0.6944448, -0.5666667], [-0.6096097, -0.0583836]]),  # noqa: E501
    ("dirichlet", False): ([[4.5], [0.9599999]], [[[0., 14.999999, 18.]], [[9.599999, 9.599999, 1.1999999]]], [[[3.0325303, 0.3571235, 0.4058386], [-0.9784814, -0.9784814, 1.0177823]]]),  # noqa: E501
    ("dirichlet", True): ([[1.5040774], [-0.0408221]], [[[0., 3.3333333, 4.]], [[10., 10., 1.25]]], [[[0.6738957, 0.0793608, 0.0901864], [-1.0192516, -1.0192516, 1.06019]]]),  # noqa: E501
}


@pytest.mark.parametrize("distribution, is_log", MXNET_PDFS, ids=[f"{d}-{'log' if log else 'pdf'}"
                                                                 for d, log in MXNET_PDFS])
def test_densities_and_their_gradients_are_mxnets(distribution, is_log):
    value, sample_grad, param_grads = MXNET_PDFS[distribution, is_log]
    sample = nd.array(DIRICHLET_SAMPLE if distribution == "dirichlet" else PDF_SAMPLE)
    params = [nd.array(p) for p in PDF_PARAMETERS[distribution]]
    for array in [sample, *params]:
        array.attach_grad()
    with autograd.record():
        got = getattr(nd, f"random_pdf_{distribution}")(sample, *params, is_log=is_log)
    got.backward()
    np.testing.assert_allclose(got.asnumpy(), value, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(sample.grad.asnumpy(), sample_grad, rtol=2e-5, atol=1e-5)
    for param, expected in zip(params, param_grads):
        np.testing.assert_allclose(param.grad.asnumpy(), expected, rtol=2e-5, atol=1e-5)


def test_density_shapes_and_dtypes_are_mxnets():
    one = nd.random_pdf_normal(nd.array([[0.5, 1.0]]), nd.array([0.0]), nd.array([1.0]))
    assert one.shape == (1, 2)
    assert nd.random_pdf_normal(nd.array([0.5, 1.0]), nd.array([0.0, 1.0]),
                                nd.array([1.0, 1.0])).shape == (2,)
    assert nd.random_pdf_normal(nd.array([[[0.5], [1.0]]]), nd.array([0.0]),
                                nd.array([1.0])).shape == (1, 2, 1)
    wide = nd.random_pdf_normal(nd.array([[0.5]], dtype="float64"),
                                nd.array([0.0], dtype="float64"), nd.array([1.0], dtype="float64"))
    assert wide.dtype == np.float64
    # MXNet's formulas outside the support: a uniform's density everywhere, an exponential's
    # at negative samples, a Poisson's 0 at -1
    np.testing.assert_allclose(nd.random_pdf_uniform(nd.array([[5.0]]), nd.array([0.0]),
                                                     nd.array([1.0])).asnumpy(), [[1.0]])
    np.testing.assert_allclose(nd.random_pdf_exponential(nd.array([[-1.0]]),
                                                         nd.array([1.0])).asnumpy(), [[math.e]],
                               rtol=1e-6)
    np.testing.assert_allclose(nd.random_pdf_poisson(nd.array([[-1.0]]),
                                                     nd.array([1.0])).asnumpy(), [[0.0]])


def test_a_generalized_negative_binomial_of_no_dispersion_is_its_poisson_limit():
    """MXNet gives NaN at alpha = 0; the limit is the Poisson of mean mu, and the derivative
    in alpha there is ((x - mu)^2 - x) / 2 (compared with a small alpha)."""
    sample = nd.array([[0.0, 1.0, 4.0]])
    limit = nd.random_pdf_generalized_negative_binomial(sample, nd.array([2.0]), nd.array([0.0]),
                                                        is_log=True)
    poisson = nd.random_pdf_poisson(sample, nd.array([2.0]), is_log=True)
    np.testing.assert_allclose(limit.asnumpy(), poisson.asnumpy(), rtol=1e-6)
    alpha = nd.array([0.0], dtype="float64")
    alpha.attach_grad()
    with autograd.record():
        log_f = nd.random_pdf_generalized_negative_binomial(
            sample.astype("float64"), nd.array([2.0], dtype="float64"), alpha, is_log=True)
    log_f.backward()

    def at(value):  # the summed log-density at alpha = value
        return nd.random_pdf_generalized_negative_binomial(
            sample.astype("float64"), nd.array([2.0], dtype="float64"),
            nd.array([value], dtype="float64"), is_log=True).asnumpy().sum()

    step, origin = 1e-4, log_f.asnumpy().sum()
    # one-sided (alpha >= 0), second order: Richardson's extrapolation of two differences
    slope = (4 * (at(step) - origin) - (at(2 * step) - origin)) / (2 * step)
    np.testing.assert_allclose(alpha.grad.asnumpy(), [slope], rtol=1e-4)


def test_lgamma_and_digamma():
    from mixrt.ops.random.special import digamma, lgamma
    x = np.array([1e-3, 0.1, 0.5, 1.0, 1.5, 2.0, 3.7, 6.0, 10.0, 57.3, 1e4, -0.5, -2.5])
    np.testing.assert_allclose(lgamma(np, x), [math.lgamma(v) for v in x], rtol=1e-12,
                               atol=1e-12)
    step = 1e-4 * np.minimum(np.abs(x), 1.0)  # small where the curvature is large
    slopes = (np.array([math.lgamma(v + h) for v, h in zip(x, step)])
              - np.array([math.lgamma(v - h) for v, h in zip(x, step)])) / (2 * step)
    np.testing.assert_allclose(digamma(np, x), slopes, rtol=1e-6, atol=1e-6)
    assert np.isinf(lgamma(np, np.array([0.0])))[0]


def test_densities_as_symbols():
    s, mu, sigma = sym.var("s"), sym.var("mu"), sym.var("sigma")
    density = sym.random_pdf_normal(s, mu, sigma)
    assert density.name.startswith("_random_pdf_normal")
    assert density.infer_shape(s=(2, 3), mu=(2,), sigma=(2,))[1] == [(2, 3)]
    got = density.eval(s=nd.array(PDF_SAMPLE), mu=nd.array([0.0, 1.0]),
                       sigma=nd.array([1.0, 2.0]))[0]
    np.testing.assert_allclose(_values(got), MXNET_PDFS["normal", False][0], rtol=2e-5)
    dirichlet = sym.random_pdf_dirichlet(sym.var("x"), sym.var("a"))
    assert dirichlet.infer_shape(x=(2, 1, 3), a=(2, 3))[1] == [(2, 1)]


PDF_REFUSED = [
    ("mx.nd.random_pdf_normal(a, a.astype('float64'), b)",
     "random_pdf_normal: the sample and the parameters must have one floating-point dtype"),
    ("mx.nd.random_pdf_normal(a.astype('int32'), a.astype('int32'), b.astype('int32'))",
     "random_pdf_normal: the sample and the parameters must have one floating-point dtype"),
    ("mx.nd.random_pdf_normal(p, a, b)",
     r"random_pdf_normal: the parameters' shape \(3,\) must begin the sample's \(2, 3\)"),
    ("mx.nd.random_pdf_normal(a, a[:2], b)", "random_pdf_normal: the parameters must have one"),
    ("mx.nd.random_pdf_dirichlet(p, p[:, :2])",
     r"random_pdf_dirichlet: the parameters' shape \(2, 2\) must begin and end"),
    ("mx.nd.random_pdf_gamma(a, 2.0, b)", "random_pdf_gamma: alpha must be an NDArray"),
]


@pytest.mark.parametrize("expression, message", PDF_REFUSED, ids=[r[0] for r in PDF_REFUSED])
def test_bad_density_arguments(expression, message):
    with pytest.raises(InputError, match=message):
        eval(expression, _environment())  # noqa: S307  (our own table)


# -- the Zipfian candidate samplers (MXNet 1.9.1's nd._internal._sample_unique_zipfian and
#    nd.contrib.rand_zipfian) ------------------------------------------------------------------

def test_unique_zipfian_rows_hold_distinct_classes_and_count_their_draws():
    mx.random.seed(3)
    classes, tries = nd._internal._sample_unique_zipfian(793472, shape=(4, 8192))
    assert classes.shape == (4, 8192) and classes.dtype == np.int64
    assert tries.shape == (4,) and tries.dtype == np.int64
    for row in classes.asnumpy():
        assert np.unique(row).size == 8192 and row.min() >= 0 and row.max() < 793472
    # the draws a row needs, as the log-uniform sampler of PyTorch and MXNet needs them
    assert ((tries.asnumpy() > 14500) & (tries.asnumpy() < 17000)).all()


def test_unique_zipfian_refuses_more_classes_than_the_range():
    with pytest.raises(InputError, match="range_max"):
        nd._internal._sample_unique_zipfian(5, shape=(1, 6))
    with pytest.raises(InputError, match="batch_size, num_sampled"):
        nd._internal._sample_unique_zipfian(5, shape=(3,))


def test_rand_zipfian_expected_counts_follow_the_distribution():
    mx.random.seed(5)
    true_classes = nd.array([0, 3, 19], dtype="int32")
    sampled, count_true, count_sampled = nd.contrib.rand_zipfian(true_classes, 1000, 20)
    assert sampled.shape == (1000,) and sampled.dtype == np.int64
    assert count_true.dtype == np.float64 and count_sampled.shape == (1000,)

    def expected(k):
        return np.log((k + 2.0) / (k + 1.0)) / np.log(21) * 1000
    np.testing.assert_allclose(count_true.asnumpy(), expected(np.array([0, 3, 19])))
    drawn = sampled.asnumpy()
    np.testing.assert_allclose(count_sampled.asnumpy(), expected(drawn))
    frequencies = np.bincount(drawn, minlength=20)
    np.testing.assert_allclose(frequencies, expected(np.arange(20)), atol=60)


def test_symbol_samplers_take_and_drop_ctx():
    drawn = sym.random.uniform(low=-1.5, high=3.0, shape=(2, 3), ctx=mx.cpu())
    assert drawn.infer_shape()[1] == [(2, 3)]


def test_random_uniform_arrays_is_a_list_as_mxnets():
    from mixrt.test_utils import random_uniform_arrays
    arrays = random_uniform_arrays((2, 3), low=-0.5, high=0.5)
    assert isinstance(arrays, list) and arrays[0].shape == (2, 3)


def test_symbol_rand_zipfian_gives_the_three_outputs():
    outputs = sym.contrib.rand_zipfian(sym.var("true_classes"), 500, 20)
    executor = sym.Group(list(outputs)).bind(
        "cpu", {"true_classes": nd.array([1, 3], dtype="int32")})
    sampled, count_true, count_sampled = executor.forward()
    assert sampled.shape == (500,) and sampled.dtype == np.int64
    drawn = sampled.asnumpy()
    assert drawn.min() >= 0 and drawn.max() < 20

    def expected(k):
        return np.log((k + 2.0) / (k + 1.0)) / np.log(21) * 500
    np.testing.assert_allclose(count_true.asnumpy(), expected(np.array([1, 3])))
    np.testing.assert_allclose(count_sampled.asnumpy(), expected(drawn))
    with pytest.raises(GraphError, match="num_sampled"):
        sym.contrib.rand_zipfian(sym.var("t"), 0, 20)



# -- refused parameters fail as MXNet's do: at the next wait, carried through later ops ------

def test_a_refused_sampler_raises_at_the_wait_not_at_the_call():
    drawn = nd.random.normal(0, -1, (2, 2))  # no error yet, as in MXNet
    product = nd.dot(nd.ones((2, 2)), drawn)  # carried on, not raised here
    with pytest.raises(mixrt.MXNetError, match="scale must be > 0"):
        product.asnumpy()
    nd.waitall()  # raised once already


def test_after_a_refused_sampler_the_next_draw_carries_its_error_once():
    nd.random.uniform(2, 1, (3,))  # low > high
    later = nd.random.uniform(0, 1, (3,))
    with pytest.raises(mixrt.MXNetError, match="low must be <= high"):
        later.asnumpy()
    nd.waitall()
    assert nd.random.uniform(0, 1, (3,)).asnumpy().shape == (3,)


def test_an_unobserved_refusal_surfaces_at_waitall():
    nd.random.gamma(-2, 3, shape=(2,))
    with pytest.raises(mixrt.MXNetError, match="gamma: alpha must be > 0"):
        nd.waitall()
    nd.waitall()


def test_copies_and_views_carry_a_refused_sampler_until_one_wait_raises_it():
    # MXNet 1.9.1's test_exc_post_fail: the rows of a failed copy, raised once through one
    first, second = nd.random.normal(0, -1, (2, 2)).copyto(mixrt.cpu())
    with pytest.raises(mixrt.MXNetError, match="normal: scale must be > 0"):
        first.asnumpy()
    assert second.asnumpy().shape == (2,)
    nd.waitall()
