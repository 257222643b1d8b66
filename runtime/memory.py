"""The memory planner: one arena per device, an offset in it for every planned tensor.

(interface fixed by the lead; the strategies are being written)
"""

from __future__ import annotations

from dataclasses import dataclass, field

STRATEGIES = ("naive", "inplace", "sharing", "greedy")
ALIGNMENT = 64


@dataclass(frozen=True)
class TensorLife:
    """A tensor the planner places: ``size`` bytes, written at step ``first`` (the index of
    its producing node in the schedule; -1 for values that exist before the first node) and
    last read at step ``last`` (>= first)."""

    name: str
    size: int
    first: int
    last: int


@dataclass
class MemoryPlan:
    strategy: str
    arena_bytes: int
    naive_bytes: int
    lower_bound_bytes: int
    offsets: dict[str, int]  # tensor name -> byte offset in the arena (ALIGNMENT-aligned)
    lifetimes: list[TensorLife]  # what was planned, in the order given
    inplace: list[tuple[str, str]] = field(default_factory=list)  # honoured (input, output)
    signature: tuple = ()  # the input-shape signature the plan was made for (set by caller)


def plan_memory(lifetimes: list[TensorLife], strategy: str = "greedy",
                inplace_candidates: list[tuple[str, str]] = (),
                alignment: int = ALIGNMENT) -> MemoryPlan:
    raise NotImplementedError
