"""A Chrome-trace profiler for sessions.

``Session(..., profile=True)`` or ``MIXRT_PROFILE=path`` records one complete event ("ph":
"X") per kernel call — the node's name, its op, its input and output shapes, microseconds —
one event per run around them, and a counter event with the arena size. The file is the
``traceEvents`` JSON that chrome://tracing and Perfetto open. ``write()`` saves it (the session
calls it from ``end_profiling``; with MIXRT_PROFILE it is also written when Python exits).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path


class Profiler:
    def __init__(self, path: str | None = None):
        self.path = path or f"mixrt_profile_{time.strftime('%Y%m%d_%H%M%S')}.json"
        self.events: list[dict] = []
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

    def clock(self) -> float:
        return time.perf_counter()

    def _us(self, moment: float) -> float:
        return round((moment - self._origin) * 1e6, 3)

    def kernel(self, step, started: float, args, outputs) -> None:
        ended = time.perf_counter()
        node = step.node
        self._add({"name": step.label, "cat": "kernel", "ph": "X", "ts": self._us(started),
                   "dur": round((ended - started) * 1e6, 3), "pid": self._pid,
                   "tid": threading.get_ident(),
                   "args": {"op": f"{node.domain + '::' if node.domain else ''}{node.op_type}",
                            "input_shapes": [_shape(a) for a in args],
                            "output_shapes": [_shape(o) for o in outputs]}})

    @contextmanager
    def run(self, arena_bytes: int):
        started = time.perf_counter()
        self._add({"name": "arena_bytes", "ph": "C", "ts": self._us(started), "pid": self._pid,
                   "args": {"arena_bytes": int(arena_bytes)}})
        try:
            yield
        finally:
            ended = time.perf_counter()
            self._add({"name": "run", "cat": "session", "ph": "X", "ts": self._us(started),
                       "dur": round((ended - started) * 1e6, 3), "pid": self._pid,
                       "tid": threading.get_ident(), "args": {"arena_bytes": int(arena_bytes)}})

    def _add(self, event: dict) -> None:
        with self._lock:
            self.events.append(event)

    def write(self) -> str:
        with self._lock:
            events = list(self.events)
        Path(self.path).write_text(json.dumps({"traceEvents": events,
                                               "displayTimeUnit": "ms"}))
        return str(self.path)


def _shape(value) -> list | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else [int(d) for d in shape]
