"""The memory planner: one arena per device, an offset in it for every planned tensor.

Once shapes are inferred the schedule is fixed, so each intermediate tensor has a known size
and a known lifetime (the step that writes it to the step that last reads it). Planning is
then an offline packing problem: give every tensor a byte offset so that no two tensors alive
at the same step share a byte, in as small an arena as we can. The executor allocates that
arena once and hands each kernel a view into it.

Four strategies, each a step further than the last:

* ``naive``   - every tensor its own region (the baseline the paper measures against);
* ``inplace`` - an op may write its output over an input whose last reader it is
  (MXNet paper, section 3.1); honoured pairs, and chains of them, share one offset;
* ``sharing`` - MXNet's allocator: a tensor's block returns to a free pool when it dies and
  a new tensor takes the best-fitting free block (growing it when none is big enough);
* ``greedy``  - TFLite's "greedy by size" (Pisarchyk & Lee 2020): biggest first, each into
  the smallest gap among the already placed tensors whose lifetimes overlap its own.

``check_plan`` validates a plan that came from a file before the executor trusts it; a plan's
figures in words are ``memory_report.py``'s.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from mixrt.base.errors import GraphError

STRATEGIES = ("naive", "inplace", "sharing", "greedy")
ALIGNMENT = 64


class TensorLife(NamedTuple):
    """A tensor the planner places: ``size`` bytes, written at step ``first`` (the index of
    its producing node in the schedule; -1 for values that exist before the first node) and
    last read at step ``last`` (>= first). A tuple of plain values, untracked by the cycle
    collector (as ``executor.Slot``)."""

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
    alignment: int = ALIGNMENT  # every offset is a multiple of it; sizes were rounded up to it
    # greedy: the index in _GREEDY_ORDERS of the order that placed it (None: another strategy,
    # or read from a file); how it was found, not what it is: equal plans may differ in it
    order: int | None = field(default=None, compare=False)


@dataclass(slots=True)
class _Group:
    """Tensors that share one offset: a single tensor, or an in-place chain a -> b -> c
    whose members follow one another in time (each written by its predecessor's last reader)."""

    members: list[int]  # indices into the lifetimes list, in chain order
    first: int
    last: int
    size: int  # aligned; the largest member's


# -- planning ------------------------------------------------------------------------------

def plan_memory(lifetimes: list[TensorLife], strategy: str = "greedy",
                inplace_candidates: list[tuple[str, str]] = (),
                alignment: int = ALIGNMENT, order: int | None = None,
                checked: bool = False) -> MemoryPlan:
    """Place every tensor of ``lifetimes`` in one arena with ``strategy``.

    ``inplace_candidates`` are (input, output) pairs an op allows to share memory. They are
    permissions, not demands: a pair is honoured only when the output is written at the
    input's last read, is no bigger than the input, and neither is already in another pair;
    pairs naming a tensor that is not planned (a weight, say) are ignored. ``naive`` ignores
    them all. ``checked``: the lifetimes come from the executor's own planning (unique
    names, plain ints, first <= last), not a file or a caller, and are taken as they are.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown memory planning strategy {strategy!r}; "
                         f"expected one of {', '.join(STRATEGIES)}")
    alignment = _check_alignment(alignment)
    lives = list(lifetimes) if checked else validate_lifetimes(lifetimes)
    sizes = [align(life.size, alignment) for life in lives]
    pairs = [] if strategy == "naive" else honour_inplace(lives, inplace_candidates)
    groups = _groups(lives, sizes, pairs)
    chosen = None
    if strategy == "greedy":
        group_offsets, chosen = _place_greedy(groups, order)
    else:
        place = {"naive": _place_in_order, "inplace": _place_in_order,
                 "sharing": _place_sharing}[strategy]
        group_offsets = place(groups)
    offsets: dict[str, int] = {}
    for group, offset in zip(groups, group_offsets):
        for index in group.members:
            offsets[lives[index].name] = offset
    arena = max((o + g.size for g, o in zip(groups, group_offsets)), default=0)
    return MemoryPlan(strategy, arena, sum(sizes), lower_bound(lives, alignment), offsets,
                      lives, pairs, alignment=alignment, order=chosen)


def align(size: int, alignment: int = ALIGNMENT) -> int:
    """``size`` rounded up to a multiple of ``alignment``."""
    return -(-size // alignment) * alignment


def lower_bound(lifetimes: list[TensorLife], alignment: int = ALIGNMENT) -> int:
    """The largest total (aligned) size of tensors alive at one step: no plan without
    in-place writes can use a smaller arena."""
    return _peak((align(life.size, alignment), life.first, life.last) for life in lifetimes)


def _peak(lives) -> int:
    """The largest total size alive at one step of (size, first, last) lives."""
    deltas: dict[int, int] = {}
    for size, first, last in lives:
        deltas[first] = deltas.get(first, 0) + size
        deltas[last + 1] = deltas.get(last + 1, 0) - size
    best = live = 0
    for step in sorted(deltas):
        live += deltas[step]
        best = max(best, live)
    return best


def live_bytes_per_step(lifetimes: list[TensorLife],
                        alignment: int = ALIGNMENT) -> tuple[list[int], list[int]]:
    """(steps, live bytes at each step) from the earliest first to the latest last; what
    ``lower_bound`` maximises, for plotting."""
    if not lifetimes:
        return [], []
    start = min(life.first for life in lifetimes)
    stop = max(life.last for life in lifetimes)
    deltas = np.zeros(stop - start + 2, dtype=np.int64)
    for life in lifetimes:
        size = align(life.size, alignment)
        deltas[life.first - start] += size
        deltas[life.last + 1 - start] -= size
    live = np.cumsum(deltas)[:-1]
    return list(range(start, stop + 1)), [int(v) for v in live]


def honour_inplace(lifetimes: list[TensorLife],
                   candidates: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The candidate (input, output) pairs that may share memory, in the order given."""
    by_name = {life.name: life for life in lifetimes}
    used_inputs: set[str] = set()
    placed_outputs: set[str] = set()
    honoured = []
    for pair in candidates:
        source, target = pair
        if source not in by_name or target not in by_name:
            continue
        if source in used_inputs or target in placed_outputs:
            continue
        if inplace_allowed(by_name[source], by_name[target]):
            used_inputs.add(source)
            placed_outputs.add(target)
            honoured.append((source, target))
    return honoured


def inplace_allowed(source: TensorLife, target: TensorLife) -> bool:
    """Whether ``target`` may be written over ``source``: the op that writes it is the last
    reader of ``source`` (so nothing later needs ``source``), it fits, and ``source``
    existed before that step (a tensor cannot be written over one made at the same step)."""
    return (source.last == target.first and source.first < target.first
            and target.size <= source.size)


def _groups(lives: list[TensorLife], sizes: list[int],
            pairs: list[tuple[str, str]]) -> list[_Group]:
    """One group per in-place chain (a lone tensor is a chain of one), in the order of each
    chain's first tensor in ``lives``."""
    index = {life.name: i for i, life in enumerate(lives)}
    successor = {index[a]: index[b] for a, b in pairs}
    is_target = set(successor.values())
    groups = []
    for head in range(len(lives)):
        if head in is_target:
            continue
        members = [head]
        while members[-1] in successor:
            members.append(successor[members[-1]])
        # chain members follow each other in time, so the tail is read last
        groups.append(_Group(members, lives[head].first, lives[members[-1]].last,
                             max(sizes[m] for m in members)))
    return groups


def _place_in_order(groups: list[_Group]) -> list[int]:
    """Each group its own region, one after another (``naive`` and ``inplace``)."""
    offsets, end = [], 0
    for group in groups:
        offsets.append(end)
        end += group.size
    return offsets


def _place_sharing(groups: list[_Group]) -> list[int]:
    """MXNet's allocator: walk the schedule; a group's block goes back to the free pool when
    it dies, and a new group takes the smallest free block that fits, else grows the largest
    free block, else opens a new one. Blocks are laid end to end at the end."""
    order = sorted(range(len(groups)), key=lambda i: (groups[i].first, -groups[i].size, i))
    block_sizes: list[int] = []
    block_of: dict[int, int] = {}
    free: list[tuple[int, int]] = []  # (size, block), sorted
    dying: list[tuple[int, int]] = []  # heap of (last step, group)
    for i in order:
        group = groups[i]
        while dying and dying[0][0] < group.first:
            block = block_of[heapq.heappop(dying)[1]]
            bisect.insort(free, (block_sizes[block], block))
        if group.size == 0:
            continue
        block_of[i] = block = _take_block(free, block_sizes, group.size)
        heapq.heappush(dying, (group.last, i))
    starts = np.concatenate(([0], np.cumsum(block_sizes, dtype=np.int64)))
    return [int(starts[block_of[i]]) if i in block_of else 0 for i in range(len(groups))]


def _take_block(free: list[tuple[int, int]], block_sizes: list[int], size: int) -> int:
    fit = bisect.bisect_left(free, (size, -1))
    if fit < len(free):
        return free.pop(fit)[1]
    if free:  # none is big enough: growing the largest costs least
        block = free.pop()[1]
        block_sizes[block] = size
        return block
    block_sizes.append(size)
    return len(block_sizes) - 1


# Orders greedy placement tries; it keeps the smallest arena. Biggest-first is TFLite's and
# wins on chains; on DenseNet's concatenations, placing long-lived or large-area (size x
# lifetime) tensors first packs tighter.
_GREEDY_ORDERS = (
    lambda g, i: (-g.size, g.first, -g.last, i),
    lambda g, i: (-g.size * (g.last - g.first + 1), -g.size, i),
    lambda g, i: (-(g.last - g.first), -g.size, i),
    lambda g, i: (g.first, -g.size, i),
    lambda g, i: (-g.size, -g.last, g.first, i),
    lambda g, i: (-g.last, -g.size, i),
)


def _place_greedy(groups: list[_Group], only: int | None = None) -> tuple[list[int], int]:
    """Greedy by size (and by the other orders above): each group at the offset of the
    smallest gap that fits among the placed groups whose lifetimes overlap its own (the
    lowest such gap on a tie), else just above them; the order giving the smallest arena
    wins. Returns the offsets and the winning order's index; ``only``: place by that order
    alone (a new shape of a form whose first plan that order won, planned from inference:
    the four orders were ~1 ms of a small BERT's new length)."""
    best, best_arena, chosen = None, None, 0
    floor = _groups_lower_bound(groups) if only is None else 0
    for index, key in enumerate(_GREEDY_ORDERS):
        if only is not None and index != only:
            continue
        order = sorted(range(len(groups)), key=lambda i: key(groups[i], i))
        offsets = _place_greedy_in(groups, order)
        arena = max((o + g.size for g, o in zip(groups, offsets)), default=0)
        if best_arena is None or arena < best_arena:
            best, best_arena, chosen = offsets, arena, index
        if best_arena <= floor:  # no order can place these groups in less
            break
    return best, chosen


def _groups_lower_bound(groups: list[_Group]) -> int:
    """The largest total size of groups alive at one step: no placement of them is smaller."""
    return _peak((group.size, group.first, group.last) for group in groups)


def _place_greedy_in(groups: list[_Group], order: list[int]) -> list[int]:
    """Each group of ``order`` in turn at :func:`_best_gap_scanned` among the placed groups
    whose lifetimes overlap its own. Which groups overlap follows from the lifetimes alone,
    so it is found for all pairs at once (one vector comparison) and each group then scans
    only its own neighbours in Python: a transformer's tensors live a few steps each, and
    the NumPy query per group (~10 us) was most of a new sequence length's placement."""
    count = len(groups)
    neighbours = _neighbours(groups) if count <= NEIGHBOUR_MATRIX_GROUPS else None
    if neighbours is None:
        return _place_greedy_queried(groups, order)
    offsets = [0] * count
    placed = [False] * count
    for i in order:
        group = groups[i]
        if group.size == 0:
            continue
        blocks = sorted((offsets[j], offsets[j] + groups[j].size)
                        for j in neighbours[i] if placed[j])
        offsets[i] = _best_gap_scanned(blocks, group.size) if blocks else 0
        placed[i] = True
    return offsets


# groups up to which their overlaps are one boolean matrix (count squared bytes: 4 MB);
# larger graphs (a training step's thousands of tensors) query each group with NumPy
NEIGHBOUR_MATRIX_GROUPS = 2048
# overlapping pairs per group above which the lists of neighbours would cost more than the
# queries (a training step keeps most activations alive together): queried instead
NEIGHBOURS_PER_GROUP = 64


def _neighbours(groups: list[_Group]) -> list[list[int]] | None:
    """For each group, the other groups alive at one of its steps; None where they are
    too many to list (NEIGHBOURS_PER_GROUP)."""
    return _overlapping(tuple(g.first for g in groups), tuple(g.last for g in groups))


@lru_cache(maxsize=64)
def _overlapping(firsts: tuple, lasts: tuple) -> list[list[int]] | None:
    """:func:`_neighbours` by the groups' lifetimes, kept for them: a form's new shapes have
    the lifetimes of its first (its plan's structure, ``executor.PlanStructure``) and only
    other sizes, and the vector query cost ~30 us of a small model's new batch (a scaler
    and a linear classifier: ~0.25 ms all told). The lists are shared: read, never
    changed."""
    count = len(firsts)
    starts, ends = np.array(firsts, np.int64), np.array(lasts, np.int64)
    overlap = (starts[:, None] <= ends[None, :]) & (ends[:, None] >= starts[None, :])
    if np.count_nonzero(overlap) > NEIGHBOURS_PER_GROUP * count:
        return None
    rows, columns = np.nonzero(overlap)
    bounds = np.searchsorted(rows, np.arange(count + 1)).tolist()
    columns = columns.tolist()
    return [columns[bounds[i]:bounds[i + 1]] for i in range(count)]


def _place_greedy_queried(groups: list[_Group], order: list[int]) -> list[int]:
    count = len(groups)
    # the placed groups, as columns so the overlap query is a few vector operations
    firsts, lasts, starts, ends = (np.empty(count, dtype=np.int64) for _ in range(4))
    placed = 0
    offsets = [0] * count
    for i in order:
        group = groups[i]
        if group.size == 0:
            continue
        offset = _best_gap(firsts[:placed], lasts[:placed], starts[:placed], ends[:placed],
                           group)
        offsets[i] = offset
        firsts[placed], lasts[placed] = group.first, group.last
        starts[placed], ends[placed] = offset, offset + group.size
        placed += 1
    return offsets


# placed blocks alive with a group up to which its gap is found by a Python scan: NumPy's
# ten calls cost more than the scan there (SSDlite's ~1,700 groups, placed 18 times over
# by the orders and in-place variants, took 0.5 s of its first run)
SCANNED_BLOCKS = 64


def _best_gap(firsts, lasts, starts, ends, group: _Group) -> int:
    live = np.flatnonzero((firsts <= group.last) & (lasts >= group.first))
    if live.size == 0:
        return 0
    if live.size <= SCANNED_BLOCKS:
        return _best_gap_scanned(sorted(zip(starts[live].tolist(), ends[live].tolist())),
                                 group.size)
    by_offset = np.argsort(starts[live], kind="stable")
    gap_ends = starts[live][by_offset]
    reach = np.maximum.accumulate(ends[live][by_offset])  # top of everything below
    gap_starts = np.concatenate(([0], reach[:-1]))
    gaps = gap_ends - gap_starts
    fits = gaps >= group.size
    if not fits.any():
        return int(reach[-1])
    # argmin takes the first (lowest) of equally small gaps
    return int(gap_starts[np.argmin(np.where(fits, gaps, np.iinfo(np.int64).max))])


def _best_gap_scanned(blocks: list[tuple[int, int]], size: int) -> int:
    """:func:`_best_gap` over (start, end) blocks sorted by start: the start of the smallest
    gap of at least ``size`` below a block (the lowest on a tie), else the top of them all.
    Blocks that share a start leave gaps of 0 or less between them, which never fit, so
    their order among themselves does not matter."""
    reach, best_gap, best_start = 0, -1, 0
    for start, end in blocks:
        gap = start - reach
        if gap >= size and (best_gap < 0 or gap < best_gap):
            best_gap, best_start = gap, reach
        if end > reach:
            reach = end
    return best_start if best_gap >= 0 else reach


# -- validation ----------------------------------------------------------------------------

def validate_lifetimes(lifetimes) -> list[TensorLife]:
    """The lifetimes with plain-int fields; GraphError names the first bad entry."""
    clean, seen = [], set()
    for position, life in enumerate(lifetimes):
        if not isinstance(life, TensorLife):
            raise GraphError(f"memory plan: entry {position} is a {type(life).__name__}, "
                             "expected a TensorLife")
        if not isinstance(life.name, str) or not life.name:
            raise GraphError(f"memory plan: entry {position} has name {life.name!r}, "
                             "expected a non-empty string")
        if life.name in seen:
            raise GraphError(f"memory plan: tensor {life.name!r} is listed twice")
        seen.add(life.name)
        size, first, last = (_as_int(life, key) for key in ("size", "first", "last"))
        if size < 0:
            raise GraphError(f"memory plan: tensor {life.name!r} has size {size}, "
                             "expected >= 0 bytes")
        if last < first:
            raise GraphError(f"memory plan: tensor {life.name!r} is last read at step {last}"
                             f" before it is written at step {first}")
        clean.append(TensorLife(life.name, size, first, last))
    return clean


def _as_int(life: TensorLife, key: str) -> int:
    value = getattr(life, key)
    try:
        if isinstance(value, bool):  # True is an int to Python, never a size or a step
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise GraphError(f"memory plan: tensor {life.name!r} has {key} {value!r}, "
                         "expected an integer") from None


def _check_alignment(alignment) -> int:
    if isinstance(alignment, bool) or not isinstance(alignment, (int, np.integer)) \
            or alignment < 1:
        raise ValueError(f"memory plan alignment must be a positive integer, got {alignment!r}")
    return int(alignment)


def check_plan(plan: MemoryPlan) -> None:
    """Raise GraphError unless ``plan`` is safe to execute: every tensor has an aligned
    offset inside the arena, every in-place pair obeys the in-place rule and shares its
    offset, and no two tensors alive at one step share a byte otherwise.

    Meant for plans read from files, so it trusts nothing and runs in O(n log n) plus the
    number of tensors alive at once."""
    if plan.strategy not in STRATEGIES:
        raise GraphError(f"memory plan: unknown strategy {plan.strategy!r}; "
                         f"expected one of {', '.join(STRATEGIES)}")
    try:
        alignment = _check_alignment(plan.alignment)
    except ValueError as error:
        raise GraphError(str(error)) from None
    lives = validate_lifetimes(plan.lifetimes)
    offsets = _checked_offsets(plan, lives, alignment)
    replaces = _checked_pairs(plan, lives, offsets)
    _check_disjoint(lives, offsets, replaces)


def _checked_offsets(plan: MemoryPlan, lives: list[TensorLife], alignment: int) -> list[int]:
    arena = plan.arena_bytes
    if isinstance(arena, bool) or not isinstance(arena, int) or arena < 0:
        raise GraphError(f"memory plan: arena size {arena!r} is not a byte count")
    if not isinstance(plan.offsets, dict) or len(plan.offsets) != len(lives):
        raise GraphError(f"memory plan: {len(lives)} tensors but "
                         f"{len(plan.offsets) if isinstance(plan.offsets, dict) else '?'} "
                         "offsets")
    offsets = []
    for life in lives:
        offset = plan.offsets.get(life.name)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise GraphError(f"memory plan: tensor {life.name!r} has offset {offset!r}, "
                             "expected an integer")
        if offset < 0 or offset % alignment or offset + life.size > arena:
            raise GraphError(f"memory plan: tensor {life.name!r} ({life.size} bytes) at "
                             f"offset {offset} is not {alignment}-byte aligned inside the "
                             f"{arena}-byte arena")
        offsets.append(offset)
    return offsets


def _checked_pairs(plan: MemoryPlan, lives: list[TensorLife],
                   offsets: list[int]) -> dict[int, int]:
    """Output index -> input index for each in-place pair, after checking the pair."""
    index = {life.name: i for i, life in enumerate(lives)}
    replaces: dict[int, int] = {}
    used: set[int] = set()
    for pair in plan.inplace:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(name in index for name in pair)):
            raise GraphError(f"memory plan: in-place pair {pair!r} does not name two "
                             "planned tensors")
        source, target = index[pair[0]], index[pair[1]]
        if source in used or target in replaces:
            raise GraphError(f"memory plan: in-place pair {tuple(pair)!r} reuses a tensor "
                             "that is already in another pair")
        if not inplace_allowed(lives[source], lives[target]):
            raise GraphError(f"memory plan: {pair[1]!r} may not be written over {pair[0]!r}"
                             ": it must be written at that tensor's last read and be no "
                             "bigger")
        if offsets[source] != offsets[target]:
            raise GraphError(f"memory plan: in-place pair {tuple(pair)!r} has offsets "
                             f"{offsets[source]} and {offsets[target]}, expected one")
        used.add(source)
        replaces[target] = source
    return replaces


def _check_disjoint(lives: list[TensorLife], offsets: list[int],
                    replaces: dict[int, int]) -> None:
    """Sweep the steps keeping the live tensors sorted by offset. If the live set is
    disjoint, a newcomer that overlaps any of it overlaps a neighbour, so checking the two
    neighbours suffices. An in-place output takes its input's place instead of joining it,
    after the step's other newcomers were checked against that input."""
    remove, add, replace = 0, 1, 2  # the order of events within one step
    events = []
    for i, life in enumerate(lives):
        if life.size == 0:
            continue  # occupies no byte
        kind = replace if i in replaces and lives[replaces[i]].size else add
        events.append((life.first, kind, i))
        events.append((life.last + 1, remove, i))
    events.sort()
    live: list[tuple[int, int, int]] = []  # (start, end, index)
    key_of: dict[int, tuple[int, int, int]] = {}
    for _, kind, i in events:
        if kind == remove:
            if i in key_of:
                live.pop(bisect.bisect_left(live, key_of.pop(i)))
            continue
        if kind == replace:
            live.pop(bisect.bisect_left(live, key_of.pop(replaces[i])))
        key = (offsets[i], offsets[i] + lives[i].size, i)
        at = bisect.bisect_left(live, key)
        for neighbour in live[max(at - 1, 0):at + 1]:
            if neighbour[0] < key[1] and key[0] < neighbour[1]:
                raise GraphError(_overlap_message(lives[neighbour[2]], neighbour[0],
                                                  lives[i], key[0]))
        live.insert(at, key)
        key_of[i] = key


def _overlap_message(a: TensorLife, a_offset: int, b: TensorLife, b_offset: int) -> str:
    return (f"memory plan: tensors {a.name!r} (steps {a.first}..{a.last}, bytes "
            f"{a_offset}..{a_offset + a.size}) and {b.name!r} (steps {b.first}..{b.last}, "
            f"bytes {b_offset}..{b_offset + b.size}) are alive at the same step and share "
            "arena bytes")
