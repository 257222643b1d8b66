"""A request's walk split by trees (``forest_walks._Forest.tree_parts``), or a classifier's
batch split by rows (``forest_walks._Forest.rows_split``), prepared once per thread and
walk (and, split by trees, per batch shape; split by rows, per rows' width and number of
parts): the part entry's words and the arrays' addresses (and, split by trees, the sums,
hits and leaves it fills), so that a call only writes its rows' (and outputs') addresses,
and split by rows its rows' count and bounds, and runs.

Made anew at every call, those words and addresses (15 arrays' shapes, a compiled call over
15 arrays) were ~5.7 us of the split's ~9 beyond its half-walks, against a one-row walk of
~30-40 us (600 XGBoost trees, 400 LightGBM ones; 2026-11-28).
"""

from __future__ import annotations

import numpy as np

import threading

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.entry_points import fixed_call
from mixrt.ops.ml import walk_choice
from mixrt.ops.panels import native_parts


class SplitCall:
    """``call(data)`` -> (sums, hits): forest_sums of ``data``'s rows over ``tables``, the
    trees split at ``bounds`` between the calling thread and ``native``'s worker through
    ``entry`` (``_jit_tree_parts.TREE_ENTRIES``). The arrays it returns are its own, filled
    again at its next call: the caller reads them first. One thread calls it."""

    __slots__ = ("native", "tables", "_go")

    def __init__(self, native, entry, bounds, data, tables, precision, targets: int):
        self.native, self.tables = native, tables  # (kept: their addresses are written)
        (roots, splits, links, members, uniform, steps, records, thresholds, leaf_start,
         leaf_targets, leaf_values) = tables
        rows = data.shape[0]
        total = np.zeros((rows, targets), precision)
        reached = np.zeros(total.shape, np.bool_)
        leaves = np.empty((rows, len(roots)), np.int64)
        arrays = (data, roots, splits, links, members, steps, records, thresholds, leaf_start,
                  leaf_targets, leaf_values, total, reached, leaves)
        words = np.array([0, *(extent for array in arrays for extent in array.shape), uniform,
                          *bounds.tolist()], np.int64)
        words[0] = words.size
        addresses = np.empty(len(arrays) + 1, np.uint64)
        native_parts.fill_addresses(addresses, (words,) + arrays)
        data_address = addresses[1:2]  # the one address a call writes
        # (each through its overload's entry: ops/compiled/entry_points.py)
        run = fixed_call(jit_cpu.panel_kernels().native_for, native.block, entry.address,
                         addresses, len(bounds) - 1)
        add = fixed_call(jit_cpu.load("mixrt.ops.ml._jit_tree_leaves").add_leaves, leaves, 0,
                         rows, int(bounds[1]), len(roots), leaf_start, leaf_targets,
                         leaf_values, total, reached)

        def go(rows_now):
            total.fill(0)
            reached.fill(False)
            native_parts.fill_addresses(data_address, (rows_now,))
            jit_cpu.note_native_job()
            run()
            add()
            return total, reached
        go.kept = (words, data_address)  # addresses[0] points into the words
        self._go = go

    def __call__(self, data):
        return self._go(data)


class RowsSplitCall:
    """``call(data, first, second)``: a walk of ``data``'s rows split in ``parts`` between
    the calling thread and ``native``'s worker through ``entry`` (a classifier's,
    ``_jit_tree_parts.CLASSIFY_ENTRIES``, into the chosen labels and scores; the sums',
    ``ENTRIES``, into the sums and hits: the words ``forest_walks._run_parts`` writes),
    prepared once per thread, rows' width and walk: a call writes its rows' count into the
    words where the data's and the outputs' shapes hold it, the parts' bounds, and the
    rows' and outputs' addresses, and runs. Made at every call, the words and 19 addresses
    were ~8 us of an XGBoost request of 10 rows whose two half-walks took ~18
    (2026-12-05); made once per batch size, a service whose batches each have their own
    size paid them at nearly every request."""

    __slots__ = ("native", "tables", "_go")

    def __init__(self, native, entry, arrays: tuple, settings: tuple, parts: int):
        # (kept: their addresses are written; not the rows and outputs of the first call)
        self.native, self.tables = native, arrays[1:-2]
        extents = [0, *(extent for array in arrays for extent in array.shape)]
        # where the rows' count stands: the data's first extent, each output's first
        rows_at = [1, len(extents) - arrays[-1].ndim - arrays[-2].ndim,
                   len(extents) - arrays[-1].ndim]
        words = np.array([*extents, *settings, *range(parts + 1)], np.int64)
        words[0] = words.size
        bounds = words[words.size - parts - 1:]
        addresses = np.empty(len(arrays) + 1, np.uint64)
        native_parts.fill_addresses(addresses, (words,) + arrays)
        data_address, outputs_address = addresses[1:2], addresses[-2:]
        run = fixed_call(jit_cpu.panel_kernels().native_for, native.block, entry.address,
                         addresses, parts)

        def go(data, first, second):
            rows = data.shape[0]
            for at in rows_at:
                words[at] = rows
            for part in range(1, parts + 1):  # contiguous parts, as forest_walks._split
                bounds[part] = rows * part // parts
            native_parts.fill_addresses(data_address, (data,))
            native_parts.fill_addresses(outputs_address, (first, second))
            jit_cpu.note_native_job()
            run()
        go.kept = words  # addresses[0] points into them
        self._go = go

    def __call__(self, data, first, second):
        self._go(data, first, second)


class RowsSplit:
    """``split(data, first, second)``: a walk of rows of one width split by rows in
    ``parts`` between the calling thread and ``native``'s worker
    (``forest_walks._Forest.rows_split``), with the walk its size's choice keeps
    (``choices``, or None: ``walks``' one alone), each walk's :class:`RowsSplitCall` made
    at its first call; ``settings`` the entry's words after ``uniform`` and ``fixed`` its
    arrays before the two outputs (a classifier's). One thread calls it."""

    __slots__ = ("native", "parts", "thread", "fixed", "_entry", "_settings", "_choices",
                 "_walks", "_calls")

    def __init__(self, native, entry, parts: int, settings: tuple, fixed: tuple,
                 choices, walks: list):
        self.native, self.parts, self.thread = native, parts, threading.get_ident()
        self.fixed, self._entry, self._settings = fixed, entry, settings
        self._choices, self._walks = choices, walks
        self._calls: list = [None] * len(walks)

    def __call__(self, data, first, second) -> None:
        rows = data.shape[0]
        choice = None if self._choices is None else self._choices.for_rows(rows)
        if choice is None:
            self._call(0, data, first, second)
        else:
            walk_choice.walk(choice, lambda index: self._call(index, data, first, second))

    def _call(self, index: int, data, first, second) -> None:
        call = self._calls[index]
        if call is None:
            tables = self._walks[index]
            arrays = (data, *tables[:4], *tables[5:], *self.fixed, first, second)
            call = self._calls[index] = RowsSplitCall(
                self.native, self._entry, arrays, (tables[4], *self._settings), self.parts)
        call(data, first, second)
