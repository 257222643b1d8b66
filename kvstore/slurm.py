"""Slurm: a KVStore job's processes as the tasks of one ``srun`` step, and the batch script
that starts it.

    salloc -n 4 mixrt launch --launcher slurm -n 2 -s 1 -- python train.py    # in an allocation
    mixrt launch --sbatch job.sh -n 2 -s 1 -- python train.py                 # writes, submits

Inside an allocation (``SLURM_JOB_ID`` set) the launcher starts one step, ``srun --ntasks
S+W+1 --kill-on-bad-exit=1``, whose tasks run ``python -m mixrt.kvstore.launch --task-child``:
each reads its rank from ``SLURM_PROCID`` and becomes the scheduler (rank 0), a server
(ranks 1..S) or a worker (ranks S+1..S+W), and execs its command. The scheduler's address is
the step's first node (where Slurm's block distribution puts task 0), its port ``--port``,
else an inherited ``DMLC_PS_ROOT_PORT``, else one derived from the job's id. Everything else
a task needs (``DMLC_*``, the job's token, the store's ``MIXRT_KV_*`` settings) reaches it
through the environment, which srun passes on (``--export=ALL``): nothing secret is on a
command line. When one task dies, Slurm ends the whole step; the launcher names the task by
its role (``task 2 (worker 1)``), as the local launcher names the process.

``--sbatch SCRIPT`` writes a batch script that runs this launcher inside the allocation it
asks for (one task per process; ``--sbatch-arg`` adds ``#SBATCH`` lines: a partition, a time,
GPUs) and submits it with ``sbatch`` (``--wait``: until the job ends, with its status).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

from mixrt.base.errors import KVStoreError
from mixrt.kvstore.supervisor import Planned

RANK_VARIABLE = "SLURM_PROCID"
PORT_BASE, PORT_SPAN = 20000, 20000   # a job's port: PORT_BASE + job id mod PORT_SPAN
# srun's own lines that name a task ("srun: error: node1: task 2: Exited with exit code 3")
_TASK_MENTION = re.compile(rb"\btask (\d+)\b")
_LABELLED = re.compile(rb"^\s*(\d+): ")
# srun's report of one task's end, the first of which ended the step
_TASK_ENDED = re.compile(rb"\btask (\d+): ([^\n]+)")


def in_allocation(environ) -> bool:
    return bool(environ.get("SLURM_JOB_ID"))


def require_allocation(environ) -> None:
    if not in_allocation(environ):
        raise KVStoreError("the slurm launcher runs inside a Slurm allocation (salloc, sbatch; "
                           "SLURM_JOB_ID is not set): start it there, or let mixrt launch "
                           "--sbatch SCRIPT write and submit the batch job")


def role_of_rank(rank: int, num_servers: int) -> tuple[str, int]:
    """(role, index) of task ``rank``: 0 the scheduler, then the servers, then the workers."""
    if rank == 0:
        return "scheduler", 0
    if rank <= num_servers:
        return "server", rank - 1
    return "worker", rank - 1 - num_servers


def task_name(rank: int, num_servers: int) -> str:
    role, index = role_of_rank(rank, num_servers)
    return "scheduler" if role == "scheduler" else f"{role} {index}"


# -- where the scheduler listens -------------------------------------------------------------

def first_node(environ) -> str:
    """The first host of the allocation, where srun's block distribution puts task 0."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise KVStoreError("the allocation names no nodes (SLURM_JOB_NODELIST is not set)")
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KVStoreError(f"cannot expand the allocation's nodes {nodelist!r} with scontrol: "
                           f"{exc}") from exc
    hosts = done.stdout.split()
    if not hosts:
        raise KVStoreError(f"scontrol found no hosts in {nodelist!r}")
    return hosts[0]


def node_address(node: str) -> str:
    try:
        return socket.gethostbyname(node)
    except OSError as exc:
        raise KVStoreError(f"cannot resolve the allocation's first node {node!r} ({exc}); "
                           f"pass --host-uri ADDRESS, its address as the others reach it") \
            from exc


def job_port(environ) -> int:
    """A port for the job's scheduler that two jobs on one node are unlikely to share."""
    job = environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        raise KVStoreError(f"SLURM_JOB_ID must be a number, got {job!r}")
    return PORT_BASE + int(job) % PORT_SPAN


# -- the step --------------------------------------------------------------------------------

def srun_process(srun: list[str], shared_env: dict[str, str], command: list[str],
                 role_command: list[str], num_servers: int, num_workers: int) -> Planned:
    """One srun step whose tasks are the whole job; ``shared_env`` reaches every task through
    srun's environment."""
    tasks = 1 + num_servers + num_workers
    child = [sys.executable, "-m", "mixrt.kvstore.launch", "--task-child",
             "--role-command", json.dumps(role_command), "--", *command]
    argv = [*srun, "--ntasks", str(tasks), "--kill-on-bad-exit=1", "--export=ALL",
            "--label", *child]
    lines = SrunLines(num_servers)
    return Planned("srun", "srun", argv, shared_env, speaker=lines, culprit=lines.culprit)


class SrunLines:
    """srun's output as the job's: a task's line (``--label``: "2: text") under the task's
    role, srun's own lines with each task they mention named by its role, and the first task
    srun reports ended (Slurm then ends the others) kept as the step's culprit."""

    def __init__(self, num_servers: int):
        self.num_servers = num_servers
        self.first_ended: tuple[str, int] | None = None

    def __call__(self, line: bytes) -> tuple[str | None, bytes]:
        labelled = _LABELLED.match(line)
        if labelled:
            return task_name(int(labelled.group(1)), self.num_servers), line[labelled.end():]
        ended = _TASK_ENDED.search(line)
        if ended and self.first_ended is None:
            self.first_ended = self._ended(int(ended.group(1)), ended.group(2))
        return None, _TASK_MENTION.sub(self._named, line)

    def _named(self, match: re.Match) -> bytes:
        return match.group(0) + f" ({task_name(int(match.group(1)), self.num_servers)})".encode()

    def _ended(self, rank: int, how: bytes) -> tuple[str, int] | None:
        """(the task's name, its return code) from srun's words for its end: "Exited with
        exit code 3" is 3, "Killed" (strsignal's SIGKILL) is -9."""
        text = how.decode("utf-8", "replace").strip()
        code = re.fullmatch(r"Exited with exit code (\d+)", text)
        returncode = int(code.group(1)) if code else _SIGNAL_BY_WORDS.get(text)
        if returncode is None:
            return None
        return f"{task_name(rank, self.num_servers)} (Slurm task {rank})", returncode

    def culprit(self) -> tuple[str, int] | None:
        return self.first_ended


# srun names a task's killing signal as strsignal does ("Killed", "Segmentation fault")
_SIGNAL_BY_WORDS = {signal.strsignal(number): -number for number in signal.valid_signals()
                    if 0 < number < signal.SIGRTMIN and signal.strsignal(number)}


# -- a batch script --------------------------------------------------------------------------

def batch_script(launch_argv: list[str], num_workers: int, num_servers: int,
                 sbatch_args: list[str], job_name: str = "mixrt") -> str:
    """A batch script asking for one task per process and running ``launch_argv`` (this
    launcher, with ``--launcher slurm``) inside the allocation."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}",
             f"#SBATCH --ntasks={1 + num_servers + num_workers}"]
    for argument in sbatch_args:
        if not argument.startswith("-") or "\n" in argument:
            raise KVStoreError(f"--sbatch-arg takes one sbatch option such as "
                               f"--partition=gpu, got {argument!r}")
        lines.append(f"#SBATCH {argument}")
    lines += ["# the job's token is made inside the job and reaches the tasks through their",
              "# environment: it is in no file and on no command line",
              f"exec {shlex.join(launch_argv)}", ""]
    return "\n".join(lines)


def submit(script: Path, text: str, sbatch: list[str], wait: bool) -> int:
    """Write ``script`` and submit it; with ``wait``, until the job ends, its status."""
    try:
        script.write_text(text, encoding="utf-8")
        script.chmod(0o755)
    except OSError as exc:
        raise KVStoreError(f"cannot write the batch script {script}: {exc}") from exc
    argv = [*sbatch, "--parsable", *(["--wait"] if wait else []), str(script)]
    try:
        done = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise KVStoreError(f"cannot run {argv[0]}: {exc}") from exc
    job = done.stdout.readline().strip().split(";")[0]  # at once, before --wait waits
    if job:
        print(f"mixrt launch: submitted {script} as Slurm job {job}", file=sys.stderr,
              flush=True)
    _, errors = done.communicate()
    if done.returncode != 0 and not (wait and job):
        raise KVStoreError(f"sbatch refused {script}: {errors.strip()}")
    return done.returncode
