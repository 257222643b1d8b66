"""Statistical checks of random generators (``mxnet.test_utils``): Pearson's chi-square
test of samples against a distribution given as buckets and their probabilities."""

from __future__ import annotations

import numpy as np

from mixrt.test_utils.compare import _host


def gen_buckets_probs_with_ppf(ppf, nbuckets):
    """``nbuckets`` equally likely buckets ``(low, high)`` of a continuous distribution,
    cut at the quantiles of its inverse CDF ``ppf``, and their probabilities."""
    buckets = [(ppf(i / nbuckets), ppf((i + 1) / nbuckets)) for i in range(nbuckets)]
    return buckets, [1.0 / nbuckets] * nbuckets


def chi_square_check(generator, buckets, probs, nsamples=1000000):
    """(p-value, observed counts, expected counts) of ``generator(nsamples)``'s samples
    in ``buckets``: ``(low, high)`` ranges for a continuous distribution, the values
    themselves for a discrete one."""
    from scipy.stats import chi2  # noqa: PLC0415  (SciPy: only tests of generators need it)
    samples = _host(generator(nsamples)).reshape(-1)
    observed = _counts(samples, buckets)
    expected = np.asarray(probs, dtype=np.float64) * nsamples
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(chi2.sf(statistic, len(buckets) - 1)), observed, expected


def _counts(samples: np.ndarray, buckets) -> np.ndarray:
    if isinstance(buckets[0], (tuple, list)):
        return np.array([np.count_nonzero((samples >= low) & (samples < high))
                         for low, high in buckets])
    return np.array([np.count_nonzero(samples == value) for value in buckets])


def verify_generator(generator, buckets, probs, nsamples=1000000, nrepeat=5,
                     success_rate=0.2, alpha=0.05):
    """Run :func:`chi_square_check` ``nrepeat`` times and raise AssertionError unless at
    least ``success_rate`` of them keep the hypothesis (p-value above ``alpha``); the
    p-values."""
    results = [chi_square_check(generator, buckets, probs, nsamples) for _ in range(nrepeat)]
    p_values = [p for p, _, _ in results]
    if sum(p > alpha for p in p_values) < nrepeat * success_rate:
        _, observed, expected = results[-1]
        raise AssertionError(f"the generator's samples do not follow the distribution: "
                             f"chi-square p-values {p_values} (alpha {alpha}); last observed "
                             f"counts {observed.tolist()}, expected {expected.tolist()}")
    return p_values
