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

The model counts those operations and weighs them by what each costs, one thread, float32:
this machine's weights where it measured them (``depthwise_calibration.py``, kept by
``depthwise_table.py``: on a 2-core EPYC in 2026-12 the shipped ones below picked forms
taking 18.9 ms over 40 random narrow geometries, the machine's 16.6, the fastest 15.3), else
the shipped ones, fitted on 74 random geometries (kernels 3-7, strides 1-2, planes
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

from mixrt.base.settings import setting
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import depthwise_table

# nanoseconds a plane, per tap and unit of each form's work: this machine's where it measured
# them (``depthwise_table.py``, ``depthwise_calibration.py``), else the shipped ones
LOOP_REGISTERS = 8  # the row loop's four sums and four loads in flight
_ACTIVE: list = []  # [the weights in use], read from the cache at the first pick


def weights() -> dict:
    """The weights the model uses (``depthwise_table.SHIPPED``'s layout): this machine's,
    read from mixrt's cache at the first pick of the process (or after :func:`refresh`),
    else the shipped ones, which ``MIXRT_CALIBRATE=0`` keeps whatever the cache holds."""
    if not _ACTIVE:
        measured = None if setting("MIXRT_CALIBRATE", "1") == "0" else \
            depthwise_table.read(machine_key())
        _ACTIVE.append(measured or depthwise_table.SHIPPED)
    return _ACTIVE[0]


def use(table: dict | None) -> None:
    """The model weighs with ``table`` from now on (None: read the cache again at the next
    pick); the picks kept from the weights before are forgotten."""
    _ACTIVE.clear()
    if table is not None:
        _ACTIVE.append(table)
    blocks_cheaper.cache_clear()
    small_plane_form.cache_clear()


def refresh() -> bool:
    """Read this machine's weights again (a calibration has just written them); True where
    there are some."""
    use(None)
    return weights() is not depthwise_table.SHIPPED


@functools.cache
def machine_key() -> str:
    """This machine's key for its weights (``depthwise_table.machine_key``)."""
    return depthwise_table.machine_key(jit_cpu.vector_bytes())


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
    return _modelled("channels", weights()["channels"], kernel, strides, dilations, out_dims,
                     itemsize)


def flat_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The flat form's modelled time for one plane: its flat row of the stride phases, as
    the block form's (:func:`block_ns`), with literal offsets."""
    return _modelled("flat", weights()["flat"], kernel, strides, dilations, out_dims,
                     itemsize)


def row_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The row form's modelled time for one plane."""
    kind = "fits" if _fits(kernel[0] * kernel[1]) else "spills"
    return _modelled("rows", weights()["rows"][kind], kernel, strides, dilations, out_dims,
                     itemsize)


def block_ns(kernel, strides, dilations, out_dims, itemsize) -> float:
    """The block form's modelled time for one plane."""
    kind = "fits" if _fits(kernel[0] * kernel[1]) else "spills"
    return _modelled("blocks", weights()["blocks"][kind], kernel, strides, dilations,
                     out_dims, itemsize)


def _modelled(form: str, weighed: list, kernel, strides, dilations, out_dims,
              itemsize) -> float:
    return sum(w * c for w, c in zip(weighed, counts(form, kernel, strides, dilations,
                                                     out_dims, _lanes(itemsize))))


def counts(form: str, kernel, strides, dilations, out_dims, lanes: int) -> list:
    """The operations of ``form`` on one plane, in its weights' order
    (``depthwise_table.SHIPPED``): the row form's passes of four vectors, remaining vectors
    and scalar outputs (a tap each) and its padded cells; the block and flat forms' vectors
    of taps over the stride phases' flat row, padded cells and the plane; the channels
    form's taps, padded cells in and outputs out, per lane (what a calibration fits the
    weights to, ``depthwise_calibration.fit``)."""
    (oh, ow), taps = out_dims, kernel[0] * kernel[1]
    hp, wp = _padded(kernel, strides, dilations, out_dims)
    if form == "rows":
        fours, rest = divmod(ow, 4 * lanes)
        return [oh * taps * fours, oh * taps * (rest // lanes), oh * taps * (rest % lanes),
                hp * wp]
    if form in ("blocks", "flat"):
        return [taps * -(-oh * -(-wp // strides[1]) // lanes), hp * wp, 1.0]
    return [taps * oh * ow / lanes, hp * wp / lanes, oh * ow / lanes]  # channels


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
