"""The suite's workers deal out the large drivers' compiles (tests/compile_shares.py)."""

from __future__ import annotations

import pytest

import compile_shares
from mixrt.ops.compiled import prebuilt


def test_every_driver_named_is_in_the_recorded_list():
    """A driver renamed or no longer recorded would drop out of the shares unnoticed."""
    level = prebuilt.host_level() or "x86-64-v3"
    named = {f"{e['module']}.{e['qualname']}" for e in compile_shares._entries(level)}
    assert named == set(compile_shares.DRIVERS)


def test_the_workers_shares_cover_the_entries_once():
    level = prebuilt.host_level() or "x86-64-v3"
    entries = compile_shares._entries(level)
    shares = [entries[i::2] for i in range(2)]
    assert sum(len(s) for s in shares) == len(entries)
    assert abs(len(shares[0]) - len(shares[1])) <= 1


@pytest.mark.parametrize("worker, count, tests, jit", [
    (None, None, 100_000, None),   # not under xdist
    ("gw0", "1", 100_000, None),   # one worker: nothing to deal out
    ("gw1", "2", 40, None),        # a few files: they compile what they call
    ("gw0", "2", 100_000, "0"),    # the NumPy kernels only
])
def test_no_share_outside_a_whole_suite_run(monkeypatch, worker, count, tests, jit):
    for name, value in (("PYTEST_XDIST_WORKER", worker), ("PYTEST_XDIST_WORKER_COUNT", count),
                        ("MIXRT_JIT", jit)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert compile_shares.compile_share(tests) == []


def test_the_share_is_read_from_xdists_variables(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    assert compile_shares.worker_share() == (3, 4)
