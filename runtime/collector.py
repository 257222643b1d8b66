"""Python's cycle collector around a session: held off while a new shape is planned, and
what a ready session holds moved out of its later passes (:func:`settle`, below).

Planning a new shape (shape inference over every node, the frozen shape arithmetic, the
plan's slots and lifetimes) makes a burst of short-lived containers: ~1,000 types and
tuples alive at once for a 5-layer RoBERTa, most gone when the plan is made. The
collector counts young objects as they are made, so a pass came in the middle of nearly
every new shape, found the burst alive and promoted it to the older generations, whose
growth is what calls a full pass: over 200 new lengths, 430 young passes and 3 full ones
(55-65 ms each, the stream's p99). Held off while planning, the burst dies by reference
counting before any pass sees it, and the passes due run in the same call once planning
is over, over what outlives it (the plan): 189 young passes and 1 full one
(2026-11-27, this 2-core machine). Nothing is moved out of the call, and a cycle made
while planning is collected by the next pass as before.

Only where the process has the collector on: a process that turned it off keeps it off.
Threads that plan at once share one hold; the last to finish turns it back on. A caller
that turns the collector off from another thread while a hold is on has its choice undone
when the hold ends (there is no way to tell its call from ours).
"""

from __future__ import annotations

import gc
import threading
import weakref
from contextlib import contextmanager

from mixrt.base.settings import setting

_lock = threading.Lock()
_holders = 0
_turned_off = False  # whether the current hold turned the collector off


@contextmanager
def held_off():
    """The collector off for the block (where it was on), back on once no block holds it."""
    global _holders, _turned_off
    with _lock:
        if _holders == 0:
            _turned_off = gc.isenabled()
            if _turned_off:
                gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _turned_off:
                _turned_off = False
                gc.enable()


# -- a serving process's settled objects -----------------------------------------------------
#
# A full pass walks every object the collector tracks, and a process that has loaded a model
# and its kernels holds ~90,000 (numba's registries and the compiled overloads' wrappers, the
# modules, the session's graph and plans): 40-60 ms a pass on this 2-core machine, which a
# service sending a new shape per request met every 90-130 new shapes, its p99 (a
# SqueezeNet's new image sizes 78 and 86 ms, 57 and 63 of them the pass; 2026-11-27).
# Those objects live as long as the process serves. So once a session is ready to serve
# (``Session.wait_compiled``), a full pass is taken and what outlives it is moved out of
# later passes (``gc.freeze``): they walk only what was made since.
#
# A frozen object that becomes garbage inside a reference cycle is not reclaimed while it
# stays frozen. A session is freed by its reference count when its caller drops it (no
# cycle runs through it), and what it leaves in cycles (~2,000 graph and import objects)
# holds no arrays; its drop also thaws the frozen objects (``gc.unfreeze``), so that the
# next full pass reclaims those cycles, and anything else of the caller's, as before; the
# next session to become ready freezes again. MIXRT_GC_FREEZE=0 leaves the collector as it
# is (the pass is still taken).

def settle(session) -> None:
    """The full pass that the making of ``session`` brought due, taken now (its caller is
    waiting anyway); then, unless MIXRT_GC_FREEZE=0, what survived it moved out of the
    collector's later passes until ``session`` is dropped. Nothing where the process has the
    collector off."""
    if freeze_what_lives():
        weakref.finalize(session, gc.unfreeze).atexit = False


def freeze_what_lives() -> bool:
    """A full pass, then (unless MIXRT_GC_FREEZE=0) what survived it moved out of the
    collector's later passes; whether it froze. Nothing where the collector is off. Also
    for a process that loads long-lived modules after its sessions are ready (a server's
    front ends): they would otherwise be walked by every full pass."""
    if not gc.isenabled():
        return False
    gc.collect()
    if setting("MIXRT_GC_FREEZE", "1") == "0":
        return False
    gc.freeze()
    return True
