"""ops/ml/_jit_trees.py's classifier scores (two_class_scores, many_class_scores) against the
NumPy forms of ops/ml/ml_trees.py they stand for, over every branch: base values 0/1/2,
binary case or not, weights all positive or not, rows scored for either class or none,
each compiled post-transform, float32 and float64 sums."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.ml import ml_trees

pytestmark = pytest.mark.skipif(not jit_cpu.enabled(), reason="the compiled tier needs numba")
RNG = np.random.default_rng(3)


@pytest.fixture(autouse=True)
def _own_draws(request):
    """Each test draws from a generator seeded by its own name: with one generator for the
    module, a test's data depended on which tests pytest-xdist had run before it in the same
    worker, and a draw now and then put a float32 softmax 3.6e-7 off its NumPy form."""
    global RNG
    RNG = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def kernels():
    return ml_trees._compiled_scores(np, np.zeros((1, 2)), "NONE", 2)


def sums(rows, classes, precision):
    raw = (RNG.standard_normal((rows, classes)) * 3).astype(precision)
    has = RNG.random((rows, classes)) < 0.6
    raw[~has] = 0  # a class no reached leaf weighs sums to 0
    raw[0, :] = 0.5  # on the binary-case threshold
    has[1, :] = False
    return raw, has


@pytest.mark.parametrize("precision", [np.float32, np.float64])
@pytest.mark.parametrize("transform", sorted(ml_trees.COMPILED_TRANSFORMS))
@pytest.mark.parametrize("bases", [0, 1, 2])
@pytest.mark.parametrize("binary_case, all_positive",
                         list(itertools.product([True, False], [True, False])))
def test_two_classes_compiled_as_the_numpy_form(precision, transform, bases, binary_case,
                                                 all_positive):
    raw, has = sums(40, 2, precision)
    base = (RNG.standard_normal(bases) * 2).astype(precision)
    labels = np.array([3, 7], np.int64)
    expected_label, expected = ml_trees._two_classes(np, labels, raw, has, base, transform,
                                                     binary_case, all_positive)
    positive = np.empty(40, np.int64)
    scores = np.empty((40, 2), np.float32)
    kernels().two_class_scores(raw, has, base, binary_case, all_positive,
                               ml_trees.COMPILED_TRANSFORMS[transform], positive, scores)
    label = labels[positive] if binary_case else positive
    np.testing.assert_array_equal(label, expected_label)
    np.testing.assert_allclose(scores, expected, rtol=2e-7, atol=1e-7)
    assert np.array_equal(np.isnan(scores), np.isnan(expected))


@pytest.mark.parametrize("precision", [np.float32, np.float64])
@pytest.mark.parametrize("transform", sorted(ml_trees.COMPILED_TRANSFORMS))
@pytest.mark.parametrize("bases", [0, 2, 5])
def test_many_classes_compiled_as_the_numpy_form(precision, transform, bases):
    raw, has = sums(40, 5, precision)
    raw[2, 3] = raw[2, 1] = raw.max() + 1  # a tie: the first wins
    has[2, [1, 3]] = True
    base = (RNG.standard_normal(bases)).astype(precision)
    expected_chosen, expected = ml_trees._multiclass(np, raw, has, base, transform)
    chosen = np.empty(40, np.int64)
    scores = np.empty((40, 5), np.float32)
    kernels().many_class_scores(raw, has, base, ml_trees.COMPILED_TRANSFORMS[transform],
                                chosen, scores)
    np.testing.assert_array_equal(chosen, expected_chosen)
    np.testing.assert_allclose(scores, expected, rtol=2e-7, atol=1e-7)


@pytest.mark.parametrize("precision", [np.float32, np.float64])
def test_many_classes_with_nan_choose_the_first_nan_as_the_numpy_form(precision):
    """A scored NaN is chosen wherever it lies (the first of two), an unscored one never:
    the selects that keep the best agree with NumPy's argmax."""
    raw, has = sums(40, 6, precision)
    has[:] = True
    raw[3, 4] = np.nan                      # after the row's best, or before it
    raw[5, [1, 4]] = np.nan                 # two: the first
    raw[7, 0] = np.nan                      # the first column
    raw[9, 2], has[9, 2] = np.nan, False    # unscored: not a candidate
    base = np.zeros(0, precision)
    expected_chosen, expected = ml_trees._multiclass(np, raw, has, base, "NONE")
    chosen = np.empty(40, np.int64)
    scores = np.empty((40, 6), np.float32)
    kernels().many_class_scores(raw, has, base, ml_trees.COMPILED_TRANSFORMS["NONE"],
                                chosen, scores)
    np.testing.assert_array_equal(chosen, expected_chosen)
    assert chosen[3] == 4 and chosen[5] == 1 and chosen[7] == 0 and chosen[9] != 2
    np.testing.assert_array_equal(np.isnan(scores), np.isnan(expected))
