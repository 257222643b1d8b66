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

from mixrt.ops.compiled import jit_cpu

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
    lanes = _lanes(itemsize)
    (oh, ow), taps = out_dims, kernel[0] * kernel[1]
    hp, wp = _padded(kernel, strides, dilations, out_dims)
    return (CHANNELS_TAP * taps * oh * ow + CHANNELS_COPY_IN * hp * wp
            + CHANNELS_COPY_OUT * oh * ow) / lanes


def flat_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The flat form's modelled time for one plane: its flat row of the stride phases, as
    the block form's (:func:`block_ns`), with literal offsets."""
    lanes = _lanes(itemsize)
    (oh, _), taps = out_dims, kernel[0] * kernel[1]
    hp, wp = _padded(kernel, strides, dilations, out_dims)
    vectors = -(-oh * -(-wp // strides[1]) // lanes)
    return FLAT_VECTOR * taps * vectors + FLAT_COPY * hp * wp + FLAT_PLANE


def row_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The row form's modelled time for one plane."""
    lanes = _lanes(itemsize)
    (oh, ow), taps = out_dims, kernel[0] * kernel[1]
    fits = _fits(taps)
    fours, rest = divmod(ow, 4 * lanes)
    per_row = ROW_FOUR_VECTORS[fits] * fours + ROW_VECTOR[fits] * (rest // lanes) \
        + ROW_SCALAR[fits] * (rest % lanes)
    hp, wp = _padded(kernel, strides, dilations, out_dims)
    return oh * taps * per_row + ROW_COPY * hp * wp


def block_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The block form's modelled time for one plane."""
    lanes = _lanes(itemsize)
    (oh, _), taps = out_dims, kernel[0] * kernel[1]
    hp, wp = _padded(kernel, strides, dilations, out_dims)
    phase_width = -(-wp // strides[1])
    vectors = -(-oh * phase_width // lanes)
    return BLOCK_VECTOR[_fits(taps)] * taps * vectors + BLOCK_COPY * hp * wp + BLOCK_PLANE


def _fits(taps: int) -> bool:
    """Whether a kernel's weights fit the vector registers beside the row loop's own:
    32 registers with AVX-512, 16 with narrower vectors (the weights fitted for the spilling
    kernels stand for those machines' 3x3 too, unmeasured)."""
    registers = 32 if _lanes(4) >= 16 else 16
    return taps + LOOP_REGISTERS <= registers


def _padded(kernel, strides, dilations, out_dims) -> tuple:
    """The padded plane as far as the last window reaches."""
    (oh, ow), (sh, sw), (dh, dw) = out_dims, strides, dilations
    return (oh - 1) * sh + (kernel[0] - 1) * dh + 1, (ow - 1) * sw + (kernel[1] - 1) * dw + 1


@functools.lru_cache(maxsize=4)
def _lanes(itemsize: int) -> int:
    return max(1, jit_cpu.vector_bytes() // itemsize)
