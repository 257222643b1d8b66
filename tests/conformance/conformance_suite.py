"""The ONNX backend test suite wired to mixrt, shared by the pytest module and report.py.

``expected_failures.txt`` lists, one per line, a case name (without the device suffix, or
with it for a case that fails on one device only) and after ``#`` the reason it fails. Listed cases run as expected failures: a regression in any
other case fails the suite, and a listed case that starts passing fails it too, until it is
removed from the list. Cases whose reason starts with "random draw" or "tie" are left out
instead.
"""

from __future__ import annotations

import re
import unittest
import warnings
from pathlib import Path

import onnx.backend.test

import mixrt.backend
from mixrt.errors import UnsupportedOperatorError

EXPECTED_FAILURES_FILE = Path(__file__).with_name("expected_failures.txt")
# a reason starting with this marks a case whose expected values are one random draw: it is
# left out (it can neither pass reliably nor fail reliably) rather than expected to fail
RANDOM_DRAW = "random draw"
# ... and this, a case whose expected output is a tie that only bit-identical float32 sums
# keep (test_ties.py checks its values before the tie is broken)
TIE = "tie"
# a listed name with a device suffix (``test_dft_inverse_cuda``) fails on that device alone
DEVICE_SUFFIX = re.compile(r"_(cpu|cuda)$")

# BackendTest's category -> the kind names onnx uses for its data folders.
KIND_OF_CATEGORY = {
    "Node": "node", "NodeModel": "node", "Real": "real", "Simple": "simple",
    "PyTorchConverted": "pytorch-converted", "PyTorchOperator": "pytorch-operator",
}  # a "Model" suffix (cases stored as model files) maps to the same kind


def expected_failures() -> dict[str, str]:
    """Case name -> reason, from the committed list."""
    failures = {}
    if not EXPECTED_FAILURES_FILE.exists():
        return failures
    for line in EXPECTED_FAILURES_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition("#")
        failures[name.strip()] = reason.strip()
    return failures


class PlannedBackend(mixrt.backend.MixrtBackend):
    """Every case through the arena executor at opt_level 2: a discovery run, then the
    planned run whose outputs are checked. A ``_cuda`` case whose values a CuPy array cannot
    hold (strings, float8, int4, ...) is skipped, with the session's reason: it is refused
    when the session is made, as it must be, and there is nothing to compare."""
    opt_level = 2
    discover_first = True

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs):
        try:
            return super().prepare(model, device, **kwargs)
        except UnsupportedOperatorError as exc:
            if str(exc.device).startswith("gpu") and "CuPy cannot hold" in str(exc):
                raise unittest.SkipTest(str(exc)) from exc
            raise


class UnoptimizedBackend(PlannedBackend):
    """The same at opt_level 0 (no graph passes)."""
    opt_level = 0


def backend_test(parent_module: str | None = None, *, xfail: bool = True,
                 backend=PlannedBackend):
    """An onnx BackendTest runner for mixrt, expected failures marked."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators warn about their own casts
        runner = onnx.backend.test.BackendTest(backend, parent_module)
    if xfail:
        for name, reason in expected_failures().items():
            if name.endswith("_cuda") and _fake_cupy():
                continue  # a failure measured on a real GPU; the fake computes with NumPy
            pattern = f"^{re.escape(name)}$" if DEVICE_SUFFIX.search(name) else \
                f"^{re.escape(name)}_(cpu|cuda)$"
            if reason.startswith((RANDOM_DRAW, TIE)):
                # our draw matches onnx's by chance now and then (1 in 1024 for a 10-element
                # Bernoulli(0.5)): a strict expected failure would fail CI at random
                runner.exclude(pattern)
            else:
                runner.xfail(pattern)
    return runner


def _fake_cupy() -> bool:
    """Whether ``cupy`` is tests/fake_cupy (the GPU paths driven on the CPU)."""
    try:
        import cupy  # noqa: PLC0415
    except ImportError:
        return False
    return bool(getattr(cupy, "IS_FAKE", False))


def case_name(test_name: str) -> str:
    """``test_abs_cpu`` -> ``test_abs``."""
    return DEVICE_SUFFIX.sub("", test_name)
