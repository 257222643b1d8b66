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

This module holds the parser and the dispatch, and the subcommands that hand over to
another module (``demo``, ``zoo``, ``launch``, ``serve``: each imports its heavy dependency
only when it runs); ``info``, ``check`` and ``export`` are in ``cli_graph.py``, ``run``,
``plan``, ``compile`` and ``warmup`` in ``cli_session.py``, the reading of ``--input`` and
``--dim`` in ``cli_inputs.py``.

Errors print one line (``mixrt: error: ...``) and exit 2; ``--debug`` shows the traceback.
A reader that closes the pipe early (``mixrt info M | head -1``) ends the command quietly
with status 141, as a SIGPIPE ends other Unix tools. Arrays are read with
``allow_pickle=False``: a .npy file never runs code.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import traceback
from pathlib import Path

from mixrt import __version__  # the package's one statement of it
from mixrt.base.errors import InputError, MixrtError, missing_dependency
from mixrt.cli_graph import cmd_check, cmd_export, cmd_info
from mixrt.cli_session import cmd_compile, cmd_plan, cmd_run, cmd_warmup
from mixrt.demo import run_demo
from mixrt.runtime.memory import STRATEGIES


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
    run.add_argument("--timeout-s", type=float, metavar="S",
                     help="end a run that takes longer than S seconds, naming the node it "
                     "stopped in (mixrt.RunOptions(timeout=S))")
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
    launch.add_argument("--launcher", choices=("local", "ssh", "mpi", "slurm", "kubernetes"),
                        default="local", help="where the servers and workers run (default "
                        "local; slurm: as the tasks of one srun step, inside an allocation; "
                        "kubernetes: writes the job's manifests)")
    launch.add_argument("-H", "--hostfile", type=Path, metavar="HOSTFILE",
                        help="ssh: host, user@host or host:slots per line; mpi: mpirun's own")
    launch.add_argument("--port", type=int, metavar="P", help="the scheduler's port (default: "
                        "DMLC_PS_ROOT_PORT if set, else a free port; slurm: one from the "
                        "job's id; kubernetes: 9091)")
    launch.add_argument("--host-uri", metavar="ADDR", help="the scheduler's address as the "
                        "other hosts reach it (ssh, mpi: default this machine's name's; "
                        "slurm: the allocation's first node's)")
    launch.add_argument("--sbatch", type=Path, metavar="SCRIPT", help="write a Slurm batch "
                        "script that runs this job under the slurm launcher, and submit it")
    launch.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                        help="an #SBATCH line of the script (--partition=gpu, --time=1:00:00, "
                        "--gpus-per-task=1, ...); repeat for more")
    launch.add_argument("--wait", action="store_true", help="with --sbatch: wait for the "
                        "job to end and exit with its status")
    kube = launch.add_argument_group("kubernetes")
    kube.add_argument("--image", help="the image every pod runs (with mixrt and CMD in it)")
    kube.add_argument("--job-name", metavar="NAME", help="the objects' name prefix "
                      "(default mixrt-XXXXXX)")
    kube.add_argument("--namespace", default="default")
    kube.add_argument("--gpus-per-worker", type=int, default=0, metavar="N",
                      help="nvidia.com/gpu each worker pod asks for")
    kube.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                      help="a node label every pod needs; repeat for more")
    kube.add_argument("--apply", action="store_true", help="apply the manifests with kubectl "
                      "instead of printing them")
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
        description="Serve models over KServe's v2 Open Inference Protocol on KServe's model "
        "server: REST (JSON and binary tensors) on --http-port, gRPC on --grpc-port, "
        "Prometheus metrics on --metrics-port. Details: docs/serving.md.")
    serve.add_argument("source", help="a .mxr or .onnx file, a folder holding model.mxr "
                       "or model.onnx (KServe's /mnt/models), or a repository folder "
                       "(NAME/VERSION/model.mxr)")
    serve.add_argument("--name", help="a lone model's name (default: the file's stem, or "
                       "the folder's name)")
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
    serve.add_argument("--max-queue", type=int, default=None, metavar="N",
                       help="requests each model holds waiting beyond those running; past "
                       "it a request is refused at once with 503 and Retry-After (gRPC "
                       "UNAVAILABLE) (default: 64, or four batches where more; 0: refused "
                       "whenever the model is busy)")
    serve.add_argument("--device", default="cpu", help="cpu or gpu:N")
    serve.add_argument("--max-body-mb", type=float, default=64.0, metavar="MB",
                       help="requests with larger bodies are refused (default 64)")
    serve.add_argument("--grace-s", type=float, default=25.0, metavar="S",
                       help="after SIGTERM, how long the workers may finish their requests "
                       "before they are killed (default 25: inside Kubernetes' 30)")
    serve.add_argument("--request-timeout-s", type=float, default=60.0, metavar="S",
                       help="a request unanswered after S seconds gets a 504 naming it, "
                       "and its run is ended (default 60; 0: no limit)")
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
        from mixrt.serve.server import ServeOptions, serve  # noqa: PLC0415 (uvicorn)
    except ImportError as exc:
        raise missing_dependency("mixrt serve", "KServe", "serve") from exc
    if importlib.util.find_spec("kserve") is None:  # imported once the models are prepared
        raise missing_dependency("mixrt serve", "KServe", "serve")
    return serve(ServeOptions(
        args.source, name=args.name, host=args.host, http_port=args.http_port,
        grpc_port=args.grpc_port, metrics_port=args.metrics_port, workers=args.workers,
        max_batch_size=args.max_batch_size, max_delay_ms=args.max_delay_ms,
        max_queue=args.max_queue, device=args.device, max_body_mb=args.max_body_mb,
        log_level=args.log_level,
        prepare_only=args.prepare_only, grace_s=args.grace_s,
        request_timeout_s=args.request_timeout_s))


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
    from mixrt.kvstore.launch import (kubernetes_job, launch,  # noqa: PLC0415 (pyzmq)
                                      submit_batch)
    # REMAINDER keeps the "--" that separates CMD from the launcher's own options
    command = args.worker_command
    command = command[1:] if command[:1] == ["--"] else command
    num_servers = args.num_workers if args.num_servers is None else args.num_servers
    _check_launcher_options(args)
    if args.launcher == "kubernetes":
        return kubernetes_job(command, args.num_workers, num_servers, image=args.image,
                              name=args.job_name, namespace=args.namespace, port=args.port,
                              gpus_per_worker=args.gpus_per_worker,
                              node_selector=args.node_selector, apply=args.apply)
    if args.sbatch is not None:
        return submit_batch(command, args.num_workers, num_servers, args.sbatch,
                            sbatch_args=args.sbatch_arg, wait=args.wait, port=args.port,
                            host_uri=args.host_uri)
    return launch(command, args.num_workers, num_servers, launcher=args.launcher,
                  hostfile=args.hostfile, port=args.port, host_uri=args.host_uri)


# the options each launcher alone reads, and how they are spelled
_OWN_OPTIONS = {
    "kubernetes": {"image": "--image", "job_name": "--job-name", "gpus_per_worker":
                   "--gpus-per-worker", "node_selector": "--node-selector", "apply": "--apply"},
    "sbatch": {"sbatch_arg": "--sbatch-arg", "wait": "--wait"},
}


def _check_launcher_options(args) -> None:
    """An option another launcher reads is refused rather than ignored."""
    used = "kubernetes" if args.launcher == "kubernetes" else \
        "sbatch" if args.sbatch is not None else None
    if args.sbatch is not None and args.launcher not in ("local", "slurm"):
        raise InputError(f"--sbatch runs the job under the slurm launcher, not "
                         f"{args.launcher}")
    for owner, options in _OWN_OPTIONS.items():
        given = [flag for name, flag in options.items() if getattr(args, name) not in
                 (None, False, [], 0)]
        if owner != used and given:
            what = "--launcher kubernetes" if owner == "kubernetes" else "--sbatch"
            raise InputError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for "
                             f"{what}")
