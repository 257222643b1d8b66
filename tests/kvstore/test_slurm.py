"""The Slurm launcher (kvstore/slurm.py): the plan, the task's role, the relayed lines and the
batch script without Slurm; then, where a Slurm cluster answers (tools/slurm_one_node.sh
starts a one-node one; .ci/run does before the suite), real jobs through salloc and sbatch:
a dist_sync fit of 2 workers and 1 server equal to one process, a job one of whose tasks is
killed, and a batch job submitted and waited for."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fit_job
from mixrt.base.errors import KVStoreError
from mixrt.kvstore import slurm
from mixrt.kvstore.launch import plan_job

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(fit_job.__file__)


# -- without Slurm ---------------------------------------------------------------------------

def test_ranks_are_the_scheduler_then_the_servers_then_the_workers():
    roles = [slurm.role_of_rank(rank, num_servers=2) for rank in range(6)]
    assert roles == [("scheduler", 0), ("server", 0), ("server", 1), ("worker", 0),
                     ("worker", 1), ("worker", 2)]
    assert slurm.task_name(3, 2) == "worker 0" and slurm.task_name(0, 2) == "scheduler"


def _allocation(tmp_path, **extra) -> dict:
    return {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1234", "MIXRT_LAUNCH_SRUN": "true",
            **extra}


def test_the_plan_is_one_srun_step_and_keeps_the_token_off_its_command_line(tmp_path):
    environ = _allocation(tmp_path)
    [step] = plan_job(["python", "train.py"], 2, 1, launcher="slurm", host_uri="127.0.0.1",
                      environ=environ)
    assert step.role == "srun" and step.finishes_job
    argv = step.argv
    assert argv[:3] == ["true", "--ntasks", "4"]
    assert "--kill-on-bad-exit=1" in argv and "--export=ALL" in argv and "--label" in argv
    assert argv[-3:] == ["--", "python", "train.py"]
    token = step.env["MIXRT_KV_TOKEN"]
    assert len(token) > 20 and not any(token in arg for arg in argv)
    assert step.env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
    assert step.env["DMLC_PS_ROOT_PORT"] == str(slurm.PORT_BASE + 1234)
    assert (step.env["DMLC_NUM_SERVER"], step.env["DMLC_NUM_WORKER"]) == ("1", "2")


def test_a_given_port_or_secret_is_kept(tmp_path):
    environ = _allocation(tmp_path, DMLC_PS_ROOT_PORT="9000", MIXRT_KV_SECRET="s" * 32)
    [step] = plan_job(["w"], 1, 1, launcher="slurm", host_uri="10.0.0.5", environ=environ)
    assert step.env["DMLC_PS_ROOT_PORT"] == "9000"
    assert "MIXRT_KV_TOKEN" not in step.env  # the secret authenticates; srun passes it on


@pytest.mark.parametrize("environ,message", [
    ({"PATH": "/usr/bin"}, "inside a Slurm allocation"),
    ({"PATH": "/usr/bin", "SLURM_JOB_ID": "7", "MIXRT_LAUNCH_SRUN": "no-such-srun-here"},
     "no-such-srun-here"),
])
def test_refused_outside_an_allocation_or_without_srun(environ, message):
    with pytest.raises(KVStoreError, match=message):
        plan_job(["w"], 1, 1, launcher="slurm", host_uri="127.0.0.1", environ=environ)


def test_a_reachable_scheduler_needs_a_secret(tmp_path):
    with pytest.raises(KVStoreError, match="MIXRT_KV_SECRET"):
        plan_job(["w"], 1, 1, launcher="slurm", host_uri="10.0.0.5",
                 environ=_allocation(tmp_path))


def test_a_host_file_is_refused(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\n")
    with pytest.raises(KVStoreError, match="the allocation or the cluster says where"):
        plan_job(["w"], 1, 1, launcher="slurm", hostfile=hosts, environ=_allocation(tmp_path))


def test_task_lines_come_under_their_role_and_srun_names_the_task():
    speak = slurm.SrunLines(num_servers=1)
    assert speak(b"3: DONE epoch 1\n") == ("worker 1", b"DONE epoch 1\n")
    assert speak(b" 0: listening\n") == ("scheduler", b"listening\n")
    assert speak.culprit() is None
    assert speak(b"srun: error: vm: task 3: Killed\n") == \
        (None, b"srun: error: vm: task 3 (worker 1): Killed\n")
    speak(b"srun: error: vm: task 0: Terminated\n")  # Slurm ending the others
    assert speak.culprit() == ("worker 1 (Slurm task 3)", -9)
    exited = slurm.SrunLines(num_servers=1)
    exited(b"srun: error: vm: task 2: Exited with exit code 3\n")
    assert exited.culprit() == ("worker 0 (Slurm task 2)", 3)


def test_a_task_becomes_its_role_and_runs_its_command(tmp_path):
    show = "import os; print(os.environ['DMLC_ROLE'], os.environ['MIXRT_KV_ROLE_INDEX'])"
    for rank, expected in ((0, "scheduler 0"), (1, "server 0"), (2, "worker 0")):
        env = {**os.environ, "SLURM_PROCID": str(rank), "DMLC_NUM_SERVER": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "mixrt.kvstore.launch", "--task-child", "--role-command",
             json.dumps([sys.executable, "-c", show]), "--", sys.executable, "-c", show],
            env=env, capture_output=True, text=True, timeout=60)
        assert done.stdout.strip() == expected, done.stderr


def test_the_batch_script_asks_for_a_task_per_process_and_holds_no_secret():
    text = slurm.batch_script(["python", "-m", "mixrt", "launch", "--launcher", "slurm", "--",
                               "python", "train.py", "a b"], 2, 1,
                              ["--partition=gpu", "--gpus-per-task=1"])
    assert text.startswith("#!/bin/bash\n")
    assert "#SBATCH --ntasks=4\n" in text and "#SBATCH --partition=gpu\n" in text
    assert text.rstrip().endswith("python train.py 'a b'")
    assert "TOKEN" not in text and "SECRET" not in text
    with pytest.raises(KVStoreError, match="one sbatch option"):
        slurm.batch_script(["x"], 1, 1, ["partition=gpu"])


# -- a real Slurm ----------------------------------------------------------------------------

@functools.cache
def _slurm_answers() -> bool:
    if shutil.which("sinfo") is None or shutil.which("salloc") is None:
        return False
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                              timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return any(state.startswith(("idle", "mixed")) for state in done.stdout.split())


@pytest.fixture
def slurm_cluster():
    """A Slurm cluster that answers, or the test skips. Asked on a test's first use, not as
    the file is collected: where sinfo is installed and no controller runs, it waits ~9 s,
    which every worker paid at collection. (srun and sbatch pass the environment on, the
    NumPy kernels' setting with it: tests/kvstore/conftest.py.)"""
    if not _slurm_answers():
        pytest.skip("no Slurm cluster answers here (tools/slurm_one_node.sh start starts a "
                    "one-node one, as .ci/run does)")


def _launch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mixrt", "launch", *args]


def _fit_config(out: Path) -> str:
    return json.dumps({"kind": "dist_sync", "out": str(out), "compression": False})


def _assert_equal_to_one_process(out: Path, output: str, workers: int) -> None:
    for case in fit_job.scenarios("dist_sync"):
        for rank in range(workers):
            assert f"[worker {rank}] DONE {case['name']}" in output, output
        expected = fit_job.reference(case, workers)
        with np.load(out / f"{case['name']}.npz", allow_pickle=False) as trained:
            for name, value in expected.items():
                difference = np.abs(trained[name] - value).max() / np.abs(value).max()
                assert difference <= 1e-6, (case["name"], name, difference)


def test_a_dist_sync_fit_in_an_allocation_equals_one_process(tmp_path, slurm_cluster):
    out = tmp_path / "weights"
    out.mkdir()
    done = subprocess.run(
        ["salloc", "--ntasks", "4", "--time", "10", *_launch_argv(
            "--launcher", "slurm", "-n", "2", "-s", "1", "--", sys.executable, str(JOB),
            _fit_config(out))],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    _assert_equal_to_one_process(out, output, workers=2)


def test_a_killed_task_ends_the_step_and_is_named(tmp_path, slurm_cluster):
    body = ("import os, signal, time\n"
            "if os.environ['MIXRT_KV_ROLE_INDEX'] == '1':\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(120)\n")
    started = time.monotonic()
    done = subprocess.run(
        ["salloc", "--ntasks", "4", "--time", "5", *_launch_argv(
            "--launcher", "slurm", "-n", "2", "-s", "1", "--", sys.executable, "-c", body)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = done.stdout + done.stderr
    # the launcher's verdict and status are the killed task's, as the local launcher's are
    assert done.returncode == 137, output
    assert "task 3 (worker 1): Killed" in output, output
    assert "worker 1 (Slurm task 3) was killed by SIGKILL (status 137); stopping the job" \
        in output, output
    assert time.monotonic() - started < 60, output  # not the sleeping tasks' 120 s


def test_a_batch_job_is_written_submitted_and_waited_for(tmp_path, slurm_cluster):
    out, script = tmp_path / "weights", tmp_path / "job.sh"
    out.mkdir()
    done = subprocess.run(
        _launch_argv("--sbatch", str(script), f"--sbatch-arg=--output={tmp_path}/job-%j.out",
                     "--sbatch-arg=--time=10", "--wait", "-n", "2", "-s", "1", "--",
                     sys.executable, str(JOB), _fit_config(out)),
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "as Slurm job" in done.stderr
    text = script.read_text()
    assert "#SBATCH --ntasks=4" in text and "TOKEN" not in text
    [log] = tmp_path.glob("job-*.out")
    _assert_equal_to_one_process(out, log.read_text(), workers=2)
