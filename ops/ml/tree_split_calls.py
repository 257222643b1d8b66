"""A request's walk split by trees (``forest_walks._Forest.tree_parts``), prepared once per
thread, batch shape and walk: the part entry's words and the arrays' addresses, and the
sums, hits and leaves it fills, so that a call only writes its rows' address and runs.

Made anew at every call, those words and addresses (15 arrays' shapes, a compiled call over
15 arrays) were ~5.7 us of the split's ~9 beyond its half-walks, against a one-row walk of
~30-40 us (600 XGBoost trees, 400 LightGBM ones; 2026-11-28).
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu
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
        run, block, address, parts = jit_cpu.panel_kernels().native_for, native.block, \
            entry.address, len(bounds) - 1
        add = jit_cpu.load("mixrt.ops.ml._jit_tree_leaves").add_leaves
        first, trees = int(bounds[1]), len(roots)

        def go(rows_now):
            total.fill(0)
            reached.fill(False)
            native_parts.fill_addresses(data_address, (rows_now,))
            jit_cpu.note_native_job()
            run(block, address, addresses, parts)
            add(leaves, 0, rows, first, trees, leaf_start, leaf_targets, leaf_values, total,
                reached)
            return total, reached
        go.kept = (words, data_address)  # addresses[0] points into the words
        self._go = go

    def __call__(self, data):
        return self._go(data)
