"""2-D MaxPool and AveragePool as generated numba loops, separably, straight from the input.

Each output row of a plane is two passes over one row buffer: the ``kh`` input rows of its
windows are reduced column by column into the buffer (contiguous loads, one vectorized loop),
then each output is the reduction of ``kw`` buffer cells ``sw`` apart. The buffer's cells left
and right of the image hold the padding value (-inf or 0), so padding costs nothing, and
input rows above or below the image are skipped. Nothing is copied first: the phase-plane
kernel this replaced copied the whole input into stride-phase planes (ops/jit_cpu.py), and
on SqueezeNet's first MaxPool (64x111x111, 3x3 stride 2) those copies alone took longer than
this whole loop (measured in benchmarks/NOTES.md §10).

The taps are unrolled: a kernel is generated per (kh, kw, strides, dilations, max or
average) from fixed templates and integer literals, and compiled and cached on disk the way
``ops/jit_elementwise.py`` caches FusedElementwise programs (the same ``kernel`` function).
With the tap counts known, LLVM keeps the loads in registers; the same loop with runtime tap
counts ran 2.5x slower.

NaN: ``a if a > b else b`` is one vector instruction, but it drops a NaN in ``a``, and a max
pool must pass NaNs on (as np.maximum does). The NaN-propagating select costs twice as much,
so the fast loop only notes whether it read a NaN, and a plane that had one is computed again
with the careful select. An average needs no care: a NaN propagates through a sum.

``out`` may start at X's first byte (the planner's shrinking in-place pair): each plane is then
computed into a staging row block and copied out after its last input row was read, and an
output plane never reaches past its own input plane, so no input is overwritten before use.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.ops.jit_elementwise import kernel as compiled
from mixrt.ops.parallel import MIN_ELEMENTS, parallel_for, thread_parts

MAX_UNROLLED_TAPS = 64  # per axis; longer windows keep the phase-plane kernel
# stride-1 pools with output rows shorter than this keep the phase-plane kernel. At 14 wide
# the whole-plane runs (``_same_source``) win once the kernel lookup is cached: 3x3 pad 1,
# 576x14x14 181 against 229 us (average) and 148 against 195 (max), 480 and 832 planes
# alike; at 7 wide they lose (1024x7x7: 281 against 192), the edge rows and columns of
# small planes costing more than the copy saves. With stride 2 this loop won at every width
# measured (13 to 111 wide).
NARROW_ROWS = 8
# inputs from this size are split over the intra-op threads by planes. Handing work to
# another thread costs ~30-40 us on this machine (a woken core; numba's own prange pays the
# same), so 256x27x27 broke even (108 against 110 us) and 128x55x55 gained (94 against 126)
SPLIT_ELEMENTS = 4 * MIN_ELEMENTS


def suits(X, out, geometry) -> bool:
    """Contiguous 4-D arrays whose windows this loop can unroll. The caller checks that
    ``out`` is either apart from X or starts at its first byte (shrinking in place)."""
    kernel, strides, out_dims = geometry[0], geometry[1], geometry[5]
    if not (X.flags.c_contiguous and out.flags.c_contiguous and len(kernel) == 2
            and max(kernel) <= MAX_UNROLLED_TAPS):
        return False
    if strides[1] == 1 and out_dims[1] < NARROW_ROWS:
        return False  # the phase planes' runs over whole planes win there (no copy to save)
    return True


def pool2d(X, out, geometry, maximum: bool, counts=None):
    """MaxPool (``maximum``) or AveragePool (window sums / ``counts``, one number or an
    (oh, ow) array) of X (N, C, H, W) into ``out`` (N, C, oh, ow); see :func:`suits`."""
    kernel, strides, dilations, begin, _, out_dims = geometry
    (height, width), (oh, ow) = X.shape[2:], out_dims
    x = X.reshape(-1, height, width)
    y = out.reshape(-1, oh, ow)
    divisor = np.ones((1, 1), X.dtype) if maximum else np.ascontiguousarray(
        np.broadcast_to(np.asarray(counts, X.dtype), out_dims))
    # the padded row as far as the last window reaches (ceil_mode can reach past the pads)
    row_cells = max(begin[1] + width,
                    (ow - 1) * strides[1] + (kernel[1] - 1) * dilations[1] + 1)
    run = _compiled(tuple(kernel), tuple(strides), tuple(dilations), bool(maximum))
    in_place = np.may_share_memory(X, out)
    planes = x.shape[0]
    same_width = tuple(strides) == (1, 1) and ow == width

    def part(start, stop):
        row = np.empty(row_cells, X.dtype)
        staged = np.empty((oh, ow) if in_place else (0, 0), X.dtype)
        plane = np.empty(oh * width if same_width else 0, X.dtype)
        run(x, y, row, staged, plane, divisor, begin[0], begin[1], start, stop)
    if in_place or X.size < SPLIT_ELEMENTS:
        part(0, planes)
    else:
        parallel_for(thread_parts(planes, X.size), part)
    return out



@functools.lru_cache(maxsize=64)
def _compiled(kernel: tuple, strides: tuple, dilations: tuple, maximum: bool):
    # generating the source costs ~10 µs a call; the cache makes a call a dict lookup
    return compiled(source(kernel, strides, dilations, maximum), prefix="mixrt_pool")


# -- the generated source ----------------------------------------------------------------------

def _fold(values: list[str], maximum: bool, careful: bool) -> list[str]:
    """Statements that leave the reduction of ``values`` in ``m``."""
    lines = [f"m = {values[0]}"]
    for v in values[1:]:
        if not maximum:
            lines.append(f"m = m + {v}")
        elif careful:  # NaN in either operand gives NaN, as np.maximum does
            lines.append(f"m = m if (m > {v} or m != m) else {v}")
        else:
            lines.append(f"m = m if m > {v} else {v}")
    return lines


def _nan_check(values: list[str]) -> str:
    return "seen |= " + " | ".join(f"({v} != {v})" for v in values)


def _plane_source(name, kernel, strides, dilations, maximum, careful) -> list[str]:
    """One plane p of x into ``target`` (oh, ow); returns whether a NaN was read (the fast
    max only: the caller then runs the careful variant on the plane)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    check = maximum and not careful
    rows = [f"r{a}[j]" for a in range(kh)]
    cells = [f"row[b + {b * dw}]" for b in range(kw)]
    body = [
        f"def {name}(x, p, target, row, inner, top, divisor):",
        "    height, width = x.shape[1], x.shape[2]",
        "    seen = False",
        "    for i in range(target.shape[0]):",
        f"        y0 = i * {sh} - top",
        f"        if y0 >= 0 and y0 + {(kh - 1) * dh} < height:",
        *[f"            r{a} = x[p, y0 + {a * dh}]" for a in range(kh)],
        "            for j in range(width):",
        *[f"                {line}" for line in _fold(rows, maximum, careful)],
        *([f"                {_nan_check(rows)}"] if check else []),
        "                inner[j] = m",
        "        else:",
        "            first = True",
        f"            for a in range({kh}):",
        f"                r = y0 + a * {dh}",
        "                if r < 0 or r >= height:",
        "                    continue",
        "                src = x[p, r]",
        "                for j in range(width):",
        "                    v = src[j]",
        *([f"                    {_nan_check(['v'])}"] if check else []),
        "                    if first:",
        "                        inner[j] = v",
        "                    else:",
        "                        m = inner[j]",
        *[f"                        {line}" for line in _fold(["m", "v"], maximum, careful)[1:]],
        "                        inner[j] = m",
        "                first = False",
        "            if first:  # every row of these windows is padding",
        "                for j in range(width):",
        f"                    inner[j] = {'-np.inf' if maximum else '0.0'}",
        "        out = target[i]",
        *([] if maximum else ["        scale = divisor[i]"]),
        "        for k in range(out.shape[0]):",
        f"            b = k * {sw}",
        *[f"            {line}" for line in _fold(cells, maximum, careful)],
        ("            out[k] = m" if maximum else
         "            out[k] = m / scale[k]"),
        "    return seen",
        "",
    ]
    return body


def _same_source(kernel, dilations, maximum) -> list[str]:
    """A stride-1 plane whose output rows are as wide as its input rows (3x3 pad 1: the
    Inception pools). Their rows are short (7-28), shorter than one unrolled vector loop, so
    both passes run over the whole plane at once: the rows of full windows as one flat run
    into ``plane`` (oh, width), the rows at the top and bottom edges one by one; then every
    output as one flat run over ``plane``, and the edge columns (whose windows that run took
    partly from the neighbouring row) again one by one."""
    (kh, kw), (dh, dw) = kernel, dilations
    fill = "-np.inf" if maximum else "0.0"
    reach = (kw - 1) * dw
    rows = [f"s{a}[n]" for a in range(kh)]
    cells = [f"c{b}[n]" for b in range(kw)]
    return [
        "def same(x, p, target, plane, top, left, divisor):",
        "    height, width = x.shape[1], x.shape[2]",
        "    oh = target.shape[0]",
        f"    right = {reach} - left",
        "    source = x[p].reshape(-1)",
        "    out = target.reshape(-1)",
        "    seen = False",
        "    lo = min(max(top, 0), oh)",
        f"    hi = max(min(height - {(kh - 1) * dh} + top, oh), lo)",
        "    count = (hi - lo) * width",
        "    first = (lo - top) * width",
        *[f"    s{a} = source[first + {a * dh} * width:first + {a * dh} * width + count]"
          for a in range(kh)],
        "    full = plane[lo * width:lo * width + count]",
        "    for n in range(count):",
        *[f"        {line}" for line in _fold(rows, maximum, False)],
        *([f"        {_nan_check(rows)}"] if maximum else []),
        "        full[n] = m",
        "    for i in range(oh):",
        "        if lo <= i < hi:",
        "            continue",
        "        row = plane[i * width:(i + 1) * width]",
        f"        row[:] = {fill}",
        f"        for a in range({kh}):",
        f"            r = i - top + a * {dh}",
        "            if 0 <= r < height:",
        "                src = x[p, r]",
        "                for j in range(width):",
        "                    v = src[j]",
        *([f"                    {_nan_check(['v'])}"] if maximum else []),
        "                    m = row[j]",
        *[f"                    {line}" for line in _fold(["m", "v"], maximum, False)[1:]],
        "                    row[j] = m",
        f"    count = oh * width - {reach}",
        *[f"    c{b} = plane[{b * dw}:{b * dw} + count]" for b in range(kw)],
        "    whole = out[left:left + count]",
        *([] if maximum else ["    scale = divisor.reshape(-1)[left:left + count]"]),
        "    for n in range(count):",
        *[f"        {line}" for line in _fold(cells, maximum, False)],
        ("        whole[n] = m" if maximum else "        whole[n] = m / scale[n]"),
        "    for i in range(oh):",
        "        for e in range(left + right):  # the edge columns: k < left, k >= width - right",
        "            k = e if e < left else width - right - left + e",
        f"            m = {fill}",
        f"            for b in range({kw}):",
        f"                c = k - left + b * {dw}",
        "                if 0 <= c < width:",
        "                    v = plane[i * width + c]",
        *[f"                    {line}" for line in _fold(["m", "v"], maximum, False)[1:]],
        ("            out[i * width + k] = m" if maximum else
         "            out[i * width + k] = m / divisor[i, k]"),
        "    return seen",
        "",
    ]


def source(kernel: tuple, strides: tuple, dilations: tuple, maximum: bool) -> str:
    """The module for one window geometry: ``run(x, y, row, staged, divisor, top, left,
    start, stop)`` pools planes start..stop of x (P, H, W) into y (P, oh, ow)."""
    for value in (*kernel, *strides, *dilations):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"pool geometry must be positive integers, got {value!r}")
    flags = "nogil=True, cache=True, boundscheck=False, error_model='numpy'"
    lines = ["import numpy as np", "from numba import njit", ""]
    lines += [f"@njit({flags})", *_plane_source("fast", kernel, strides, dilations, maximum,
                                                False)]
    if maximum:
        lines += [f"@njit({flags})", *_plane_source("careful", kernel, strides, dilations,
                                                    True, True)]
    same = tuple(strides) == (1, 1)
    if same:
        lines += [f"@njit({flags})", *_same_source(kernel, dilations, maximum)]
    lines += [
        f"@njit({flags})",
        "def run(x, y, row, staged, plane, divisor, top, left, start, stop):",
        f"    row[:] = {'-np.inf' if maximum else '0.0'}",
        "    inner = row[left:left + x.shape[2]]",
        "    for p in range(start, stop):",
        "        target = staged if staged.shape[0] > 0 else y[p]",
        ("        if (same(x, p, target, plane, top, left, divisor) if plane.shape[0] > 0 "
         "else fast(x, p, target, row, inner, top, divisor)):" if same else
         "        if fast(x, p, target, row, inner, top, divisor):"),
        *(["            careful(x, p, target, row, inner, top, divisor)"] if maximum
          else ["            pass"]),
        "        if staged.shape[0] > 0:",
        "            y[p] = staged",
        "",
    ]
    return "\n".join(lines)

