"""A convolution node's call at an image size it has met, for any batch of that size.

A service that batches its requests sends one image size at many batch sizes, and a
service that resizes to a few sizes sends each of them again and again; each new (batch,
size) is a new plan, whose first run took every node's full route: the checks among the
CPU forms, the geometry, the layout, the kit, then the kernel. The route at one image size
does not depend on the batch (each form is chosen by the image's shape, and the direct
convolution's call loops over the batch's images with one kit), yet a first run paid it
again for each batch: ~30 us a convolution warm, ~80 cold (MobileNetV3-small's first run
of a size: ~4 ms of route over ~4 ms of kernels, 2026-11-29).

So a node whose full route ended in a call that takes its arrays as arguments (the direct
convolution's, ``conv_direct_cpu.conv``, with the activation pass after it where the tile
does not apply it) keeps that call here, by image shape (the input's shape without the
batch, whether a residual comes, the pads a call came with), and the node's next call at
that image size, whatever its batch and arena, goes straight to it. The call is the one
the full route would make there: the same kit and kernel, so the same bits. The
squeeze-excite node (``ops/nn/squeeze_excite_cpu.py``) keeps its call too, by its channels
alone: its route is the same at every image size (its call splits the work as it runs).

The direct convolution's call holds its thread's kit (scratch addresses) and the native
pool: it is taken only on the thread that made it, with the pool and scratch buffers as
they were (``How.tied``). Any kept call is taken only with the node's own constants
(weight and bias objects); its input and output must be C-contiguous, of its
dtype, apart from each other, and a residual of the output's shape. Anything else takes
the full route, which keeps a call again. A node keeps the last MAX_ROUTES image sizes.

A depthwise convolution (``ops/conv/jit_depthwise.py``) keeps its call over the planes (or
over the channels) for the form it took, which at a new size is often a stand-in: the flat
form of a plane geometry this process has not loaded. Its route is kept for *loading* runs
(a signature's first run, ``jit_tier.compile_misses``), which take the stand-ins, and for
the serving runs of a process that compiles in the background while the flat form is in no
cache (the full route would take the same stand-in there); a run that may compile in the
foreground, or that finds the flat form in a cache, takes the full route, which loads or
compiles the flat form and compiles the stand-ins for other sizes. A stand-in's call lapses
once the flat form of its geometry is loaded (``stale``), and notes the optional miss the
full route would (``note``), so the background compiler hears of the size as before.
"""

from __future__ import annotations

import threading

import numpy as np

from mixrt.ops.compiled import jit_cpu, jit_tier, replay
from mixrt.ops.compiled.generated import compiled_before

ROUTES = ("image routes",)  # a node dict's table: image key -> _Route
STASH = ("image routes", "made")  # the call the node's current full route made
SCRATCH = ("image routes", "scratch")  # the scratch generation the table was last kept at
MAX_ROUTES = 64


class _Route:
    __slots__ = ("thread", "pool", "scratch", "constants", "dtype", "action", "how")


class How:
    """How a kept call is taken: ``records``, it keeps the node's replay itself (else
    :func:`ran` records the call as the replay); ``loading_only``, in loading runs alone;
    ``stale``, (name, names): the call is not the one the full route would make once
    ``name`` is in ``names`` (a set); ``note``, the optional miss to note on each call;
    ``over_input``, it may write over its input (``out`` the very X: the squeeze-excite
    node's in-place plans); ``tied``, it holds its thread's kit, scratch addresses and the
    native pool (the direct convolution's), so it is taken only with those as they were
    (a call that asks for them anew, as the depthwise and squeeze-excite ones do, is not:
    a thread's scratch reallocated for a larger batch let go every kept call)."""

    __slots__ = ("records", "loading_only", "stale", "note", "over_input", "tied")

    def __init__(self, records=False, loading_only=False, stale=None, note=None,
                 over_input=False, tied=True):
        self.records, self.loading_only, self.stale, self.note = \
            records, loading_only, stale, note
        self.over_input, self.tied = over_input, tied


ANY_RUN = How()


class Kept:
    """A kept call as one object, ``run(*arrays, *arguments)`` with the arrays (X, the
    constants, out) as :func:`ran` passes them but the residual: a closure's cells were
    each one more object for the cycle collector to walk, a kept call per node and size."""

    __slots__ = ("run", "arguments")

    def __init__(self, run, *arguments):
        self.run, self.arguments = run, arguments

    def __call__(self, *arrays):
        self.run(*arrays[:-2], arrays[-1], *self.arguments)


def stash(prepacked: dict | None, out, action, how: How = ANY_RUN) -> None:
    """Note ``action(X, *constants, Z, out)`` (a convolution's constants its weight and
    bias), the call a full route of the node (``prepacked``, its dict where its weights
    are constants) just made for ``out``, as one that takes any arrays of its image size;
    :func:`keep` files it when the route is over."""
    if prepacked is None:
        return
    prepacked[STASH] = (threading.get_ident(), out, action, how)


def amend(prepacked: dict | None, out, stale: tuple, note=None) -> None:
    """The stashed call for ``out`` as a stand-in: lapsing once ``stale`` holds (see
    :class:`How`), noting ``note``."""
    made = None if prepacked is None else prepacked.get(STASH)
    if made is not None and made[1] is out:
        how = made[3]
        prepacked[STASH] = made[:3] + (How(how.records, how.loading_only, stale, note,
                                           how.over_input, how.tied),)


def then(prepacked: dict | None, out, after) -> None:
    """The stashed call for ``out`` followed by ``after(out)`` (an activation the kernel
    does not apply)."""
    made = None if prepacked is None else prepacked.get(STASH)
    if made is None or made[1] is not out:
        return
    prepacked[STASH] = (made[0], out, _Then(made[2], after), made[3])


class _Then:
    """A kept call, then ``after(out)``."""

    __slots__ = ("action", "after")

    def __init__(self, action, after):
        self.action, self.after = action, after

    def __call__(self, *arrays):
        self.action(*arrays)
        self.after(arrays[-1])


def keep(prepacked: dict | None, X, constants: tuple, Z, out, pads, any_size=False) -> None:
    """File the call this thread's full route stashed for ``out`` under X's image shape
    (its channels alone, ``any_size``, for a node whose route is the same at every size);
    nothing where the route stashed none (it took a form whose call holds its arrays)."""
    made = None if prepacked is None else prepacked.pop(STASH, None)
    if made is None or made[1] is not out or made[0] != threading.get_ident():
        return
    routes = prepacked.get(ROUTES)
    if routes is None:
        routes = prepacked.setdefault(ROUTES, {})
    scratch = jit_cpu.scratch_generation()
    if prepacked.get(SCRATCH, scratch) != scratch:
        _let_go_stale(routes, scratch)
    prepacked[SCRATCH] = scratch
    key = _key(X, Z, out, pads, any_size)
    if key not in routes and len(routes) >= MAX_ROUTES:
        try:
            del routes[next(iter(routes))]
        except (KeyError, RuntimeError, StopIteration):
            pass  # another thread let one go at once
    route = _Route()
    route.thread, route.pool = made[0], jit_cpu.loaded_native_pool()
    route.scratch, route.constants = scratch, constants
    route.dtype, route.action, route.how = X.dtype, made[2], made[3]
    routes[key] = route


def _let_go_stale(routes: dict, scratch: int) -> None:
    """Drop the tied calls made before the thread's scratch buffers were reallocated: their
    kits hold the old buffers alive, which ``jit_cpu.scratch_kit`` lets go for that reason
    (a service's growing batches reallocate them a few times, MBs each)."""
    for key, route in list(routes.items()):
        if route.how.tied and route.scratch != scratch:
            routes.pop(key, None)


def ran(prepacked: dict | None, X, constants: tuple, Z, out, pads, any_size=False) -> bool:
    """Whether the node's call kept for X's image size ran on these arrays (see the
    module's docstring for when it may): X, the node's ``constants`` (the very objects the
    call was kept with), a residual Z or None, ``out``."""
    routes = None if prepacked is None else prepacked.get(ROUTES)
    if routes is None:
        return False
    route = routes.get(_key(X, Z, out, pads, any_size))
    if route is None or not _same(route.constants, constants) \
            or not jit_tier.compiled_allowed() \
            or not fits(route.dtype, X, Z, out, route.how.over_input):
        return False
    how = route.how
    if how.tied and (route.thread != threading.get_ident()
                     or route.pool is not jit_cpu.loaded_native_pool()
                     or route.scratch != jit_cpu.scratch_generation()):
        return False
    if how.loading_only and not _stands_in_here(how):
        return False
    arrays = (X, *constants, Z, out)
    if how.loading_only:
        try:  # the full route has a fallback where a kept form would compile (another split)
            with jit_tier.optional():
                route.action(*arrays)
        except jit_tier.CompileForbidden:
            return False
    else:
        route.action(*arrays)
    if how.note is not None:
        jit_tier.note_optional_miss(how.note)
    if not how.records:
        # the arena's next run replays it, and binds it after, as the full route's call
        replay.record(prepacked, arrays, route.action)
    return True


def _stands_in_here(how: How) -> bool:
    """Whether this run takes a call kept for loading runs (a depthwise node's, over the
    form its size took): a loading run, unless the call stands in for a flat form
    (``how.stale`` names it) that is loaded now; and a serving run of a process that
    compiles in the background, unless that flat form is in a cache. There the node's full
    route would take the same form after its checks and warmers (``jit_depthwise
    .depthwise_conv``); the forms add the taps in one order, so the bits are the same.
    MobileNetV2's seventeen, a size's second run over its third, medians of 58 and 60 new
    sizes alternating in one process: 4.50 -> 4.13 ms (2026-12-03). A run that may
    compile in the foreground takes the full route, which compiles what the size takes."""
    stale = how.stale
    if stale is not None and stale[0] in stale[1]:
        return False
    if jit_tier.compile_misses() is not None:
        return True
    return jit_tier.background_compiles() and (stale is None or not compiled_before(stale[0]))


def _same(kept: tuple, constants: tuple) -> bool:
    if len(kept) != len(constants):
        return False
    for a, b in zip(kept, constants):
        if a is not b:
            return False
    return True


def _key(X, Z, out, pads, any_size=False) -> tuple:
    # the output's image size too: a call's pads are in the key, but a node's kernel called
    # with other strides at one input size (not in a graph, whose nodes' strides are
    # fixed) took the call kept for the first, and wrote past its output
    if any_size:
        return X.shape[1:2], Z is None, None if pads is None else tuple(pads)
    return X.shape[1:], out.shape[2:], Z is None, None if pads is None else tuple(pads)


def fits(dtype, X, Z, out, over_input=False) -> bool:
    """Arrays a call made for ``dtype`` takes: X and ``out`` of that dtype, C-contiguous
    (X aligned), one batch, ``out`` apart from X (or X itself where ``over_input``) and from
    a residual Z of its shape and dtype (what ``conv_direct_cpu.pointwise_anew`` asks too)."""
    return X.dtype == dtype and out.dtype == dtype and X.flags.c_contiguous \
        and X.flags.aligned and out.flags.c_contiguous and out.shape[0] == X.shape[0] \
        and ((over_input and out is X) or not np.may_share_memory(out, X)) \
        and (Z is None or (Z.shape == out.shape and Z.dtype == dtype and Z.flags.c_contiguous
                           and not np.may_share_memory(out, Z)))
