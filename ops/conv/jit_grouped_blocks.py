"""Grouped convolutions of narrow groups (RegNet's are 8 channels wide) as one generated
module per kernel, strides, dilations, activation and group width, whatever the image size.

The layout is the flat form's (``jit_depthwise.FlatPlane``): a group's input planes copied in
turn into the scratch, each as its stride phases, so that every tap of a flat output row
(output ``(i, j)`` at ``i * phase_width + j``, the columns past the output's width computed and
dropped) reads consecutive cells. The flat form bakes that layout into its source as literal
offsets, so each image size was a module of its own: a service's new size found it in no
cache, took the slower row form meanwhile, and a size that came back started a compile child
on one of the machine's cores. Here the layout is worked out at the call from the image's
size, and the flat row is summed in blocks of four vectors by ``_jit_tap_block.tap_block``,
whose sums stay in registers across the taps while it reads each tap's offset and weight
from arrays. Each output adds its taps in the flat form's order, product by product: the
same bits.

One thread, 8-wide groups, 3x3, us, row / flat / blocks (2026-11-28): 440x7x7 572 / 122 /
93, 208x14x14 628 / 185 / 142, 48x56x56 733 / 631 / 388, 208x40x90 4,047 / 3,121 / 2,218,
96x28x28 stride 2 353 / 99 / 88. (A depthwise convolution's nine taps are too few for the
blocks to beat its flat form on small planes: 960x7x7 flat 39, blocks 65. They stand in for
it, at a width of one, where the flat form is in no cache and ``depthwise_costs`` finds them
cheaper than the row form.)
"""

from __future__ import annotations

import functools
from pathlib import Path

from mixrt.ops.compiled.generated import kernel_file_stamp
from mixrt.ops.compiled.generated import kernel_module as compiled
from mixrt.ops.conv.depthwise_common import (ACTIVATIONS, FLAGS, _module_head, pair_copy,
                                             part_entries, word_views)

PREFIX = "mixrt_grouped_blocks"
# the block's kernel file: its hash is in each module's text (generated.kernel_file_stamp)
_TAP_BLOCK = str(Path(__file__).with_name("_jit_tap_block.py"))
# _jit_tap_block's block (BLOCK_VECTORS x VECTOR_BYTES) and vector, as bytes (kept apart from
# it: that module loads numba)
BLOCK_BYTES, VECTOR_BYTES = 256, 64
# input rows from this many columns are copied a stride phase at a time (_row_copy)
PHASE_LOOPS_COLUMNS = 64


@functools.lru_cache(maxsize=64)
def module(kernel: tuple, strides: tuple, dilations: tuple, activation: str, width: int):
    """The block form's module for this geometry (``run`` as the row form's: see
    :func:`source`)."""
    return compiled(source(kernel, strides, dilations, activation, width), prefix=PREFIX)


def cells(kernel: tuple, strides: tuple, dilations: tuple, width: int, out_dims: tuple,
          itemsize: int) -> int:
    """The scratch a call of the block form takes, in cells: the group's planes as their
    phases, then the flat output row (as ``run`` lays them out)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilations, out_dims
    hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    phase_width, lanes = -(-wp // sw), VECTOR_BYTES // itemsize
    length = -(-oh * phase_width // lanes) * lanes
    reach = (kh - 1) * dh // sh * phase_width + (kw - 1) * dw // sw
    plane = max(-(-hp // sh) * phase_width, length + reach)
    return width * sh * sw * plane + length


def source(kernel: tuple, strides: tuple, dilations: tuple, activation: str = "",
           width: int = 2) -> str:
    """The module: ``run(x, w, bias, y, act, multiplier, m, top, left, start, stop, pad)``
    computes output planes start..stop of y (N*M, oh, ow) from x (N*C, H, W), the weights w
    (M, width*kh*kw) and bias (M,), in ``pad`` (1, :func:`cells`), applying ``activation``
    (one of depthwise_common.ACTIVATIONS) as each output is stored."""
    for value in (*kernel, *strides, *dilations, width):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"grouped geometry must be positive integers, got {value!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"no activation {activation!r} in the grouped convolution's loop")
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    taps = [(c, a, b) for c in range(width) for a in range(kh) for b in range(kw)]
    # tap (c, a, b): plane c of the group, then its phase and its place in the phase
    offsets = [f"    offsets[{t}] = {c} * held + {(a * dh % sh) * sw + b * dw % sw} * plane"
               f" + {a * dh // sh} * wph + {b * dw // sw}" for t, (c, a, b) in enumerate(taps)]
    return "\n".join([
        *_module_head(activation),
        "from mixrt.ops.conv._jit_tap_block import tap_block, tap_vector"
        f"  # {kernel_file_stamp(_TAP_BLOCK)}",
        "",
        f"@njit({FLAGS})",
        "def run(x, w, bias, y, act, multiplier, m, top, left, start, stop, pad):",
        "    c0, c1, c2, c3 = act[0], act[1], act[2], act[3]",
        "    height, width = x.shape[1], x.shape[2]",
        "    oh, ow = y.shape[1], y.shape[2]",
        f"    hp = (oh - 1) * {sh} + {(kh - 1) * dh + 1}",
        f"    wp = (ow - 1) * {sw} + {(kw - 1) * dw + 1}",
        "    rows, cols = min(height, hp - top), min(width, wp - left)",
        f"    wph = -(-wp // {sw})",
        f"    block, lanes = {BLOCK_BYTES} // pad.itemsize, {VECTOR_BYTES} // pad.itemsize",
        "    length = -(-oh * wph // lanes) * lanes",
        "    blocks = length - length % block  # the rest a vector at a time",
        f"    reach = {(kh - 1) * dh // sh} * wph + {(kw - 1) * dw // sw}",
        f"    plane = max(-(-hp // {sh}) * wph, length + reach)",
        f"    held = {sh * sw} * plane  # one input plane's phases",
        f"    output = {width} * held  # where the flat output row starts",
        f"    offsets = np.empty({len(taps)}, np.int64)",
        *offsets,
        "    xs, ws, ys, ps = x.reshape(-1), w.reshape(-1), y.reshape(-1), pad.reshape(-1)",
        *(word_views() if sw == 2 else []),
        "    channels = m // multiplier",
        "    # the padding stays zero: every group overwrites the same cells",
        "    for t in range(output):",
        "        ps[t] = 0",
        "    padded = -1",
        "    for q in range(start, stop):",
        "        image, channel = q // m, q % m",
        "        p = image * channels + channel // multiplier  # the group's index",
        "        if p != padded:",
        f"            for g in range({width}):",
        "                for r in range(rows):",
        f"                    source = ((p * {width} + g) * height + r) * width",
        f"                    target = g * held + ((r + top) % {sh}) * {sw} * plane"
        f" + (r + top) // {sh} * wph",
        *_row_copy(sw),
        "            padded = p",
        "        for k in range(0, blocks, block):",
        f"            tap_block(ps, k, offsets, ws, channel * {len(taps)}, {len(taps)},"
        " bias[channel], output)",
        "        for k in range(blocks, length, lanes):",
        f"            tap_vector(ps, k, offsets, ws, channel * {len(taps)}, {len(taps)},"
        " bias[channel], output)",
        "        base = q * oh * ow",
        "        for i in range(oh):",
        "            for j in range(ow):",
        "                v = ps[uint64(output + i * wph + j)]",
        *[f"                {line}" for line in ACTIVATIONS[activation][1]],
        "                ys[uint64(base + i * ow + j)] = v",
        "",
        *part_entries(),
    ])


def _row_copy(sw: int) -> list[str]:
    """The copy of one input row (from ``source``) into its stride phases across (from
    ``target``): padded column ``c + left`` to phase ``(c + left) % sw``, cell ``(c + left) //
    sw``. With a stride across, a phase at a time, its columns ``sw`` apart read into
    consecutive cells, which LLVM vectorizes; column by column each store went to another
    phase and the loop stayed scalar. One thread, the block form's call (2026-12-01, Xeon):
    96 planes of 96 x 96 at stride 2 574 -> 411 us, 6 groups of 8 at 56 x 56 224 -> 210; rows
    shorter than PHASE_LOOPS_COLUMNS keep the one loop (26 groups of 8 at 28 x 28 214 ->
    240 in phases, 144 planes of 48 x 48 177 -> 189). Float32 rows at stride 2 are copied
    as pairs of cells instead, each half to its phase (``depthwise_common.pair_copy``),
    whatever their length."""
    one_loop = ["for c in range(cols):",
                f"    ps[uint64(target + (c + left) % {sw} * plane + (c + left) // {sw})]"
                " = xs[uint64(source + c)]"]
    if sw == 1:
        return [f"{' ' * 20}{line}" for line in one_loop]
    pairs = []
    if sw == 2:  # float32: as pairs of cells, each half to its phase
        pairs = ["if xs.itemsize == 4:  # (a constant of the compiled loop)",
                 *pair_copy("    ", lambda j: f"({j}) % 2 * plane + ({j}) // 2"),
                 "    continue"]
    return [f"{' ' * 20}{line}" for line in [
        *pairs,
        f"if cols < {PHASE_LOOPS_COLUMNS}:  # short rows: one loop",
        *[f"    {line}" for line in one_loop],
        "else:",
        f"    for b in range({sw}):",
        f"        c = (b + {sw} - left % {sw}) % {sw}  # its first column",
        f"        into = target + b * plane + (c + left) // {sw}",
        f"        for u in range((cols - c + {sw - 1}) // {sw}):",
        f"            ps[uint64(into + u)] = xs[uint64(source + c + {sw} * u)]"]]
