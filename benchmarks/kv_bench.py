"""KVStore throughput: mixrt's dist_sync against a raw ZeroMQ echo of the same bytes, and
against MXNet 1.9.1's dist_sync where it runs, one process run, on loopback.

    python benchmarks/kv_bench.py [--mib 64] [--steps 30] [--warmup 3] [--block 3]
    python benchmarks/kv_bench.py --mxnet-python /tmp/mxvenv/bin/python   # adds MXNet rows
    python benchmarks/kv_bench.py --configs echo mixrt --servers 1 --no-write  # a quick look

One key of ``--mib`` MiB float32; per step every worker pushes its gradient and pulls the
value back (dist_sync: the servers sum the workers' pushes, store the sum or apply SGD, then
answer the pulls), so a worker moves 2 x ``--mib`` MiB a step. Topologies: 2 workers x 1
server and 2 x 2 (the key is then split into contiguous equal parts, one per server, as the
store splits a big key).

Baseline, same topology and bytes: one echo process per "server" (a ROUTER that sends
every message straight back, pyzmq ``copy=False`` both ways) and 2 client processes, each
sending its parts (a small header frame and the part, as the store frames a push) to the echo
servers and receiving them back per step. The clients start each block together but are not
synchronized per step; the store's workers are, as dist_sync is.

Method: for one topology every configuration's processes are started and kept alive; after
``--warmup`` steps each, the configurations take turns in blocks of ``--block`` steps (the
order rotating every turn) until each has ``--steps`` timed steps, so that load from other
processes on the shared cores falls on all of them alike; waiting processes block on a read
and take no CPU. Figures: median step time over every timed step of both workers;
throughput = bytes pushed + pulled per worker per second (GB = 1e9 bytes); ratio = that
throughput / the echo's with the same number of servers, from the pooled medians, and also
per turn (the echo's median step in that turn / this one's), whose median and range show
how much the machine moved. Pulled values are checked at the end.

MXNet 1.9.1 runs in another interpreter (``--mxnet-python``, or ``MIXRT_BENCH_MXNET_PYTHON``):
its wheel is ``py3-none-manylinux2014_x86_64`` and imports only with NumPy < 1.24 (it uses
``np.bool``), which this project's NumPy 2 venv cannot give it. Such a venv::

    python3.11 -m venv /tmp/mxvenv
    /tmp/mxvenv/bin/pip install mxnet==1.9.1 numpy==1.23.5

Without one the section says why there is no MXNet row (``import mxnet`` here, and whether
``pip download mxnet==1.9.1`` finds a wheel). Every process is started with subprocess and
stopped in a ``finally`` (SIGTERM, then SIGKILL); on Linux they also die with this one
(PR_SET_PDEATHSIG). The result goes to the "KVStore throughput" section of ``BENCHMARKS.md``
(``--out``), between generated-block markers; text after the block is kept.

Here: the configurations' jobs taken in turns, MXNet's availability, the command line. What
runs in the children is in ``_kv_children.py``, how they are started, talked to and stopped
in ``_kv_processes.py``, the section written in ``_kv_report.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kv_children import (child_echo_client, child_echo_server, child_mixrt_worker,  # noqa: E402
                          child_mxnet_worker)
from _kv_processes import JOB_TIMEOUT, ROOT, BenchError, Child, child_env, free_port  # noqa: E402
from _kv_report import CONFIGS, LABELS, SECTION, render, summarize, write_section  # noqa: E402

SCRIPT = Path(__file__).resolve()


# -- a configuration's processes --------------------------------------------------------------

class Job:
    """One configuration's processes, alive until ``finish``; ``run(k)`` has every worker
    (or echo client) do k steps and returns their step times."""

    def __init__(self, config: str, servers: int, workers: int, args, logdir: Path):
        self.config, self.label = config, f"{LABELS[config]}, {workers} x {servers}"
        self.children: list[Child] = []
        self.others: list[Child] = []   # scheduler and servers (echo servers)
        self.workers: list[Child] = []
        common = ["--mib", str(args.mib)]
        tag = f"{config}-{workers}x{servers}"
        deadline = time.monotonic() + JOB_TIMEOUT
        try:
            if config.startswith("echo"):
                chunk = ["--chunk-mib", str(args.echo_chunk_mib)] \
                    if config == "echo-chunked" else []
                for i in range(servers):
                    self.others.append(self._start(
                        f"{tag} echo {i}", [sys.executable, str(SCRIPT), "--child",
                                            "echo-server"], child_env(), logdir))
                ports = [echo.expect("PORT", deadline) for echo in self.others]
                for i in range(workers):
                    self.workers.append(self._start(
                        f"{tag} client {i}", [sys.executable, str(SCRIPT), "--child",
                                              "echo-client", "--ports", ",".join(ports),
                                              *common, *chunk], child_env(), logdir))
            else:
                mxnet = config.startswith("mxnet")
                python = args.mxnet_python if mxnet else sys.executable
                job = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
                       "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers)}
                if mxnet:  # keep ps-lite on loopback
                    job.update(DMLC_NODE_HOST="127.0.0.1", DMLC_INTERFACE="lo")
                else:  # authenticated as `mixrt launch` makes a job, unless "-open"
                    from mixrt.kvstore.launch import with_job_token  # noqa: PLC0415
                    job = with_job_token(job) if config != "mixrt-open" else job
                    if args.message_mib:
                        job["MIXRT_KV_MESSAGE_BYTES"] = str(args.message_mib << 20)
                role_argv = [python, "-c", "import mxnet"] if mxnet else \
                    [python, "-m", "mixrt.kvstore.dist"]
                for role, index in [("scheduler", 0)] + [("server", i) for i in range(servers)]:
                    self.others.append(self._start(
                        f"{tag} {role} {index}", role_argv, child_env(
                            {**job, "DMLC_ROLE": role, "MIXRT_KV_ROLE_INDEX": str(index)}),
                        logdir))
                argv = [python, str(SCRIPT), "--child",
                        "mxnet-worker" if mxnet else "mixrt-worker", *common]
                if config.endswith("-sgd"):
                    argv.append("--sgd")
                for i in range(workers):
                    self.workers.append(self._start(f"{tag} worker {i}", argv, child_env(
                        {**job, "DMLC_ROLE": "worker", "MIXRT_KV_ROLE_INDEX": str(i)}), logdir))
            for worker in self.workers:
                worker.expect("READY", deadline)
        except BaseException:
            self.stop()
            raise

    def _start(self, *args) -> Child:
        child = Child(*args)
        self.children.append(child)
        return child

    def run(self, steps: int) -> list[list[float]]:
        deadline = time.monotonic() + JOB_TIMEOUT
        for worker in self.workers:
            worker.send(f"run {steps}\n")
        return [json.loads(worker.expect("TIMES", deadline)) for worker in self.workers]

    def finish(self) -> None:
        """Let the workers check their values and leave, then the servers; raises on a
        wrong value or a non-zero exit."""
        deadline = time.monotonic() + JOB_TIMEOUT
        for worker in self.workers:
            worker.send("quit\n")
        checks = [json.loads(worker.expect("RESULT", deadline))["check"]
                  for worker in self.workers]
        waited = self.workers + ([] if self.config.startswith("echo") else self.others)
        for child in waited:
            if child.wait(deadline) != 0:
                raise BenchError(f"{child.name} exited with status {child.popen.returncode}"
                                 f"{child.tail()}")
        bad = [check for check in checks if check != "ok"]
        if bad:
            raise BenchError(f"{self.label}: wrong values pulled: {bad[0]}")

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


def run_topology(servers: int, configs: list[str], args, logdir: Path, samples: dict,
                 turns: dict, failures: list[str]) -> None:
    """Every configuration with ``servers`` servers, interleaved in blocks of steps."""
    jobs: dict[str, Job] = {}

    def fail(config: str, exc: Exception) -> None:
        label = f"{LABELS[config]}, {args.workers} x {servers}"
        failures.append(f"{label}: {exc}")
        print(f"{label}: FAILED: {exc}", flush=True)
        job = jobs.pop(config, None)
        if job is not None:
            job.stop()

    try:
        for config in configs:
            try:
                jobs[config] = Job(config, servers, args.workers, args, logdir)
                if args.warmup:
                    jobs[config].run(args.warmup)
            except BenchError as exc:
                fail(config, exc)
        blocks = -(-args.steps // args.block)
        for turn in range(blocks):
            steps = min(args.block, args.steps - turn * args.block)
            order = configs[turn % len(configs):] + configs[:turn % len(configs)]
            for config in order:
                if config not in jobs:
                    continue
                try:
                    times = jobs[config].run(steps)
                except BenchError as exc:
                    fail(config, exc)
                    continue
                samples[(config, servers)].append(times)
                turns[(config, servers)].append(
                    statistics.median(t for worker in times for t in worker))
        for config in list(jobs):
            try:
                jobs[config].finish()
            except BenchError as exc:
                fail(config, exc)
                continue
            pooled = [t for block in samples[(config, servers)] for worker in block
                      for t in worker]
            per_worker = [statistics.median(t for block in samples[(config, servers)]
                                            for t in block[w])
                          for w in range(args.workers)]
            median = statistics.median(pooled)
            print(f"{LABELS[config]}, {args.workers} x {servers}: median step "
                  f"{median * 1e3:.1f} ms (per worker "
                  f"{', '.join(f'{t * 1e3:.0f}' for t in per_worker)}), "
                  f"{2 * (args.mib << 20) / median / 1e9:.2f} GB/s per worker", flush=True)
    finally:
        for job in jobs.values():
            job.stop()


# -- mxnet's availability ---------------------------------------------------------------------

def mxnet_status(args) -> tuple[bool, str]:
    """(usable, a line for the report)."""
    if args.mxnet_python:
        probe = subprocess.run(
            [args.mxnet_python, "-c", "import sys, mxnet, numpy; print(mxnet.__version__, "
             "numpy.__version__, sys.version.split()[0], "
             "mxnet.runtime.Features().is_enabled('DIST_KVSTORE'))"],
            capture_output=True, text=True, timeout=120)
        if probe.returncode != 0:
            return False, (f"MXNet 1.9.1: `{args.mxnet_python}` cannot import it: "
                           f"{_last_line(probe.stderr)}")
        version, numpy_version, python_version, dist = probe.stdout.split()[-4:]
        if dist != "True":
            return False, f"MXNet {version}: built without DIST_KVSTORE"
        return True, (f"MXNet {version} (the PyPI wheel) in its own venv, Python "
                      f"{python_version}, NumPy {numpy_version}")
    try:
        import mxnet  # noqa: F401,PLC0415
        reason = "imports here, but run it with --mxnet-python to keep the two apart"
    except Exception as exc:  # noqa: BLE001  (any import failure is the reason)
        reason = f"`import mxnet` fails here ({type(exc).__name__}: {str(exc)[:120]})"
    wheel = _pip_download()
    return False, f"MXNet 1.9.1: not measured: {reason}; {wheel}"


def _pip_download() -> str:
    with tempfile.TemporaryDirectory() as where:
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "mxnet==1.9.1",
                                   "--no-deps", "-d", where], capture_output=True, text=True,
                                  timeout=180)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`pip download mxnet==1.9.1 --no-deps` did not finish ({exc})"
        wheels = [p.name for p in Path(where).glob("*.whl")]
    if done.returncode == 0 and wheels:
        return (f"`pip download mxnet==1.9.1 --no-deps` finds {wheels[0]}, which imports "
                f"only with NumPy < 1.24 (it uses np.bool): give it its own venv and pass "
                f"--mxnet-python (see the script's docstring)")
    return f"`pip download mxnet==1.9.1 --no-deps` fails: {_last_line(done.stderr)}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no message)"


# -- main -------------------------------------------------------------------------------------

def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="the key's size (default 64)")
    parser.add_argument("--steps", type=int, default=30,
                        help="timed steps per configuration (default 30)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps per configuration first (default 3)")
    parser.add_argument("--block", type=int, default=3,
                        help="steps per turn; configurations take turns (default 3)")
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--no-sgd", action="store_true", help="leave out the SGD rows")
    parser.add_argument("--echo-chunk-mib", type=int, default=8,
                        help="an extra echo row sending each part in messages of at most "
                             "this many MiB (default 8; 0 leaves it out)")
    parser.add_argument("--message-mib", type=int, default=0,
                        help="mixrt's MIXRT_KV_MESSAGE_BYTES in MiB (default: the store's)")
    parser.add_argument("--mxnet-python", default=os.environ.get("MIXRT_BENCH_MXNET_PYTHON"),
                        help="an interpreter that imports mxnet 1.9.1")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the children's stderr logs (their folder is printed)")
    # a child of this script (not for users)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--chunk-mib", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--sgd", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.mib, args.steps, args.block, args.workers, *args.servers) < 1 or \
            args.warmup < 0:
        parser.error("--mib, --steps, --block, --workers and --servers must be positive")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.child:
        return {"echo-server": child_echo_server, "echo-client": child_echo_client,
                "mixrt-worker": child_mixrt_worker,
                "mxnet-worker": child_mxnet_worker}[args.child](args)
    # SIGTERM unwinds like Ctrl-C, so that the finally blocks stop every child
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    command = "python benchmarks/kv_bench.py" + ("" if not argv else " " + shlex.join(argv))
    configs = [c for c in CONFIGS if c in args.configs
               and not (args.no_sgd and c.endswith("-sgd"))
               and not (c == "echo-chunked" and not args.echo_chunk_mib)]
    LABELS["echo-chunked"] = f"raw ZeroMQ echo in {args.echo_chunk_mib} MiB messages"
    mxnet_ok, mxnet_line = mxnet_status(args) if any(c.startswith("mxnet") for c in configs) \
        else (False, "MXNet 1.9.1: not in this run's --configs")
    if not mxnet_ok:
        configs = [c for c in configs if not c.startswith("mxnet")]
    print(f"kv_bench: {args.mib} MiB float32, {args.workers} workers x {args.servers} "
          f"servers, {configs} in turns of {args.block} steps; {mxnet_line}", flush=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    loads = [", ".join(f"{x:.1f}" for x in os.getloadavg())]
    clock = time.monotonic()
    samples: dict = {(c, s): [] for s in args.servers for c in configs}
    turns: dict = {(c, s): [] for s in args.servers for c in configs}
    failures: list[str] = []
    logdir = Path(tempfile.mkdtemp(prefix="kv_bench_"))
    try:
        for servers in args.servers:
            run_topology(servers, configs, args, logdir, samples, turns, failures)
    except KeyboardInterrupt:
        print("kv_bench: interrupted", file=sys.stderr)
        return 130
    finally:
        if args.keep_logs or failures:
            print(f"kv_bench: the children's stderr is in {logdir}", flush=True)
        else:
            for log in logdir.glob("*.log"):
                log.unlink()
            logdir.rmdir()
    loads.append(", ".join(f"{x:.1f}" for x in os.getloadavg()))
    rows = summarize(samples, turns, args)
    block = render(rows, args, command, started, time.monotonic() - clock, mxnet_line,
                   tuple(loads), failures)
    print()
    print(block)
    if not args.no_write:
        write_section(args.out, block)
        print(f"kv_bench: wrote the section {SECTION[3:]!r} of {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
