"""What each of onnxruntime's session options does in mixrt.

``session_settings(options)`` reads a :class:`SessionOptions` once, as a session is made, and
says how the session honours each field; a field mixrt has no counterpart for, at a value
that asks for something, is named in an :class:`~mixrt.errors.OnnxruntimeOptionWarning`
(once per message; onnxruntime's own ``log_severity_level`` of 3 or more, errors only, keeps
them quiet, as it keeps onnxruntime's warnings). ``docs/onnxruntime-api.md`` has the table.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

from mixrt.base.errors import OnnxruntimeOptionWarning
from mixrt.onnxruntime.errors import InvalidArgument, NotImplemented as NotSupported
from mixrt.onnxruntime.options import (ExecutionMode, ExecutionOrder, GraphOptimizationLevel,
                                       SessionOptions)
from mixrt.ops.compiled import parallel

# onnxruntime's optimization levels -> mixrt's graph passes (runtime/passes: 0 none,
# 1 the folding and elimination passes, 2 those and the fusions)
OPT_LEVELS = {GraphOptimizationLevel.ORT_DISABLE_ALL: 0,
              GraphOptimizationLevel.ORT_ENABLE_BASIC: 1,
              GraphOptimizationLevel.ORT_ENABLE_EXTENDED: 2,
              GraphOptimizationLevel.ORT_ENABLE_LAYOUT: 2,
              GraphOptimizationLevel.ORT_ENABLE_ALL: 2}
EXTERNAL_FILE = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN_BYTES = "session.optimized_model_external_initializers_min_size_in_bytes"
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"
MODEL_FORMATS = ("session.load_model_format", "session.save_model_format")
# config entries honoured above, and those whose only effect mixrt has anyway
HONOURED_ENTRIES = {EXTERNAL_FILE, EXTERNAL_MIN_BYTES, RECORD_ASSIGNMENT, *MODEL_FORMATS}
THREADS_SETTING = "MIXRT_INTRA_OP_THREADS"


@dataclass
class SessionSettings:
    """How a session honours its options: mixrt.Session's arguments, and the work around it
    (the model's edits before loading, the optimized model to write, the trace)."""

    opt_level: int = 2
    strategy: str = "greedy"
    profile_prefix: str | None = None
    optimized_model_path: str = ""
    external_file: str = ""
    external_min_bytes: int = 1024
    record_assignment: bool = False
    quiet: bool = False
    edits: SessionOptions = field(default_factory=SessionOptions)


def session_settings(options: SessionOptions | None) -> SessionSettings:
    if options is None:
        return SessionSettings()
    if not isinstance(options, SessionOptions):
        raise InvalidArgument(f"sess_options is a {type(options).__name__}; expected "
                              f"mixrt.onnxruntime.SessionOptions")
    settings = SessionSettings(
        opt_level=_opt_level(options.graph_optimization_level),
        strategy="greedy" if options.enable_mem_reuse else "naive",
        profile_prefix=options.profile_file_prefix if options.enable_profiling else None,
        optimized_model_path=os.fspath(options.optimized_model_filepath or ""),
        quiet=options.log_severity_level >= 3, edits=options)
    _read_entries(options.config_entries, settings)
    for message in _unhonoured(options):
        warn(settings, message)
    _apply_threads(options.intra_op_num_threads, settings)
    return settings


def warn(settings: SessionSettings, message: str) -> None:
    if not settings.quiet:
        warnings.warn(message, OnnxruntimeOptionWarning, stacklevel=4)


def _opt_level(level) -> int:
    try:
        return OPT_LEVELS[GraphOptimizationLevel(level)]
    except ValueError:
        raise InvalidArgument(f"graph_optimization_level={level!r}; expected one of "
                              f"{[int(member) for member in GraphOptimizationLevel]}") from None


def _read_entries(entries: dict[str, str], settings: SessionSettings) -> None:
    for key in MODEL_FORMATS:
        if entries.get(key, "ONNX").upper() != "ONNX":
            raise NotSupported(f"session config entry {key}={entries[key]!r}: mixrt reads "
                                 f"and writes ONNX models only (not onnxruntime's ORT format)")
    settings.external_file = entries.get(EXTERNAL_FILE, "")
    if EXTERNAL_MIN_BYTES in entries:
        settings.external_min_bytes = _integer(EXTERNAL_MIN_BYTES, entries[EXTERNAL_MIN_BYTES])
    settings.record_assignment = entries.get(RECORD_ASSIGNMENT, "0") == "1"
    for key in sorted(set(entries) - HONOURED_ENTRIES):
        warn(settings, f"session config entry {key!r} has no mixrt counterpart and is not "
                       f"applied (honoured: {', '.join(sorted(HONOURED_ENTRIES))})")


def _integer(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"session config entry {key}={text!r}; expected a whole "
                              f"number") from None


def _unhonoured(options: SessionOptions):
    """Messages for the fields set to something mixrt does not do."""
    if options.execution_mode == ExecutionMode.ORT_PARALLEL:
        yield ("execution_mode=ORT_PARALLEL: mixrt runs a graph's nodes one after another "
               "(each kernel may use intra_op_num_threads threads); it runs as ORT_SEQUENTIAL")
    if options.execution_order != ExecutionOrder.DEFAULT:
        yield (f"execution_order={ExecutionOrder(options.execution_order).name}: mixrt "
               f"orders nodes its own way (a topological order its memory plan follows)")
    if not options.enable_cpu_mem_arena or not options.enable_mem_pattern:
        yield ("enable_cpu_mem_arena/enable_mem_pattern=False: mixrt always runs on "
               "planned arenas (enable_mem_reuse=False gives every tensor its own memory)")
    if options.use_deterministic_compute:
        yield "use_deterministic_compute=True has no mixrt counterpart and is not applied"
    if not options.use_per_session_threads:
        yield ("use_per_session_threads=False: mixrt's kernel threads are one pool per "
               "process already")


def _apply_threads(threads: int, settings: SessionSettings) -> None:
    """intra_op_num_threads sets mixrt's kernel threads, which are one pool per process
    (MIXRT_INTRA_OP_THREADS): the whole process takes the count, and the warning says so."""
    if not threads or int(threads) == parallel.intra_op_threads():
        return
    os.environ[THREADS_SETTING] = str(int(threads))
    warn(settings, f"intra_op_num_threads={int(threads)}: mixrt's kernel threads are one pool "
                   f"per process, so every session of this process now uses {int(threads)} "
                   f"({THREADS_SETTING})")
