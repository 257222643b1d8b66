"""The conformance cases left out as random draws (expected_failures.txt, "random draw") still
run through mixrt here, checked for what a valid draw must be: the expected outputs' dtype and
shape, and values the distribution can produce."""

import warnings

import numpy as np
import pytest
from onnx.backend.test.case.node import collect_testcases

import mixrt

from conformance_suite import RANDOM_DRAW, expected_failures

RANDOM_CASES = {name for name, reason in expected_failures().items()
                if reason.startswith(RANDOM_DRAW)}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the case generators warn about their own casts
    CASES = [case for case in collect_testcases(None) if case.name in RANDOM_CASES]


def test_every_random_draw_case_is_found():
    assert {case.name for case in CASES} == RANDOM_CASES


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_random_draw_is_a_valid_bernoulli_draw(case):
    session = mixrt.Session(case.model)
    for inputs, expected in case.data_sets:
        feeds = dict(zip((i.name for i in case.model.graph.input), inputs))
        outputs = session.run(None, feeds)
        for got, want in zip(outputs, expected):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert set(np.unique(got).tolist()) <= {0, 1}
