"""The input and output transforms of Winograd F(2x2, 3x3) (``ops/conv/winograd_cpu.py``): adds
and subtracts over stride-phase planes of the padded image, each a long unit-stride run
that LLVM vectorizes; the products between them are NumPy's batched matmul. Arrays are flat
and indexed with unsigned offsets (see ``ops/compiled/jit_cpu.py``).
"""

from __future__ import annotations

from numba import njit, uint64

_jit = njit(nogil=True, cache=True, boundscheck=False)


# A band is the global tile rows g0..g1 (g = image * th + tile row). Each tile row takes
# tw + 1 columns of the transformed planes: tile (ty, tx) of a band's image sits at column
# (ty - first row) * (tw + 1) + tx, and the last column of each row is spare. With that
# layout, element (a, b) of every tile is one flat run of a stride-phase plane of the padded
# image (``phases[(a % 2) * 2 + b % 2]``, rows tw + 1 wide) shifted by (a // 2) * (tw + 1) +
# b // 2, so both transforms are long unit-stride runs. Each run reads one or two (three)
# streams and writes one: a loop writing all 16 planes at once kept LLVM from vectorizing
# (it could not check that many pairs for overlap) and ran 3.6x slower on 64x56x56.
# ``v`` and ``mm`` hold 16 planes of (channels, columns), ``plane`` elements apart,
# staggered so that the streams do not fall into the same cache sets.

@njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
def _combine(out, o, a, sa, sb, sign, count):
    """out[o + i] = a[sa + i] + sign * a[sb + i] for i < count."""
    for i in range(count):
        out[uint64(o + i)] = a[uint64(sa + i)] + sign * a[uint64(sb + i)]


@njit(nogil=True, boundscheck=False, error_model="numpy", inline="always")
def _combine3(out, o, a, sa, sb, sc, sign, bias, count):
    """out[o + i] = a[sa + i] + sign * (a[sb + i] + a[sc + i]) + bias for i < count."""
    for i in range(count):
        out[uint64(o + i)] = a[uint64(sa + i)] + sign * (a[uint64(sb + i)]
                                                         + a[uint64(sc + i)]) + bias


@_jit
def _split_phases(x, phases, source, row, size, left, w, wide):
    """Input row ``x[source:source + w]`` into the two column phases of a padded row: padded
    column 2k + b (x column 2k + b - left) goes to ``phases[row + b * size + k]``."""
    inner0 = max(0, (left + 1) // 2)
    inner1 = min(wide, (w + left) // 2)  # from inner0 to here both columns are inside x
    for k in range(inner0, inner1):
        phases[uint64(row + k)] = x[uint64(source + 2 * k - left)]
        phases[uint64(row + size + k)] = x[uint64(source + 2 * k + 1 - left)]
    for k in range(wide):
        if inner0 <= k < inner1:
            continue
        for b in range(2):
            j = 2 * k + b - left
            if 0 <= j < w:
                phases[uint64(row + b * size + k)] = x[uint64(source + j)]


@_jit
def winograd_input(x, v, c, h, w, top, left, th, tw, g0, g1, plane, phases, rows):
    """V = B^T d B for every 4x4 input tile d of the band: tile (ty, tx) covers padded rows
    2*ty..2*ty+3 and columns 2*tx..2*tx+3. ``x``: flat (N, C, H, W); scratch ``phases``:
    4 * ((th + 1) * (tw + 1) + 1) elements, ``rows``: 8 * ((g1 - g0) * (tw + 1) + 1)."""
    wide = tw + 1
    columns = (g1 - g0) * wide
    for image in range(g0 // th, (g1 - 1) // th + 1):
        ty0 = max(g0, image * th) - image * th
        ty1 = min(g1, (image + 1) * th) - image * th
        size = (ty1 - ty0 + 1) * wide + 1  # a phase plane, one spare cell for the last run
        count = (ty1 - ty0) * wide
        span = count + 1
        first = (image * th + ty0 - g0) * wide
        for ch in range(c):
            for q in range(4 * size):
                phases[uint64(q)] = 0.0
            for q in range(2 * ty0, 2 * ty1 + 2):  # the padded rows these tiles read
                r = q - top
                if 0 <= r < h:
                    _split_phases(x, phases, ((image * c + ch) * h + r) * w,
                                  (q & 1) * 2 * size + ((q >> 1) - ty0) * wide, size, left, w,
                                  wide)
            # B^T d, per column phase b: rows (d0 - d2, d1 + d2, d2 - d1, d1 - d3), where d0
            # and d2 are row phase 0 (d2 one row down), d1 and d3 row phase 1
            for b in range(2):
                even, odd = b * size, (2 + b) * size
                _combine(rows, b * span, phases, even, even + wide, -1.0, span)
                _combine(rows, (2 + b) * span, phases, odd, even + wide, 1.0, span)
                _combine(rows, (4 + b) * span, phases, even + wide, odd, -1.0, span)
                _combine(rows, (6 + b) * span, phases, odd, odd + wide, -1.0, span)
            # times B: the same combination along each row's columns e0..e3, where e0 and e2
            # are column phase 0 (e2 one column on), e1 and e3 column phase 1
            out = ch * columns + first
            for r in range(4):
                even = 2 * r * span
                odd = even + span
                _combine(v, out + 4 * r * plane, rows, even, even + 1, -1.0, count)
                _combine(v, out + (4 * r + 1) * plane, rows, odd, even + 1, 1.0, count)
                _combine(v, out + (4 * r + 2) * plane, rows, even + 1, odd, -1.0, count)
                _combine(v, out + (4 * r + 3) * plane, rows, odd, odd + 1, -1.0, count)


@_jit
def winograd_output(mm, y, bias, m, oh, ow, th, tw, g0, g1, plane, quads):
    """Y = A^T M A + bias for every tile of the band, into output rows 2*ty and 2*ty + 1
    (the second only where the image has it; likewise the last column). ``mm``: 16 planes
    of (M, columns); ``y``: flat (N, M, oh, ow); scratch ``quads``: 12 * columns."""
    wide = tw + 1
    columns = (g1 - g0) * wide
    half = ow // 2
    for ch in range(m):
        b = bias[uint64(ch)]
        e = ch * columns
        # A^T M: rows (m0 + m1 + m2, m1 - m2 - m3) per column s, into quads[s], quads[4 + s]
        for s in range(4):
            _combine3(quads, s * columns, mm, e + s * plane, e + (4 + s) * plane,
                      e + (8 + s) * plane, 1.0, 0.0, columns)
            _combine3(quads, (4 + s) * columns, mm, e + (4 + s) * plane, e + (8 + s) * plane,
                      e + (12 + s) * plane, -1.0, 0.0, columns)
        # times A, plus the bias: output (i, j) of every tile into quads[8 + 2i + j]
        for i in range(2):
            rows = 4 * i * columns
            _combine3(quads, (8 + 2 * i) * columns, quads, rows, rows + columns,
                      rows + 2 * columns, 1.0, b, columns)
            _combine3(quads, (9 + 2 * i) * columns, quads, rows + columns, rows + 2 * columns,
                      rows + 3 * columns, -1.0, b, columns)
        for g in range(g0, g1):  # interleave the four quarter planes into the output rows
            image = g // th
            ty = g - image * th
            for i in range(2):
                r = 2 * ty + i
                if r >= oh:
                    break
                target = uint64(((image * m + ch) * oh + r) * ow)
                even = uint64((8 + 2 * i) * columns + (g - g0) * wide)
                odd = even + uint64(columns)
                for tx in range(half):
                    y[target + uint64(2 * tx)] = quads[even + uint64(tx)]
                    y[target + uint64(2 * tx + 1)] = quads[odd + uint64(tx)]
                if ow % 2:
                    y[target + uint64(2 * half)] = quads[even + uint64(half)]
