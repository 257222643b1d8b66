"""Chrome-trace profilers: one per session, and the process-wide one ``mixrt.profiler`` drives.

A session's own trace: ``Session(..., profile=True)`` or ``MIXRT_PROFILE=path`` records one
complete event ("ph": "X", category "kernel") per kernel call — the node's name, its op, its
input and output shapes, microseconds — one "run" event around them, and an ``arena_bytes``
counter per run. ``write()`` saves the ``traceEvents`` JSON that chrome://tracing and Perfetto
open (the session calls it from ``end_profiling``; with MIXRT_PROFILE it is also written when
Python exits).

The process-wide profiler (``mixrt.profiler.set_config``/``set_state``, MXNet's API) is a
:class:`Profiler` too. :func:`current` returns it while its state is "run" and it is not
paused, else None; it is one global read, cheap enough for every imperative op. The hooks:

* ``kernel(step, started, args, outputs)`` and ``run(arena_bytes, device)`` — a Session
  records into :func:`symbolic_profiler` when it has no profiler of its own, so hybridized
  code shows up (category "symbolic", memory counters from the arena when profile_memory);
* ``imperative(op_name, started, inputs, outputs)`` — one "X" event, category "imperative",
  with the inputs' and outputs' shapes and dtypes; the NDArray dispatcher calls it with
  ``started = time.perf_counter()`` taken before the op. Its statistics go to MXNet's
  category "operator" under the name ``STATISTICS_NAMES`` gives (or to the category and
  prefix ``IMPERATIVE_GROUP`` sets, inside a custom operator);
* ``python_op(name, category, started)`` — one "X" event for a Python operator's code;
* ``memory(device, allocated_bytes)`` — a counter event named ``memory:<device>``;
* ``mark(name, scope)`` — an instant event ("ph": "i"), ``mixrt.profiler.Marker``.

Events made inside ``mixrt.profiler.scope(name)`` are named ``name:<event>``. With
aggregate_stats, kernel and imperative events are also summed per (category, op) for
``mixrt.profiler.dumps``.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from mixrt.ops.compiled.jit_tier import compiled_allowed

# the names events get inside mixrt.profiler.scope(...): "outer:inner:"
SCOPE = contextvars.ContextVar("mixrt_profiler_scope", default="")

INSTANT_SCOPES = {"global": "g", "process": "p", "thread": "t"}

# (category, name prefix) for the aggregate statistics of imperative ops made inside a
# Python operator (mixrt.operator: "Custom Operator", "<op_type>::"); None elsewhere
IMPERATIVE_GROUP = contextvars.ContextVar("mixrt_profiler_imperative_group", default=None)
# the statistics' name of an imperative op, (op_type, raw inputs) -> name: mixrt.profiler
# installs MXNet's operator names (``sqrt``, ``_plus_scalar``); the trace keeps op_type
STATISTICS_NAMES: list = []


class Profiler:
    """Recorded events and the options that choose them. A session's own profiler keeps the
    defaults; the process-wide one is set up by :meth:`configure`."""

    def __init__(self, path: str | None = None, *, category: str = "kernel",
                 arena_counter: bool = True):
        self.path = path or f"mixrt_profile_{time.strftime('%Y%m%d_%H%M%S')}.json"
        self.events: list[dict] = []
        self.category = category  # of kernel events
        self.arena_counter = arena_counter  # a session's own trace: "arena_bytes" per run
        self.profile_symbolic = True
        self.profile_imperative = True
        self.profile_memory = False
        self.profile_api = False
        self.continuous_dump = False
        self.stats: dict[tuple[str, str], list[float]] | None = None
        self._origin = time.perf_counter()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def from_options(cls, profile) -> "Profiler | None":
        """``profile``: False, True, or a path; MIXRT_PROFILE=path turns profiling on."""
        env_path = os.environ.get("MIXRT_PROFILE")
        if not profile and not env_path:
            return None
        profiler = cls(profile if isinstance(profile, (str, Path)) else env_path)
        if env_path and not profile:
            atexit.register(profiler.write)
        return profiler

    def configure(self, *, filename, profile_symbolic: bool, profile_imperative: bool,
                  profile_memory: bool, profile_api: bool, aggregate_stats: bool,
                  continuous_dump: bool) -> None:
        """Set every option (mixrt.profiler.set_config has checked them). Recorded events
        stay; statistics start when aggregate_stats is turned on."""
        with self._lock:
            self.path = os.fspath(filename)
            self.profile_symbolic = profile_symbolic
            self.profile_imperative = profile_imperative
            self.profile_memory = profile_memory
            self.profile_api = profile_api
            self.continuous_dump = continuous_dump
            if not aggregate_stats:
                self.stats = None
            elif self.stats is None:
                self.stats = {}

    def clock(self) -> float:
        return time.perf_counter()

    def _us(self, moment: float) -> float:
        return round((moment - self._origin) * 1e6, 3)

    # -- hooks -----------------------------------------------------------------------------

    def kernel(self, step, started: float, args, outputs) -> None:
        ended = time.perf_counter()
        node = step.node
        op = f"{node.domain + '::' if node.domain else ''}{node.op_type}"
        self._complete(step.label, op, self.category, started, ended,
                       {"op": op, "input_shapes": [_shape(a) for a in args],
                        "output_shapes": [_shape(o) for o in outputs],
                        # the run's kernel tier (runtime/kernel_tiers.py): "numpy" while
                        # its compiled kernels are still being built
                        "tier": "compiled" if compiled_allowed() else "numpy"})

    def imperative(self, op_name: str, started: float, inputs, outputs) -> None:
        if not self.profile_imperative:
            return
        ended = time.perf_counter()
        inputs, outputs = _as_list(inputs), _as_list(outputs)
        category, prefix = IMPERATIVE_GROUP.get() or ("operator", "")  # MXNet's category
        named = STATISTICS_NAMES[0](op_name, inputs) if STATISTICS_NAMES else op_name
        self._complete(op_name, prefix + named, "imperative", started, ended,
                       {"input_shapes": [_shape(a) for a in inputs],
                        "input_dtypes": [_dtype(a) for a in inputs],
                        "output_shapes": [_shape(o) for o in outputs],
                        "output_dtypes": [_dtype(o) for o in outputs]},
                       stats_category=category)

    def python_op(self, name: str, category: str, started: float) -> None:
        """One event for Python code that computes as an op (a custom operator)."""
        self._complete(name, name, category, started, time.perf_counter(), {})

    def memory(self, device: str, allocated_bytes: int) -> None:
        if not self.profile_memory:
            return
        self._add({"name": f"memory:{device}", "ph": "C",
                   "ts": self._us(time.perf_counter()), "pid": self._pid,
                   "args": {"allocated_bytes": int(allocated_bytes)}})

    def mark(self, name: str, scope: str = "process") -> None:
        self._add({"name": SCOPE.get() + name, "cat": "marker", "ph": "i",
                   "ts": self._us(time.perf_counter()), "pid": self._pid,
                   "tid": threading.get_ident(), "s": INSTANT_SCOPES[scope]})

    @contextmanager
    def run(self, arena_bytes: int, device=None):
        started = time.perf_counter()
        if self.arena_counter:
            self._add({"name": "arena_bytes", "ph": "C", "ts": self._us(started),
                       "pid": self._pid, "args": {"arena_bytes": int(arena_bytes)}})
        if device is not None:
            self.memory(str(device), arena_bytes)
        try:
            yield
        finally:
            ended = time.perf_counter()
            self._add({"name": "run", "cat": "session", "ph": "X", "ts": self._us(started),
                       "dur": round((ended - started) * 1e6, 3), "pid": self._pid,
                       "tid": threading.get_ident(), "args": {"arena_bytes": int(arena_bytes)}})

    # -- recording -------------------------------------------------------------------------

    def _complete(self, name: str, op: str, category: str, started: float, ended: float,
                  args: dict, stats_category: str | None = None) -> None:
        scope = SCOPE.get()
        duration = round((ended - started) * 1e6, 3)
        event = {"name": scope + name, "cat": category, "ph": "X", "ts": self._us(started),
                 "dur": duration, "pid": self._pid, "tid": threading.get_ident(),
                 "args": args}
        with self._lock:
            self.events.append(event)
            if self.stats is not None:
                _accumulate(self.stats, (stats_category or category, scope + op), duration)

    def _add(self, event: dict) -> None:
        with self._lock:
            self.events.append(event)

    def statistics(self, reset: bool = False) -> dict[tuple[str, str], list[float]]:
        """(category, op) -> [count, total, min, max] microseconds (a copy)."""
        with self._lock:
            stats = {key: list(value) for key, value in (self.stats or {}).items()}
            if reset and self.stats is not None:
                self.stats = {}
        return stats

    def write(self, clear: bool = False) -> str:
        """Save the trace; ``clear`` also forgets the events written (a finished trace)."""
        with self._lock:
            events = list(self.events)
            if clear:
                self.events.clear()
        Path(self.path).write_text(json.dumps({"traceEvents": events,
                                               "displayTimeUnit": "ms"}))
        return str(self.path)


def _accumulate(stats: dict, key: tuple[str, str], duration: float) -> None:
    entry = stats.get(key)
    if entry is None:
        stats[key] = [1, duration, duration, duration]
        return
    entry[0] += 1
    entry[1] += duration
    entry[2] = min(entry[2], duration)
    entry[3] = max(entry[3], duration)


def _as_list(values) -> list:
    if values is None:
        return []
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _shape(value) -> list | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else [int(d) for d in shape]


def _dtype(value) -> str | None:
    dtype = getattr(value, "dtype", None)
    return None if dtype is None else str(getattr(dtype, "name", dtype))


# -- the process-wide profiler ------------------------------------------------------------------
# mixrt.profiler (the frontend) checks arguments and calls what follows; the state is here so
# that runtime code can read it without importing a frontend.

_process: Profiler | None = None  # made on first use, kept for the life of the process
_running: Profiler | None = None  # _process while the state is "run" and not paused
_state = "stop"
_paused = False
_exit_dump_registered = False


def current() -> Profiler | None:
    """The process-wide profiler while it records, else None."""
    return _running


def symbolic_profiler() -> Profiler | None:
    """:func:`current` when it records sessions' kernels (profile_symbolic)."""
    running = _running
    return running if running is not None and running.profile_symbolic else None


def process_profiler() -> Profiler:
    global _process
    if _process is None:
        _process = Profiler("profile.json", category="symbolic", arena_counter=False)
        _process.profile_memory = True
    return _process


def state() -> str:
    return _state


def set_state(new_state: str) -> None:
    """``"run"`` or ``"stop"`` (checked by the caller). Running again un-pauses."""
    global _state, _paused, _running, _exit_dump_registered
    profiler = process_profiler()
    _state, _paused = new_state, False
    _running = profiler if new_state == "run" else None
    if new_state == "run" and profiler.continuous_dump and not _exit_dump_registered:
        atexit.register(_dump_at_exit)
        _exit_dump_registered = True
    if new_state == "stop" and profiler.continuous_dump:
        profiler.write()


def set_paused(paused: bool) -> None:
    global _paused, _running
    _paused = paused
    _running = _process if _state == "run" and not paused else None


def _dump_at_exit() -> None:
    if _process is not None and _process.continuous_dump and _process.events:
        _process.write()
