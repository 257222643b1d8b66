"""The process-wide profiler, with MXNet's API.

    from mixrt import profiler
    profiler.set_config(filename="trace.json", aggregate_stats=True)
    profiler.set_state("run")
    with profiler.scope("forward"):
        outputs = net(data)               # imperative ops and hybridized (Session) runs
    profiler.Marker("step 1").mark()
    profiler.set_state("stop")
    profiler.dump()                       # trace.json: open it in chrome://tracing or Perfetto
    print(profiler.dumps())               # time per op: count, total, min, max, average

User annotations are MXNet's ``Domain``, ``Task``, ``Frame``, ``Event``, ``Counter`` and
``Marker`` (``mixrt/profiler_objects.py``).

What is recorded: imperative NDArray ops (category "imperative"; in the statistics MXNet's
"operator" with MXNet's op names, ``sqrt``, ``_plus_scalar``; "Custom Operator" for a
Python operator and the ops it runs, ``mixrt/operator.py``), the kernels of every
Session that has no profiler of its own (category "symbolic", each run as a "run" event in
category "session"), memory counters ``memory:<device>`` (a session's arena per run) and
markers. ``profile_api`` is accepted so MXNet scripts run; mixrt has no C API layer to time,
and the flag records nothing. The hooks runtime code calls are documented in
``runtime/profiler.py``.
"""

from __future__ import annotations

import contextvars
import json
import numbers
import os

from mixrt.base.errors import InputError
from mixrt.profiler_objects import Counter, Domain, Event, Frame, Marker, Task  # noqa: F401
from mixrt.runtime import profiler as _runtime

CONFIG_DEFAULTS = {"filename": "profile.json", "profile_all": False,
                   "profile_symbolic": True, "profile_imperative": True,
                   "profile_memory": True, "profile_api": False, "aggregate_stats": False,
                   "continuous_dump": False}
# MXNet's options that change nothing here: mixrt dumps when asked (or, with
# continuous_dump, at stop and exit), and profiles the worker it runs in
ACCEPTED_ONLY = {"dump_period": 1.0, "profile_process": "worker", "contiguous_dump": False}

STATES = ("run", "stop")
PROCESSES = ("worker", "server")
SORT_KEYS = {"total": 1, "avg": None, "min": 2, "max": 3, "count": 0}

# MXNet's names for the ops imperative calls run, in the statistics (the trace keeps the
# ONNX op): a unary op's lower-case name, a binary one's scalar form when one operand is a
# number (0-d: MXNet 1.x arrays have none), the number first for the reversed ones
_UNARY_NAMES = {"Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Abs": "abs", "Neg": "negative",
                "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Sin": "sin",
                "Cos": "cos", "Tan": "tan", "Floor": "floor", "Ceil": "ceil",
                "Round": "round", "Sign": "sign", "Reciprocal": "reciprocal",
                "Softmax": "softmax", "LogSoftmax": "log_softmax", "MatMul": "dot",
                "Transpose": "transpose", "Reshape": "Reshape", "Cast": "Cast",
                "Identity": "_copy", "Erf": "erf"}
_BINARY_NAMES = {"Add": ("plus", "add", "plus"), "Sub": ("minus", "sub", "rminus"),
                 "Mul": ("mul", "mul", "mul"), "Div": ("div", "div", "rdiv"),
                 "Pow": ("power", "power", "rpower"), "Max": ("maximum", "maximum", "maximum"),
                 "Min": ("minimum", "minimum", "minimum"), "Mod": ("mod", "mod", "rmod")}


def mxnet_op_name(op_type: str, inputs: list) -> str:
    """The name MXNet's profiler gives the op an imperative call ran."""
    if op_type in _BINARY_NAMES and len(inputs) == 2:
        scalar, broadcast, reversed_scalar = _BINARY_NAMES[op_type]
        first, second = (getattr(x, "ndim", None) == 0 for x in inputs)
        if second and not first:
            return f"_{scalar}_scalar"
        if first and not second:
            return f"_{reversed_scalar}_scalar"
        return f"broadcast_{broadcast}"
    return _UNARY_NAMES.get(op_type, op_type)


_runtime.STATISTICS_NAMES[:] = [mxnet_op_name]


def set_config(**options) -> None:
    """Configure the profiler. Every call sets every option; those not given take their
    defaults (``CONFIG_DEFAULTS``). ``profile_all`` turns on symbolic, imperative, memory
    and api profiling. ``aggregate_stats`` keeps the per-op times :func:`dumps` reports;
    ``continuous_dump`` writes the trace at every ``set_state("stop")`` and at exit."""
    unknown = sorted(set(options) - set(CONFIG_DEFAULTS) - set(ACCEPTED_ONLY))
    if unknown:
        raise InputError(f"profiler.set_config: unknown option(s) {unknown}; the options are "
                         f"{list(CONFIG_DEFAULTS) + list(ACCEPTED_ONLY)}")
    _check_accepted_only(options)
    config = {**CONFIG_DEFAULTS, **{k: v for k, v in options.items()
                                    if k not in ACCEPTED_ONLY}}
    filename = config.pop("filename")
    if not isinstance(filename, (str, os.PathLike)) or not os.fspath(filename):
        raise InputError(f"profiler.set_config: filename must be a non-empty path, got "
                         f"{filename!r}")
    for name, value in config.items():
        if not isinstance(value, bool):
            raise InputError(f"profiler.set_config: {name} must be True or False, got "
                             f"{value!r}")
    if config.pop("profile_all"):
        for name in ("profile_symbolic", "profile_imperative", "profile_memory",
                     "profile_api"):
            config[name] = True
    _runtime.process_profiler().configure(filename=filename, **config)


def _check_accepted_only(options: dict) -> None:
    period = options.get("dump_period", 1.0)
    if isinstance(period, bool) or not isinstance(period, numbers.Real) or period <= 0:
        raise InputError(f"profiler.set_config: dump_period must be a positive number of "
                         f"seconds, got {period!r}")
    _check_process("set_config", options.get("profile_process", "worker"))
    if not isinstance(options.get("contiguous_dump", False), bool):
        raise InputError("profiler.set_config: contiguous_dump must be True or False")


def _check_process(what: str, process) -> None:
    """MXNet's ``profile_process``: "worker" is this process; a parameter server's own
    profiling ("server") is not offered."""
    if process not in PROCESSES:
        raise InputError(f"profiler.{what}: profile_process must be one of "
                         f"{list(PROCESSES)}, got {process!r}")
    if process == "server":
        raise InputError(f"profiler.{what}: profile_process='server' (profiling the "
                         f"parameter servers) is not offered; mixrt profiles this worker")


def set_state(state: str = "stop", profile_process: str = "worker") -> None:
    """``"run"`` starts (or restarts, un-pausing) recording; ``"stop"`` stops it."""
    _check_process("set_state", profile_process)
    if state not in STATES:
        raise InputError(f"profiler.set_state: state must be one of {list(STATES)}, got "
                         f"{state!r}")
    _runtime.set_state(state)


def state() -> str:
    """``"run"`` or ``"stop"``."""
    return _runtime.state()


def pause(profile_process: str = "worker") -> None:
    """Stop recording without leaving the "run" state; :func:`resume` goes on."""
    _check_process("pause", profile_process)
    _runtime.set_paused(True)


def resume(profile_process: str = "worker") -> None:
    _check_process("resume", profile_process)
    _runtime.set_paused(False)


def dump(finished: bool = True, profile_process: str = "worker") -> str:
    """Write the events recorded so far to the configured file as Chrome ``traceEvents``
    JSON; returns its path. ``finished`` also forgets them, so the next trace starts
    empty; with ``finished=False`` a later dump rewrites the file with these and newer
    events."""
    _check_process("dump", profile_process)
    return _runtime.process_profiler().write(clear=finished)


def dump_profile() -> str:
    """MXNet's older name for :func:`dump`."""
    return dump(True)


def dumps(reset: bool = False, format: str = "table", sort_by: str = "total",  # noqa: A002
          ascending: bool = False) -> str:
    """The aggregate statistics: per category and op, the number of calls and the total,
    minimum, maximum and average time, sorted by ``sort_by`` ("total", "avg", "min",
    "max", "count"), largest first unless ``ascending``. ``format`` "table" (microseconds)
    or "json" (MXNet's layout: ``{"Memory": {...}, "Time": {category: {name: {"Count",
    "Total", "Min", "Max", "Avg"}}}, "Unit": {"Time": "ms", "Memory": "kB"}}``). ``reset`` starts the statistics afresh
    (the trace is kept). Needs ``set_config(aggregate_stats=True)``."""
    if format not in ("table", "json"):
        raise InputError(f"profiler.dumps: format must be 'table' or 'json', got {format!r}")
    if sort_by not in SORT_KEYS:
        raise InputError(f"profiler.dumps: sort_by must be one of {list(SORT_KEYS)}, got "
                         f"{sort_by!r}")
    profiler = _runtime.process_profiler()
    if profiler.stats is None:
        raise InputError("profiler.dumps: aggregate statistics are off; call "
                         "profiler.set_config(aggregate_stats=True) before recording")
    rows = _sorted(profiler.statistics(reset=reset), sort_by, ascending)
    if format == "json":
        return format_json(rows, _memory_rows(profiler, sort_by, ascending))
    return format_table(dict(rows))


def _sorted(stats: dict, sort_by: str, ascending: bool) -> list:
    column = SORT_KEYS[sort_by]

    def key(item):
        count, total = item[1][0], item[1][1]
        return total / count if column is None else item[1][column]
    return sorted(stats.items(), key=key, reverse=not ascending)


def format_json(rows: list, memory: list | None = None) -> str:
    """MXNet's JSON statistics: times in milliseconds, the memory counters (each device's
    ``memory:<device>`` samples) in kB."""
    table: dict = {}
    for (category, name), (count, total, low, high) in rows:
        table.setdefault(category, {})[name] = {
            "Count": int(count), "Total": total / 1e3, "Min": low / 1e3, "Max": high / 1e3,
            "Avg": total / count / 1e3}
    storage = {name: {"Count": count, "Min": low / 1e3, "Max": high / 1e3,
                      "Avg": total / count / 1e3} for name, (count, total, low, high)
               in (memory or [])}
    return json.dumps({"Memory": {"Device Storage": storage} if storage else {},
                       "Time": table, "Unit": {"Time": "ms", "Memory": "kB"}}, indent=4)


def _memory_rows(profiler, sort_by: str, ascending: bool) -> list:
    """(counter name, [count, total, min, max] bytes) of the trace's memory counters."""
    samples: dict = {}
    for event in list(profiler.events):
        if event.get("ph") == "C" and str(event.get("name", "")).startswith("memory:"):
            value = float(event.get("args", {}).get("allocated_bytes", 0))
            entry = samples.setdefault(f"Memory: {event['name'][7:]}", [0, 0.0, value, value])
            entry[0] += 1
            entry[1] += value
            entry[2], entry[3] = min(entry[2], value), max(entry[3], value)
    ordered = _sorted({(None, name): values for name, values in samples.items()}, sort_by,
                      ascending)
    return [(name, values) for (_, name), values in ordered]


def format_table(stats: dict) -> str:
    """The statistics as a table, in the order ``stats`` lists them."""
    header = ("Category", "Name", "Count", "Total (us)", "Min (us)", "Max (us)", "Avg (us)")
    rows = [(category, name, str(int(count)), f"{total:.3f}", f"{low:.3f}", f"{high:.3f}",
             f"{total / count:.3f}")
            for (category, name), (count, total, low, high) in stats.items()]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells) -> str:
        return "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    rule = "-" * len(line(header))
    body = [line(row) for row in rows] or ["(no operator events recorded)"]
    return "\n".join(["Profile statistics", rule, line(header), rule, *body, rule]) + "\n"


class Scope:
    """``with profiler.Scope("forward"):`` names the events made inside ``forward:<name>``;
    scopes nest (``outer:inner:<name>``). The prefix follows the thread or task that
    entered it."""

    def __init__(self, name: str = "<unk>"):
        if not isinstance(name, str) or not name:
            raise InputError(f"profiler.Scope: name must be a non-empty string, got {name!r}")
        self.name = name if name.endswith(":") else f"{name}:"
        self._tokens: list[contextvars.Token] = []

    def __enter__(self) -> "Scope":
        self._tokens.append(_runtime.SCOPE.set(_runtime.SCOPE.get() + self.name))
        return self

    def __exit__(self, *exc_info) -> None:
        _runtime.SCOPE.reset(self._tokens.pop())


def scope(name: str = "<unk>") -> Scope:
    return Scope(name)


__all__ = ["CONFIG_DEFAULTS", "Counter", "Domain", "Event", "Frame", "Marker", "Scope",
           "Task", "dump", "dump_profile", "dumps", "pause", "resume", "scope", "set_config",
           "set_state", "state"]
