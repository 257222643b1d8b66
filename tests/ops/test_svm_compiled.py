"""The compiled one-vs-one decisions of an SVC (ops/ml/_jit_svm.py): each vector's kernel
value is its feature sum left to right in float32, whichever way the loops run, so the
decisions are those of a plain scalar reference, bit for bit, for every kernel."""

import numpy as np
import pytest
from numba import njit

from mixrt.ops.compiled import jit_cpu, jit_tier
from mixrt.ops.ml import ml_svm

FEATURES = 7


@njit
def _exp(x):  # numba's float32 exp and tanh, as the kernel's (NumPy's differ in a last bit)
    return np.exp(x)


@njit
def _tanh(x):
    return np.tanh(x)


def _reference_decisions(rows, model, kernel, gamma, coef0, degree):
    """libsvm's decision values, one vector and one feature at a time (float32 kernel
    values, float64 weighted sums)."""
    gamma, coef0 = np.float32(gamma), np.float32(coef0)
    decisions = []
    for row in rows:
        values = []
        for vector in model.vectors:
            total = np.float32(0)
            for x, v in zip(row, vector):
                total = np.float32(total + ((x - v) * (x - v) if kernel == "RBF" else x * v))
            if kernel == "RBF":
                total = _exp(-gamma * total)
            elif kernel == "POLY":
                total = (gamma * total + coef0) ** np.float32(degree)
            elif kernel == "SIGMOID":
                total = _tanh(gamma * total + coef0)
            values.append(np.float32(total))
        pair, found = 0, []
        classes = len(model.counts)
        for i in range(classes - 1):
            for j in range(i + 1, classes):
                mine = sum(np.float64(np.float32(values[v] * model.dual[j - 1, v]))
                           for v in range(model.starts[i], model.starts[i] + model.counts[i]))
                theirs = sum(np.float64(np.float32(values[v] * model.dual[i, v]))
                             for v in range(model.starts[j], model.starts[j] + model.counts[j]))
                found.append(np.float32(np.float64(mine) + np.float64(theirs)
                                        + np.float64(model.rho[pair])))
                pair += 1
        decisions.append(found)
    return np.array(decisions, np.float32)


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("classes", [2, 3, 4])
def test_compiled_decisions_are_the_scalar_references_bits(kernel, classes):
    if not jit_cpu.enabled():
        pytest.skip("the compiled tier is off here")
    rng = np.random.default_rng(classes * 7 + len(kernel))
    counts = rng.integers(2, 9, size=classes)
    vectors = int(counts.sum())
    model = ml_svm._Classifier(
        classlabels_ints=list(range(classes)), classlabels_strings=None,
        coefficients=rng.normal(size=(classes - 1) * vectors).tolist(),
        kernel_params=[0.07, 0.4, 3.0], kernel_type=kernel, post_transform="NONE",
        prob_a=None, prob_b=None, rho=rng.normal(size=classes * (classes - 1) // 2).tolist(),
        support_vectors=rng.normal(size=vectors * FEATURES).astype(np.float32).tolist(),
        vectors_per_class=counts.tolist())
    rows = rng.normal(size=(5, FEATURES)).astype(np.float32)
    with jit_tier.using(True):
        decisions, _ = model.compiled_one_vs_one(ml_svm._compiled(np), rows)
    name, gamma, coef0, degree = model.kernel
    np.testing.assert_array_equal(
        decisions, _reference_decisions(rows, model, name, gamma, coef0, degree))
