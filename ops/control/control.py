"""Control-flow operators: If, Loop, Scan and SequenceMap.

Each GRAPH attribute arrives as a callable ``Subgraph``: ``body(*values) -> list`` runs the
body with the enclosing scope already bound, and ``body.input_names`` / ``body.output_names``
say how many values it takes and returns. Values are arrays, lists (ONNX sequences) or
``None`` (an empty optional), so a branch or loop body may carry any of them unchanged.

These kernels always return a tuple, one entry per output, because a lone list result would
otherwise be indistinguishable from a sequence output.
"""

from __future__ import annotations

import numpy as np

from mixrt.base import run_options
from mixrt.ops.ir.registry import op
from mixrt.ops.shape.shape import constant
from mixrt.ops.ir.types import (UNKNOWN, SequenceType, TensorType, merge_types, normalize_axis,
                             type_of_value, without_value)


def _is_true(xp, cond) -> bool:
    """The truth of a one-element boolean tensor (a device sync on the GPU: control flow
    needs the value on the host)."""
    return bool(xp.asarray(cond).reshape(-1)[0])


def _graph_output_types(graph) -> list:
    """Declared output types of a body that cannot infer (a Graph, or a test's stand-in
    with ``output_types``), UNKNOWN where none is declared."""
    types = getattr(graph, "output_types", None)
    if types is None and hasattr(graph, "outputs"):
        types = [getattr(v, "type", None) for v in graph.outputs]
    if types is None:
        types = [None] * len(graph.output_names)
    return [UNKNOWN if t is None else t for t in types]


def _body_outputs(body, *input_types) -> list:
    """What a body outputs, given its inputs' types: inferred through the body where the
    caller can (plan time, or a Subgraph at run time), its declared types otherwise."""
    found = body.infer(*input_types) if hasattr(body, "infer") else _graph_output_types(body)
    return [without_value(t) for t in found]


_MAX_WIDENINGS = 8


def _settled_states(initial: list, run) -> tuple[list, list]:
    """Types of loop-carried states that hold on every iteration, and the body's outputs
    from them. ``run(states)`` returns the body's outputs, the next states first. Start from
    the initial types and widen by what the body makes of them until nothing changes: a
    state that grows each iteration ends with that dim unknown. Each round forgets at least
    one dim, so a few rounds settle; past ``_MAX_WIDENINGS`` only ranks are dropped."""
    states = [without_value(t) for t in initial]
    for _ in range(_MAX_WIDENINGS):
        outputs = run(states)
        widened = [merge_types(state, out) for state, out in zip(states, outputs)]
        if widened == states:
            return states, outputs
        states = widened
    states = [TensorType(s.dtype, None) if isinstance(s, TensorType) else UNKNOWN
              for s in states]
    return states, run(states)


def _stacked(element_type, length=None, axis: int = 0):
    """The type of scan outputs stacked along a new axis of ``length`` entries."""
    if isinstance(element_type, TensorType) and element_type.shape is not None:
        shape = list(element_type.shape)
        shape.insert(normalize_axis(axis, len(shape) + 1), length)
        return TensorType(element_type.dtype, tuple(shape))
    if isinstance(element_type, TensorType):
        return TensorType(element_type.dtype, None)
    return UNKNOWN


def _empty_scan_output(xp, element_type, axis: int = 0):
    """A scan output of zero iterations: no element to take a shape from, so the shape is
    the body's inferred element shape with the dims it cannot know as 0 (the rank agrees
    with plan-time inference), or (0,) float32 when even the rank is unknown."""
    dtype = np.float32
    if isinstance(element_type, TensorType) and element_type.dtype is not None:
        dtype = element_type.dtype
    if not isinstance(element_type, TensorType) or element_type.shape is None:
        return xp.zeros((0,), dtype=dtype)
    dims = [d if isinstance(d, int) else 0 for d in element_type.shape]
    dims.insert(normalize_axis(axis, len(dims) + 1), 0)
    return xp.zeros(tuple(dims), dtype=dtype)


def _without_axis(value_type, axis):
    """One element's type of a tensor scanned along ``axis``."""
    if not isinstance(value_type, TensorType) or value_type.shape is None:
        return without_value(value_type) if isinstance(value_type, TensorType) else UNKNOWN
    shape = list(value_type.shape)
    del shape[normalize_axis(axis, len(shape))]
    return TensorType(value_type.dtype, tuple(shape))


def _stack(xp, elements: list, axis: int = 0):
    """Scan outputs are tensors stacked along a new axis; sequences are kept as a list."""
    if any(isinstance(e, list) for e in elements):
        return list(elements)
    return xp.stack([xp.asarray(e) for e in elements], axis=axis)


# -- If ---------------------------------------------------------------------------------

@op("If", since=1)
def if_(xp, cond, *, then_branch=None, else_branch=None):
    if then_branch is None or else_branch is None:
        raise ValueError("If needs both then_branch and else_branch attributes")
    branch = then_branch if _is_true(xp, cond) else else_branch
    return tuple(branch())


@if_.infer
def _(cond, *, then_branch=None, else_branch=None, **_):
    then_types = _body_outputs(then_branch)
    else_types = _body_outputs(else_branch)
    return [merge_types(a, b) for a, b in zip(then_types, else_types)]


# -- Loop -------------------------------------------------------------------------------

@op("Loop", since=1)
def loop(xp, M=None, cond=None, *v_initial, body=None):
    if body is None:
        raise ValueError("Loop needs a body attribute")
    trip_count = None if M is None else int(xp.asarray(M).reshape(-1)[0])
    keep_going = True if cond is None else _is_true(xp, cond)
    carried = list(v_initial)
    n_scan = len(body.output_names) - 1 - len(carried)
    scanned = [[] for _ in range(n_scan)]
    iteration_type, cond_type = _loop_counters(body)
    cond_value = xp.asarray(keep_going).reshape(cond_type.shape)
    # a body that hands a true cond back needs no look at it: on the GPU each look waits
    # for the iteration to finish, which keeps the host from queueing the next one
    read_cond = not _cond_stays_true(getattr(body, "graph", None))
    if trip_count is None and keep_going and not read_cond:
        raise ValueError("Loop has no trip count (M) and its body hands back a true cond "
                         "unchanged, so it would never stop; give it M, or a body that can "
                         "make cond false")
    i = 0
    while keep_going and (trip_count is None or i < trip_count):
        run_options.check()  # a trip count from the input may be huge: the run's limits
        outputs = body(xp.asarray(i, dtype=np.int64).reshape(iteration_type.shape), cond_value,
                       *carried)
        cond_value = outputs[0]
        carried = list(outputs[1:1 + len(carried)])
        for collected, value in zip(scanned, outputs[1 + len(carried):]):
            collected.append(value)
        # the spec's comments call the body's condition ignored when the node has no cond
        # input, but onnxruntime stops on it either way, and so do we
        if read_cond:
            keep_going = _is_true(xp, cond_value)
        i += 1
    if i == 0 and scanned:  # no iteration made an element to take a shape from
        elements = _body_outputs(body, *_loop_counters(body),
                                 *map(type_of_value, carried))[1:]
        return (*carried, *(_empty_scan_output(xp, t) for t in elements[len(carried):]))
    return (*carried, *(_stack(xp, values) for values in scanned))


def _cond_stays_true(graph) -> bool:
    """Whether a Loop body's cond output is its cond input (through Identity nodes, as
    exporters write a ``for`` loop) or a constant true: a body that only runs on a true
    cond then always gives true back. Structure alone decides, so it holds whatever the
    loop's states and the enclosing values are."""
    if graph is None or len(graph.inputs) < 2 or not graph.outputs:
        return False
    producers = graph.producers()
    name, cond_in = graph.output_names[0], graph.input_names[1]
    while name != cond_in:
        if name in graph.initializers:
            return _all_true(graph.initializers[name])
        node = producers.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            return False  # read from an enclosing graph, or an op we do not know
        if node.op_type == "Constant":
            return _all_true(constant(np, **node.attributes))
        if node.op_type != "Identity":
            return False
        name = node.inputs[0]
    return True


def _all_true(value) -> bool:
    value = np.asarray(value)
    return value.dtype == np.bool_ and value.size == 1 and bool(value.reshape(-1)[0])


def _loop_counters(body) -> tuple[TensorType, TensorType]:
    """The types of the iteration number and the condition as a body is handed them:
    scalars, except where the body declares one with a rank, which then gets a [1] tensor
    (onnxruntime's rule; exporters write either)."""
    inputs = getattr(getattr(body, "graph", None), "inputs", None) or []
    shapes = [(1,) if index < len(inputs) and _has_rank(inputs[index].type) else ()
              for index in (0, 1)]
    return (TensorType(np.dtype(np.int64), shapes[0]),
            TensorType(np.dtype(np.bool_), shapes[1]))


def _has_rank(declared) -> bool:
    return isinstance(declared, TensorType) and bool(declared.shape)


@loop.infer
def _(M=None, cond=None, *v_initial, body=None, **_):
    trips = _constant_scalar(M)
    counters = _loop_counters(body)
    if (trips is not None and trips <= 0) or _constant_scalar(cond) is False:
        return _no_iterations(v_initial, lambda initial: _body_outputs(
            body, *counters, *initial)[1 + len(initial):])
    states, outputs = _settled_states(
        v_initial, lambda carried: _body_outputs(body, *counters, *carried)[1:])
    iterations = trips if trips is not None and _never_stops_early(cond, body, states) \
        else None
    return states + [_stacked(t, iterations) for t in outputs[len(states):]]


def _no_iterations(initial: list, scan_elements, axes=None) -> list:
    """The types a loop or scan that runs no iteration gives: its states as they came in,
    and each scan output empty along its new axis, its other dims what the body makes of
    the initial states (the kernel shapes them so; a dim unknown here stays unknown)."""
    states = [without_value(t) for t in initial]
    made = scan_elements(states)
    return states + [_stacked(t, 0, a) for t, a in zip(made, axes or [0] * len(made))]


def _never_stops_early(cond, body, states) -> bool:
    """Whether every iteration up to the trip count runs: the loop starts on a true cond
    (a constant, or none given) and the body keeps a true cond true. The body only ever
    runs on a true cond, so by induction no iteration stops the loop."""
    if cond is not None and _constant_scalar(cond) is not True or not hasattr(body, "infer"):
        return False
    iteration, cond_type = _loop_counters(body)
    true = TensorType(cond_type.dtype, cond_type.shape,
                      value=np.ones(cond_type.shape, dtype=np.bool_))
    kept = body.infer(iteration, true, *states)[0]
    body.infer(iteration, cond_type, *states)  # leave the body typed for every iteration
    return _constant_scalar(kept) is True


def _constant_scalar(value_type):
    """The Python value of a one-element tensor known at plan time, else None."""
    if not isinstance(value_type, TensorType) or value_type.value is None or \
            np.asarray(value_type.value).size != 1:
        return None
    return np.asarray(value_type.value).reshape(-1)[0].item()


# -- Scan -------------------------------------------------------------------------------

def _scan_once(xp, body, states, scan_inputs, input_axes, input_reversed, length):
    """Run the body ``length`` times; the final states and each output's elements in
    iteration order."""
    n_out = len(body.output_names) - len(states)
    collected = [[] for _ in range(n_out)]
    for t in range(length):
        run_options.check()
        elements = [xp.take(x, length - 1 - t if rev else t, axis=axis)
                    for x, axis, rev in zip(scan_inputs, input_axes, input_reversed)]
        outputs = body(*states, *elements)
        states = list(outputs[:len(states)])
        for values, value in zip(collected, outputs[len(states):]):
            values.append(value)
    return states, collected


@op("Scan", since=9)
def scan(xp, *inputs, body=None, num_scan_inputs=None, scan_input_axes=None,
         scan_input_directions=None, scan_output_axes=None, scan_output_directions=None):
    if body is None or num_scan_inputs is None:
        raise ValueError("Scan needs the body and num_scan_inputs attributes")
    n_state = len(inputs) - num_scan_inputs
    states, scan_inputs = list(inputs[:n_state]), inputs[n_state:]
    in_axes = [normalize_axis(a, x.ndim)
               for a, x in zip(scan_input_axes or [0] * num_scan_inputs, scan_inputs)]
    in_reversed = scan_input_directions or [0] * num_scan_inputs
    length = scan_inputs[0].shape[in_axes[0]] if scan_inputs else 0
    states, collected = _scan_once(xp, body, states, scan_inputs, in_axes, in_reversed, length)
    out_axes = scan_output_axes or [0] * len(collected)
    out_reversed = scan_output_directions or [0] * len(collected)
    if length == 0:  # no iteration made an element to take a shape from
        element_types = [_without_axis(type_of_value(x), a) for x, a in zip(scan_inputs, in_axes)]
        made = _body_outputs(body, *map(type_of_value, states), *element_types)[n_state:]
        return (*states, *(_empty_scan_output(xp, t, a) for t, a in zip(made, out_axes)))
    outputs = []
    for j, elements in enumerate(collected):
        if out_reversed[j]:
            elements = elements[::-1]
        axis = normalize_axis(out_axes[j], elements[0].ndim + 1)
        outputs.append(xp.stack(elements, axis=axis))
    return (*states, *outputs)


@scan.infer
def _(*inputs, body=None, num_scan_inputs=0, scan_input_axes=None, scan_output_axes=None,
      **_):
    n_state = len(inputs) - num_scan_inputs
    scanned = inputs[n_state:]
    in_axes = scan_input_axes or [0] * num_scan_inputs
    elements = [_without_axis(t, a) for t, a in zip(scanned, in_axes)]
    length = _dim(scanned[0], in_axes[0]) if scanned else 0
    if length == 0:
        return _no_iterations(inputs[:n_state], lambda initial: _body_outputs(
            body, *initial, *elements)[n_state:], scan_output_axes)
    states, outputs = _settled_states(
        inputs[:n_state], lambda carried: _body_outputs(body, *carried, *elements))
    made = outputs[n_state:]
    return states + [_stacked(t, length, a)
                     for t, a in zip(made, scan_output_axes or [0] * len(made))]


def _dim(value_type, axis: int):
    """One dim of a tensor type, None when unknown."""
    if not isinstance(value_type, TensorType) or value_type.shape is None:
        return None
    return value_type.shape[normalize_axis(axis, len(value_type.shape))]


@op("Scan", since=8)
def scan_8(xp, sequence_lens=None, *inputs, body=None, num_scan_inputs=None, directions=None):
    """Opset 8: axis 0 is a batch axis, axis 1 the scan axis; each batch entry scans its own
    sequence_lens[b] steps and scan outputs are zero-padded to the longest sequence."""
    if body is None or num_scan_inputs is None:
        raise ValueError("Scan needs the body and num_scan_inputs attributes")
    n_state = len(inputs) - num_scan_inputs
    initial, scan_inputs = inputs[:n_state], inputs[n_state:]
    batch, max_len = scan_inputs[0].shape[0], scan_inputs[0].shape[1]
    lengths = _sequence_lengths(xp, sequence_lens, batch, max_len)
    reversed_ = directions or [0] * num_scan_inputs
    blank = _Scan8Blank(xp, body, initial, scan_inputs, max_len)
    final_states, scan_outputs = [], []
    for b in range(batch):
        states = [s[b] for s in initial]
        # a reversed input of a short sequence starts from its last valid element
        per_batch = [x[b][:lengths[b]] for x in scan_inputs]
        states, collected = _scan_once(xp, body, states, per_batch, [0] * len(per_batch),
                                       reversed_, lengths[b])
        final_states.append(states)
        scan_outputs.append([_padded(xp, elements, max_len) if elements else blank.entry(j)
                             for j, elements in enumerate(collected)])
    if batch == 0:
        return (*initial, *blank.batch_outputs())
    n_out = len(body.output_names) - n_state
    results = [xp.stack([final_states[b][i] for b in range(batch)]) for i in range(n_state)]
    results += [xp.stack([scan_outputs[b][j] for b in range(batch)]) for j in range(n_out)]
    return tuple(results)


def _sequence_lengths(xp, sequence_lens, batch: int, max_len: int) -> list[int]:
    if sequence_lens is None:
        return [max_len] * batch
    lengths = [int(n) for n in xp.asarray(sequence_lens).reshape(-1).tolist()]
    if len(lengths) != batch or any(not 0 <= n <= max_len for n in lengths):
        raise ValueError(f"sequence_lens {lengths} must hold {batch} lengths in "
                         f"[0, {max_len}] (the batch and scan axes of the first scan input)")
    return lengths


class _Scan8Blank:
    """Zero-filled scan outputs for a batch entry that ran no step (or a batch of none):
    their element shapes come from the body's inference, made once when first needed."""

    def __init__(self, xp, body, initial, scan_inputs, max_len: int):
        self.xp, self.body, self.max_len = xp, body, max_len
        self.initial, self.scan_inputs = initial, scan_inputs
        self._made = None

    def made(self) -> list:
        if self._made is None:
            states = [_without_axis(type_of_value(s), 0) for s in self.initial]
            elements = [_without_axis(_without_axis(type_of_value(x), 0), 0)
                        for x in self.scan_inputs]
            self._made = _body_outputs(self.body, *states, *elements)[len(states):]
        return self._made

    def entry(self, j: int):
        """One batch entry's padding for scan output j: max_len zero elements."""
        empty = _empty_scan_output(self.xp, self.made()[j])
        return self.xp.zeros((self.max_len, *empty.shape[1:]), dtype=empty.dtype)

    def batch_outputs(self) -> list:
        """Each scan output of a batch of no entries: (0, max_len, element dims)."""
        return [self.entry(j)[None][:0] for j in range(len(self.made()))]


def _padded(xp, elements: list, length: int):
    stacked = xp.stack(elements)
    if stacked.shape[0] == length:
        return stacked
    padding = xp.zeros((length - stacked.shape[0], *stacked.shape[1:]), dtype=stacked.dtype)
    return xp.concatenate([stacked, padding])


@scan_8.infer
def _(sequence_lens=None, *inputs, body=None, num_scan_inputs=0, **_):
    n_state = len(inputs) - num_scan_inputs
    scanned = inputs[n_state:]
    batch = _dim(scanned[0], 0) if scanned else None
    steps = _dim(scanned[0], 1) if scanned else None
    elements = [_without_axis(_without_axis(t, 0), 0) for t in scanned]
    states, outputs = _settled_states(
        [_without_axis(t, 0) for t in inputs[:n_state]],
        lambda carried: _body_outputs(body, *carried, *elements))
    return ([_stacked(t, batch) for t in states]
            + [_stacked(_stacked(t, steps), batch) for t in outputs[n_state:]])


# -- SequenceMap ------------------------------------------------------------------------

@op("SequenceMap", since=17)
def sequence_map(xp, input_sequence, *additional_inputs, body=None):
    """Run the body once per position; additional sequences are indexed in step, tensors
    are passed whole every time."""
    if body is None:
        raise ValueError("SequenceMap needs a body attribute")
    results = [[] for _ in body.output_names]
    for i in range(len(input_sequence)):
        extra = [a[i] if isinstance(a, list) else a for a in additional_inputs]
        for collected, value in zip(results, body(input_sequence[i], *extra)):
            collected.append(value)
    return tuple(results)


@sequence_map.infer
def _(input_sequence, *additional_inputs, body=None, **_):
    per_position = [t.element if isinstance(t, SequenceType) else t
                    for t in (input_sequence, *additional_inputs)]
    return [SequenceType(t if isinstance(t, TensorType) else None)
            for t in _body_outputs(body, *per_position)]
