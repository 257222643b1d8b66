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

from mixrt.ops.registry import op
from mixrt.ops.types import UNKNOWN, SequenceType, TensorType, normalize_axis


def _is_true(xp, cond) -> bool:
    """The truth of a one-element boolean tensor (a device sync on the GPU: control flow
    needs the value on the host)."""
    return bool(xp.asarray(cond).reshape(-1)[0])


def _graph_output_types(graph) -> list:
    """Output types of a body graph when the caller knows them, UNKNOWN otherwise."""
    types = getattr(graph, "output_types", None)
    if types is None and hasattr(graph, "outputs"):
        types = [getattr(v, "type", None) for v in graph.outputs]
    if types is None:
        types = [None] * len(graph.output_names)
    return [UNKNOWN if t is None else t for t in types]


def _merge(a, b):
    """The type two branches agree on: dims that differ become unknown."""
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)):
        return a if a == b else (a if b is UNKNOWN else b if a is UNKNOWN else UNKNOWN)
    dtype = a.dtype if a.dtype is not None else b.dtype
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return TensorType(dtype, None)
    return TensorType(dtype, tuple(x if x == y else None for x, y in zip(a.shape, b.shape)))


def _stacked(element_type):
    """The type of scan outputs stacked along a new leading axis."""
    if isinstance(element_type, TensorType) and element_type.shape is not None:
        return TensorType(element_type.dtype, (None, *element_type.shape))
    if isinstance(element_type, TensorType):
        return TensorType(element_type.dtype, None)
    return UNKNOWN


def _empty_scan_output(xp, body, index: int):
    """A scan output of zero iterations: its element shape comes from the body's declared
    output type when that is fully known, else we can only say (0,) float32."""
    declared = _graph_output_types(body)[index]
    if (isinstance(declared, TensorType) and declared.shape is not None
            and all(isinstance(d, int) for d in declared.shape)):
        return xp.zeros((0, *declared.shape), dtype=declared.dtype or np.float32)
    dtype = declared.dtype if isinstance(declared, TensorType) and declared.dtype else np.float32
    return xp.zeros((0,), dtype=dtype)


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
    then_types = _graph_output_types(then_branch)
    else_types = _graph_output_types(else_branch)
    return [_merge(a, b) for a, b in zip(then_types, else_types)]


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
    cond_value = xp.asarray(keep_going)
    i = 0
    while keep_going and (trip_count is None or i < trip_count):
        outputs = body(xp.asarray(i, dtype=np.int64), cond_value, *carried)
        cond_value = outputs[0]
        carried = list(outputs[1:1 + len(carried)])
        for collected, value in zip(scanned, outputs[1 + len(carried):]):
            collected.append(value)
        # the body's condition output is ignored when the node has no cond input
        keep_going = cond is None or _is_true(xp, cond_value)
        i += 1
    stacked = [_stack(xp, values) if values else
               _empty_scan_output(xp, body, 1 + len(carried) + j)
               for j, values in enumerate(scanned)]
    return (*carried, *stacked)


@loop.infer
def _(M=None, cond=None, *v_initial, body=None, **_):
    body_types = _graph_output_types(body)
    n_carried = len(v_initial)
    carried = [t if t is not None and t is not UNKNOWN else body_types[1 + i]
               for i, t in enumerate(v_initial)]
    return carried + [_stacked(t) for t in body_types[1 + n_carried:]]


# -- Scan -------------------------------------------------------------------------------

def _scan_once(xp, body, states, scan_inputs, input_axes, input_reversed, length):
    """Run the body ``length`` times; the final states and each output's elements in
    iteration order."""
    n_out = len(body.output_names) - len(states)
    collected = [[] for _ in range(n_out)]
    for t in range(length):
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
    outputs = []
    for j, elements in enumerate(collected):
        if not elements:
            outputs.append(_empty_scan_output(xp, body, n_state + j))
            continue
        if out_reversed[j]:
            elements = elements[::-1]
        axis = normalize_axis(out_axes[j], elements[0].ndim + 1)
        outputs.append(xp.stack(elements, axis=axis))
    return (*states, *outputs)


@scan.infer
def _(*inputs, body=None, num_scan_inputs=0, scan_output_axes=None, **_):
    body_types = _graph_output_types(body)
    n_state = len(inputs) - num_scan_inputs
    states = [t if t is not None and t is not UNKNOWN else body_types[i]
              for i, t in enumerate(inputs[:n_state])]
    if scan_output_axes:  # the new axis is not leading: only the dtype is cheap to know
        return states + [TensorType(getattr(t, "dtype", None), None)
                         for t in body_types[n_state:]]
    return states + [_stacked(t) for t in body_types[n_state:]]


@op("Scan", since=8)
def scan_8(xp, sequence_lens=None, *inputs, body=None, num_scan_inputs=None, directions=None):
    """Opset 8: axis 0 is a batch axis, axis 1 the scan axis; each batch entry scans its own
    sequence_lens[b] steps and scan outputs are zero-padded to the longest sequence."""
    if body is None or num_scan_inputs is None:
        raise ValueError("Scan needs the body and num_scan_inputs attributes")
    n_state = len(inputs) - num_scan_inputs
    initial, scan_inputs = inputs[:n_state], inputs[n_state:]
    batch, max_len = scan_inputs[0].shape[0], scan_inputs[0].shape[1]
    lengths = ([max_len] * batch if sequence_lens is None
               else [int(n) for n in xp.asarray(sequence_lens).reshape(-1).tolist()])
    reversed_ = directions or [0] * num_scan_inputs
    final_states, scan_outputs = [], []
    for b in range(batch):
        states = [s[b] for s in initial]
        per_batch = [x[b] for x in scan_inputs]
        # a reversed input of a short sequence starts from its last valid element
        per_batch = [x[:lengths[b]] for x in per_batch]
        states, collected = _scan_once(xp, body, states, per_batch, [0] * len(per_batch),
                                       reversed_, lengths[b])
        final_states.append(states)
        scan_outputs.append([_padded(xp, elements, max_len) for elements in collected])
    n_out = len(body.output_names) - n_state
    results = [xp.stack([final_states[b][i] for b in range(batch)]) for i in range(n_state)]
    results += [xp.stack([scan_outputs[b][j] for b in range(batch)]) for j in range(n_out)]
    return tuple(results)


def _padded(xp, elements: list, length: int):
    stacked = xp.stack(elements)
    if stacked.shape[0] == length:
        return stacked
    padding = xp.zeros((length - stacked.shape[0], *stacked.shape[1:]), dtype=stacked.dtype)
    return xp.concatenate([stacked, padding])


@scan_8.infer
def _(sequence_lens=None, *inputs, body=None, num_scan_inputs=0, **_):
    body_types = _graph_output_types(body)
    n_state = len(inputs) - num_scan_inputs
    batch = [TensorType(getattr(t, "dtype", None), None) for t in body_types]
    return [t if t is not None and t is not UNKNOWN else batch[i]
            for i, t in enumerate(inputs[:n_state])] + batch[n_state:]


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
    return [SequenceType(t if isinstance(t, TensorType) else None)
            for t in _graph_output_types(body)]
