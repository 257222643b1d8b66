"""The depthwise convolution's size-free forms at random geometries: the row form and the
block form timed one thread each, against the pick of ``ops/conv/depthwise_costs.py``.
With ``--narrow``, outputs the flat form can take (at most ``FLAT_MAX_WIDTH`` wide): the
flat and channels forms timed too, against ``small_plane_form``'s pick among all four.

    python benchmarks/depthwise_forms.py [--seed S] [--points N] [--narrow] [--out F.json]

Geometries are drawn from wide ranges on every run (kernels 3-7, strides 1-2, planes 3-120
a side, 16-960 channels, 1-8 images; float32, one of the activations the kernels apply),
seeded per run and printed, so the model meets shapes it was not fitted on. Each form is
timed on the same arrays (a quarter-quantile of up to 40 calls after one untimed), and the
two outputs must be the same bits. Reports the total time of the model's picks against
the faster form of each point and against the row form alone (what took every size before
the model), and the points where the pick was more than 10% slower than the other form.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("MIXRT_NATIVE_POOL", "0")  # one thread: the forms' own work

import numpy as np  # noqa: E402

from mixrt.ops.conv import depthwise_costs  # noqa: E402
from mixrt.ops.conv import jit_depthwise  # noqa: E402
from mixrt.ops.conv import jit_depthwise_channels  # noqa: E402
from mixrt.ops.conv import jit_grouped_blocks as grouped_blocks  # noqa: E402
from mixrt.ops.conv.depthwise_common import activation_constants  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners import call_seconds  # noqa: E402


def draw(rng, narrow: bool = False) -> dict | None:
    """One geometry, or None where its image is empty or too large to time quickly."""
    kernel = int(rng.choice([3, 3, 5, 5, 7]))
    point = dict(kernel=kernel, stride=int(rng.choice([1, 1, 2])),
                 activation=str(rng.choice(["Relu", "HardSwish", ""])),
                 height=int(rng.integers(3, 121)), width=int(rng.integers(3, 121)),
                 channels=int(rng.choice([16, 24, 32, 48, 72, 96, 120, 144, 240, 288, 480,
                                          576, 960])),
                 images=int(rng.choice([1, 1, 2, 3, 4, 8])))
    pad = kernel // 2
    point["out"] = [(side + 2 * pad - kernel) // point["stride"] + 1
                    for side in (point["height"], point["width"])]
    planes = point["images"] * point["channels"]
    if min(point["out"]) < 1 or planes * point["height"] * point["width"] > 4_000_000:
        return None
    if narrow and point["out"][1] > jit_depthwise.FLAT_MAX_WIDTH:
        return None
    return point


def _quarter_us(call, reps: int) -> float:
    """The quarter-quantile of ``reps`` calls' times, after one untimed: the form's time
    with the host's stalls mostly left out."""
    times = sorted(call_seconds(call, reps))
    return times[len(times) // 4] * 1e6


def measure(point: dict, rng, narrow: bool = False) -> dict:
    """The row and block forms' times at ``point`` (with ``narrow``, the flat and channels
    forms' too), and the model's pick."""
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
    reps = max(5, min(40, int(2e7 / (planes * oh * ow * k * k + 1))))
    times = {form: _quarter_us(call, reps) for form, call in calls.items()}
    if any(not np.array_equal(outputs["rows"], out) for out in outputs.values()):
        raise AssertionError(f"the forms' bits differ at {point}")
    blocks_picked = depthwise_costs.blocks_cheaper(*window, (oh, ow), 4)
    free = "blocks" if blocks_picked else "rows"
    result = {**point, **{f"{form}_us": t for form, t in times.items()}, "picked": free}
    if narrow:
        form = depthwise_costs.small_plane_form(*window, (oh, ow), 4, True)
        result["picked"] = free if form == "free" else form
        # the rule before small_plane_form: the channels form against the flat form alone
        channels_before = depthwise_costs.channels_ns(*window, (oh, ow), 4) \
            < depthwise_costs.flat_ns(*window, (oh, ow), 4)
        result["picked_before"] = "channels" if channels_before else "flat"
    return result


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


def _progress(items, total: int):
    if not sys.stderr.isatty():
        return items
    from tqdm import tqdm  # noqa: PLC0415
    return tqdm(items, total=total, desc="geometries", unit="point")


def report_narrow(results: list) -> str:
    """The narrow planes' totals: the model's picks among the four forms, its picks before
    (the channels form or the flat form), the fastest form of each point."""
    forms = ("rows", "blocks", "flat", "channels")
    picked = sum(r[f"{r['picked']}_us"] for r in results)
    before = sum(r[f"{r['picked_before']}_us"] for r in results)
    fastest = sum(min(r[f"{f}_us"] for f in forms) for r in results)
    off = [r for r in results if r[f"{r['picked']}_us"] > 1.1 * min(r[f"{f}_us"] for f in forms)]
    lines = [f"{len(results)} narrow geometries: the model's picks {picked / 1e3:.1f} ms, "
             f"channels or flat as before {before / 1e3:.1f} ms, the fastest form of each "
             f"{fastest / 1e3:.1f} ms; picks more than 10% slower than the fastest: {len(off)}"]
    for r in off:
        times = ", ".join(f"{f} {r[f'{f}_us']:.1f}" for f in forms)
        lines.append(f"  {r['images']}x{r['channels']}x{r['height']}x{r['width']} "
                     f"k{r['kernel']} s{r['stride']} -> {r['out'][0]}x{r['out'][1]}: "
                     f"{times} us, picked {r['picked']}")
    return "\n".join(lines)


def report(results: list) -> str:
    picked = sum(r[f"{r['picked']}_us"] for r in results)
    fastest = sum(min(r["rows_us"], r["blocks_us"]) for r in results)
    rows = sum(r["rows_us"] for r in results)
    off = [r for r in results
           if r[f"{r['picked']}_us"] > 1.1 * min(r["rows_us"], r["blocks_us"])]
    lines = [f"{len(results)} geometries: the model's picks {picked / 1e3:.1f} ms, the faster "
             f"form of each {fastest / 1e3:.1f} ms, the row form alone {rows / 1e3:.1f} ms; "
             f"picks more than 10% slower than the other form: {len(off)}"]
    for r in off:
        lines.append(f"  {r['images']}x{r['channels']}x{r['height']}x{r['width']} "
                     f"k{r['kernel']} s{r['stride']} -> {r['out'][0]}x{r['out'][1]}: rows "
                     f"{r['rows_us']:.1f} us, blocks {r['blocks_us']:.1f} us, picked "
                     f"{r['picked']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--points", type=int, default=60)
    parser.add_argument("--narrow", action="store_true",
                        help="outputs the flat form takes: all four forms timed")
    parser.add_argument("--out", default=None, help="write the points as JSON here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (--seed {seed} draws the same geometries again)", flush=True)
    rng = np.random.default_rng(seed)
    points = []
    while len(points) < args.points:
        point = draw(rng, args.narrow)
        if point is not None:
            points.append(point)
    results = [measure(point, rng, args.narrow) for point in _progress(points, len(points))]
    print(report_narrow(results) if args.narrow else report(results))
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"seed": seed, "points": results}, out, indent=1)


if __name__ == "__main__":
    main()
