"""A form's shape programs made before its first new size: traced and confirmed at sizes
near the one the session ran, while ``Session.wait_compiled`` waits anyway.

A form's new sizes are planned by its shape program (``runtime/shape_programs.py``) once
the program is traced at one new size and confirmed at another; until then each new size
takes concrete inference over every node, and the first two also the trace and the check
(a 2-layer BERT's: 15-20 ms each, against ~3 ms once the program holds; a 5-layer
RoBERTa's more). A service sending a new length per request paid that on its first
requests, and on the first of each set of guards (a batch of one, where the program was
traced at two), which made the stream's p99 (2026-11-27). The sizes asked here are the
ran one's free axes (an input's symbolic or unknown dims, moved together where they share
a name) one and two larger, then smaller where larger does not suit the model (a length
past its positions); and, for each free axis the session ran at a size other than one,
the same with that axis at one, for a program whose guards take it. The programs are
made from shapes alone (inference needs the feeds' shapes and dtypes, and the plans made
are dropped); then, once its first kernels are in, the session runs once at the first
sizes of each set of guards, on feeds of zeros, so that the kernels of the argument
layouts those sizes meet are loaded (or compiled by the child) before a request needs
them. The full collection all this
brings due is taken after, while the caller still waits (``collector.settle``).

A form whose one free axis group is a batch of small feeds (a tabular model, a small MLP)
is also run at every size from one to ``LADDER_TOP`` (64, :func:`ladder_sizes`), twice each
on zeros: its plan made, then its calls bound, so that a request of any of those sizes
takes its steady lane from the first. A service's batches come in a few dozen sizes, and
each size's first request cost three of its later ones (the inference and plan of a new
size, its kernels' full routes, ~0.5-1 ms of a ~0.1-0.4 ms request), and its second one
the binding: that was the new-shape stream's p99 for such models, 3-5x onnxruntime's
(2026-11-28). Within ``LADDER_BUDGET_S`` per wait, the smallest sizes first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mixrt.base import made_up_feeds
from mixrt.base.settings import setting
from mixrt.runtime import collector
from mixrt.runtime.inferred_plans import ShapeProgram, TrustedForm, plan_for_form
from mixrt.runtime.row_buckets import RowBuckets, batch_names, rows_stay_apart, verified
from mixrt.runtime.run_loop import BIND_AT_RUN


@dataclass
class Prepared:
    """What a wait runs on zeros for the forms it prepared: ``sizes`` once each
    (:func:`run_made_up`), ``ladder`` three times each (:func:`run_ladder`), ``reach`` a
    list of sizes a free group, each run once and let go (:func:`run_reach`)."""

    sizes: list = field(default_factory=list)
    ladder: list = field(default_factory=list)
    reach: list = field(default_factory=list)
    buckets: RowBuckets | None = None  # a row-wise form's, once verified (run_prepared)
    laddered: list = field(default_factory=list)  # the ladders' sizes run_prepared ran

    def __bool__(self) -> bool:
        return bool(self.sizes or self.ladder or self.reach or self.buckets)


def prepare_forms(forms, program: ShapeProgram | None, bound, graph,
                  strategy: str) -> tuple[ShapeProgram | None, Prepared]:
    """Each of ``forms`` (a session's trusted forms) prepared once (:func:`prepare_form`).
    Returns the session's ShapeProgram (made here where it had none and a form needs it)
    and what to run on zeros: the first sizes of each set of guards a program was made
    for and the spread of :func:`spread_sizes`, once each; :func:`ladder_sizes`, three
    times; :func:`reach_sizes`, once and let go."""
    prepared = Prepared()
    if setting("MIXRT_SHAPE_PROGRAMS", "1") == "0":
        return program, prepared
    for form in list(forms):
        if form.prepared[0] or not form.signature:
            continue
        form.prepared[0] = True
        program = program if program is not None else ShapeProgram(graph)
        prepared.sizes += prepare_form(form, program, bound, graph, strategy)
        prepared.sizes += spread_sizes(form.signature, graph)
        prepared.ladder += ladder_sizes(form.signature, graph)
        prepared.reach += reach_sizes(form.signature, graph)
        if prepared.buckets is None and ladder_sizes(form.signature, graph) \
                and batch_names(form.signature, _free_groups(graph, form.signature)) \
                and rows_stay_apart(graph):
            prepared.buckets = RowBuckets(form.signature, LADDER_TOP)
    return program, prepared


def run_made_up(sizes: list[tuple], run) -> None:
    """``run(feeds)`` (a session's run) once at each of ``sizes``, on feeds of zeros: the
    kernels of the argument layouts those sizes meet (a batch of one's broadcasts, a chain
    split over the threads) are loaded from the cache the compile child fills, or compiled
    by it, rather than at a service's first requests (a 5-layer RoBERTa's first new length
    loaded seven, ~50 ms). The caller runs them on the compiled tier, once the session's
    first kernels are in: run while the child still compiled those, they took the NumPy
    tier and loaded nothing."""
    with made_up_feeds.made_up():  # nothing learns from zeros (base/made_up_feeds.py)
        for signature in sizes:
            try:
                run(_zeros(signature))
            except Exception:  # noqa: BLE001  (zeros this model refuses: its first request loads)
                continue


def _zeros(signature: tuple) -> dict:
    """Feeds of zeros of ``signature``'s shapes and dtypes."""
    return {name: np.zeros(part[0], np.dtype(part[1])) for name, part in signature}


def run_prepared(prepared: Prepared, run, run_let_go) -> RowBuckets | None:
    """:func:`run_made_up` at the prepared sizes, :func:`run_reach` (its larger sizes
    through ``run_let_go``), the row buckets of a form they hold for
    (``runtime/row_buckets.py``: checked, then their sizes run as a ladder's, as far as
    BUCKETS_BUDGET_S goes), then :func:`run_ladder` at the ladder. The plans the ladders
    make are ``prepared`` (``Session._kept``: none of their calls is trimmed meanwhile,
    most not among the last run, or a ladder's sizes were bound again by their first
    requests). The largest sizes run first: a scratch buffer they grow asks every bound
    call again (``jit_cpu.note_change``), and a ladder run before them had its sizes'
    first requests bind again (an MLP's batches of 1-16: p99 0.26 -> 0.56 ms, 2026-12-04).
    Returns the buckets, or None."""
    run_made_up(prepared.sizes, run)
    run_reach(prepared.reach, run, run_let_go)
    buckets = prepared.buckets
    if buckets is not None and not verified(buckets, run, run_let_go):
        buckets = None
    if buckets is not None:
        ladder = [tuple((name, ((size,) + buckets.rest[name], buckets.dtypes[name].str))
                        for name in sorted(buckets.names)) for size in buckets.sizes]
        ladder = [signature for signature in ladder if _feed_bytes(signature) <= SPREAD_MAX_BYTES]
        prepared.laddered += run_ladder(ladder, run, BUCKETS_BUDGET_S)
    prepared.laddered += run_ladder(prepared.ladder, run)
    return buckets


def run_missed(prepared: Prepared, compiled, run) -> bool:
    """The ladders' sizes :func:`run_prepared` ran that are not on the compiled tier
    (``compiled(signature)``) run as a ladder's again; True where any did. A size's first
    run loads its kernels or, where one is in no cache (a route only its rows take: a
    forest's split walk, a product's panels), answers on the NumPy tier while a child
    compiles it, and forgets the size: with empty caches 31 of a decision tree's 64
    buckets took their first sight in a service's requests, its p50 0.64 ms against 0.48
    with a warm cache (2026-12-04). The caller runs this once the children are done."""
    missed = [signature for signature in prepared.laddered if not compiled(signature)]
    prepared.laddered = []  # once: a size missing a kernel again takes its first request
    if missed:
        run_ladder(missed, run)
    return bool(missed)


# a wait's time for running the row buckets' sizes (each three times, as the ladder's)
BUCKETS_BUDGET_S = 0.5


def run_ladder(sizes: list[tuple], run, budget_s: float | None = None) -> list[tuple]:
    """``run(feeds)`` LADDER_RUNS times at each of ``sizes`` in order, on feeds of zeros,
    until ``budget_s`` (``LADDER_BUDGET_S``) has passed; returns the sizes that ran. The
    first run plans the size and takes its kernels' full routes, the BIND_AT_RUN-th binds
    its calls, the next settles them on this thread (``steady_run.settled_calls``), so a
    request of that size takes them, or its one call (``steady_run.OneCall``), from the
    first: a lone decision tree's stream of new batch sizes took the lane at the first
    request of each of its 56 sizes among 200, ~35 us more each (2026-11-29)."""
    deadline = time.monotonic() + (LADDER_BUDGET_S if budget_s is None else budget_s)
    ran = []
    with made_up_feeds.made_up():
        for signature in sizes:
            if time.monotonic() > deadline:
                break
            feeds = _zeros(signature)
            try:
                for _ in range(LADDER_RUNS):
                    run(feeds)
            except Exception:  # noqa: BLE001  (zeros this model refuses at this size)
                continue
            ran.append(signature)
    return ran


# a ladder size's runs: planned, run until bound, settled
LADDER_RUNS = BIND_AT_RUN + 1


def ladder_sizes(signature: tuple, graph) -> list[tuple]:
    """Every size of the signature's one free axis group from one to ``LADDER_TOP``, its
    own among them (run once by the caller, its calls not yet bound), while the feeds stay
    within ``SPREAD_MAX_BYTES`` (none for a form of several groups: a batch and a length,
    whose sizes are too many to run)."""
    groups = _free_groups(graph, signature)
    if len(groups) != 1:
        return []
    key = next(iter(groups))
    found = []
    for size in range(1, LADDER_TOP + 1):
        resized = _resized(signature, groups, {key: size})
        if resized is None or not all(_is_tensor(part) for _, part in resized):
            continue
        if _feed_bytes(resized) > SPREAD_MAX_BYTES:
            break
        found.append(resized)
    return found


# the batch sizes a one-group form of small feeds is run at (ladder_sizes): a dynamic
# batcher's usual largest batches are 32-64; and the time a wait spends on them (~1-2 ms a
# size for a small MLP, two runs on cold code)
LADDER_TOP = 64
LADDER_BUDGET_S = 0.25


def prepare_form(form: TrustedForm, program: ShapeProgram, bound, graph,
                 strategy: str) -> list[tuple]:
    """The form's programs traced and confirmed at sizes near its discovered signature
    (the module's words); a variant whose sizes the model refuses is skipped. Returns the
    first signature of each variant that planned, where every feed is a tensor."""
    groups = _free_groups(graph, form.signature)
    if not groups:
        return []
    sizes = {key: _size(form.signature, axes[0]) for key, axes in groups.items()}
    planned = []
    for variant in _variants(sizes):
        for index, changed in enumerate(variant):
            signature = _resized(form.signature, groups, changed)
            if signature is None or not _planned(form, signature, program, bound, graph,
                                                 strategy):
                break
            if index == 0 and all(_is_tensor(part) for _, part in signature):
                planned.append(signature)
    return planned


def spread_sizes(signature: tuple, graph) -> list[tuple]:
    """Sizes away from the one the session ran, to run once on zeros: every free axis at a
    half and a quarter of its size, then each at twice its own (the others as they were, so
    that no run holds more than twice the ran one's elements), then at four and eight times
    where the feeds stay small (SPREAD_MAX_BYTES: token ids, not images). A kernel's route
    depends on its sizes (a 1x1 convolution over a plane of fewer than 49 pixels takes the
    pixel rows' compiled parts, a product under a few thousand multiply-adds its tiny
    form), and the first request that took a route not met before loaded its kernels from
    the cache then: a SqueezeNet's first batch of ten 64 x 160 images 90 ms against ~15,
    eight of its kernels loaded; a RoBERTa's stacked products at a new layout 11 ms
    (2026-11-27)."""
    groups = _free_groups(graph, signature)
    sizes = {key: _size(signature, axes[0]) for key, axes in groups.items()}
    spread = [{key: max(1, size // part) for key, size in sizes.items()} for part in (2, 4)]
    spread += [{**sizes, key: 2 * size} for key, size in sizes.items()]
    larger = [{**sizes, key: factor * size} for factor in (4, 8) for key, size in sizes.items()]
    found = []
    for changed in spread + larger:
        resized = _resized(signature, groups, changed) if changed != sizes else None
        if resized is None or resized in found \
                or not all(_is_tensor(part) for _, part in resized):
            continue
        if changed in larger and _feed_bytes(resized) > SPREAD_MAX_BYTES:
            continue
        found.append(resized)
    return found


# feeds' bytes up to which an axis is also run at four and eight times its size (a
# sequence's lengths: attention's stacked products take their batched panel kernel past
# STACK_MIN_WORK multiply-adds, which a RoBERTa warmed up at 13 tokens first met at 70,
# loading it then, 11 ms); larger feeds (images) stay within twice the ran one's elements
SPREAD_MAX_BYTES = 1 << 20


def reach_sizes(signature: tuple, graph) -> list[list[tuple]]:
    """For each free axis group, the sizes past the spread's and the ladder's a service may
    still send, doubling from the larger of sixteen times its size and twice LADDER_TOP,
    the other groups as they were, while the feeds stay within SPREAD_MAX_BYTES: a list a
    group, ``signature`` first, then smallest first. A product's and a softmax's routes
    change with their rows (a few rows, panels, parts over the threads), and a route first
    met in a request loaded its kernels and modules then: a small MLP warmed at a batch of
    one took 140-190 ms over its first batch of a few thousand rows, 11 kernels and 18
    modules loaded, and where the caches were empty it answered on NumPy kernels while the
    child compiled the softmax rows' (2026-12-04)."""
    groups = _free_groups(graph, signature)
    sizes = {key: _size(signature, axes[0]) for key, axes in groups.items()}
    reach = []
    for key, size in sizes.items():
        found, grown = [signature], max(16 * size, 2 * LADDER_TOP)
        while True:
            resized = _resized(signature, groups, {**sizes, key: grown})
            if resized is None or not all(_is_tensor(part) for _, part in resized) \
                    or _feed_bytes(resized) > SPREAD_MAX_BYTES:
                break
            found.append(resized)
            grown *= 2
        if len(found) > 1:
            reach.append(found)
    return reach


def run_reach(groups: list[list[tuple]], run, run_let_go, budget_s: float | None = None) -> int:
    """Each group of :func:`reach_sizes` on feeds of zeros: its first (the size the session
    ran) timed through ``run(feeds)``, then each larger size through ``run_let_go(signature,
    feeds)``, which runs it twice, lets its plan go and returns the second run's seconds
    and outputs (the first loads what the size's routes need). A size runs while its time, expected
    from the last one's in proportion to the feeds, is within REACH_RUN_MAX_S and the wait's
    ``budget_s`` (``REACH_BUDGET_S``) holds its two runs; a group stops at the first size
    the model refuses (a length past its positions). Returns how many larger sizes ran."""
    deadline = time.monotonic() + (REACH_BUDGET_S if budget_s is None else budget_s)
    ran = 0
    with made_up_feeds.made_up():
        for base, *larger in groups:
            feeds = _zeros(base)
            started = time.monotonic()
            try:
                run(feeds)
            except Exception:  # noqa: BLE001  (zeros this model refuses)
                continue
            last, last_bytes = time.monotonic() - started, _feed_bytes(base)
            for signature in larger:
                expected = last * _feed_bytes(signature) / max(1, last_bytes)
                if expected > REACH_RUN_MAX_S or \
                        time.monotonic() + 2 * expected > deadline:
                    break
                try:
                    last = run_let_go(signature, _zeros(signature))[0]
                except Exception:  # noqa: BLE001  (a size past the model's: larger ones too)
                    break
                last_bytes = _feed_bytes(signature)
                ran += 1
    return ran


# a wait's time for the reach's runs, and the longest run expected there (a service that
# sends a batch longer than that pays its loads in proportion)
REACH_BUDGET_S = 0.5
REACH_RUN_MAX_S = 0.05


def _feed_bytes(signature: tuple) -> int:
    return sum(int(np.prod(part[0], dtype=np.int64)) * np.dtype(part[1]).itemsize
               for _, part in signature)


def _variants(sizes: dict) -> list:
    """Pairs of sizes (group -> size) to trace at, then confirm at: every group one and
    two larger, or smaller where that cannot be (the second pair is tried only where the
    first failed, :func:`prepare_form` stops a variant at its first failure); then each
    group not at one, at one, the others one and two larger."""
    larger = [{key: size + step for key, size in sizes.items()} for step in (1, 2)]
    smaller = [{key: size - step for key, size in sizes.items()} for step in (1, 2)]
    variants = [larger]
    if all(size > 3 for size in sizes.values()):
        variants.append(smaller)
    for key, size in sizes.items():
        if size != 1 and len(sizes) > 1:
            variants.append([{**changed, key: 1} for changed in larger])
    return variants


def _planned(form, signature, program, bound, graph, strategy: str) -> bool:
    feeds = {name: _placeholder(part) for name, part in signature}
    try:  # the burst of objects planning makes dies before a collection (collector.py)
        with collector.held_off():
            return plan_for_form(form, signature, feeds, program, bound, graph.output_names,
                                 strategy, graph.plans) is not None
    except Exception:  # noqa: BLE001  (sizes the model refuses: the variant is skipped)
        return False


def _free_groups(graph, signature: tuple) -> dict:
    """Group key -> [(feed, axis)] of the signature's tensor feeds' free axes: an input's
    dims that are not a number, grouped by their name (unnamed ones by their size)."""
    parts = dict(signature)
    groups: dict = {}
    for value in graph.feed_inputs():
        part = parts.get(value.name)
        declared = getattr(value.type, "shape", None)
        if not _is_tensor(part) or declared is None or len(declared) != len(part[0]):
            continue
        for axis, dim in enumerate(declared):
            if not isinstance(dim, int):
                key = dim if isinstance(dim, str) and dim else ("size", part[0][axis])
                groups.setdefault(key, []).append((value.name, axis))
    return groups


def _size(signature: tuple, feed_axis: tuple) -> int:
    name, axis = feed_axis
    return dict(signature)[name][0][axis]


def _resized(signature: tuple, groups: dict, sizes: dict) -> tuple | None:
    """``signature`` with each group's axes at its size in ``sizes``; None where a size is
    under one."""
    if any(size < 1 for size in sizes.values()):
        return None
    shapes = {name: list(part[0]) for name, part in signature if _is_tensor(part)}
    for key, axes in groups.items():
        for name, axis in axes:
            shapes[name][axis] = sizes[key]
    return tuple((name, (tuple(shapes[name]), part[1]) if name in shapes else part)
                 for name, part in signature)


def _is_tensor(part) -> bool:
    return part is not None and isinstance(part[0], tuple)


def _placeholder(part) -> np.ndarray | None:
    """An array of the part's shape and dtype with no memory of its own (inference reads
    the shape and dtype alone)."""
    if not _is_tensor(part):
        return None
    shape, dtype = part
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.dtype(dtype)), shape,
                                           (0,) * len(shape), writeable=False)
