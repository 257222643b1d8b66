"""MXNet 1.x's ``mx.mon.Monitor``: statistics of the arrays an executor computes, collected
every ``interval`` batches.

    mon = mixrt.mon.Monitor(100, pattern=".*weight")
    mod.install_monitor(mon)          # or mon.install(executor)
    mon.tic(); mod.forward_backward(batch); mon.toc_print()

Between ``tic`` and ``toc`` of a monitored batch, every array the executors report through
their monitor callback (``Executor.set_monitor_callback``; with ``monitor_all`` the inputs
too) whose name matches ``pattern`` is passed to ``stat_func``; ``toc`` adds the arguments
and auxiliary states and returns ``(batch number, name, statistic as text)`` triples.
"""

from __future__ import annotations

import logging
import math
import re

from mixrt import nd
from mixrt.base.errors import InputError


def _norm_per_element(array):
    """MXNet's default statistic: ``norm(x) / sqrt(x.size)``, the root mean square."""
    return nd.norm(array) / math.sqrt(max(array.size, 1))


class Monitor:
    """Collects ``stat_func`` of the arrays whose names match ``pattern`` on every
    ``interval``-th batch (``tic`` counts batches); ``sort`` orders ``toc``'s result by
    name; ``monitor_all`` asks the executors for every operator input as well."""

    def __init__(self, interval: int, stat_func=None, pattern: str = ".*", sort: bool = False,
                 monitor_all: bool = False):
        if int(interval) < 1:
            raise InputError(f"Monitor: interval must be a positive number of batches, got "
                             f"{interval!r}")
        self.interval = int(interval)
        self.stat_func = _norm_per_element if stat_func is None else stat_func
        self.re_prog = re.compile(pattern)
        self.sort = sort
        self.monitor_all = monitor_all
        self.activated = False
        self.queue: list = []
        self.step = 0
        self.exes: list = []

    def stat_helper(self, name: str, array) -> None:
        """The executors' callback: queue ``array``'s statistic while activated."""
        if not self.activated or not self.re_prog.match(name):
            return
        self.queue.append((self.step, name, self.stat_func(array)))

    def install(self, exe) -> None:
        """Have executor ``exe`` report to this monitor."""
        exe.set_monitor_callback(self.stat_helper, self.monitor_all)
        self.exes.append(exe)

    def tic(self) -> None:
        """Start a batch: collection turns on when its number is a multiple of
        ``interval``."""
        if self.step % self.interval == 0:
            self.queue = []
            self.activated = True
        self.step += 1

    def toc(self) -> list:
        """End the batch: ``[(batch number, name, statistic text)]``, the executors'
        arguments and auxiliary states included; [] when this batch was not collected."""
        if not self.activated:
            return []
        for exe in self.exes:
            self._queue_inputs(exe.symbol.list_arguments(), exe.arg_arrays)
            self._queue_inputs(exe.symbol.list_auxiliary_states(), exe.aux_arrays)
        self.activated = False
        if self.sort:
            self.queue.sort(key=lambda entry: entry[1])
        result = [(step, name, _as_text(stats)) for step, name, stats in self.queue]
        self.queue = []
        return result

    def _queue_inputs(self, names: list, arrays: list) -> None:
        for name, array in zip(names, arrays):
            if array is not None and self.re_prog.match(name):
                self.queue.append((self.step, name, self.stat_func(array)))

    def toc_print(self) -> None:
        """``toc`` written to the log, one line per statistic."""
        for step, name, text in self.toc():
            logging.info("Batch: %7d %30s %s", step, name, text)


def _as_text(stats) -> str:
    """A statistic (an array or a list of them) as MXNet prints it: each value, a scalar
    for a one-element array, followed by a tab."""
    values = stats if isinstance(stats, (list, tuple)) else [stats]
    text = ""
    for value in values:
        host = value.asnumpy() if hasattr(value, "asnumpy") else value
        if getattr(host, "size", None) == 1:
            host = host.reshape(())[()]  # a NumPy scalar: its own dtype's digits
        text += str(host) + "\t"
    return text
