"""Draw a memory plan as the arena over time (``mixrt plan --png``).

Each tensor is a rectangle: across, the steps it is alive; up, the bytes it holds. A line
traces the bytes alive at each step, so the gap between that line and the top of the
rectangles is what the strategy wastes over the lower bound. Seeing the picture makes a bad
plan (a tall tower of long-lived tensors, a hole nobody fills) obvious at a glance.

matplotlib is imported inside ``draw_plan`` only: planning and running never need it, and it
is an extra (``mixrt[plot]``), which the drawing asks for where it is missing.
"""

from __future__ import annotations

from pathlib import Path

from mixrt.base.errors import missing_dependency
from mixrt.runtime.memory import MemoryPlan, live_bytes_per_step
from mixrt.runtime.memory_report import plan_report

_MIB = 1 << 20
_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7",
            "#9c755f")
_INPLACE_EDGE = "#d62728"


def draw_plan(plan: MemoryPlan, path, title: str | None = None) -> Path:
    """Write a PNG of ``plan`` to ``path`` and return the path."""
    try:
        import matplotlib  # noqa: PLC0415  (heavy, and only the plotting command wants it)
    except ImportError as exc:
        raise missing_dependency("mixrt plan --png", "matplotlib", "plot") from exc
    matplotlib.use("Agg", force=True)  # files only: never open a window, work without a display
    from matplotlib import pyplot  # noqa: PLC0415
    from matplotlib.collections import PatchCollection  # noqa: PLC0415
    from matplotlib.patches import Rectangle  # noqa: PLC0415

    figure, axes = pyplot.subplots(figsize=(12, 6), dpi=100)
    try:
        rectangles, edges = _tensor_rectangles(plan, Rectangle)
        axes.add_collection(PatchCollection(
            rectangles, facecolors=[r.get_facecolor() for r in rectangles],
            edgecolors=edges, linewidths=0.4))
        _draw_live_line(axes, plan)
        axes.axhline(plan.arena_bytes / _MIB, color="black", linewidth=0.8, linestyle="--",
                     label="arena")
        _frame(axes, plan, title)
        figure.tight_layout()
        path = Path(path)
        figure.savefig(path, format="png")
    finally:
        pyplot.close(figure)
    return path


def _tensor_rectangles(plan: MemoryPlan, rectangle):
    """One rectangle per tensor with bytes; in-place outputs get a red edge so the chains
    that share a slot read as one."""
    written_in_place = {target for _, target in plan.inplace}
    rectangles, edges = [], []
    for index, life in enumerate(plan.lifetimes):
        if life.size == 0:
            continue
        offset = plan.offsets[life.name] / _MIB
        rectangles.append(rectangle((life.first, offset), life.last + 1 - life.first,
                                    life.size / _MIB,
                                    facecolor=_COLOURS[index % len(_COLOURS)]))
        edges.append(_INPLACE_EDGE if life.name in written_in_place else "white")
    return rectangles, edges


def _draw_live_line(axes, plan: MemoryPlan) -> None:
    steps, live = live_bytes_per_step(plan.lifetimes, plan.alignment)
    if not steps:
        return
    # a step function over [step, step + 1), matching the rectangles' extent
    xs = [*steps, steps[-1] + 1]
    ys = [v / _MIB for v in live]
    axes.stairs(ys, xs, color="black", linewidth=1.2, label="alive (lower bound at peak)")


def _frame(axes, plan: MemoryPlan, title: str | None) -> None:
    report = plan_report(plan)
    if title is None:
        title = (f"{plan.strategy}: arena {report['arena_bytes'] / _MIB:.2f} MiB, "
                 f"lower bound {report['lower_bound_bytes'] / _MIB:.2f} MiB, "
                 f"naive {report['naive_bytes'] / _MIB:.2f} MiB")
    axes.set_title(title)
    axes.set_xlabel("step (node in schedule order)")
    axes.set_ylabel("arena offset (MiB)")
    if plan.lifetimes:
        axes.set_xlim(min(life.first for life in plan.lifetimes),
                      max(life.last for life in plan.lifetimes) + 1)
    top = max(plan.arena_bytes, plan.lower_bound_bytes) / _MIB
    axes.set_ylim(0, top * 1.05 if top else 1)
    # outside the axes: inside, it would hide the top of the arena, where the waste shows
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
