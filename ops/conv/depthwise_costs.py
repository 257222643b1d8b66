"""Which form a depthwise convolution takes at a size, chosen by a model of each form's work
rather than by a threshold: the channels form (``jit_depthwise_channels``), the flat form or
a size-free one (below, :func:`small_plane_form`), and among the size-free ones the row form
(``jit_depthwise.source``) or the block form of one-channel groups (``jit_grouped_blocks``).

Both are compiled once per kernel, strides, dilations and activation, whatever the image
size, and add the taps in the same order (the same bits). They stand in where the flat form,
generated per plane geometry, is in no cache (a service's new image size) and on planes too
wide for it. Their costs differ in how an output row meets the CPU's vectors:

* the row form sums an output row's taps in a loop that LLVM vectorizes four vectors at a
  time; what is left past whole groups of four runs vector by vector, and what is left past
  whole vectors runs one output at a time, each tap a scalar multiply-add. Rows narrower than
  a vector (the small planes of a network's last stages) are all scalar;
* the block form sums a flat row of the plane's stride phases (``oh`` rows of the phase
  width, the columns past ``ow`` computed and dropped) in whole vectors, each tap's offset
  and weight read from arrays; it copies the plane into its phases first.

The model counts those operations and weighs them by what each cost on this machine's
kind, one thread, float32, fitted on 74 random geometries (kernels 3-7, strides 1-2, planes
3-120, 16-960 channels) and checked on 76 others (2026-11-29, AMD EPYC with AVX-512;
``benchmarks/depthwise_forms.py`` draws new ones and compares the pick with the faster
form). The row form holds the kernel's weights in vector registers beside its loop's sums
and loads: where they fit (a 3x3 kernel's nine, on AVX-512's 32 registers) its passes cost
little beside its copy of the plane, where they spill (5x5 and up) each tap costs more, so
each form's weights come in two sets, fitted apart. On the 76: the model's picks took
99.3 ms in all, the faster form of each 99.0, the row form alone 168.4 (one weight set for
all kernels had picked 100.1); a draw of 80 more: 70.2 ms, 69.1, 92.4. The row form of a
5x5 kernel over a 12 x 20 output took 152 us, the block form 96.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.jit_cache import cache_root
from mixrt.ops.conv.depthwise_calibration import cpu_label, features, fit, load, path, save

# nanoseconds a plane, per tap and unit of each form's work, where the kernel's weights fit
# the registers and where they spill (:func:`_fits`)
ROW_FOUR_VECTORS = {True: 0.001, False: 1.636}  # one pass of the row loop: four vectors
ROW_VECTOR = {True: 0.082, False: 0.661}  # one vector of the row's remainder
ROW_SCALAR = {True: 0.060, False: 0.135}  # one output of the row's scalar remainder
ROW_COPY = 0.387  # a cell of the padded plane (per plane, not per tap)
BLOCK_VECTOR = {True: 0.389, False: 0.454}  # one vector of the flat row
BLOCK_COPY = 0.378  # a cell of the padded plane, copied into its phases
BLOCK_PLANE = 15.1  # a plane's setup (its taps' offsets and weights)
LOOP_REGISTERS = 8  # the row loop's four sums and four loads in flight

# The channels form (``jit_depthwise_channels``: a block of channels side by side, each output
# pixel's taps one vector of channels each) against the flat form, generated per plane
# geometry, which it replaces where it is modelled cheaper: nanoseconds a plane, float32, one
# thread, replayed calls, fitted on 60 geometries (3x3 and 5x5 kernels, strides 1 and 2,
# outputs 4x4 to 28x28, 144 channels) once the channels form's copies in and out were
# transposes in registers (2026-11-30, the same EPYC). On those 60 the model's picks took
# 21.2 ms, the faster form of each 20.8, the channels form alone 21.7, the flat form alone
# 23.4; on 13 at 384 channels 681 us, 643, 694, 714. The channels form won at every 3x3
# stride 2 and 5x5 stride 2 size but two near ties, and lost to the flat form past ~150
# outputs of a 5x5 kernel at stride 1 (768 outputs: 177 against 153 us at 144 channels).
CHANNELS_TAP = 0.749  # one tap of one output pixel, a vector of channels (per lane)
CHANNELS_COPY_IN = 2.646  # a cell of the padded plane, transposed in (per lane)
CHANNELS_COPY_OUT = 3.351  # an output pixel, transposed out (per lane)
FLAT_VECTOR = 0.521  # one tap of one vector of the flat row
FLAT_COPY = 0.314  # a cell of the padded plane, copied into its phases
FLAT_PLANE = 12.29  # a plane's setup


# the picks are asked at every first run of a node's size (~3-8 us each here, a depthwise
# node's route at a new image size asked three): a network's geometries are few
@functools.lru_cache(maxsize=1024)
def blocks_cheaper(kernel: tuple, strides: tuple, dilations: tuple, out_dims: tuple,
                   itemsize: int) -> bool:
    """Whether the block form's modelled time is below the row form's for one plane of
    this geometry and output size (tuples: the answers are kept)."""
    return block_ns(kernel, strides, dilations, out_dims, itemsize) \
        < row_ns(kernel, strides, dilations, out_dims, itemsize)


@functools.lru_cache(maxsize=1024)
def small_plane_form(kernel: tuple, strides: tuple, dilations: tuple, out_dims: tuple,
                     itemsize: int, channels: bool) -> str:
    """The form modelled cheapest for a plane the flat form can take: "flat" (generated per
    plane geometry), "channels" (where ``channels``: that form can take the node) or "free",
    the size-free row or block form (:func:`blocks_cheaper` picks which). Asked only of the
    flat form against the channels form, the rows' outputs past whole vectors left the flat
    form every narrow plane, where rows of whole vectors are cheaper without its copy out:
    MobileNetV2's 3x3 over 10 x 16 outputs, one thread, rows 128 ns a plane, flat 167; over
    20 x 32 433 against 628 (2026-12-01, Xeon). On 40 random narrow geometries there
    (``benchmarks/depthwise_forms.py --narrow``, seed 20261201) the picks took 50.0 ms, the
    channels-or-flat picks before 55.8, the fastest form of each 43.6: the constants, fitted
    on an EPYC, still over-pick the channels form on this Xeon."""
    costs = {"flat": flat_ns(kernel, strides, dilations, out_dims, itemsize),
             "free": min(row_ns(kernel, strides, dilations, out_dims, itemsize),
                         block_ns(kernel, strides, dilations, out_dims, itemsize))}
    if channels:
        costs["channels"] = channels_ns(kernel, strides, dilations, out_dims, itemsize)
    return min(costs, key=costs.get)


def channels_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The channels form's modelled time for one plane (one channel of a block)."""
    return _modelled("channels", kernel, strides, dilations, out_dims, itemsize)


def flat_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The flat form's modelled time for one plane: its flat row of the stride phases, as
    the block form's (:func:`block_ns`), with literal offsets."""
    return _modelled("flat", kernel, strides, dilations, out_dims, itemsize)


def row_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The row form's modelled time for one plane."""
    return _modelled("rows", kernel, strides, dilations, out_dims, itemsize)


def block_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The block form's modelled time for one plane."""
    return _modelled("blocks", kernel, strides, dilations, out_dims, itemsize)


def _modelled(form, kernel, strides, dilations, out_dims, itemsize) -> float:
    """``form``'s units of work at this geometry (``depthwise_calibration.features``)
    weighed by this machine's weights (:func:`weights`)."""
    counts = features(form, kernel, strides, dilations, out_dims, _lanes(itemsize),
                      _fits(kernel[0] * kernel[1]))
    return float(weights()[form] @ counts)


# the weights fitted on the EPYC (above), in ``depthwise_calibration.UNITS``' order
SHIPPED = {
    "rows": np.array([ROW_FOUR_VECTORS[True], ROW_FOUR_VECTORS[False], ROW_VECTOR[True],
                      ROW_VECTOR[False], ROW_SCALAR[True], ROW_SCALAR[False], ROW_COPY]),
    "blocks": np.array([BLOCK_VECTOR[True], BLOCK_VECTOR[False], BLOCK_COPY, BLOCK_PLANE]),
    "channels": np.array([CHANNELS_TAP, CHANNELS_COPY_IN, CHANNELS_COPY_OUT]),
    "flat": np.array([FLAT_VECTOR, FLAT_COPY, FLAT_PLANE]),
}
_WEIGHTS: list = []  # [this process's weights], read once
# whether this process measures the weights where the cache has none for its CPU: the
# background compiler's child (``runtime/compile_worker.py``), which compiles the forms the
# measuring times anyway, off the serving thread, once per machine
_MEASURES: list = []


def weights() -> dict:
    """Each form's weights: this machine's, where ``depthwise_calibration`` measured them
    and kept them in the cache, else :data:`SHIPPED` (a compile child measures them first,
    :func:`measure_where_missing`)."""
    if not _WEIGHTS:
        _WEIGHTS.append(_machine_weights() or SHIPPED)
    return _WEIGHTS[0]


def measure_where_missing(measure) -> None:
    """Let this process measure this CPU's weights with ``measure()`` (samples for
    ``depthwise_calibration.fit``: ``depthwise_timing.measure``, which imports the forms that
    import this module) at its first pick if the cache has none (~12 s where the forms
    compile first; under a second where they are cached)."""
    _MEASURES.append(measure)


def _machine_weights() -> dict | None:
    where = calibration_path()
    found = load(where)
    if found is None and _MEASURES:
        measure = _MEASURES.pop()  # once a process, whatever comes of it
        try:
            found = fit(measure())
        except Exception:  # noqa: BLE001 (a form that fails to time: the model keeps shipping)
            return None
        if set(found) != set(SHIPPED):
            return None
        save(found, where)
    return found


def calibrated_since() -> bool:
    """Whether this CPU's weights are in the cache while this process models with the
    shipped ones (another process, a compile child, measured them since it first asked)."""
    return bool(_WEIGHTS) and _WEIGHTS[0] is SHIPPED and calibration_path().is_file()


def calibration_path():
    """Where this CPU's weights are kept in mixrt's cache."""
    return path(cache_root(), cpu_label())


def use_weights(found: dict | None) -> None:
    """Model with ``found`` from now on (None: read them again where they are kept), the
    picks made with the weights before forgotten."""
    _WEIGHTS.clear()
    if found is not None:
        _WEIGHTS.append(found)
    blocks_cheaper.cache_clear()
    small_plane_form.cache_clear()


def _fits(taps: int) -> bool:
    """Whether a kernel's weights fit the vector registers beside the row loop's own:
    32 registers with AVX-512, 16 with narrower vectors (the weights fitted for the spilling
    kernels stand for those machines' 3x3 too, unmeasured)."""
    registers = 32 if _lanes(4) >= 16 else 16
    return taps + LOOP_REGISTERS <= registers


@functools.lru_cache(maxsize=4)
def _lanes(itemsize: int) -> int:
    return max(1, jit_cpu.vector_bytes() // itemsize)
