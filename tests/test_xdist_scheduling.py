"""The suite's xdist scheduler (tests/xdist_scheduling.py) hands out the same tests as xdist's
``loadgroup``: each test once, each group on one worker, a crashed worker's test reported and
the rest run, while its bookkeeping holds only what a worker is running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections import deque
from pathlib import Path

from xdist.remote import Producer

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import json, os
import pytest

def _note(name):
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(json.dumps([name, os.environ.get("PYTEST_XDIST_WORKER", "")]) + "\\n")

@pytest.mark.parametrize("i", range(300))
def test_alone(i):
    _note(f"alone{i}")

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(20))
def test_grouped(i):
    _note(f"grouped{i}")

def test_crash():
    _note("crash")
    os._exit(3)  # the worker dies mid-test
'''


def _child_run(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    ran = tmp_path / "ran.jsonl"
    env = dict(os.environ, PYTHONPATH=str(TESTS), RAN_LOG=str(ran))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "conftest", "-n", "2", "--dist", "loadgroup",
                           "--max-worker-restart", "1", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = ran.read_text().splitlines() if ran.exists() else []
    return done, [json.loads(line) for line in lines]


class _Config:
    """What the scheduler reads of pytest's config: two local workers, loadgroup."""
    option = types.SimpleNamespace(loadscopereorder=True)

    def getvalue(self, name):
        return {"dist": "loadgroup", "tx": ["2*popen"]}[name]


class _Worker:
    """An xdist worker's controller as the scheduler drives it: tests sent queue up here."""

    def __init__(self, name: str):
        self.queue, self.shutting_down = deque(), False
        self.gateway = types.SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        self.queue.extend(indices)

    def shutdown(self):
        self.shutting_down = True


def _suites_conftest(pytestconfig):
    """tests/conftest.py as pytest loaded it (``import conftest`` may find another folder's)."""
    return next(plugin for plugin in pytestconfig.pluginmanager.get_plugins()
                if getattr(plugin, "__file__", None) == str(TESTS / "conftest.py"))


def test_the_conftests_scheduler_hands_out_each_test_once_holding_only_what_runs(pytestconfig):
    from xdist_scheduling import GroupScheduling  # noqa: PLC0415
    make = _suites_conftest(pytestconfig).pytest_xdist_make_scheduler
    scheduler = make(_Config(), Producer("sched", enabled=False))
    assert isinstance(scheduler, GroupScheduling)
    collection = [f"t.py::test_{i}" for i in range(1000)] + \
        [f"t.py::test_g[{i}]@g" for i in range(10)]
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    ran, held = [], 0
    while any(worker.queue for worker in workers):
        for worker in workers:
            if worker.queue:
                index = worker.queue.popleft()
                ran.append((collection[index], worker))
                scheduler.mark_test_complete(worker, index)
                held = max(held, sum(map(len, scheduler.assigned_work.values())))
    assert sorted(name for name, _ in ran) == sorted(collection)
    assert len({worker for name, worker in ran if name.endswith("@g")}) == 1
    assert scheduler.tests_finished and not scheduler.has_pending
    assert held <= 8  # units assigned and unfinished, never the 1,010 run so far


def test_each_test_runs_once_a_group_on_one_worker_and_a_crash_is_reported(tmp_path):
    done, ran = _child_run(tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "test_crash" in done.stdout and "crashed" in done.stdout, done.stdout[-3000:]
    names = [name for name, _ in ran if name != "crash"]  # a crashed test may be run again
    assert sorted(names) == sorted({*names}) and len(names) == 320, len(names)
    assert len({worker for name, worker in ran if name.startswith("grouped")}) == 1
    assert len({worker for name, worker in ran if name.startswith("alone")}) >= 2
