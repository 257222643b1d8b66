"""NonMaxSuppression's selection on the host (``ops/image/image.non_max_suppression``).

Per (batch, class) row: the candidates scoring at least ``score_threshold``, best first (a
stable sort: equal scores in index order, as onnxruntime breaks ties), each kept unless a
box kept before it has IoU > ``iou_threshold`` with it, at most ``limit`` kept. The compiled
tier runs that greedy walk in ``ops/image/_jit_nms.py``. The NumPy tier never walks box by box:

* it finds the pairs that can suppress each other at all (boxes overlapping along x, by a
  sweep over the boxes sorted by their left edge; others have IoU 0) and their IoUs at once;
* the greedy choice is then the unique solution of "kept[b] = no kept a before b suppresses
  b", a triangular system, solved by repeating that update over all pairs until nothing
  changes (each pass settles at least the next undecided box; chains of suppressions are
  short in practice, so a few passes).

A negative threshold (disjoint boxes suppress too) or NaN coordinates take the plain form:
one vectorised IoU of each kept box against the remaining candidates.
"""

from __future__ import annotations

import numpy as np

from mixrt.base import run_options
from mixrt.ops.compiled import jit_cpu

_PAIR_BLOCK = 1 << 21  # candidate pairs measured at once (bounds the sweep's memory)


def corners(boxes, center_point_box):
    """[B, N, 4] boxes as (y_min, x_min, y_max, x_max) float64, whatever corner order or
    format they came in."""
    boxes = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    y1, x1, y2, x2 = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2),
                     np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def areas(boxes):
    with np.errstate(invalid="ignore"):  # a NaN or infinite corner: a NaN area, no overlap
        return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def select_all(boxes, scores, limit, iou_threshold, score_threshold):
    """[K, 3] int64 rows (batch, class, box) of the kept boxes: batches, then classes, then
    best score first. boxes [B, N, 4] corners float64, scores [B, C, N]."""
    batches, classes, count = scores.shape
    if limit <= 0 or count == 0 or batches * classes == 0:
        return np.zeros((0, 3), dtype=np.int64)
    flat = scores.reshape(batches * classes, count).astype(np.float64)
    orders = np.argsort(-flat, axis=1, kind="stable")
    if score_threshold is None:
        counts = np.full(len(flat), count, dtype=np.int64)
    else:  # NaN scores sort last and never pass the threshold
        counts = (flat >= score_threshold).sum(axis=1)
    row_batches = np.repeat(np.arange(batches, dtype=np.int64), classes)
    box_areas = areas(boxes)
    kernels = _compiled()
    if kernels is not None:
        kept = np.empty((len(flat), min(limit, count)), dtype=np.int64)
        found = kernels.select_rows(boxes, box_areas, orders, counts, row_batches,
                                    limit, iou_threshold, kept)
        picks = [kept[r, :found[r]] for r in range(len(flat))]
    else:
        picks = [_select_row(boxes[row_batches[r]], box_areas[row_batches[r]],
                             orders[r, :counts[r]], limit, iou_threshold)
                 for r in range(len(flat))]
    return _rows(picks, classes)


def _compiled():
    """ops/image/_jit_nms.py where it may run (the compiled tier on), else None."""
    if not jit_cpu.enabled():
        return None
    return jit_cpu.load("mixrt.ops.image._jit_nms")


def _rows(picks, classes):
    sizes = np.array([len(p) for p in picks], dtype=np.int64)
    if not sizes.sum():
        return np.zeros((0, 3), dtype=np.int64)
    row = np.repeat(np.arange(len(picks), dtype=np.int64), sizes)
    return np.stack([row // classes, row % classes, np.concatenate(picks)], axis=1)


def _select_row(boxes, box_areas, order, limit, iou_threshold):
    """Kept box indices of one row, best first; ``order`` its candidates by score."""
    if len(order) == 0:
        return order
    ranked, ranked_areas = boxes[order], box_areas[order]
    if iou_threshold < 0 or np.isnan(ranked).any():
        kept = _greedy_by_kept_box(ranked, ranked_areas, limit, iou_threshold)
    else:
        first, second = _overlapping_pairs(ranked, ranked_areas, iou_threshold)
        kept = np.flatnonzero(_settle(len(order), first, second))[:limit]
    return order[kept]


def _iou_rows(boxes, box_areas, a, b):
    """IoU of boxes[a] with boxes[b], pairwise (the compiled kernel's formula)."""
    top = np.maximum(boxes[a, 0], boxes[b, 0])
    left = np.maximum(boxes[a, 1], boxes[b, 1])
    bottom = np.minimum(boxes[a, 2], boxes[b, 2])
    right = np.minimum(boxes[a, 3], boxes[b, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    union = box_areas[a] + box_areas[b] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _overlapping_pairs(ranked, ranked_areas, iou_threshold):
    """(earlier, later) ranks of every pair with IoU > threshold. Only boxes overlapping
    along x can have any: sweeping the boxes in order of their left edge, box p pairs with
    the boxes after it that start before it ends."""
    by_left = np.argsort(ranked[:, 1], kind="stable")
    columns = ranked[by_left].T.copy()  # y1, x1, y2, x2, each contiguous in left-edge order
    box_areas = ranked_areas[by_left]
    ends = np.searchsorted(columns[1], columns[3], side="left")
    spans = np.maximum(ends - np.arange(len(by_left)) - 1, 0)
    firsts, seconds = [], []
    for start, stop in _blocks(spans):
        run_options.check()  # a block of pairs at a time: a huge input's run has limits
        a, b = _sweep_pairs(spans, start, stop)
        a, b = _pairs_over(columns, box_areas, a, b, iou_threshold)
        a, b = by_left[a], by_left[b]
        firsts.append(np.minimum(a, b))
        seconds.append(np.maximum(a, b))
    if not firsts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(firsts), np.concatenate(seconds)


def _sweep_pairs(spans, start, stop):
    """Pairs (p, q) for p in start..stop-1 and q = p+1 .. p+spans[p]."""
    counts = spans[start:stop]
    a = np.repeat(np.arange(start, stop), counts)
    before = np.cumsum(counts) - counts  # pairs of the boxes before p in this block
    b = np.arange(len(a)) + np.repeat(np.arange(start, stop) + 1 - before, counts)
    return a, b


def _pairs_over(columns, box_areas, a, b, iou_threshold):
    """The pairs (a, b) of the sweep (b starts within a along x) with IoU > threshold;
    those disjoint along y are dropped first (IoU 0, cheaper to tell)."""
    y1, x1, y2, x2 = columns
    near = (y1[b] < y2[a]) & (y1[a] < y2[b])
    a, b = a[near], b[near]
    top = np.maximum(y1[a], y1[b])
    left = np.maximum(x1[a], x1[b])
    bottom = np.minimum(y2[a], y2[b])
    right = np.minimum(x2[a], x2[b])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    union = box_areas[a] + box_areas[b] - inter
    iou = np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)
    hit = ~(iou <= iou_threshold)
    return a[hit], b[hit]


def _blocks(spans):
    """Ranges of boxes whose pairs number about _PAIR_BLOCK together."""
    totals = np.cumsum(spans)
    start = 0
    while start < len(spans):
        done = totals[start - 1] if start else 0
        stop = int(np.searchsorted(totals, done + _PAIR_BLOCK, side="right"))
        stop = max(stop, start + 1)
        if totals[stop - 1] > done:
            yield start, stop
        start = stop


def _settle(count, first, second):
    """kept[b] = no kept a < b with a pair (a, b), solved by repeated passes (the system is
    triangular, so its solution is unique and a pass that changes nothing has reached it)."""
    kept = np.ones(count, dtype=bool)
    while True:
        suppressed = np.zeros(count, dtype=bool)
        suppressed[second[kept[first]]] = True
        settled = ~suppressed
        if np.array_equal(settled, kept):
            return kept
        kept = settled


def _greedy_by_kept_box(ranked, ranked_areas, limit, iou_threshold):
    """The plain greedy walk, one vectorised step per kept box: ranks of the kept boxes."""
    alive = np.arange(len(ranked))
    kept = []
    while len(alive) and len(kept) < limit:
        run_options.check()
        best, alive = alive[0], alive[1:]
        kept.append(best)
        iou = _iou_rows(ranked, ranked_areas, np.full(len(alive), best), alive)
        alive = alive[iou <= iou_threshold]
    return np.asarray(kept, dtype=np.int64)
