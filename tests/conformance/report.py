"""Run the ONNX backend test suite on mixrt and print passed/failed per kind.

    python tests/conformance/report.py                 # all 2,033 CPU cases, totals per kind
    python tests/conformance/report.py -k "test_conv"  # only cases whose name matches (regex)
    python tests/conformance/report.py --verbose       # one line per case, with the error
    python tests/conformance/report.py --failures-out FILE   # failing cases + first error line

Expected failures are not applied here: the counts are what mixrt really passes.
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import sys
import time
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conformance_suite import (KIND_OF_CATEGORY, PlannedBackend, backend_test,  # noqa: E402
                               case_name)

KINDS = ["node", "real", "simple", "pytorch-converted", "pytorch-operator"]


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout("case ran past the per-case time limit")


def run_case(test: unittest.TestCase, seconds: int) -> tuple[str, str]:
    """('pass' | 'fail' | 'skip', first line of the error)."""
    result = unittest.TestResult()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(seconds)
    try:
        test.run(result)
    except _Timeout as exc:
        return "fail", str(exc)
    finally:
        signal.alarm(0)
    if result.skipped:
        return "skip", result.skipped[0][1]
    problems = result.errors + result.failures
    if problems:
        return "fail", _summary(problems[0][1])
    return "pass", ""


def _summary(traceback_text: str) -> str:
    lines = [l for l in traceback_text.strip().splitlines() if l.strip()]
    for line in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Timeout)\b", line.strip()) or \
                line.startswith(("AssertionError", "mixrt.")):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", "--pattern", default="", help="regex over case names")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--timeout", type=int, default=120, help="seconds per case")
    parser.add_argument("--failures-out", type=Path, help="write failing cases here")
    parser.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2),
                        help="Session optimization level (every case runs planned)")
    args = parser.parse_args(argv)
    pattern = re.compile(args.pattern)
    backend = type("ReportBackend", (PlannedBackend,), {"opt_level": args.opt_level})
    runner = backend_test(xfail=False, backend=backend)
    counts = collections.defaultdict(collections.Counter)
    failures = []
    started = time.perf_counter()
    for category, case_class in sorted(runner.test_cases.items()):
        kind = KIND_OF_CATEGORY[category.removeprefix("OnnxBackend").removesuffix("Test")
                                .removesuffix("Model")]
        for test in unittest.defaultTestLoader.loadTestsFromTestCase(case_class):
            name = test._testMethodName
            if not name.endswith("_" + args.device) or not pattern.search(name):
                continue
            status, error = run_case(test, args.timeout)
            counts[kind][status] += 1
            if status == "fail":
                failures.append((case_name(name), error))
            if args.verbose:
                print(f"{status.upper():4} {case_name(name)}  {error}", flush=True)
    _print_totals(counts, time.perf_counter() - started)
    if args.failures_out:
        args.failures_out.write_text("".join(f"{n}  # {e}\n" for n, e in failures))
    return 0


def _print_totals(counts, seconds: float) -> None:
    total = collections.Counter()
    print(f"{'kind':20} {'passed':>7} {'failed':>7} {'skipped':>8}")
    for kind in KINDS:
        c = counts.get(kind, collections.Counter())
        total.update(c)
        print(f"{kind:20} {c['pass']:7} {c['fail']:7} {c['skip']:8}")
    print(f"{'total':20} {total['pass']:7} {total['fail']:7} {total['skip']:8}")
    ran = total["pass"] + total["fail"]
    print(f"{total['pass']} passed, {total['fail']} failed  ({ran} cases, {seconds:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
