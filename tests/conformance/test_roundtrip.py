"""Export round trip over the ONNX backend node cases mixrt passes: import with mixrt, export
at the case's opset (onnx's full check included), run the export in onnxruntime on the CPU
and compare with the case's expected outputs at its tolerances (roundtrip_suite.py).

Cases in roundtrip_exceptions.txt are strict expected failures, so a regression and a newly
passing case both fail the suite."""

import pytest

from roundtrip_suite import node_cases, round_trip, round_trip_exceptions

CASES = node_cases()
EXCEPTIONS = round_trip_exceptions()
ENVIRONMENT = "environment"  # a reason that depends on the machine: not strict


def _param(case):
    reason = EXCEPTIONS.get(case.name)
    if reason is None:
        return pytest.param(case, id=case.name)
    mark = pytest.mark.xfail(reason=reason, strict=not reason.startswith(ENVIRONMENT))
    return pytest.param(case, id=case.name, marks=mark)


@pytest.mark.parametrize("case", [_param(case) for case in CASES])
def test_round_trip(case):
    round_trip(case)


def test_exceptions_name_cases_that_are_tried():
    """An entry for a case not tried here (renamed, or now an expected failure of mixrt
    itself) would silently excuse nothing; it must go."""
    tried = {case.name for case in CASES}
    assert sorted(set(EXCEPTIONS) - tried) == []
