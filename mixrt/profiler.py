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

What is recorded: imperative NDArray ops (category "imperative"), the kernels of every
Session that has no profiler of its own (category "symbolic", each run as a "run" event in
category "session"), memory counters ``memory:<device>`` (a session's arena per run) and
markers. ``profile_api`` is accepted so MXNet scripts run; mixrt has no C API layer to time,
and the flag records nothing. The hooks runtime code calls are documented in
``runtime/profiler.py``.
"""

from __future__ import annotations

import contextvars
import os

from mixrt.base.errors import InputError
from mixrt.runtime import profiler as _runtime

CONFIG_DEFAULTS = {"filename": "profile.json", "profile_all": False,
                   "profile_symbolic": True, "profile_imperative": True,
                   "profile_memory": True, "profile_api": False, "aggregate_stats": False,
                   "continuous_dump": False}

STATES = ("run", "stop")


def set_config(**options) -> None:
    """Configure the profiler. Every call sets every option; those not given take their
    defaults (``CONFIG_DEFAULTS``). ``profile_all`` turns on symbolic, imperative, memory
    and api profiling. ``aggregate_stats`` keeps the per-op times :func:`dumps` reports;
    ``continuous_dump`` writes the trace at every ``set_state("stop")`` and at exit."""
    unknown = sorted(set(options) - set(CONFIG_DEFAULTS))
    if unknown:
        raise InputError(f"profiler.set_config: unknown option(s) {unknown}; the options are "
                         f"{list(CONFIG_DEFAULTS)}")
    config = {**CONFIG_DEFAULTS, **options}
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


def set_state(state: str = "stop") -> None:
    """``"run"`` starts (or restarts, un-pausing) recording; ``"stop"`` stops it."""
    if state not in STATES:
        raise InputError(f"profiler.set_state: state must be one of {list(STATES)}, got "
                         f"{state!r}")
    _runtime.set_state(state)


def state() -> str:
    """``"run"`` or ``"stop"``."""
    return _runtime.state()


def pause() -> None:
    """Stop recording without leaving the "run" state; :func:`resume` goes on."""
    _runtime.set_paused(True)


def resume() -> None:
    _runtime.set_paused(False)


def dump(finished: bool = True) -> str:
    """Write the events recorded so far to the configured file as Chrome ``traceEvents``
    JSON; returns its path. ``finished`` also forgets them, so the next trace starts
    empty; with ``finished=False`` a later dump rewrites the file with these and newer
    events."""
    return _runtime.process_profiler().write(clear=finished)


def dumps(reset: bool = False) -> str:
    """The aggregate statistics as a table: per category and op, the number of calls and the
    total, minimum, maximum and average microseconds, largest total first. ``reset`` starts
    the statistics afresh (the trace is kept). Needs ``set_config(aggregate_stats=True)``."""
    profiler = _runtime.process_profiler()
    if profiler.stats is None:
        raise InputError("profiler.dumps: aggregate statistics are off; call "
                         "profiler.set_config(aggregate_stats=True) before recording")
    return format_table(profiler.statistics(reset=reset))


def format_table(stats: dict) -> str:
    header = ("Category", "Name", "Count", "Total (us)", "Min (us)", "Max (us)", "Avg (us)")
    rows = [(category, name, str(int(count)), f"{total:.3f}", f"{low:.3f}", f"{high:.3f}",
             f"{total / count:.3f}")
            for (category, name), (count, total, low, high)
            in sorted(stats.items(), key=lambda item: -item[1][1])]
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


class Marker:
    """An instant event: ``profiler.Marker("epoch 3").mark()``; recorded only while the
    profiler runs."""

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise InputError(f"profiler.Marker: name must be a non-empty string, got "
                             f"{name!r}")
        self.name = name

    def mark(self, scope: str = "process") -> None:
        """``scope``: how far the line is drawn — "global", "process" or "thread"."""
        if scope not in _runtime.INSTANT_SCOPES:
            raise InputError(f"profiler.Marker.mark: scope must be one of "
                             f"{list(_runtime.INSTANT_SCOPES)}, got {scope!r}")
        profiler = _runtime.current()
        if profiler is not None:
            profiler.mark(self.name, scope)


__all__ = ["CONFIG_DEFAULTS", "Marker", "Scope", "dump", "dumps", "pause", "resume",
           "scope", "set_config", "set_state", "state"]
