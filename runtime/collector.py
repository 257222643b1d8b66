"""Python's cycle collector held off while a new shape is planned.

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
from contextlib import contextmanager

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
