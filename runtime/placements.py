"""Where a plan's tensors go: the in-place pairing that places them in the smallest arena,
and, for a form's new sizes, the placement it kept (each tensor's offset as a function of
the sizes).

A service that sends a new sequence length per request gets a new plan per request, and
each plan placed its tensors again (``memory.plan_memory``'s greedy scan: ~0.2 ms of a
2-layer BERT's new length, ~0.5 ms of a 5-layer RoBERTa's). Yet the plans of one form
differ only in sizes: the same tensors, the same lifetimes, the same in-place pairs. So the
first placement of a form is kept as a *stacking*: for each group of tensors that share an
offset (a tensor, or an in-place chain), the groups alive with it that lay below it. A new
set of sizes then places each group, in the order of the kept offsets, just above the
highest of those below it:

    offset(g) = max(offset(b) + size(b) for b below g), or 0

Any two groups alive at one step lay one below the other in the kept placement, and the
lower one is placed first with its new size, so the new offsets never overlap whatever
the sizes are. Where the sizes grow alike (every tensor of a transformer over a longer
sequence, bar the attention scores) it is the kept placement, scaled; where they do not,
the arena may come out larger than a fresh placement's, and when it is more than
``SLACK`` above what the kept placement left over its own floor (the most bytes alive at
one step), the tensors are placed afresh and that placement kept instead.
"""

from __future__ import annotations

from mixrt.runtime.memory import (MemoryPlan, TensorLife, _groups, _overlapping, align,
                                  honour_inplace, plan_memory)

# how far above its floor a restacked arena may come, relative to the kept placement's own
# margin over its floor, before the tensors are placed afresh
SLACK = 1.10


def smallest_plan(lifetimes, strategy: str, inplace, pairing: str | None = None,
                  order: int | None = None,
                  stackings: dict | None = None) -> tuple[MemoryPlan, str]:
    """The planner places an in-place pair as one block of the input's size for both lives,
    so a shrinking pair (MaxPool over its input) can cost more than it saves: plan with all
    pairs, with same-size pairs only and with none, and keep the smallest arena; returns it
    and which pairing it took. ``pairing`` plans with that one alone: a new shape of a form
    planned from inference takes the pairing its discovered plan chose (the three placements
    were half of a 6-layer BERT's plan, ~3.5 ms a new length), placed by ``order`` (the
    greedy order that placed it: ``memory.plan_memory``), or with its kept placement
    (``stackings``: pairing -> its :class:`Stacking`, kept there) where that still fits."""
    sizes = {life.name: life.size for life in lifetimes}
    pairings = {"all": inplace,
                "same size": [(a, b) for a, b in inplace if sizes.get(a) == sizes.get(b)],
                "none": []}
    if pairing in pairings:
        kept = None if stackings is None or strategy != "greedy" else stackings.get(pairing)
        memory = None if kept is None else restack(kept, lifetimes, pairings[pairing])
        if memory is None:
            memory = plan_memory(lifetimes, strategy, pairings[pairing], order=order,
                                 checked=True)
            if stackings is not None and strategy == "greedy":
                stackings[pairing] = stacking_of(memory)
        return memory, pairing
    plans = [(plan_memory(lifetimes, strategy, inplace, checked=True), "all")]
    if len(pairings["same size"]) < len(inplace):
        plans.append((plan_memory(lifetimes, strategy, pairings["same size"], checked=True),
                      "same size"))
    if inplace:  # greedy by size can also place better without any pairs (DenseNet)
        plans.append((plan_memory(lifetimes, strategy, [], checked=True), "none"))
    return min(plans, key=lambda made: made[0].arena_bytes)


def stored_plan(stored, signature: tuple, lifetimes: list[TensorLife]) -> MemoryPlan | None:
    """The plan a compiled model carries for these very tensors, if any."""
    for memory in stored:
        if tuple(memory.signature) == signature and list(memory.lifetimes) == lifetimes:
            return memory
    return None


class Stacking:
    """A kept greedy placement, as :func:`restack` reads it (see the module's words)."""

    __slots__ = ("count", "pairs", "members", "order", "steps", "margin", "greedy_order",
                 "alignment")

    def __init__(self, count, pairs, members, order, steps, margin, greedy_order, alignment):
        self.count = count  # how many lives it placed
        self.pairs = pairs  # the in-place pairs it honoured
        self.members = members  # per group, its lives' indices
        self.order = order  # (group, the groups below it) by the kept offsets, lowest first
        self.steps = steps  # per step a life starts or ends at: (lives added, lives gone)
        self.margin = margin  # kept arena / most bytes alive at one step
        self.greedy_order = greedy_order  # memory.plan_memory's order that placed it
        self.alignment = alignment


def stacking_of(memory: MemoryPlan) -> Stacking | None:
    """The stacking of a greedy placement, or None where it cannot be kept: another
    strategy, a group of no bytes (placed nowhere, so nothing says what lies below it), or
    lifetimes too entangled to list each one's neighbours (a training step's)."""
    lives = memory.lifetimes
    if memory.strategy != "greedy" or not lives:
        return None
    alignment = memory.alignment
    sizes = [align(life.size, alignment) for life in lives]
    groups = _groups(list(lives), sizes, memory.inplace)
    if any(group.size == 0 for group in groups):
        return None
    neighbours = _overlapping(tuple(g.first for g in groups), tuple(g.last for g in groups))
    if neighbours is None:
        return None
    offsets = [memory.offsets[lives[group.members[0]].name] for group in groups]
    order = []
    for g in sorted(range(len(groups)), key=offsets.__getitem__):
        below = tuple(b for b in neighbours[g] if b != g
                      and offsets[b] + groups[b].size <= offsets[g])
        order.append((g, below))
    steps = _steps(lives)
    floor = _peak(steps, sizes)
    margin = memory.arena_bytes / floor if floor else 1.0
    return Stacking(len(lives), list(memory.inplace), [tuple(g.members) for g in groups],
                    tuple(order), steps, margin, memory.order, alignment)


def restack(stacking: Stacking, lifetimes: list[TensorLife],
            candidates: list[tuple[str, str]]) -> MemoryPlan | None:
    """The greedy plan of ``lifetimes`` (the kept form's lives, with new sizes) from the
    stacking, honouring the same in-place pairs; None where the pairs honoured differ or the
    arena comes out more than SLACK over the kept one's margin (place afresh then)."""
    if len(lifetimes) != stacking.count:
        return None
    pairs = honour_inplace(lifetimes, candidates)
    if pairs != stacking.pairs:
        return None
    alignment = stacking.alignment
    sizes = [align(life.size, alignment) for life in lifetimes]
    group_sizes = [sizes[m[0]] if len(m) == 1 else max(sizes[i] for i in m)
                   for m in stacking.members]
    offsets = [0] * len(group_sizes)
    for g, below in stacking.order:
        top = 0
        for b in below:
            reach = offsets[b] + group_sizes[b]
            if reach > top:
                top = reach
        offsets[g] = top
    arena = max(o + s for o, s in zip(offsets, group_sizes))
    floor = _peak(stacking.steps, sizes)
    if floor and arena > floor * stacking.margin * SLACK:
        return None
    by_name = {}
    for members, offset in zip(stacking.members, offsets):
        for index in members:
            by_name[lifetimes[index].name] = offset
    return MemoryPlan("greedy", arena, sum(sizes), floor, by_name, lifetimes, pairs,
                      alignment=alignment, order=stacking.greedy_order)


def _steps(lives) -> tuple:
    """Per step at which a life starts (its first) or ends (the step after its last), in
    step order: (the lives that start, the lives that end)."""
    events: dict = {}
    for index, life in enumerate(lives):
        events.setdefault(life.first, ([], []))[0].append(index)
        events.setdefault(life.last + 1, ([], []))[1].append(index)
    return tuple((tuple(events[s][0]), tuple(events[s][1])) for s in sorted(events))


def _peak(steps: tuple, sizes: list[int]) -> int:
    """The most bytes alive at one step (``memory.lower_bound`` over the lives of
    :func:`_steps` with these aligned sizes)."""
    live = best = 0
    for started, ended in steps:
        for index in started:
            live += sizes[index]
        for index in ended:
            live -= sizes[index]
        if live > best:
            best = live
    return best
