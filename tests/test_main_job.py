"""The README's main job, run as users run it: every step, real files, real onnxruntime."""

import time

from mixrt.main_job import run_main_job


def test_main_job_reaches_its_targets(tmp_path, capsys):
    started = time.perf_counter()
    assert run_main_job(tmp_path, progress=False) == 0
    elapsed = time.perf_counter() - started
    out = capsys.readouterr().out
    assert elapsed < 120, f"the main job took {elapsed:.0f} s; the target is under 2 minutes"
    accuracy = float(out.split("task B test accuracy ")[1].split("%")[0]) / 100
    assert accuracy >= 0.95
    for step in range(1, 7):
        assert f"[{step}/6]" in out
    assert "PASS" in out and "same scores" in out
    assert (tmp_path / "digits_task_b.mxr").exists()
