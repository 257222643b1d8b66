"""Serving throughput and latency: ``mixrt serve`` against onnxruntime behind the same server
framework (KServe's Python model server), over gRPC with binary tensors.

For each model (ResNet-50, a small BERT encoder: ``_serve_models.py``), each runtime and each
batching setting, one server is started alone on this machine (``_serve_servers.py``), and
clients at each concurrency (threads, each with its own ``tritonclient.grpc`` client and
connection) send requests of one row back to back: first a warm-up, then a timed phase of a
fixed duration. Measured: requests per second (requests completed in the timed phase over its
length) and the median and 99th percentile of their latencies.

* mixrt: ``mixrt serve MODEL.mxr --workers 1`` with ``--max-batch-size B --max-delay-ms D``
  (batching on) or ``--max-batch-size 0`` (off);
* onnxruntime: ``_ort_kserve_model.py`` (one process), a ``kserve.Model`` over the ``.onnx``
  in KServe's ``ModelServer``, batching off only: KServe's Python server has no adaptive
  batching (KServe's batcher is an agent in a container beside the server), so onnxruntime
  has no batching-on rows, and mixrt's batching-on rows are compared with onnxruntime
  unbatched at the same concurrency.

The clients run in this process, on the same cores as the server: on a small machine they
take their share of the CPU, alike for both runtimes.

``--paced MS`` measures the service rhythm instead: batching off, ONE client sends a request
every MS milliseconds (start to start, sleeping between; one that takes longer is followed at
once), ``--requests`` of them timed (default 300) after 20 untimed and a pause of ``--settle``
seconds (a runtime that compiles in the background has finished by then). BERT is served as
``bert_dynseq`` (its sequence axis symbolic), each request ``--lengths fixed`` (64 tokens)
or ``new`` (``--new-lengths``): a length drawn at random from 8..128 per request, warm-up
included, under the printed ``--seed``, the same lengths for both runtimes. Measured: p50 and
p99 of the client's latencies, send to response.

    python benchmarks/serve_bench.py                      # 10 s per setting, concurrency 1, 8, 32
    python benchmarks/serve_bench.py --quick              # ~3 s per setting, concurrency 1 and 8
    python benchmarks/serve_bench.py --models resnet50 --concurrency 1,8 --out serve.json
    python benchmarks/serve_bench.py --paced 10 --lengths fixed,new --out paced.json

The table (markdown) goes to stdout; ``--out`` writes every figure, each server's start and
end time and the runtimes' versions as JSON. Exported models are cached under
``benchmarks/.cache/serve/``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _serve_models  # noqa: E402
from _serve_paced import (LONGEST, SHORTEST, PacedResult, draw_lengths,  # noqa: E402
                          first_seen, paced, paced_table)
from _serve_servers import start_mixrt, start_onnxruntime  # noqa: E402

MIXRT_BATCHING_LINE = re.compile(r"ready from .*: batching (.*)")
RUNTIMES = ("mixrt", "onnxruntime")
ATTEMPTS = 2  # starts of one server before its settings are given up
PACED_WARMUP = 20  # untimed requests before a paced run, their lengths drawn as the timed ones


@dataclass
class Setting:
    model: str
    runtime: str
    batching: str  # "on" or "off"
    concurrency: int


@dataclass
class Result:
    model: str
    runtime: str
    batching: str
    concurrency: int
    requests: int
    errors: int
    seconds: float
    req_per_s: float
    p50_ms: float
    p99_ms: float
    started: str
    ended: str


@dataclass
class ServerRun:
    model: str
    runtime: str
    batching: str
    command: list
    started: str
    ready: str = ""
    ended: str = ""
    note: str = ""  # the server's own word on batching (mixrt's load-time check)
    results: list = field(default_factory=list)
    lengths: str = ""  # paced runs: "fixed" or "new"


def package_version(*names: str) -> str:
    """The installed version of the first of ``names`` found (onnxruntime may be installed
    as onnxruntime-gpu)."""
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "?"


VERSIONS = {"mixrt": ("mixrt",), "kserve": ("kserve",),
            "onnxruntime": ("onnxruntime", "onnxruntime-gpu"), "tritonclient": ("tritonclient",)}


def baseline() -> str:
    return (f"onnxruntime {package_version(*VERSIONS['onnxruntime'])} behind KServe "
            f"{package_version('kserve')}'s Python model server (one process, its log lines "
            f"per request off)")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# -- clients ---------------------------------------------------------------------------------

def grpc_client(port: int):
    """A ``tritonclient.grpc`` client on a connection of its own: gRPC's channels to one
    address otherwise share their connection (the process-wide subchannel pool), and every
    client would send over one TCP connection to one server process."""
    import tritonclient.grpc as grpcclient  # noqa: PLC0415
    size = grpcclient.MAX_GRPC_MESSAGE_SIZE
    return grpcclient.InferenceServerClient(
        f"127.0.0.1:{port}", channel_args=[("grpc.max_send_message_length", size),
                                           ("grpc.max_receive_message_length", size),
                                           ("grpc.use_local_subchannel_pool", 1)])


def _inputs(grpcclient, feeds: dict, model: _serve_models.ServeModel) -> list:
    items = []
    for name, array in feeds.items():
        item = grpcclient.InferInput(name, list(array.shape), model.inputs[name][2])
        item.set_data_from_numpy(array)
        items.append(item)
    return items


def measure(model: _serve_models.ServeModel, grpc_port: int, concurrency: int,
            warmup_s: float, duration_s: float, progress=None) -> dict:
    """Warm up, then time ``duration_s`` of ``concurrency`` clients sending back to back."""
    import tritonclient.grpc as grpcclient  # noqa: PLC0415
    feeds = [_serve_models.request_feeds(model, 1, seed) for seed in range(8)]
    clients = [grpc_client(grpc_port) for _ in range(concurrency)]
    first = clients[0].infer(model.name, _inputs(grpcclient, feeds[0], model))
    if first.as_numpy(first.get_response().outputs[0].name).shape[0] != 1:
        raise RuntimeError("the server answered a one-row request with another row count")
    barrier = threading.Barrier(concurrency + 1)
    clock = {}
    records = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    failures = []

    def client(index: int) -> None:
        requests = [_inputs(grpcclient, f, model) for f in feeds]
        barrier.wait()
        count = 0
        while True:
            started = time.perf_counter()
            if started >= clock["end"]:
                break
            try:
                clients[index].infer(model.name, requests[(index + count) % len(requests)])
            except Exception as exc:  # noqa: BLE001 - counted, the first kept for the report
                errors[index] += 1
                if not failures:
                    failures.append(repr(exc))
                continue
            finally:
                count += 1
            records[index].append((started, time.perf_counter()))

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(concurrency)]
    for thread in threads:
        thread.start()
    clock["begin"] = time.perf_counter() + warmup_s
    clock["end"] = clock["begin"] + duration_s
    barrier.wait()
    while any(thread.is_alive() for thread in threads):
        if progress is not None:
            phase = "warm-up" if time.perf_counter() < clock["begin"] else "timing"
            progress.set_postfix_str(f"c={concurrency} {phase}")
        time.sleep(0.25)
    for each in clients:
        each.close()
    # the timed phase's requests: those that completed in it (a request that began in the
    # warm-up and ended in it counts, as one still running at its end does not)
    timed = [end - start for record in records for start, end in record
             if clock["begin"] <= end <= clock["end"]]
    if not timed:
        print(f"warning: no request completed in {duration_s:g} s (errors: {sum(errors)}, "
              f"the first: {failures[:1]})", file=sys.stderr)
        timed = [float("nan")]
    latencies = np.array(timed) * 1e3
    done = int(np.isfinite(latencies).sum())
    return {"requests": done, "errors": sum(errors), "seconds": duration_s,
            "req_per_s": done / duration_s,
            "p50_ms": float(np.percentile(latencies, 50)),
            "p99_ms": float(np.percentile(latencies, 99)),
            "mean_ms": float(statistics.fmean(latencies)), "first_error": failures[:1]}


# -- paced: one client, a request every MS milliseconds -------------------------------------

def paced_mode(args, lengths: str) -> str:
    return f"paced {args.paced:g} ms, " + \
        ("new lengths" if lengths == "new" else f"fixed {_serve_models.BERT['seq']}")


def serve_paced(run: ServerRun, model, start, args, workdir: Path, progress) -> list:
    """Start one server (batching off), warm it up, let it settle, time one paced client,
    stop it; the result."""
    import tritonclient.grpc as grpcclient  # noqa: PLC0415
    count = PACED_WARMUP + args.requests
    lengths = draw_lengths(count, args.seed, model.max_length) if run.lengths == "new" \
        else [_serve_models.BERT["seq"]] * count
    requests = [_inputs(grpcclient, _serve_models.request_feeds(model, 1, i % 8, length), model)
                for i, length in enumerate(lengths)]
    progress.set_postfix_str("starting")
    server = start(model, False, args, workdir)
    run.command, run.ready = server.command, now()
    said = MIXRT_BATCHING_LINE.search(server.text()) if run.runtime == "mixrt" else None
    run.note = f"mixrt's batching: {said[1]}" if said else ""
    client, failures = grpc_client(server.grpc), []

    def send(index: int) -> float:
        began = time.perf_counter()
        try:
            client.infer(model.name, requests[index])
        except Exception as exc:  # noqa: BLE001 - counted, the first kept for the report
            failures.append(repr(exc))
            return float("nan")
        return (time.perf_counter() - began) * 1e3

    try:
        first = client.infer(model.name, requests[0])
        if first.as_numpy(first.get_response().outputs[0].name).shape[0] != 1:
            raise RuntimeError("the server answered a one-row request with another row count")
        progress.set_postfix_str("warm-up")
        for index in range(1, PACED_WARMUP):
            send(index)
        time.sleep(args.settle)
        progress.set_postfix_str("timing")
        started = now()
        latencies = np.array(paced(lambda i: send(PACED_WARMUP + i), args.requests,
                                   args.paced / 1000))
        ended = now()
        server.check_alive()
    finally:
        client.close()
        server.stop()
        run.ended = now()
    done = latencies[np.isfinite(latencies)]
    if not done.size:
        print(f"warning: no request answered (the first error: {failures[:1]})",
              file=sys.stderr)
        done = np.array([float("nan")])
    result = PacedResult(model.name, run.runtime, paced_mode(args, run.lengths),
                         int(np.isfinite(latencies).sum()), int(np.isnan(latencies).sum()),
                         float(np.percentile(done, 50)), float(np.percentile(done, 99)),
                         started, ended)
    run.results.append({
        **asdict(result), "mean_ms": float(np.mean(done)), "first_error": failures[:1],
        "over_interval": int((done > args.paced).sum()),
        "first_seen_lengths": first_seen(lengths[PACED_WARMUP:], lengths[:PACED_WARMUP]),
        "warmup_lengths": lengths[:PACED_WARMUP], "lengths": lengths[PACED_WARMUP:],
        "latencies_ms": [round(float(x), 3) for x in latencies]})
    if failures:
        print(f"warning: {model.name} {run.runtime} {result.mode}: {len(failures)} failed "
              f"requests (warm-up included), the first: {failures[0]}", file=sys.stderr)
    return [result]


# -- the table -------------------------------------------------------------------------------

def table(results: list) -> str:
    """The rows, and mixrt's requests a second over onnxruntime's at the same concurrency:
    onnxruntime's batching off, its only setting, for mixrt's rows of either setting."""
    by_key = {(r.model, r.runtime, r.batching, r.concurrency): r for r in results}
    lines = ["| model | runtime | batching | concurrency | req/s | p50 ms | p99 ms "
             "| mixrt / onnxruntime (batching off) req/s |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = ""
        if r.runtime == "mixrt":
            other = by_key.get((r.model, "onnxruntime", "off", r.concurrency))
            if other is not None and other.req_per_s > 0:
                ratio = f"{r.req_per_s / other.req_per_s:.2f}x"
        lines.append(f"| {r.model} | {r.runtime} | {r.batching} | {r.concurrency} "
                     f"| {r.req_per_s:.1f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {ratio} |")
    return "\n".join(lines)


def _order(results: list) -> list:
    models = list(dict.fromkeys(r.model for r in results))
    return sorted(results, key=lambda r: (models.index(r.model), r.batching != "off",
                                          r.concurrency, RUNTIMES.index(r.runtime)))


def serve_settings(run: ServerRun, model, start, args, workdir: Path, progress) -> list:
    """Start one server, measure it at every concurrency, stop it; the results."""
    progress.set_postfix_str("starting")
    server = start(model, run.batching == "on", args, workdir)
    run.command, run.ready = server.command, now()
    if run.runtime == "mixrt":
        said = MIXRT_BATCHING_LINE.search(server.text())
        run.note = f"mixrt's batching: {said[1]}" if said else ""
    results = []
    try:
        for concurrency in args.concurrency:
            started = now()
            figures = measure(model, server.grpc, concurrency, args.warmup, args.duration,
                              progress if not progress.disable else None)
            server.check_alive()
            result = Result(model.name, run.runtime, run.batching, concurrency,
                            figures["requests"], figures["errors"], figures["seconds"],
                            figures["req_per_s"], figures["p50_ms"], figures["p99_ms"],
                            started, now())
            results.append(result)
            run.results.append({**asdict(result), "mean_ms": figures["mean_ms"],
                                "first_error": figures["first_error"]})
            if figures["errors"]:
                print(f"warning: {model.name} {run.runtime} batching {run.batching} "
                      f"c={concurrency}: {figures['errors']} failed requests, the first: "
                      f"{figures['first_error'][0]}", file=sys.stderr)
    finally:
        server.stop()
        run.ended = now()
    return results


def _csv(text: str, kind=str) -> list:
    return [kind(part) for part in text.split(",") if part.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=_csv, default=None,
                        help="comma-separated: resnet50,bert (default both; --paced: bert)")
    parser.add_argument("--runtimes", type=_csv, default=list(RUNTIMES))
    parser.add_argument("--batching", type=_csv, default=None,
                        help="off,on: mixrt's (default both; --paced: off only); "
                             "onnxruntime's is off only")
    parser.add_argument("--concurrency", type=lambda s: _csv(s, int), default=None,
                        help="comma-separated client counts (default 1,8,32; --quick 1,8)")
    parser.add_argument("--duration", type=float, default=None,
                        help="timed seconds per setting (default 10; --quick 3)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="warm-up seconds before each timed phase (default 3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke check: short phases")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-delay-ms", type=float, default=2.0)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--logs", type=Path, help="keep the servers' logs in this folder")
    paced_group = parser.add_argument_group("service rhythm (one paced client, batching off)")
    paced_group.add_argument("--paced", type=float, metavar="MS",
                             help="one client, a request every MS ms (start to start)")
    paced_group.add_argument("--lengths", type=_csv, default=None,
                             help="fixed (64 tokens), new (drawn per request) or fixed,new")
    paced_group.add_argument("--new-lengths", action="store_true", help="as --lengths new")
    paced_group.add_argument("--requests", type=int, default=300, help="timed, per server")
    paced_group.add_argument("--seed", type=int, default=0, help="of the drawn lengths")
    paced_group.add_argument("--settle", type=float, default=2.5,
                             help="seconds of quiet between the warm-up and the timed requests")
    args = parser.parse_args(argv)
    return serve_bench(parser, args) if args.paced is None else paced_bench(parser, args)


def paced_bench(parser, args) -> int:
    """The service rhythm: every model, runtime and kind of lengths, one paced client."""
    if args.paced <= 0 or args.requests < 1:
        parser.error("--paced MS and --requests N take positive numbers")
    if args.batching not in (None, ["off"]):
        parser.error("--paced runs with batching off: one client has no requests to join")
    if args.new_lengths and args.lengths:
        parser.error("--new-lengths is --lengths new: give one of them")
    args.models = args.models or ["bert"]
    args.batching, args.lengths = ["off"], args.lengths or (["new"] if args.new_lengths
                                                            else ["fixed"])
    unknown = [m for m in args.models if m not in _serve_models.MODELS] + \
        [r for r in args.runtimes if r not in RUNTIMES] + \
        [n for n in args.lengths if n not in ("fixed", "new")]
    fixed_only = [m for m in args.models if m not in _serve_models.SEQUENCE_VARIANTS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    if "new" in args.lengths and fixed_only:
        parser.error(f"{', '.join(fixed_only)}: no sequence axis, no new lengths")
    models = {name: _serve_models.SEQUENCE_VARIANTS.get(name, _serve_models.MODELS[name])()
              for name in args.models}
    servers = [(m, rt, "off", n) for m in args.models for n in args.lengths
               for rt in args.runtimes]
    runs, results = run_servers(servers, models, serve_paced, args)
    print(f"Service rhythm over gRPC (tritonclient, binary tensors), one row per request: "
          f"batching off, ONE client sending a request every {args.paced:g} ms (start to "
          f"start), {PACED_WARMUP} untimed requests and {args.settle:g} s of quiet, then "
          f"{args.requests} timed; new lengths: {SHORTEST}..{LONGEST} tokens, seed "
          f"{args.seed}; {os.cpu_count()} CPUs; mixrt serve --workers 1, {baseline()}.\n")
    print(paced_table(results))
    print()
    for run in runs:
        said = run.results[0] if run.results else {}
        fresh = (f", {said['first_seen_lengths']} of the timed lengths first seen"
                 if run.lengths == "new" and said else "")
        over = f"; {said['over_interval']} took longer than {args.paced:g} ms" if said else ""
        print(f"- {run.model} {run.runtime} {paced_mode(args, run.lengths)}: started "
              f"{run.started}, ready {run.ready}, ended {run.ended}{fresh}{over}"
              f"{'; ' + run.note if run.note else ''}")
    if args.out:
        write_json(args, runs, {"paced_ms": args.paced, "requests": args.requests,
                                "warmup_requests": PACED_WARMUP, "settle_s": args.settle,
                                "lengths": args.lengths, "seed": args.seed,
                                "new_lengths_range": [SHORTEST, LONGEST], "batching": "off"})
    return 0


def serve_bench(parser, args) -> int:
    """The throughput benchmark: every model, runtime, batching setting and concurrency."""
    args.models = args.models or list(_serve_models.MODELS)
    args.batching = args.batching or ["off", "on"]
    args.concurrency = args.concurrency or ([1, 8] if args.quick else [1, 8, 32])
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0)
    unknown = [m for m in args.models if m not in _serve_models.MODELS] + \
        [r for r in args.runtimes if r not in RUNTIMES] + \
        [b for b in args.batching if b not in ("on", "off")]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")

    models = {name: _serve_models.MODELS[name]() for name in args.models}
    runs, results = run_servers(server_settings(args), models, serve_settings, args)

    print(f"Serving over gRPC (tritonclient, binary tensors), one row per request; "
          f"{args.warmup:g} s warm-up and {args.duration:g} s timed per setting; mixrt's "
          f"batching on: max batch {args.max_batch_size} rows, max delay "
          f"{args.max_delay_ms:g} ms; {os.cpu_count()} CPUs; mixrt serve --workers 1, "
          f"{baseline()}.")
    if "onnxruntime" in args.runtimes:
        print("onnxruntime has no batching-on rows: KServe's Python model server has no "
              "adaptive batching (KServe's batcher is an agent in a container beside the "
              "server), so onnxruntime is served unbatched only, and mixrt's rows of either "
              "setting are compared with that.")
    print()
    print(table(_order(results)))
    print()
    for run in runs:
        note = f"; {run.note}" if run.note else ""
        print(f"- {run.model} {run.runtime} batching {run.batching}: started {run.started}, "
              f"ready {run.ready}, ended {run.ended}{note}")
    if args.out:
        write_json(args, runs, {"duration_s": args.duration, "warmup_s": args.warmup,
                                "max_batch_size": args.max_batch_size,
                                "max_delay_ms": args.max_delay_ms,
                                "onnxruntime_batching": "off only: KServe's Python model "
                                                        "server has no batching"})
    return 0


def server_settings(args) -> list:
    """The servers of the throughput benchmark, (model, runtime, batching, ""): mixrt at each
    of ``--batching``, onnxruntime with batching off only, whatever ``--batching`` says (its
    server has no batching, and mixrt's rows compare with it)."""
    return [(model, runtime, batching, "") for model in args.models
            for batching in ("off", "on") for runtime in args.runtimes
            if (batching in args.batching if runtime == "mixrt" else batching == "off")]


def run_servers(servers: list, models: dict, serve, args) -> tuple:
    """Each (model, runtime, batching, lengths) of ``servers`` measured by ``serve`` on a
    server of its own: the server runs and the results."""
    from tqdm import tqdm  # noqa: PLC0415
    per_server = 1 if serve is serve_paced else len(args.concurrency)
    progress = tqdm(total=len(servers) * per_server, unit="setting",
                    disable=not sys.stderr.isatty(), file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="serve-bench-"))
    runs, results = [], []
    starters = {"mixrt": start_mixrt, "onnxruntime": start_onnxruntime}
    try:
        for name, runtime, batching, lengths in servers:
            label = f"{name} {runtime} batching {batching}" + (f", {lengths} lengths"
                                                                 if lengths else "")
            progress.set_description(label)
            for attempt in range(1, ATTEMPTS + 1):
                # a server that dies under the benchmark (or that someone else's cleanup
                # ends) is started again once, and its settings measured again
                run = ServerRun(models[name].name, runtime, batching, [], now(),
                                lengths=lengths)
                runs.append(run)
                folder = workdir / f"{lengths + '_' if lengths else ''}attempt{attempt}"
                folder.mkdir(exist_ok=True)
                try:
                    measured = serve(run, models[name], starters[runtime], args, folder,
                                     progress)
                except RuntimeError as exc:
                    run.ended, run.note = now(), f"failed: {str(exc).splitlines()[0]}"
                    print(f"warning: {label}, attempt {attempt}: {str(exc)[-2000:]}",
                          file=sys.stderr)
                    continue
                results.extend(measured)
                progress.update(len(measured))
                break
    finally:
        progress.close()
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in workdir.rglob("*.log"):
                (args.logs / f"{log.parent.name}_{log.name}").write_bytes(log.read_bytes())
    return runs, results


def write_json(args, runs: list, settings: dict) -> None:
    args.out.write_text(json.dumps({
        "when": now(), "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "load_average_at_end": os.getloadavg()},
        "versions": {p: package_version(*names) for p, names in VERSIONS.items()},
        "settings": {**settings, "rows_per_request": 1, "bert": _serve_models.BERT},
        "servers": [asdict(run) for run in runs]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
