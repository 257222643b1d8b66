"""Serving memory: the proportional set size (PSS) of ``mixrt serve`` with 1 and 4 worker
processes against 1 and 4 processes each holding an onnxruntime session, ResNet-50 (the
export of ``_serve_models.py``, as ``serve_bench.py`` serves it).

PSS is what a set of processes costs the machine together: each page counted once, split
between the processes that map it. Measured here as the sum of ``Pss:`` in
``/proc/PID/smaps_rollup`` over

* mixrt: the server's whole process tree (the supervisor, which prepared the model before it
  forked, and its workers), after every worker has answered requests: rounds of requests of
  one row over several new gRPC connections (which the kernel spreads over the workers'
  SO_REUSEPORT sockets) until each worker's CPU time shows it ran the model;
* onnxruntime: N plain Python processes, each with an ``onnxruntime.InferenceSession`` of
  the ``.onnx`` (CPUExecutionProvider) that has run a few one-row batches; no server around
  them, so their figure is a floor for an onnxruntime server of N processes.

    python benchmarks/serve_memory.py                 # workers / processes 1 and 4
    python benchmarks/serve_memory.py --counts 1,2,4 --out memory.json
    python benchmarks/serve_memory.py --quick         # the same (it is short already)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _serve_models  # noqa: E402
import _serve_servers  # noqa: E402
import serve_bench  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RAN_CPU_S = 0.05  # a worker whose CPU time grew this much since it was ready ran the model
MAX_ROUNDS = 8


@dataclass
class Measured:
    runtime: str
    processes: int
    pss_mb: float
    pss_anon_mb: float
    pss_file_mb: float
    pids: list
    note: str = ""


# -- /proc -----------------------------------------------------------------------------------

def _rollup(pid: int) -> dict:
    """``smaps_rollup``'s kB figures of one process."""
    figures = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                figures[parts[0].rstrip(":")] = int(parts[1])
    return figures


def _children() -> dict:
    """Parent pid -> its children's pids, over every process readable now."""
    tree: dict[int, list] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def process_tree(root: int) -> list:
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, []))
    return found


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def total_pss(pids: list) -> tuple:
    """(PSS, anonymous PSS, file-backed PSS) in MB, summed over ``pids``."""
    sums = {"Pss": 0, "Pss_Anon": 0, "Pss_File": 0}
    for pid in pids:
        figures = _rollup(pid)
        for key in sums:
            sums[key] += figures.get(key, 0)
    return tuple(sums[key] / 1024 for key in ("Pss", "Pss_Anon", "Pss_File"))


# -- mixrt serve -----------------------------------------------------------------------------

def _round(model, grpc_port: int, requests: int, connections: int) -> int:
    """``requests`` one-row requests spread over ``connections`` new connections; the number
    that failed."""
    import tritonclient.grpc as grpcclient  # noqa: PLC0415
    failed = [0]
    share = [requests // connections + (i < requests % connections)
             for i in range(connections)]

    def client(index: int) -> None:
        each = serve_bench.grpc_client(grpc_port)
        try:
            for n in range(share[index]):
                feeds = _serve_models.request_feeds(model, 1, seed=index * 100 + n)
                try:
                    each.infer(model.name, serve_bench._inputs(grpcclient, feeds, model))
                except Exception:  # noqa: BLE001 - counted and reported
                    failed[0] += 1
        finally:
            each.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed[0]


def measure_mixrt(model, workers: int, args, workdir: Path) -> Measured:
    command = [sys.executable, "-m", "mixrt", "serve", str(model.mxr), "--name", model.name,
               "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0", "--workers", str(workers)]
    server = _serve_servers.Server(command, workdir / f"mixrt_w{workers}.log",
                                   dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        _serve_servers.wait_ready(server, model.name, ports_from_log=True)
        supervisor = server.process.pid
        deadline = time.monotonic() + 120  # the workers load their models after the port
        while True:  # opens; wait until each has said so
            worker_pids = [p for p in process_tree(supervisor) if p != supervisor]
            loaded = server.text().count(f"model {model.name} ready from ")
            if len(worker_pids) >= workers and loaded >= workers:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{workers} workers did not all load:\n"
                                   f"{server.text()[-3000:]}")
            server.check_alive()
            time.sleep(0.25)
        before = {pid: cpu_seconds(pid) for pid in worker_pids}
        failed, rounds = 0, 0
        while rounds < MAX_ROUNDS:
            failed += _round(model, server.grpc, args.requests, args.connections)
            rounds += 1
            ran = [pid for pid in worker_pids if cpu_seconds(pid) - before[pid] >= RAN_CPU_S]
            if len(ran) == len(worker_pids):
                break
        time.sleep(args.settle)
        server.check_alive()
        pids = process_tree(supervisor)
        pss, anon, file_ = total_pss(pids)
        note = (f"{rounds} round(s) of {args.requests} requests over {args.connections} "
                f"connections; {len(ran)} of {len(worker_pids)} workers ran")
        if failed:
            note += f"; {failed} requests failed"
        return Measured("mixrt serve", workers, pss, anon, file_, pids, note)
    finally:
        server.stop()


# -- onnxruntime processes -------------------------------------------------------------------

def ort_child(path: str, runs: int) -> int:
    """A process holding one onnxruntime session of ``path`` that has run ``runs`` times;
    says ``ready`` and waits for its standard input to close."""
    import onnxruntime as ort  # noqa: PLC0415
    model = _serve_models.resnet50() if "resnet50" in path else _serve_models.bert()
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for run in range(runs):
        session.run(None, _serve_models.request_feeds(model, 1, seed=run))
    print("ready", flush=True)
    sys.stdin.read()
    return 0


def measure_onnxruntime(model, processes: int, args) -> Measured:
    children = [subprocess.Popen([sys.executable, __file__, "--ort-child", str(model.onnx),
                                  "--runs", str(args.runs)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    try:
        for child in children:
            line = child.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"an onnxruntime process ended with {child.wait()}")
        time.sleep(args.settle)
        pids = [p for child in children for p in process_tree(child.pid)]
        pss, anon, file_ = total_pss(pids)
        return Measured("onnxruntime", processes, pss, anon, file_, pids,
                        f"each ran {args.runs} one-row batches")
    finally:
        for child in children:
            child.stdin.close()
        for child in children:
            child.wait(30)


# -- main ------------------------------------------------------------------------------------

def table(results: list) -> str:
    ones = {r.runtime: r.pss_mb for r in results if r.processes == 1}
    lines = ["| runtime | processes | total PSS MB | anonymous MB | file-backed MB "
             "| ratio to one |", "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        one = ones.get(r.runtime)
        ratio = f"{r.pss_mb / one:.2f}" if one else ""
        lines.append(f"| {r.runtime} | {r.processes} | {r.pss_mb:.0f} | {r.pss_anon_mb:.0f} "
                     f"| {r.pss_file_mb:.0f} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=lambda s: serve_bench._csv(s, int), default=[1, 4],
                        help="worker / process counts (default 1,4)")
    parser.add_argument("--runtimes", type=serve_bench._csv, default=["mixrt", "onnxruntime"])
    parser.add_argument("--requests", type=int, default=20, help="requests per round")
    parser.add_argument("--connections", type=int, default=8, help="connections per round")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs of each onnxruntime process before it is measured")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds between the last request and the measurement")
    parser.add_argument("--quick", action="store_true", help="accepted for symmetry with "
                        "serve_bench.py; the defaults are short already")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--logs", type=Path, help="keep the servers' logs in this folder")
    parser.add_argument("--ort-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ort_child:
        return ort_child(args.ort_child, args.runs)
    if not os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
        parser.error("needs Linux's /proc/PID/smaps_rollup (kernel 4.14 or later)")

    from tqdm import tqdm  # noqa: PLC0415
    model = _serve_models.resnet50()
    plan = [(runtime, count) for runtime in args.runtimes for count in args.counts]
    workdir = Path(tempfile.mkdtemp(prefix="serve-memory-"))
    results = []
    with tqdm(plan, unit="case", disable=not sys.stderr.isatty(), file=sys.stderr) as bar:
        try:
            for runtime, count in bar:
                bar.set_description(f"{runtime} x{count}")
                if runtime == "mixrt":
                    results.append(measure_mixrt(model, count, args, workdir))
                else:
                    results.append(measure_onnxruntime(model, count, args))
        finally:
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                for log in workdir.glob("*.log"):
                    (args.logs / log.name).write_bytes(log.read_bytes())
    print(f"ResNet-50 ({model.mxr.name} / {model.onnx.name}), total PSS over each runtime's "
          f"processes after they answered requests of one row; {os.cpu_count()} CPUs.\n")
    print(table(results))
    print()
    for r in results:
        print(f"- {r.runtime} x{r.processes}: {len(r.pids)} processes measured; {r.note}")
    if args.out:
        args.out.write_text(json.dumps({"when": serve_bench.now(),
                                        "results": [asdict(r) for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
