"""The depthwise convolution's size-free forms at random geometries: the row form and the
block form timed one thread each, against the pick of ``ops/conv/depthwise_costs.py``.
With ``--narrow``, outputs the flat form can take (at most ``FLAT_MAX_WIDTH`` wide): the
flat and channels forms timed too, against ``small_plane_form``'s pick among all four.

    python benchmarks/depthwise_forms.py [--seed S] [--points N] [--narrow] [--out F.json]

Geometries are drawn from wide ranges on every run (kernels 3-7, strides 1-2, planes 3-120
a side, 16-960 channels, 1-8 images; float32, one of the activations the kernels apply),
seeded per run and printed, so the model meets shapes it was not fitted on. Each form is
timed on the same arrays (the fastest of 10-60 calls after one untimed), and the
two outputs must be the same bits. Reports the total time of the model's picks against
the faster form of each point and against the row form alone (what took every size before
the model), and the points where the pick was more than 10% slower than the other form.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("MIXRT_NATIVE_POOL", "0")  # one thread: the forms' own work

import numpy as np  # noqa: E402

from mixrt.ops.conv import depthwise_calibration, depthwise_costs, depthwise_table  # noqa: E402


def draw(rng, narrow: bool = False) -> dict | None:
    """One geometry, or None where its image is empty or too large to time quickly (the
    calibration's draw, ``ops/conv/depthwise_calibration.py``)."""
    return depthwise_calibration.draw(rng, narrow=narrow)


def measure(point: dict, rng, narrow: bool = False) -> dict:
    """The row and block forms' times at ``point`` (with ``narrow``, the flat and channels
    forms' too, ``depthwise_calibration.measure``), and the model's pick."""
    result = depthwise_calibration.measure(point, rng, narrow)
    window = ((point["kernel"],) * 2, (point["stride"],) * 2, (1, 1))
    out = tuple(point["out"])
    free = "blocks" if depthwise_costs.blocks_cheaper(*window, out, 4) else "rows"
    result["picked"] = free
    if narrow:
        form = depthwise_costs.small_plane_form(*window, out, 4, True)
        result["picked"] = free if form == "free" else form
        # the rule before small_plane_form: the channels form against the flat form alone
        channels_before = depthwise_costs.channels_ns(*window, out, 4) \
            < depthwise_costs.flat_ns(*window, out, 4)
        result["picked_before"] = "channels" if channels_before else "flat"
    return result


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
    parser.add_argument("--shipped", action="store_true",
                        help="the model's shipped weights, not this machine's")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (--seed {seed} draws the same geometries again)", flush=True)
    if args.shipped:
        depthwise_costs.use(depthwise_table.SHIPPED)
    measured = depthwise_costs.weights() is not depthwise_table.SHIPPED
    print("the model's weights: " + ("this machine's (python -m "
          "mixrt.ops.conv.depthwise_calibration)" if measured else "the shipped ones"))
    rng = np.random.default_rng(seed)
    points = []
    while len(points) < args.points:
        point = draw(rng, args.narrow)
        if point is not None:
            points.append(point)
    results = [measure(point, rng, args.narrow) for point in _progress(points, len(points))]
    print(report_narrow(results) if args.narrow else report(results))
    weighed = {"this machine's": depthwise_costs.weights(), "the shipped": depthwise_table.SHIPPED}
    print(", ".join(f"{name} weights' picks "
                    f"{depthwise_calibration.picks_us(results, table, args.narrow) / 1e3:.1f} ms"
                    for name, table in weighed.items()))
    if args.out:
        with open(args.out, "w") as out:
            json.dump({"seed": seed, "points": results}, out, indent=1)


if __name__ == "__main__":
    main()
