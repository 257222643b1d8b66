"""The ``mixrt`` command.

    mixrt info MODEL                       inputs, outputs, opsets, operator histogram
    mixrt run MODEL --input x=x.npy ...    run it; print outputs, or save them with --output-dir;
                                           --profile FILE writes a Chrome trace of the run
    mixrt compile MODEL.onnx -o MODEL.mxr  optimize, plan memory, write the .mxr file
    mixrt export MODEL -o OUT.onnx [--opset N]   write a .onnx or compiled .mxr model as ONNX
    mixrt plan MODEL [--json] [--png F]    the memory plan: arena, naive and lower-bound bytes
    mixrt check MODEL [--device D] [--json]   per-node support table; exit 1 if any node fails
    mixrt check MODEL --validate [--rtol R --atol A]   ... and compare with onnxruntime
    mixrt demo                             the main job: train, export, fine-tune, validate,
                                           compile and serve the built-in digits CNN
    mixrt zoo                              the 9 zoo models end to end, checked

Errors print one line (``mixrt: error: ...``) and exit 2; ``--debug`` shows the traceback.
A reader that closes the pipe early (``mixrt info M | head -1``) ends the command quietly
with status 141, as a SIGPIPE ends other Unix tools. Arrays are read with
``allow_pickle=False``: a .npy file never runs code.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

import mixrt  # registers the model loaders
from mixrt import __version__  # the package's one statement of it
from mixrt.base.errors import InputError, LenientLoadWarning, MixrtError, ModelLoadError
from mixrt.demo import run_demo
from mixrt.ops.compiled import prebuilt
from mixrt.ops.compiled.jit_cache import cache_root
from mixrt.ops.device import device_named, parse_device
from mixrt.ops.ir.types import MapType, SequenceType, TensorType
from mixrt.runtime.format import save_mxr
from mixrt.runtime.kernel_tiers import warm_up
from mixrt.runtime.memory import STRATEGIES, format_report, plan_report
from mixrt.runtime.support import check_dim_names, support_table
from mixrt.runtime.npz import read_npy  # checks before it reads
from mixrt.runtime.plan_plot import draw_plan  # loads matplotlib only when it draws
from mixrt.runtime.session import load_graph


# the status a shell gives a command a SIGPIPE ended (128 + the signal's number)
BROKEN_PIPE_STATUS = 128 + signal.SIGPIPE


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except BrokenPipeError:
        return _reader_went_away()
    except (MixrtError, OSError, ValueError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"mixrt: error: {exc}", file=sys.stderr)
        return 2


def _reader_went_away() -> int:
    """The reader of stdout closed it (``| head``): nothing is wrong and nothing more can
    be said. stdout is pointed at /dev/null so that Python's flush at exit does not raise
    the same error again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return BROKEN_PIPE_STATUS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mixrt", description="mixrt: run and check ONNX "
                                     "models")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"mixrt {__version__}")
    commands = parser.add_subparsers(dest="command")

    info = commands.add_parser("info", help="describe a model")
    info.add_argument("model")
    info.set_defaults(handler=cmd_info)

    run = commands.add_parser("run", help="run a model on .npy inputs")
    run.add_argument("model")
    run.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy")
    run.add_argument("--output-dir", "-o", type=Path)
    run.add_argument("--device", default="cpu")
    run.add_argument("--profile", type=Path, metavar="FILE",
                     help="write a Chrome trace (chrome://tracing, Perfetto) of the run")
    _add_compile_options(run)
    run.set_defaults(handler=cmd_run)

    compile_ = commands.add_parser("compile", help="optimize and plan a model, write .mxr")
    compile_.add_argument("model")
    compile_.add_argument("--output", "-o", type=Path, required=True, metavar="MODEL.mxr")
    _add_compile_options(compile_)
    _add_shape_options(compile_)
    compile_.set_defaults(handler=cmd_compile)

    export = commands.add_parser("export", help="write a model (.onnx, or a compiled .mxr "
                                 "with its fused ops) as ONNX at a chosen opset")
    export.add_argument("model")
    export.add_argument("--output", "-o", type=Path, required=True, metavar="OUT.onnx")
    export.add_argument("--opset", type=int, metavar="N",
                        help="default-domain opset to write (default: the model's own)")
    export.set_defaults(handler=cmd_export)

    plan = commands.add_parser("plan", help="print the memory plan (arena, naive and "
                               "lower-bound bytes)")
    plan.add_argument("model")
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    plan.add_argument("--png", type=Path, metavar="FILE", help="draw the arena over time")
    _add_compile_options(plan)
    _add_shape_options(plan)
    plan.set_defaults(handler=cmd_plan)

    check = commands.add_parser("check", help="per-node support table (exit 1 if any "
                                "node is unsupported)")
    check.add_argument("model")
    check.add_argument("--device", default="cpu",
                       help="the device to check on; it must be present on this machine "
                       "unless --registry-only is given")
    check.add_argument("--registry-only", action="store_true",
                       help="answer from the operator registry alone, without the device "
                       "(a CPU-only CI runner asking whether a model would run on gpu:N)")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--validate", action="store_true",
                       help="also run the model in mixrt and onnxruntime and compare every "
                       "output (exit 0 only when all nodes are supported and all match)")
    check.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                       help="with --validate: this input's values (default: random, seeded)")
    check.add_argument("--dim", action="append", default=[], metavar="SYMBOL=N",
                       help="with --validate: value of a symbolic dimension for random inputs")
    check.add_argument("--rtol", type=float, default=1e-3)
    check.add_argument("--atol", type=float, default=1e-5)
    check.set_defaults(handler=cmd_check)
    warmup = commands.add_parser(
        "warmup", help="compile a model's kernels into the cache now (a container image's "
        "build step), so that later processes run them from their first call")
    warmup.add_argument("model")
    _add_compile_options(warmup)
    _add_shape_options(warmup)
    warmup.set_defaults(handler=cmd_warmup)

    demo = commands.add_parser("demo", help="the main job: train a CNN on the built-in digits, "
                               "export, fine-tune the import, validate, compile, serve")
    demo.add_argument("--workdir", type=Path, default=Path("mixrt-demo"),
                      help="where the .onnx and .mxr files go (default ./mixrt-demo)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--no-progress", action="store_true", help="one line per epoch instead "
                      "of progress bars")
    demo.add_argument("--kvstore", choices=("local", "device", "dist_sync", "dist_async",
                                            "dist_device_sync"),
                      help="train through this KVStore; the dist_* kinds run under "
                      "`mixrt launch -n W -s S -- mixrt demo --kvstore dist_sync`")
    demo.add_argument("--compression", type=float, metavar="THRESHOLD",
                      help="with --kvstore: 2-bit gradient compression with this threshold")
    demo.set_defaults(handler=cmd_demo)
    zoo = commands.add_parser("zoo", help="run the 9 zoo models end to end and check them "
                              "against their reference outputs")
    zoo.add_argument("--device", default="cpu")
    zoo.set_defaults(handler=cmd_zoo)
    _add_launch_command(commands)
    serve = _add_serve_command(commands)
    for sub in (info, run, compile_, export, plan, check, demo, zoo, serve):
        # SUPPRESS keeps "mixrt --debug info" working: the subcommand must not reset it
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks")
    return parser


def _add_launch_command(commands) -> None:
    launch = commands.add_parser(
        "launch", help="start a distributed KVStore job: a scheduler, S servers and W workers "
        "running CMD (mixrt launch -n W -s S -- CMD...)",
        description="Start a scheduler, S servers (python -m mixrt.kvstore.dist) and W workers "
        "(CMD), with the DMLC_* variables set, relay their output prefixed with their names, "
        "and exit with the first failure's status (details: kvstore/launch.py and "
        "kvstore/supervisor.py).")
    launch.add_argument("-n", "--num-workers", type=int, required=True, metavar="W")
    launch.add_argument("-s", "--num-servers", type=int, metavar="S",
                        help="number of servers (default: W, as MXNet's launcher)")
    launch.add_argument("--launcher", choices=("local", "ssh", "mpi"), default="local",
                        help="where the servers and workers run (default local)")
    launch.add_argument("-H", "--hostfile", type=Path, metavar="HOSTFILE",
                        help="ssh: host, user@host or host:slots per line; mpi: mpirun's own")
    launch.add_argument("--port", type=int, metavar="P", help="the scheduler's port (default: "
                        "DMLC_PS_ROOT_PORT if set, else a free port)")
    launch.add_argument("--host-uri", metavar="ADDR", help="the scheduler's address as the "
                        "other hosts reach it (ssh, mpi; default: this machine's name's)")
    launch.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")
    # not "command": that is where the subcommand's name goes
    launch.add_argument("worker_command", nargs=argparse.REMAINDER, metavar="-- CMD",
                        help="the workers' command")
    launch.set_defaults(handler=cmd_launch)


def _add_serve_command(commands):
    serve = commands.add_parser(
        "serve", help="serve a model file or a repository (NAME/VERSION/model.mxr) over the "
        "Open Inference Protocol, REST and gRPC (needs mixrt[serve])",
        description="Serve models over KServe's v2 Open Inference Protocol on MLServer: REST "
        "(JSON and binary tensors) on --http-port, gRPC on --grpc-port, Prometheus metrics "
        "on --metrics-port. Details: mixrt/serve/server.py.")
    serve.add_argument("source", help="a .mxr or .onnx file, or a repository folder")
    serve.add_argument("--name", help="a model file's name (default: the file's stem)")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--http-port", type=int, default=8080)
    serve.add_argument("--grpc-port", type=int, default=8081)
    serve.add_argument("--metrics-port", type=int, default=8082)
    serve.add_argument("--workers", type=int, default=1, help="worker processes, forked "
                       "after the models are prepared so that they share their weights")
    serve.add_argument("--max-batch-size", type=int, default=0, metavar="ROWS",
                       help="join concurrent requests into batches of up to ROWS rows "
                       "(default 0: each request runs alone)")
    serve.add_argument("--max-delay-ms", type=float, default=2.0, metavar="MS",
                       help="how long a request waits to be joined (default 2)")
    serve.add_argument("--device", default="cpu", help="cpu or gpu:N")
    serve.add_argument("--max-body-mb", type=float, default=64.0, metavar="MB",
                       help="requests with larger bodies are refused (default 64)")
    serve.add_argument("--grace-s", type=float, default=25.0, metavar="S",
                       help="after SIGTERM, how long the workers may finish their requests "
                       "before they are killed (default 25: inside Kubernetes' 30)")
    serve.add_argument("--log-level", default="info",
                       choices=("debug", "info", "warning", "error"))
    serve.add_argument("--prepare-only", action="store_true", help="prepare the models as "
                       "the server would (compile their kernels into the cache at one row "
                       "and a full batch, check batching) and exit: a container image's "
                       "build step")
    serve.set_defaults(handler=cmd_serve)
    return serve


def cmd_serve(args) -> int:
    try:
        from mixrt.serve.server import ServeOptions, serve  # noqa: PLC0415 (mlserver)
    except ImportError as exc:
        raise InputError(f"mixrt serve needs MLServer: pip install 'mixrt[serve]' "
                         f"({exc})") from None
    return serve(ServeOptions(
        args.source, name=args.name, host=args.host, http_port=args.http_port,
        grpc_port=args.grpc_port, metrics_port=args.metrics_port, workers=args.workers,
        max_batch_size=args.max_batch_size, max_delay_ms=args.max_delay_ms,
        device=args.device, max_body_mb=args.max_body_mb, log_level=args.log_level,
        prepare_only=args.prepare_only, grace_s=args.grace_s))


def _add_compile_options(parser) -> None:
    parser.add_argument("--opt-level", type=int, default=2, choices=(0, 1, 2),
                        help="graph optimization level (default 2)")
    parser.add_argument("--strategy", default="greedy", choices=STRATEGIES,
                        help="memory planner (default greedy)")


def _add_shape_options(parser) -> None:
    parser.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                        help="plan for this input (default: the model's static shapes)")
    parser.add_argument("--dim", action="append", default=[], metavar="SYMBOL=N",
                        help="value of a symbolic dimension (e.g. --dim batch=8)")


def _load_graph(model: str):
    graph = load_graph(model)
    graph.validate()
    return graph


# -- demo ------------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    from mixrt.main_job import run_main_job  # noqa: PLC0415 (onnx, via the training frontends)
    compression = None if args.compression is None else {"type": "2bit",
                                                         "threshold": args.compression}
    # progress bars on a terminal; in a pipe or a log file, one line per epoch
    progress = not args.no_progress and sys.stderr.isatty()
    return run_main_job(args.workdir, seed=args.seed, progress=progress,
                        kvstore=args.kvstore, compression=compression)


def cmd_zoo(args) -> int:
    return run_demo(args.device)


# -- launch ----------------------------------------------------------------------------------

def cmd_launch(args) -> int:
    from mixrt.kvstore.launch import launch  # noqa: PLC0415 (pyzmq)
    # REMAINDER keeps the "--" that separates CMD from the launcher's own options
    command = args.worker_command
    command = command[1:] if command[:1] == ["--"] else command
    num_servers = args.num_workers if args.num_servers is None else args.num_servers
    return launch(command, args.num_workers, num_servers, launcher=args.launcher,
                  hostfile=args.hostfile, port=args.port, host_uri=args.host_uri)


# -- info ------------------------------------------------------------------------------------

def cmd_info(args) -> int:
    graph = _load_graph(args.model)
    print(f"model: {args.model}")
    for line in _provenance(graph.metadata):
        print(line)
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(graph.opsets.items())))
    print("inputs:")
    for value in graph.feed_inputs():
        print(f"  {value.name}: {value.type or '?'}")
    print("outputs:")
    for value in graph.outputs:
        print(f"  {value.name}: {value.type or '?'}")
    weights = sum(a.nbytes for a in graph.initializers.values())
    print(f"initializers: {len(graph.initializers)} ({weights / 2**20:.1f} MiB)")
    histogram = collections.Counter(
        f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in graph.all_nodes())
    print(f"operators ({sum(histogram.values())} nodes):")
    for name, count in histogram.most_common():
        print(f"  {count:6}  {name}")
    return 0


def _provenance(metadata: dict) -> list[str]:
    """Who wrote the model and, for a compiled .mxr, which model file it was compiled from."""
    lines = []
    if metadata.get("producer"):
        lines.append(f"producer: {metadata['producer']} "
                     f"{metadata.get('producer_version', '')}".rstrip())
    if "opt_level" not in metadata or "format_version" not in metadata:
        return lines  # not a .mxr
    if "source_name" in metadata:
        size = metadata.get("source_bytes")
        facts = [f"sha256 {metadata['source_sha256']}"] if "source_sha256" in metadata else []
        facts += [f"{size:,} bytes"] if isinstance(size, int) else []
        facts += [f"written by {metadata['source_producer']}"] \
            if metadata.get("source_producer") else []
        lines.append(f"compiled from: {metadata['source_name']}"
                     + (f" ({', '.join(facts)})" if facts else ""))
    else:
        lines.append("compiled from: a model given as bytes or a graph (no file recorded)")
    lines.append(f"compiled at opt level {metadata['opt_level']}, .mxr format "
                 f"{metadata['format_version']}")
    return lines


# -- run -------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    session = mixrt.Session(args.model, device=args.device, opt_level=args.opt_level,
                            strategy=args.strategy,
                            profile=str(args.profile) if args.profile else False)
    feeds = dict(_read_input(spec) for spec in args.input)
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(None, feeds)
    if args.profile:
        session.run(None, feeds)  # the first run of a shape discovers it; profile a planned one
        print(f"profile: {session.end_profiling()}")
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, value in zip(names, outputs):
        array = np.asarray(value) if not isinstance(value, list) else value
        print(f"{name}: {_describe(array)}")
        if args.output_dir is not None and isinstance(array, np.ndarray):
            np.save(args.output_dir / f"{_file_safe(name)}.npy", array, allow_pickle=False)
    return 0


def _read_input(spec: str) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise InputError(f"--input {spec!r}: expected NAME=FILE.npy")
    try:
        return name, read_npy(path, "input file")
    except ModelLoadError as exc:
        raise InputError(f"--input {name}: not a plain .npy array: {exc}") from exc


def _describe(value) -> str:
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    preview = np.array2string(value.reshape(-1)[:6], precision=4, separator=", ")
    return f"{value.dtype} {list(value.shape)} {preview}{' ...' if value.size > 6 else ''}"


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


# -- compile and plan ------------------------------------------------------------------------

def _planned_session(args, opt_level: int | None = None):
    session = _session(args, opt_level)
    return session, session.memory_plan(_plan_feeds(session, args))


def _session(args, opt_level: int | None = None):
    level = args.opt_level if opt_level is None else opt_level
    return mixrt.Session(args.model, opt_level=level, strategy=args.strategy)


def _plan_feeds(session, args) -> dict:
    """Feeds to plan for: --input files, else zeros of the declared shapes (--dim values
    for their symbolic dimensions)."""
    feeds = dict(_read_input(spec) for spec in args.input)
    symbols = _dim_sizes(session, args)
    for value in session._required:
        if value.name not in feeds:
            feeds[value.name] = _zeros_for(value, symbols)
    return feeds


def _open_dims(session, args) -> list[str]:
    """The symbolic input dimensions neither --dim nor --input gives a size."""
    given = {spec.partition("=")[0] for spec in args.input}
    symbols = _dim_sizes(session, args)
    shapes = [(v.name, getattr(v.type, "shape", None)) for v in session._required
              if v.name not in given]
    return [f"{name}[{axis}] {dim!r}" if dim is not None else f"{name}[{axis}] (unnamed)"
            for name, shape in shapes for axis, dim in enumerate(shape or ())
            if dim is None or isinstance(dim, str) and dim not in symbols]


def _map_inputs(session) -> list[str]:
    """Inputs that are maps (or sequences of them): their sizes are part of the plan
    signature, and --input reads only arrays, so no stored plan can be made for them."""
    return [f"{v.name} ({v.type})" for v in session._required
            if isinstance(v.type, MapType) or (isinstance(v.type, SequenceType)
                                              and isinstance(v.type.element, MapType))]


def _dim_sizes(session, args) -> dict[str, int]:
    """--dim's sizes, each for a symbolic dimension the model's inputs declare."""
    sizes = dict(_read_dim(spec) for spec in args.dim)
    check_dim_names(session.graph.feed_inputs(), sizes)
    return sizes


def _read_dim(spec: str) -> tuple[str, int]:
    name, sep, text = spec.partition("=")
    if not sep or not name or not text.isdigit():
        raise InputError(f"--dim {spec!r}: expected SYMBOL=N with N a whole number")
    return name, int(text)


def _zeros_for(value, symbols: dict) -> np.ndarray:
    """A zero feed of the input's declared shape, symbolic dims taken from --dim."""
    value_type = value.type
    element = value_type.element if isinstance(value_type, SequenceType) else value_type
    if isinstance(element, MapType):
        kind = "a sequence of maps" if element is not value_type else "a map"
        raise InputError(f"input {value.name!r} is {kind}, which --input (.npy arrays) "
                         f"cannot give and a memory plan needs; plan it from Python: "
                         f"Session(model).memory_plan(feeds)")
    if not isinstance(value_type, TensorType) or value_type.shape is None \
            or value_type.dtype is None:
        raise InputError(f"input {value.name!r} has no declared tensor shape; give it with "
                         f"--input {value.name}=FILE.npy")
    dims = []
    for axis, dim in enumerate(value_type.shape):
        if isinstance(dim, int):
            dims.append(dim)
        elif isinstance(dim, str) and dim in symbols:
            dims.append(symbols[dim])
        elif dim is None:  # no name to give --dim
            raise InputError(f"input {value.name!r} dimension {axis} has no size and no "
                             f"name; give the input with --input {value.name}=FILE.npy")
        else:
            raise InputError(f"input {value.name!r} dimension {axis} is {dim!r}; give it "
                             f"with --dim {dim}=N or --input {value.name}=FILE.npy")
    return np.zeros(dims, dtype=value_type.dtype)


def cmd_warmup(args) -> int:
    started = time.perf_counter()
    session = mixrt.Session(args.model, opt_level=args.opt_level, strategy=args.strategy)
    feeds = _plan_feeds(session, args)
    marker = warm_up(session, args.model, args.opt_level, feeds)
    shapes = ", ".join(f"{name} {list(np.shape(value))}" for name, value in feeds.items())
    if marker is None:
        print(f"nothing to compile: {args.model} runs no compiled kernel here (MIXRT_JIT=0)")
        return 0
    level = prebuilt.level_name()
    print(f"compiled the kernels of {args.model} for {shapes} in "
          f"{time.perf_counter() - started:.1f} s; cache: {cache_root()}; prebuilt kernels: "
          f"{level or 'none for this CPU'}")
    return 0


def cmd_compile(args) -> int:
    session = _session(args)
    open_dims, maps = _open_dims(session, args), _map_inputs(session)
    # a model with dynamic axes or map inputs compiles without a stored plan: Session plans
    # each input shape at its first run, as it does for an .onnx model
    plan = None if open_dims or maps else session.memory_plan(_plan_feeds(session, args))
    graph = session.graph
    graph.plans = [] if plan is None else [plan]
    save_mxr(graph, args.output, opt_level=args.opt_level)
    size = args.output.stat().st_size
    print(f"wrote {args.output} ({size / 2**20:.1f} MiB, opt level {args.opt_level}, "
          f"{len(graph.nodes)} nodes)")
    if plan is None and maps:
        print(f"no memory plan stored: map input(s) {', '.join(maps)} are sized when fed "
              f"(each input shape is planned at its first run)")
    elif plan is None:
        print(f"no memory plan stored: {', '.join(open_dims)} stay open (each input "
              f"shape is planned at its first run; --dim NAME=N or --input NAME=FILE.npy "
              f"stores a plan for one)")
    else:
        print(format_report(plan))
    return 0


def cmd_plan(args) -> int:
    session, plan = _planned_session(args)
    # naive allocation of the model as imported: the MXNet paper's baseline (a .mxr is
    # already optimized, so it has none)
    imported = None
    if args.opt_level:
        as_imported, naive_plan = _planned_session(args, opt_level=0)
        if as_imported.graph.metadata.get("opt_level") == 0:
            imported = naive_plan.naive_bytes
    if args.json:
        print(json.dumps(plan_report(plan, imported), indent=2))
    else:
        print(format_report(plan, imported))
    if args.png:
        draw_plan(plan, args.png, title=f"{Path(args.model).name}: {plan.strategy}")
        if not args.json:
            print(f"plot: {args.png}")
    return 0


# -- export ----------------------------------------------------------------------------------

def cmd_export(args) -> int:
    from mixrt.exporters.onnx import save_model  # noqa: PLC0415 (onnx)

    model = save_model(_load_graph(args.model), args.output, opset=args.opset)
    opset = next((o.version for o in model.opset_import if not o.domain), None)
    size = args.output.stat().st_size
    print(f"wrote {args.output} ({size / 2**20:.1f} MiB, "
          f"{'opset ' + str(opset) if opset else 'no default-domain nodes'}, "
          f"{len(model.graph.node)} nodes)")
    return 0


# -- check -----------------------------------------------------------------------------------

def cmd_check(args) -> int:

    if args.validate:
        if args.registry_only:
            raise InputError("--validate runs the model, so it needs the device itself; "
                             "--registry-only answers without running anything")
        return _check_validate(args)
    if args.dim or args.input:
        raise InputError(f"--{'dim' if args.dim else 'input'} gives values to run the model "
                         f"with, which only --validate does")
    graph, lenient = _load_graph_noting_leniency(args.model)
    # a device that is not here fails the check (a GPU job would fail the same way), unless
    # the caller asks only what the operator registry supports for it
    device = device_named(args.device) if args.registry_only else parse_device(args.device)
    rows = support_table(graph, device)
    unsupported = [r for r in rows if not r.supported]
    if args.json:
        print(json.dumps({"model": args.model, "device": str(device),
                          "supported": not unsupported, "nodes": [r.as_dict() for r in rows],
                          "warnings": lenient}, indent=2))
    else:
        _print_table(rows, device)
    return 1 if unsupported else 0


def _load_graph_noting_leniency(model: str):
    """The graph, and the messages of the LenientLoadWarnings its load gave: what mixrt
    assumed where the model breaks the spec as onnxruntime tolerates. A CI gate reading
    ``--json`` sees them there; each is also shown on stderr, as any warning is."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LenientLoadWarning)
        graph = _load_graph(model)
    lenient = []
    for record in caught:
        if issubclass(record.category, LenientLoadWarning):
            lenient.append({"kind": record.category.__name__, "message": str(record.message)})
        warnings.warn_explicit(record.message, record.category, record.filename,
                               record.lineno)
    return graph, lenient


def _check_validate(args) -> int:
    """Support table plus a numeric comparison with onnxruntime: the CI gate."""
    from mixrt.exporters import coverage  # noqa: PLC0415 (onnx)
    feeds = dict(_read_input(item) for item in args.input) or None
    dims = dict(_read_dim(item) for item in args.dim)
    report = coverage.validate(args.model, feeds, device=args.device, rtol=args.rtol,
                               atol=args.atol, dims=dims)
    if args.json:
        print(json.dumps({"model": args.model, **report.as_dict()}, indent=2))
    else:
        print(coverage.format_report(report))
    return 0 if report.ok else 1


def _print_table(rows, device) -> None:
    header = ("node", "op", "opset", "dtype", "kernel / reason")
    table = [(r.node, f"{'' if r.domain == 'ai.onnx' else r.domain + '::'}{r.op_type}",
              str(r.opset), r.dtype or "?", r.kernel if r.supported else "UNSUPPORTED: "
              + r.reason) for r in rows]
    widths = [min(40, max([len(h)] + [len(t[i]) for t in table])) for i, h in
              enumerate(header[:-1])]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[-1]
    print(line)
    print("-" * len(line))
    for entry in table:
        print("  ".join(c[:w].ljust(w) for c, w in zip(entry, widths)) + "  " + entry[-1])
    bad = sum(not r.supported for r in rows)
    print(f"\n{len(rows) - bad} of {len(rows)} nodes supported on {device}"
          + (f"; {bad} unsupported" if bad else ""))
