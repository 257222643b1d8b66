"""The main job through `mixrt launch -n 2 -s 1 --launcher local` (acceptance): the CNN
trains and fine-tunes through the parameter server, worker 0 validates, compiles and
serves; dist_sync and dist_async both reach the main job's accuracy target (on the NumPy
kernels, as every KVStore test: tests/kvstore/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mixrt.main_job import ACCURACY_TARGET


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_main_job_fine_tunes_through_mixrt_launch(tmp_path, kind):
    done = subprocess.run(
        [sys.executable, "-m", "mixrt", "launch", "-n", "2", "-s", "1", "--launcher",
         "local", "--", sys.executable, "-m", "mixrt", "demo", "--kvstore", kind,
         "--workdir", str(tmp_path / "work"), "--no-progress"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for rank in (0, 1):
        assert f"[worker {rank}] [kv] worker {rank} of 2 in a '{kind}' job" in output, output
        found = re.search(rf"\[worker {rank}\]     task B test accuracy ([\d.]+)%", output)
        assert found and float(found.group(1)) / 100 >= ACCURACY_TARGET, output
    assert "[worker 0] main job passed" in output
    assert "[worker 1] worker 1: trained through" in output
    assert (tmp_path / "work" / "digits_task_b.mxr").exists()
