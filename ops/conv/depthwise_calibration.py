"""This machine's weights for the depthwise convolution's cost model (``depthwise_costs.py``):
the four forms timed on reference geometries, one thread, and each form's weights fitted to
its times (``depthwise_table.py`` keeps them).

    python -m mixrt.ops.conv.depthwise_calibration [--points N] [--seed S]

``Session.wait_compiled`` runs it in a process of its own, once per machine (and whenever
the forms' kernels change), for a model with depthwise convolutions, after the compile
child is done, so that the times are the forms' alone (``runtime/machine_weights.py``).

The reference geometries are drawn from wide ranges (kernels 3-7, strides 1-2, planes 3-120
a side and, for the size-free forms' wide rows, up to 240 wide; 16-960 channels, 1-8 images)
with a fixed seed: the same ones on every machine, none of them a network's. A form's time
per plane is a sum of its counted operations, each weighed (``depthwise_costs``'s ``*_ns``):
the weights are the non-negative least-squares fit of those counts to the times, each time
weighed by its inverse so that small planes count as much as large ones. On a 2-core EPYC
(2026-12-04), weights fitted on 40 random narrow geometries picked forms that took 15.8 ms
over 40 others (the fastest form of each 13.6, the shipped weights' picks 20.3), and
26.8 ms over the first 40 when fitted on the second (25.4, 28.5).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: calibrations are not kept apart
    fcntl = None

from mixrt.ops.conv import depthwise_costs, depthwise_table, jit_depthwise
from mixrt.ops.conv import jit_depthwise_channels
from mixrt.ops.conv import jit_grouped_blocks as grouped_blocks
from mixrt.ops.conv.depthwise_common import activation_constants

NARROW_POINTS, WIDE_POINTS = 24, 8  # reference geometries the flat form takes, and wider
SEED = 20261204
MAX_CELLS = 2_000_000  # input cells of a reference geometry at most (its forms' times ~1 ms)
FORMS = ("rows", "blocks", "flat", "channels")


# -- geometries ------------------------------------------------------------------------------

def draw(rng, narrow: bool = False, wide: bool = False, cells: int = 4_000_000) -> dict | None:
    """One geometry (kernel, stride, activation, input plane, channels, images and its
    output size), or None where its output is empty or its input past ``cells``;
    ``narrow``: an output the flat form takes (at most ``FLAT_MAX_WIDTH`` wide); ``wide``:
    one past it, up to 240 wide."""
    kernel = int(rng.choice([3, 3, 5, 5, 7]))
    point = dict(kernel=kernel, stride=int(rng.choice([1, 1, 2])),
                 activation=str(rng.choice(["Relu", "HardSwish", ""])),
                 height=int(rng.integers(3, 121)),
                 width=int(rng.integers(70, 241) if wide else rng.integers(3, 121)),
                 channels=int(rng.choice([16, 24, 32, 48, 72, 96, 120, 144, 240, 288, 480,
                                          576, 960])),
                 images=int(rng.choice([1, 1, 2, 3, 4, 8])))
    pad = kernel // 2
    point["out"] = [(side + 2 * pad - kernel) // point["stride"] + 1
                    for side in (point["height"], point["width"])]
    planes = point["images"] * point["channels"]
    if min(point["out"]) < 1 or planes * point["height"] * point["width"] > cells:
        return None
    too_wide = point["out"][1] > jit_depthwise.FLAT_MAX_WIDTH
    if (narrow and too_wide) or (wide and not too_wide):
        return None
    return point


def reference_points(narrow: int = NARROW_POINTS, wide: int = WIDE_POINTS,
                     seed: int = SEED) -> list[dict]:
    """The calibration's geometries: ``narrow`` the flat form takes, ``wide`` past it."""
    rng = np.random.default_rng(seed)
    points = []
    for count, kind in ((narrow, {"narrow": True}), (wide, {"wide": True})):
        made = 0
        while made < count:
            point = draw(rng, cells=MAX_CELLS, **kind)
            if point is not None:
                points.append(point)
                made += 1
    return points


# -- timing the forms ------------------------------------------------------------------------

def fastest_us(call, reps: int) -> float:
    """The fastest of ``reps`` calls after one untimed, in microseconds: the form's own
    time, the host's stalls left out (a form's work is the same on every call; the
    quarter-quantile, used before, let a busy neighbour's stalls into some forms' times
    and not others', and two calibrations of one machine picked forms 2.5 ms apart over
    40 geometries)."""
    call()
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def measure(point: dict, rng, narrow: bool | None = None) -> dict:
    """The forms' times at ``point`` (``{form}_us``): the row and block forms always, the
    flat and channels forms where the output is narrow enough for the flat form
    (``narrow``, by default from the point's width); their outputs must be the same bits."""
    if narrow is None:
        narrow = point["out"][1] <= jit_depthwise.FLAT_MAX_WIDTH
    k, s, name = point["kernel"], point["stride"], point["activation"]
    planes, (oh, ow) = point["images"] * point["channels"], point["out"]
    x = rng.standard_normal((planes, point["height"], point["width"])).astype(np.float32)
    weights = rng.standard_normal((point["channels"], k * k)).astype(np.float32)
    bias = rng.standard_normal(point["channels"]).astype(np.float32)
    constants = activation_constants(name, [], np.float32)
    window = ((k, k), (s, s), (1, 1))
    hp, wp = (oh - 1) * s + k, (ow - 1) * s + k
    rows = jit_depthwise._compiled(*window, name)
    blocks = grouped_blocks.module(*window, name, 1)
    cells = grouped_blocks.cells(*window, 1, (oh, ow), 4)
    outputs = {form: np.empty((planes, oh, ow), np.float32) for form in ("rows", "blocks")}
    pad = k // 2
    calls = {
        "rows": lambda: rows.run(x, weights, bias, outputs["rows"], constants, 1,
                                 point["channels"], pad, pad, 0, planes,
                                 np.empty((hp, wp), np.float32)),
        "blocks": lambda: blocks.run(x, weights, bias, outputs["blocks"], constants, 1,
                                     point["channels"], pad, pad, 0, planes,
                                     np.empty((1, cells), np.float32)),
    }
    if narrow:
        calls.update(_narrow_calls(point, x, weights, bias, window, outputs))
    reps = max(10, min(60, int(4e7 / (planes * oh * ow * k * k + 1))))
    times = {form: fastest_us(call, reps) for form, call in calls.items()}
    if any(not np.array_equal(outputs["rows"], out) for out in outputs.values()):
        raise AssertionError(f"the depthwise forms' bits differ at {point}")
    return {**point, **{f"{form}_us": t for form, t in times.items()}}


def _narrow_calls(point, x, weights, bias, window, outputs) -> dict:
    """The flat form's and the channels form's calls at ``point``, writing into
    ``outputs``."""
    k, name, channels = point["kernel"], point["activation"], point["channels"]
    (oh, ow), images, pad = point["out"], point["images"], k // 2
    image = (point["height"], point["width"], pad, pad, oh, ow)
    text, cells = jit_depthwise._flat_text(*window, image, name, 1)
    flat = jit_depthwise._flat_module(text)
    constants = activation_constants(name, [], np.float32)
    planes = images * channels
    outputs["flat"] = np.empty((planes, oh, ow), np.float32)
    outputs["channels"] = np.empty((planes, oh, ow), np.float32)
    x4 = x.reshape(images, channels, *x.shape[1:])
    W = weights.reshape(channels, 1, k, k)
    return {
        "flat": lambda: flat.run(x, weights, bias, outputs["flat"], constants, 1, channels,
                                 pad, pad, 0, planes, np.empty((1, cells), np.float32)),
        "channels": lambda: jit_depthwise_channels.channels_conv(
            x4, W, bias, outputs["channels"].reshape(images, channels, oh, ow), *window,
            (pad, pad), None, (name, [])),
    }


# -- the fit ---------------------------------------------------------------------------------

def counts(point: dict, form: str, lanes: int) -> list[float]:
    """The operations of ``form`` on one plane of ``point`` (``depthwise_costs.counts``)."""
    k, s = point["kernel"], point["stride"]
    return depthwise_costs.counts(form, (k, k), (s, s), (1, 1), tuple(point["out"]), lanes)


def fit(results: list[dict], lanes: int) -> tuple[dict, dict]:
    """Each form's weights fitted to its times in ``results`` (:func:`measure`'s), the row
    and block forms' apart for kernels whose weights fit the registers and those that
    spill (``depthwise_costs._fits``); a set without points keeps the shipped weights.
    Returns the weights and, per set, the median relative error of the fit."""
    shipped = depthwise_table.SHIPPED
    weights = {"rows": {}, "blocks": {}}
    errors = {}
    for form in FORMS:
        kinds = ("fits", "spills") if form in weights else (None,)
        for kind in kinds:
            chosen = [r for r in results if f"{form}_us" in r and (
                kind is None or depthwise_costs._fits(r["kernel"] ** 2) == (kind == "fits"))]
            default = shipped[form] if kind is None else shipped[form][kind]
            found, error = _fitted(chosen, form, lanes, default)
            label = form if kind is None else f"{form} {kind}"
            errors[label] = error
            if kind is None:
                weights[form] = found
            else:
                weights[form][kind] = found
    return weights, errors


def _fitted(results: list[dict], form: str, lanes: int, default: list) -> tuple[list, float]:
    """Non-negative least squares of ``form``'s counts to its times per plane (relative
    errors), or ``default`` where there are fewer points than weights."""
    if len(results) < len(default) + 1:
        return list(default), float("nan")
    A = np.array([counts(r, form, lanes) for r in results], np.float64)
    y = np.array([r[f"{form}_us"] * 1e3 / (r["images"] * r["channels"]) for r in results])
    scale = 1.0 / y
    found = _nonnegative_fit(A * scale[:, None], y * scale)
    error = float(np.median(np.abs(A @ found - y) / y))
    return [round(float(v), 5) for v in found], error


def _nonnegative_fit(A, y) -> np.ndarray:
    """Least squares with every weight >= 0: the most negative weight left out until none
    is (an active set; the forms have three or four weights)."""
    active = list(range(A.shape[1]))
    found = np.zeros(A.shape[1])
    while active:
        solved, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if (solved >= 0).all():
            found[active] = solved
            break
        active.pop(int(np.argmin(solved)))
    return found


# -- the calibration -------------------------------------------------------------------------

def calibrate(points: list[dict] | None = None, progress=None) -> tuple[dict, dict]:
    """The forms timed at ``points`` (the reference geometries by default), their weights
    fitted and kept for this machine (``depthwise_table.write``); returns the weights and
    what was written beside them. Where weights fitted on half the points pick slower forms
    on the other half than the shipped weights do there (both halves in turn), the shipped
    weights are kept instead: a calibration the host's noise spoilt does not make the
    picks worse."""
    points = reference_points() if points is None else points
    rng = np.random.default_rng(SEED)
    results = []
    for point in points:
        results.append(measure(point, rng))
        if progress is not None:
            progress(len(results), len(points))
    lanes = depthwise_costs._lanes(4)
    weights, errors = fit(results, lanes)
    held_out = sum(picks_us(results[1 - half::2], fit(results[half::2], lanes)[0])
                   for half in (0, 1))
    shipped = picks_us(results, depthwise_table.SHIPPED)
    kept = "measured" if held_out < shipped else "shipped"
    about = {"made": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "points": len(results), "kept": kept, "median_relative_error": errors,
             # the forms the weights pick on each half, fitted on the other, against the
             # shipped weights' picks and the fastest form of each point (us in all)
             "picks_us": {"held_out": held_out, "shipped": shipped,
                          "fastest": sum(min(r[f"{f}_us"] for f in FORMS if f"{f}_us" in r)
                                         for r in results)},
             "cpu": depthwise_table._cpu_name(), "vector_bytes": lanes * 4,
             "results": results}  # the times fitted, for a look at what the weights came of
    if kept == "shipped":
        weights = depthwise_table.SHIPPED
    depthwise_table.write(depthwise_costs.machine_key(), weights, about)
    return weights, about


def picks_us(results: list[dict], weights: dict, four_forms: bool = True) -> float:
    """The time of the forms the model picks under ``weights`` at each of ``results``'
    points, as a node picks (the four forms where the output is narrow enough for the
    flat form, else the row or block form; the latter two only, without ``four_forms``),
    in microseconds."""
    before = depthwise_costs.weights()
    depthwise_costs.use(weights)
    try:
        total = 0.0
        for r in results:
            window = ((r["kernel"],) * 2, (r["stride"],) * 2, (1, 1), tuple(r["out"]), 4)
            narrow = four_forms and r["out"][1] <= jit_depthwise.FLAT_MAX_WIDTH
            form = depthwise_costs.small_plane_form(*window, True) if narrow else "free"
            if form == "free":
                form = "blocks" if depthwise_costs.blocks_cheaper(*window) else "rows"
            total += r[f"{form}_us"]
        return total
    finally:
        depthwise_costs.use(before)


@contextlib.contextmanager
def _machine_lock():
    """This machine's calibrations one at a time (two at once would time each other's
    work): an exclusive lock on a file beside the weights, where the platform has one."""
    path = depthwise_table.table_path(depthwise_costs.machine_key()).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as held:
        if fcntl is not None:
            fcntl.flock(held, fcntl.LOCK_EX)
        yield


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=None,
                        help="reference geometries in all (default: 16 narrow, 8 wide)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    points = None
    if args.points is not None or args.seed != SEED:
        total = NARROW_POINTS + WIDE_POINTS if args.points is None else args.points
        narrow = max(1, total * 2 // 3)
        points = reference_points(narrow, max(0, total - narrow), args.seed)
    shown = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        if shown:
            print(f"\rdepthwise forms timed at {done} of {total} geometries", end="",
                  file=sys.stderr, flush=True)

    with _machine_lock():
        if points is None and depthwise_table.read(depthwise_costs.machine_key()):
            return 0  # another process measured while this one waited for the lock
        weights, about = calibrate(points, progress)
    if shown:
        print(file=sys.stderr)
    print(f"depthwise weights for {about['cpu']} ({about['points']} geometries): "
          f"{depthwise_table.table_path(depthwise_costs.machine_key())}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MIXRT_NATIVE_POOL", "0")  # one thread: the forms' own work
    sys.exit(main())
