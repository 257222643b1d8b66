"""The ``mixrt`` command.

    mixrt info MODEL                       inputs, outputs, opsets, operator histogram
    mixrt run MODEL --input x=x.npy ...    run it; print outputs, or save them with --output-dir
    mixrt check MODEL [--device D] [--json]   per-node support table; exit 1 if any node fails
    mixrt demo                             the main job: 9 zoo models end to end, checked

Errors print one line (``mixrt: error: ...``) and exit 2; ``--debug`` shows the traceback.
Arrays are read with ``allow_pickle=False``: a .npy file never runs code.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import traceback
from pathlib import Path

import numpy as np

from mixrt.errors import InputError, MixrtError


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except (MixrtError, OSError, ValueError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"mixrt: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mixrt", description="mixrt: run and check ONNX "
                                     "models")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command")

    info = commands.add_parser("info", help="describe a model")
    info.add_argument("model")
    info.set_defaults(handler=cmd_info)

    run = commands.add_parser("run", help="run a model on .npy inputs")
    run.add_argument("model")
    run.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy")
    run.add_argument("--output-dir", "-o", type=Path)
    run.add_argument("--device", default="cpu")
    run.set_defaults(handler=cmd_run)

    check = commands.add_parser("check", help="per-node support table (exit 1 if any "
                                "node is unsupported)")
    check.add_argument("model")
    check.add_argument("--device", default="cpu")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(handler=cmd_check)
    demo = commands.add_parser("demo", help="run the 9 zoo models end to end and check them "
                               "against their reference outputs")
    demo.add_argument("--device", default="cpu")
    demo.set_defaults(handler=cmd_demo)
    for sub in (info, run, check, demo):
        # SUPPRESS keeps "mixrt --debug info" working: the subcommand must not reset it
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks")
    return parser


def _load_graph(model: str):
    import mixrt  # noqa: F401,PLC0415  (registers the model loaders)
    from mixrt.runtime.session import load_graph  # noqa: PLC0415
    graph = load_graph(model)
    graph.validate()
    return graph


# -- demo ------------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    from mixrt.demo import run_demo  # noqa: PLC0415
    return run_demo(args.device)


# -- info ------------------------------------------------------------------------------------

def cmd_info(args) -> int:
    graph = _load_graph(args.model)
    print(f"model: {args.model}")
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


# -- run -------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    import mixrt  # noqa: PLC0415

    session = mixrt.Session(args.model, device=args.device)
    feeds = dict(_read_input(spec) for spec in args.input)
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(None, feeds)
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
        return name, np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InputError(f"--input {name}: {path} is not a plain .npy array ({exc})") from exc


def _describe(value) -> str:
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    preview = np.array2string(value.reshape(-1)[:6], precision=4, separator=", ")
    return f"{value.dtype} {list(value.shape)} {preview}{' ...' if value.size > 6 else ''}"


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "output"


# -- check -----------------------------------------------------------------------------------

def cmd_check(args) -> int:
    from mixrt.runtime.device import Device, parse_device  # noqa: PLC0415
    from mixrt.runtime.support import support_table  # noqa: PLC0415

    graph = _load_graph(args.model)
    # The registry answers for a device whether or not this machine has one.
    device = Device("gpu", 0) if args.device.startswith(("gpu", "cuda")) else \
        parse_device(args.device)
    rows = support_table(graph, device)
    unsupported = [r for r in rows if not r.supported]
    if args.json:
        print(json.dumps({"model": args.model, "device": str(device),
                          "supported": not unsupported, "nodes": [r.as_dict() for r in rows]},
                         indent=2))
    else:
        _print_table(rows, device)
    return 1 if unsupported else 0


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
