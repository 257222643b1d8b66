"""The depthwise forms timed on this machine for ``depthwise_calibration``'s fit: every form
(the row form, the block form, the channels form and, on outputs narrow enough, the flat
form) on one thread at each of :data:`GEOMETRIES`, float32, a Relu after, each the
quarter-quantile of its calls after one untimed, their outputs checked to be the same bits.
A compile child runs it once per CPU (``runtime/compile_worker.py``,
``depthwise_costs.measure_where_missing``); most of its ~12 s is the forms' compiling,
which that child does for a depthwise model anyway.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import jit_depthwise, jit_depthwise_channels
from mixrt.ops.conv import jit_grouped_blocks as blocks
from mixrt.ops.conv.depthwise_calibration import FORMS, features, padded
from mixrt.ops.conv.depthwise_common import activation_constants

# (kernel side, stride, output rows, output columns): the forms' work spans rows of whole
# vector groups, of remainders and of scalars, copies large and small, kernels whose
# weights fit the registers and kernels whose weights spill
GEOMETRIES = tuple(itertools.product((3, 5, 7), (1, 2), (
    (3, 3), (6, 10), (12, 12), (20, 7), (28, 28), (17, 45), (48, 48), (10, 96), (36, 70),
    (60, 120))))
CHANNELS = 96  # planes of a timed call (one image): as many as a mid network's layer


def measure(geometries=GEOMETRIES, repeats: int = 15) -> list:
    """(form, features, nanoseconds a plane) for every form at every geometry it can take,
    float32, one thread, the quarter-quantile of ``repeats`` calls after one untimed; the
    forms' outputs checked to be the same bits."""
    lanes = max(1, jit_cpu.vector_bytes() // 4)
    registers = 32 if lanes >= 16 else 16
    rng = np.random.default_rng(0)
    samples = []
    for k, s, out_dims in geometries:
        calls, planes = _calls((k, k), (s, s), out_dims, rng)
        fits = k * k + 8 <= registers  # (depthwise_costs.LOOP_REGISTERS)
        for form, call in calls.items():
            ns = _quarter_ns(call, repeats) / planes
            samples.append((form, features(form, (k, k), (s, s), (1, 1), out_dims, lanes,
                                           fits), ns))
    return samples


def _calls(kernel: tuple, strides: tuple, out_dims: tuple, rng) -> tuple:
    """Each form's call at one geometry, writing its own output; and the planes a call
    computes."""
    window, (oh, ow), k = (kernel, strides, (1, 1)), out_dims, kernel[0]
    pad = k // 2
    height, width = ((oh - 1) * strides[0] + k - 2 * pad, (ow - 1) * strides[1] + k - 2 * pad)
    x = rng.standard_normal((CHANNELS, height, width)).astype(np.float32)
    weights = rng.standard_normal((CHANNELS, k * k)).astype(np.float32)
    bias = rng.standard_normal(CHANNELS).astype(np.float32)
    act = activation_constants("Relu", [], np.float32)
    hp, wp = padded(kernel, strides, (1, 1), out_dims)
    y = {form: np.empty((CHANNELS, oh, ow), np.float32) for form in FORMS}
    rows = jit_depthwise._compiled(*window, "Relu")
    # the channels form's module called on this thread (the node's call may split it)
    channels = jit_depthwise_channels._compiled_channels(*window, "Relu")
    taps = np.ascontiguousarray(weights.T)
    blocks_of_channels = -(-CHANNELS // jit_depthwise_channels.CHANNEL_BLOCK)
    block = blocks.module(*window, "Relu", 1)
    cells = blocks.cells(*window, 1, out_dims, 4)
    plane = (CHANNELS, pad, pad, 0, CHANNELS)
    calls = {
        "rows": lambda: rows.run(x, weights, bias, y["rows"], act, 1, *plane,
                                 np.empty((hp, wp), np.float32)),
        "blocks": lambda: block.run(x, weights, bias, y["blocks"], act, 1, *plane,
                                    np.empty((1, cells), np.float32)),
        "channels": lambda: channels.run(x[None], taps, bias, y["channels"][None], act,
                                         blocks_of_channels, pad, pad, 0, blocks_of_channels,
                                         np.float32(0)),
    }
    if ow <= jit_depthwise.FLAT_MAX_WIDTH:  # (the flat form is made for these only)
        text, flat_cells = jit_depthwise._flat_text(
            *window, (height, width, pad, pad, oh, ow), "Relu", 1)
        flat = jit_depthwise._flat_module(text)
        calls["flat"] = lambda: flat.run(x, weights, bias, y["flat"], act, 1, *plane,
                                         np.empty((1, flat_cells), np.float32))
    for call in calls.values():
        call()
    if any(not np.array_equal(y["rows"], y[form]) for form in calls):
        raise AssertionError(f"the depthwise forms' bits differ at {kernel}, {strides}, "
                             f"{out_dims}")
    return calls, CHANNELS


def _quarter_ns(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return sorted(times)[len(times) // 4]
