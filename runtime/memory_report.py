"""A memory plan in numbers and words: the arena against the naive sum and the lower bound
(``mixrt run --memory-plan``, ``TrainingProgram.memory_report``, the plan plots)."""

from __future__ import annotations

from mixrt.runtime.memory import MemoryPlan

_MIB = 1 << 20


def plan_report(plan: MemoryPlan, imported_naive: int | None = None) -> dict:
    """The plan's figures as JSON-ready values (what ``mixrt plan --json`` prints).
    ``imported_naive``: naive bytes of the model as imported (opt_level 0), the MXNet
    paper's baseline, when the caller planned that graph too."""
    arena, lower = plan.arena_bytes, plan.lower_bound_bytes
    extra = {} if imported_naive is None else {
        "naive_as_imported_bytes": imported_naive,
        "naive_as_imported_over_arena": round(imported_naive / arena, 4) if arena else 1.0}
    return extra | {
        "strategy": plan.strategy,
        "arena_bytes": arena,
        "naive_bytes": plan.naive_bytes,
        "lower_bound_bytes": lower,
        "tensors": len(plan.lifetimes),
        "inplace": len(plan.inplace),
        # in-place writes can beat the lower bound, so this may be below 1
        "ratio_to_lower_bound": round(arena / lower, 4) if lower else 1.0,
        "naive_over_arena": round(plan.naive_bytes / arena, 4) if arena else 1.0,
    }


def format_report(plan: MemoryPlan, imported_naive: int | None = None) -> str:
    """The plan's figures for a person (what ``mixrt plan`` prints)."""
    report = plan_report(plan, imported_naive)
    lines = [
        f"memory plan: {report['strategy']}, {plan.alignment}-byte alignment",
        f"  tensors      {report['tensors']:>10}   ({report['inplace']} written in place)",
        f"  arena        {_mib(report['arena_bytes'])}",
        f"  lower bound  {_mib(report['lower_bound_bytes'])}",
        f"  naive        {_mib(report['naive_bytes'])}",
        f"  arena / lower bound {report['ratio_to_lower_bound']:.3f}   "
        f"naive / arena {report['naive_over_arena']:.2f}",
    ]
    if imported_naive is not None:
        lines.append(f"  naive, model as imported {imported_naive / _MIB:.2f} MiB "
                     f"({imported_naive} bytes)   naive as imported / arena "
                     f"{report['naive_as_imported_over_arena']:.2f}")
    return "\n".join(lines)


def _mib(size: int) -> str:
    return f"{size / _MIB:>10.2f} MiB  ({size} bytes)"
