"""The ``mixrt`` subcommands that make a Session of a model: ``run`` (run it on .npy inputs,
print or save the outputs, profile a planned run), ``plan`` (its memory plan, against
the naive allocation of the model as imported), ``compile`` (the optimized graph and its
plan written as .mxr) and ``warmup`` (its compiled kernels built into the cache now).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

import mixrt  # registers the model loaders
from mixrt.cli_inputs import map_inputs, open_dims, plan_feeds, read_input
from mixrt.ops.compiled import prebuilt
from mixrt.ops.compiled.jit_cache import cache_root
from mixrt.runtime import machine_weights
from mixrt.runtime.format import save_mxr
from mixrt.runtime.kernel_tiers import warm_up
from mixrt.runtime.memory_report import format_report, plan_report
from mixrt.runtime.plan_plot import draw_plan  # loads matplotlib only when it draws


# -- run -------------------------------------------------------------------------------------

def cmd_run(args) -> int:
    session = mixrt.Session(args.model, device=args.device, opt_level=args.opt_level,
                            strategy=args.strategy,
                            profile=str(args.profile) if args.profile else False)
    feeds = dict(read_input(spec) for spec in args.input)
    names = [o.name for o in session.get_outputs()]
    limits = None if args.timeout_s is None else mixrt.RunOptions(timeout=args.timeout_s)
    outputs = session.run(None, feeds, limits)
    if args.profile:  # the first run of a shape discovers it; profile a planned one
        session.run(None, feeds, limits)
        print(f"profile: {session.end_profiling()}")
    if args.output_dir:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, value in zip(names, outputs):
        array = np.asarray(value) if not isinstance(value, list) else value
        print(f"{name}: {_describe(array)}")
        if args.output_dir is not None and isinstance(array, np.ndarray):
            np.save(args.output_dir / f"{_file_safe(name)}.npy", array, allow_pickle=False)
    return 0


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
    return session, session.memory_plan(plan_feeds(session, args))


def _session(args, opt_level: int | None = None):
    level = args.opt_level if opt_level is None else opt_level
    return mixrt.Session(args.model, opt_level=level, strategy=args.strategy)


def cmd_warmup(args) -> int:
    started = time.perf_counter()
    session = mixrt.Session(args.model, opt_level=args.opt_level, strategy=args.strategy)
    feeds = plan_feeds(session, args)
    # this machine's weights for the depthwise forms' model first, so that the warm-up
    # picks (and compiles) the forms they choose (runtime/machine_weights.py)
    measured = machine_weights.calibrate_for(session.graph, None)
    marker = warm_up(session, args.model, args.opt_level, feeds)
    shapes = ", ".join(f"{name} {list(np.shape(value))}" for name, value in feeds.items())
    if marker is None:
        print(f"nothing to compile: {args.model} runs no compiled kernel here (MIXRT_JIT=0)")
        return 0
    level = prebuilt.level_name()
    print(f"compiled the kernels of {args.model} for {shapes} in "
          f"{time.perf_counter() - started:.1f} s; cache: {cache_root()}; prebuilt kernels: "
          f"{level or 'none for this CPU'}"
          + ("; this machine's depthwise weights measured" if measured else ""))
    return 0


def cmd_compile(args) -> int:
    session = _session(args)
    unsized, maps = open_dims(session, args), map_inputs(session)
    # a model with dynamic axes or map inputs compiles without a stored plan: Session plans
    # each input shape at its first run, as it does for an .onnx model
    plan = None if unsized or maps else session.memory_plan(plan_feeds(session, args))
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
        print(f"no memory plan stored: {', '.join(unsized)} stay open (each input "
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
