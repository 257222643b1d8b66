"""NonMaxSuppression's greedy selection compiled by numba (``ops/image/nms_cpu.select_all``).

Each (batch, class) walks its candidates in score order and keeps a box unless a box kept
before it overlaps it by more than the IoU threshold: a loop of data-dependent length that
NumPy can only run one kept box at a time. Here each candidate is compared with the kept
boxes of its row, stopping at the first that suppresses it. The IoU is computed in float64
with the NumPy path's formula and order of operations (``ops/image/nms_cpu._iou_rows``), so both
give the same boxes.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def select_rows(corners, areas, orders, counts, row_batches, limit, iou_threshold, kept):
    """For every row r (a (batch, class) pair), its kept candidates in score order:
    kept[r, :n], with n in the result. corners [B, N, 4] (y1, x1, y2, x2) and areas [B, N]
    float64; orders [R, N] candidate indices by score, of which counts[r] are candidates;
    row_batches[r] the batch of row r."""
    rows, count = orders.shape
    found = np.zeros(rows, dtype=np.int64)
    lefts = np.empty(count, dtype=np.float64)  # the kept boxes that can suppress, by left edge
    members = np.empty(count, dtype=np.int64)
    for r in range(rows):
        boxes, area = corners[row_batches[r]], areas[row_batches[r]]
        n = indexed = 0
        widest = 0.0
        for t in range(counts[r]):
            if n >= limit:
                break
            i = orders[r, t]
            if not (0.0 <= iou_threshold):  # every kept box suppresses: IoU >= 0 always
                if n > 0:
                    continue
            elif np.isfinite(area[i]):
                if _suppressed(boxes, area, lefts, members, indexed, widest, i, iou_threshold):
                    continue
                widest = max(widest, boxes[i, 3] - boxes[i, 1])
                indexed = _insert(lefts, members, indexed, boxes[i, 1], i)
            # else: a NaN or infinite area makes every IoU with the box 0 (a NaN union)
            kept[r, n] = i
            n += 1
        found[r] = n
    return found


@njit(nogil=True, cache=True, inline="always")
def _insert(lefts, members, indexed, left, i):
    at = np.searchsorted(lefts[:indexed], left)
    lefts[at + 1:indexed + 1] = lefts[at:indexed].copy()
    members[at + 1:indexed + 1] = members[at:indexed].copy()
    lefts[at], members[at] = left, i
    return indexed + 1


@njit(nogil=True, cache=True, inline="always")
def _suppressed(boxes, area, lefts, members, indexed, widest, i, iou_threshold):
    """Does a kept box overlapping box i along x have IoU > threshold with it? Only those
    starting within ``widest`` (the widest kept box, with a margin for rounding) before
    box i and before its right edge can overlap it."""
    y1, x1, y2, x2 = boxes[i, 0], boxes[i, 1], boxes[i, 2], boxes[i, 3]
    reach = x1 - widest - 1e-9 * (abs(x1) + widest)
    first = np.searchsorted(lefts[:indexed], reach)
    stop = np.searchsorted(lefts[:indexed], x2)
    for s in range(first, stop):
        j = members[s]
        if boxes[j, 3] <= x1 or boxes[j, 0] >= y2 or boxes[j, 2] <= y1:
            continue  # disjoint: IoU 0
        top = max(y1, boxes[j, 0])
        left = max(x1, boxes[j, 1])
        bottom = min(y2, boxes[j, 2])
        right = min(x2, boxes[j, 3])
        inter = max(bottom - top, 0.0) * max(right - left, 0.0)
        union = area[i] + area[j] - inter
        iou = inter / union if union > 0 else 0.0
        if not (iou <= iou_threshold):
            return True
    return False
