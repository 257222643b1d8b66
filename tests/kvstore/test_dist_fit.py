"""Distributed training started as users start it (`mixrt launch`), over every equal sharding:
Module.fit with and without eval data, a Gluon Trainer loop, a dataset that divides by
neither the workers nor the batch under each last-batch rule, several epochs, 2-bit
compression on and off, 2 and 3 workers, 1 and 2 servers. Every job must finish, and a
synchronous job's weights must equal a single-process run over the same shards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fit_job

JOB = Path(fit_job.__file__)


def _launch(tmp_path, kind: str, workers: int, servers: int, compression: bool = False):
    out = tmp_path / "weights"
    out.mkdir()
    config = json.dumps({"kind": kind, "out": str(out), "compression": compression})
    done = subprocess.run(
        [sys.executable, "-m", "mixrt", "launch", "-n", str(workers), "-s", str(servers),
         "--", sys.executable, str(JOB), config],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for case in fit_job.scenarios():
        for rank in range(workers):
            assert f"[worker {rank}] DONE {case['name']}" in output, output
    return out


def _relative_difference(saved: Path, expected: dict) -> float:
    with np.load(saved, allow_pickle=False) as trained:
        return max(float(np.abs(trained[name] - value).max() / np.abs(value).max())
                   for name, value in expected.items())


@pytest.mark.parametrize("kind,workers,servers", [
    ("dist_sync", 2, 1), ("dist_sync", 3, 2), ("dist_device_sync", 2, 2),
    ("dist_device_sync", 3, 1)])
def test_sync_jobs_finish_and_equal_one_process(tmp_path, kind, workers, servers):
    out = _launch(tmp_path, kind, workers, servers)
    differences = {case["name"]: _relative_difference(out / f"{case['name']}.npz",
                                                      fit_job.reference(case, workers))
                   for case in fit_job.scenarios()}
    print("largest relative difference per scenario:", differences)
    assert max(differences.values()) <= 1e-6, differences


@pytest.mark.parametrize("kind,workers,servers,compression", [
    ("dist_async", 2, 1, False), ("dist_async", 3, 2, False), ("dist_sync", 2, 2, True),
    ("dist_sync", 3, 1, True), ("dist_async", 2, 2, True)])
def test_async_and_compressed_jobs_finish_with_trained_weights(tmp_path, kind, workers,
                                                               servers, compression):
    out = _launch(tmp_path, kind, workers, servers, compression)
    for case in fit_job.scenarios():
        initial = fit_job.weights(fit_job.module_model() if case["api"] == "module"
                                  else fit_job.gluon_model())
        with np.load(out / f"{case['name']}.npz", allow_pickle=False) as trained:
            assert all(np.isfinite(trained[name]).all() for name in initial), case
            moved = max(float(np.abs(trained[name] - value).max())
                        for name, value in initial.items())
        assert moved > 1e-3, (case, moved)
