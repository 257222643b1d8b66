"""The depthwise forms' cost model (``depthwise_costs``) fitted on the machine that runs it.

Each form's modelled time for one plane is a sum of counts of its work (vectors of a row,
outputs past whole vectors, cells of the padded plane copied, a plane's setup; see
``depthwise_costs``) weighed by nanoseconds per unit. The weights shipped were fitted on an
AMD EPYC; on the 2-core Xeon these notes were measured on they picked a form more than 10%
slower than the fastest at 17 of 30 narrow geometries (``benchmarks/depthwise_forms.py``),
the channels form over a 6 x 96 x 144 x 48 stride-2 layer 2,938 us where the row form took
1,577. What each unit costs is the machine's (its vector units, its caches, how it handles
a masked or scalar remainder), so the weights are measured here: every form timed on one
thread at a fixed set of geometries (``depthwise_timing``: kernels 3, 5 and 7, strides 1
and 2, outputs from 3 x 3 to 60 x 120), then each form's weights fitted by non-negative
least squares on the relative error (a large plane's microseconds do not drown a small
one's) by :func:`fit`, and kept in the cache, one file per CPU (:func:`path`, :func:`save`);
``depthwise_costs`` reads that file where it exists and the shipped weights where it does
not.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
from pathlib import Path

import numpy as np

FORMS = ("rows", "blocks", "channels", "flat")
# each form's units, in the order of its weights (``depthwise_costs`` names them)
UNITS = {
    "rows": ("four_vectors_fit", "four_vectors_spill", "vector_fit", "vector_spill",
             "scalar_fit", "scalar_spill", "copy"),
    "blocks": ("vector_fit", "vector_spill", "copy", "plane"),
    "channels": ("tap", "copy_in", "copy_out"),
    "flat": ("vector", "copy", "plane"),
}
def features(form: str, kernel: tuple, strides: tuple, dilations: tuple, out_dims: tuple,
             lanes: int, fits: bool) -> np.ndarray:
    """The counts of ``form``'s units of work for one plane (``UNITS[form]``'s order):
    ``lanes`` values to a vector, ``fits`` whether the kernel's weights fit the registers
    beside the row loop's own."""
    (oh, ow), taps = out_dims, kernel[0] * kernel[1]
    hp, wp = padded(kernel, strides, dilations, out_dims)
    if form == "rows":
        fours, rest = divmod(ow, 4 * lanes)
        work = [oh * taps * fours, oh * taps * (rest // lanes), oh * taps * (rest % lanes)]
        split = [(value, 0) if fits else (0, value) for value in work]
        return np.array([*itertools.chain.from_iterable(split), hp * wp], float)
    if form == "channels":
        return np.array([taps * oh * ow, hp * wp, oh * ow], float) / lanes
    vectors = -(-oh * -(-wp // strides[1]) // lanes)
    if form == "blocks":
        return np.array([taps * vectors if fits else 0, 0 if fits else taps * vectors,
                         hp * wp, 1], float)
    return np.array([taps * vectors, hp * wp, 1], float)  # flat


def padded(kernel, strides, dilations, out_dims) -> tuple:
    """The padded plane as far as the last window reaches."""
    (oh, ow), (sh, sw), (dh, dw) = out_dims, strides, dilations
    return (oh - 1) * sh + (kernel[0] - 1) * dh + 1, (ow - 1) * sw + (kernel[1] - 1) * dw + 1


def fit(samples: list) -> dict:
    """Each form's weights from ``samples`` of (form, its features, nanoseconds a plane):
    the non-negative weights whose modelled times are closest in relative error. A unit
    that none of a form's samples exercise keeps a weight of zero (those samples say
    nothing of it)."""
    found = {}
    for form in FORMS:
        rows = [(x, ns) for f, x, ns in samples if f == form]
        if not rows:
            continue
        a = np.array([x / ns for x, ns in rows])  # each row scaled by its time: relative
        found[form] = _nonnegative_least_squares(a, np.ones(len(rows)))
    return found


def _nonnegative_least_squares(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a w - b| over w >= 0, by trying every set of free weights (at most seven
    units a form: 127 small least-squares problems), the units no sample uses held at zero."""
    used = [j for j in range(a.shape[1]) if np.any(a[:, j] != 0)]
    best, best_error = np.zeros(a.shape[1]), float(np.sum(b * b))
    for size in range(1, len(used) + 1):
        for free in itertools.combinations(used, size):
            w, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if np.any(w < 0):
                continue
            error = float(np.sum((a[:, free] @ w - b) ** 2))
            if error < best_error:
                best_error, best = error, np.zeros(a.shape[1])
                best[list(free)] = w
    return best


# -- kept per CPU ---------------------------------------------------------------------------------

def path(cache_dir: Path, cpu: str) -> Path:
    """Where a CPU's weights are kept in ``cache_dir``."""
    return Path(cache_dir) / "depthwise_costs" / f"{_safe(cpu)}.json"


def save(weights: dict, where: Path) -> None:
    """``weights`` (form -> array) written at ``where`` whole or not at all."""
    where.parent.mkdir(parents=True, exist_ok=True)
    partial = where.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({form: [float(v) for v in w] for form, w in weights.items()}))
    os.replace(partial, where)


def load(where: Path) -> dict | None:
    """The weights kept at ``where``, or None where there are none or they are not whole (a
    form's weights of the wrong count, a value that is not a non-negative number)."""
    try:
        kept = json.loads(Path(where).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or set(kept) != set(FORMS):
        return None
    found = {}
    for form, values in kept.items():
        if not isinstance(values, list) or len(values) != len(UNITS[form]) or not all(
                isinstance(v, (int, float)) and v >= 0 and np.isfinite(v) for v in values):
            return None
        found[form] = np.array(values, float)
    return found


def cpu_label() -> str:
    """The CPU's model name (``/proc/cpuinfo``), which names its weights' file: a cache
    copied to another kind of machine does not lend it this one's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "cpu"
