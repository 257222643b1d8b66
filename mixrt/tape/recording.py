"""Recording and training mode, and the tape's side of every imperative op call.

``record()`` and ``pause()`` switch recording (and, with it, Dropout's and BatchNorm's
training mode) per thread. The imperative dispatcher (``mixrt/dispatch.py``) asks this
module, once connected, whether a call must be taped (``needs_tape``), how many outputs its
kernel must produce for the backward (``forward_outputs``), and leaves the call's node on the
tape (``record_op``). Nothing here knows the array classes above it: arrays are duck-typed
(``_entry``, ``_grad``, ``ctx``).
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

from mixrt import dispatch
from mixrt.tape import nodes, opgrad


class _State(threading.local):
    recording = False
    training = False


_state = _State()


# -- modes ----------------------------------------------------------------------------------

def is_recording() -> bool:
    return _state.recording


def is_training() -> bool:
    return _state.training


def set_recording(is_recording: bool) -> bool:
    previous, _state.recording = _state.recording, bool(is_recording)
    return previous


def set_training(train_mode: bool) -> bool:
    previous, _state.training = _state.training, bool(train_mode)
    return previous


@contextmanager
def scope(recording: bool | None, training: bool | None):
    previous = (_state.recording, _state.training)
    if recording is not None:
        _state.recording = recording
    if training is not None:
        _state.training = training
    try:
        yield
    finally:
        _state.recording, _state.training = previous


def record(train_mode: bool = True):
    """Tape the ops run inside; ``train_mode`` switches Dropout and BatchNorm to training."""
    return scope(True, train_mode)


def pause(train_mode: bool = False):
    return scope(False, train_mode)


def train_mode():
    return scope(None, True)


def predict_mode():
    return scope(None, False)


# -- what the imperative dispatcher calls (mixrt/dispatch.py) -----------------------------

def needs_tape(inputs) -> bool:
    if not _state.recording:
        return False
    for value in inputs:
        if getattr(value, "_entry", None) is not None or getattr(value, "_grad", None) \
                is not None:
            return True
    return False


def _wanted(inputs, raw) -> list:
    return [nodes._parent_of(x) is not None and opgrad.differentiable(r)
            for x, r in zip(inputs, raw)]


def forward_outputs(spec, attributes, raw, inputs, count, ctx) -> int:
    """How many outputs the kernel must produce for this call's backward."""
    wants = _wanted(inputs, raw)
    if not any(wants):
        return count
    sig = opgrad.signature(spec, attributes, raw, wants, count, str(ctx.device))
    return opgrad.forward_plan(sig, attributes).produced


def record_op(spec, attributes, inputs, raw, results, outputs) -> None:
    wants = _wanted(inputs, raw)
    if not any(wants):
        return
    ctx = outputs[0].ctx
    sig = opgrad.signature(spec, attributes, raw, wants, len(outputs), str(ctx.device))
    plan = opgrad.forward_plan(sig, attributes)
    if not any(j < len(outputs) for j in plan.float_outputs):
        return  # integer or boolean results: nothing flows back through them
    meta = [(r.shape, r.dtype) if r is not None else ((), None) for r in results]
    node = nodes.OpNode(spec, attributes, sig, inputs, raw, results, ctx, meta)
    if plan.error is not None:
        node.pushed_at = nodes.call_site()
    node.watch_outputs(outputs)
    for index, output in enumerate(outputs):
        if index in plan.float_outputs:
            output._entry = (node, index)


def connect_dispatcher() -> None:
    """Hand this module to the imperative dispatcher, which stands below the tape."""
    dispatch._tape = sys.modules[__name__]
