"""The dense products' tile kernels by row count (``ops/panels/_jit_dense.py``), made from the
tile of ``ops/panels/_jit_tile.py``: a whole 12-row strip read packed, strips of 1-12 rows read in
place (9-12 as 8 and the rest), their biased forms (a bias and an activation as the tile is
stored), a last panel's half, and the wide tiles of a product of a few rows (panels side by
side)."""

from __future__ import annotations

from numba import njit

from mixrt.ops.panels._jit_tile import DENSE_ROWS, STRIP_ROWS, _make_tile, _tile, _tile8

_jit = njit(nogil=True, cache=True, boundscheck=False)

# A whole strip of the dense products reads its rows packed k by k (``_jit_dense._pack_strips``)
# from one pointer. Read in place, twelve row pointers and the sums overflowed the registers:
# on a Zen 5 core (numba 0.68, LLVM 22) the loop reloaded them from the stack each k, 28-33
# GMAC/s one thread against onnxruntime's 80-95; packed, 78-91 (2026-12-02). Strips read in
# place go as 8 rows and the rest (a kernel for each of 9-12 rows had cost compile seconds).
_tile12_packed = _make_tile(DENSE_ROWS, packed=True)


@_jit
def _dense_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    """:func:`_tile` for 1..12 rows (DENSE_ROWS), the dense products' strips read in place:
    9..12 as 8 and the rest (whole strips packed take ``_tile12_packed``)."""
    if rows > STRIP_ROWS:
        _tile8(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
        _tile(rows - STRIP_ROWS, a, a_offset + STRIP_ROWS * lda, lda, panels, panel_offset, ldw,
              c, c_offset + STRIP_ROWS * ldc, ldc, k_len)
    else:
        _tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)


_btile1, _btile2, _btile3, _btile4, _btile5, _btile6, _btile7, _btile8 = \
    (_make_tile(rows, biased=True) for rows in range(1, STRIP_ROWS + 1))
_btile12_packed = _make_tile(DENSE_ROWS, biased=True, packed=True)


@_jit
def _biased_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
                 bias, bias_offset, low, high, slope):
    """:func:`_tile` with ``bias[bias_offset + j]`` added to column j's sums as they are
    stored (a whole panel's columns of bias must exist), then times ``slope`` below zero and
    clamped to [low, high] (:func:`limited`)."""
    if rows == 8:
        _btile8(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    elif rows == 7:
        _btile7(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    elif rows == 6:
        _btile6(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    elif rows == 5:
        _btile5(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    elif rows == 4:
        _btile4(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    elif rows == 3:
        _btile3(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    elif rows == 2:
        _btile2(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
    else:
        _btile1(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)


@_jit
def _dense_biased_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc,
                       k_len, bias, bias_offset, low, high, slope):
    """:func:`_biased_tile` for 1..12 rows, as :func:`_dense_tile`."""
    if rows > STRIP_ROWS:
        _btile8(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope)
        _biased_tile(rows - STRIP_ROWS, a, a_offset + STRIP_ROWS * lda, lda, panels,
                     panel_offset, ldw, c, c_offset + STRIP_ROWS * ldc, ldc, k_len, bias,
                     bias_offset, low, high, slope)
    else:
        _biased_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc,
                     k_len, bias, bias_offset, low, high, slope)


# Panels side by side in the tile of a product of 1..WIDE_ROWS rows (a request's row or two
# through a dense layer). One panel's tile keeps rows x 2 sums, each a chain of multiply-adds
# that waits on its last one (4 cycles); a core issues two a cycle, so fewer than 8 chains
# leave it waiting: one row's tile ran at a quarter of the rate, and 1-4 rows through a
# 768 x 768 layer took the same ~31 us on one thread (OpenBLAS's one-row gemv 26). Each
# output's sum is the same sequence as one panel's tile makes (the same bits: batch
# invariance holds). Rows 3 and 4 gained ~14% too, but wide tiles for 1-4 rows made the
# first compile of the dense products ~3.9 s longer (7.9 -> 11.7 s), these two ~1 s.
WIDE_ROWS = 2
WIDE_ACROSS = (4, 2)  # panels side by side for 1 and 2 rows
_wide1, _wide2 = (_make_tile(rows, across=WIDE_ACROSS[rows - 1])
                  for rows in range(1, WIDE_ROWS + 1))
_bwide1, _bwide2 = (_make_tile(rows, biased=True, across=WIDE_ACROSS[rows - 1])
                    for rows in range(1, WIDE_ROWS + 1))


@_jit
def wide_across(rows):
    """Panels side by side in the wide tile of ``rows`` (1..WIDE_ROWS) rows."""
    return WIDE_ACROSS[rows - 1]


@_jit
def _wide_tile(rows, a, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
               panel_stride):
    """The tile of ``rows`` (1..WIDE_ROWS) rows from a's first over :func:`wide_across`
    panels from ``panel_offset``."""
    if rows == 1:
        _wide1(a, 0, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, panel_stride)
    else:
        _wide2(a, 0, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, panel_stride)


@_jit
def _wide_biased_tile(rows, a, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len,
                      bias, bias_offset, low, high, slope, panel_stride):
    """:func:`_wide_tile` with the bias and activation of :func:`_biased_tile`."""
    if rows == 1:
        _bwide1(a, 0, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope, panel_stride)
    else:
        _bwide2(a, 0, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len, bias,
                bias_offset, low, high, slope, panel_stride)


_half1, _half2, _half3, _half4, _half5, _half6, _half7, _half8 = \
    (_make_tile(rows, vectors=1) for rows in range(1, STRIP_ROWS + 1))


@_jit
def _half_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len):
    """:func:`_tile` over the first vector of a panel's columns only: a last panel that
    holds at most ``lanes`` of the weight's columns (a layer to 40 outputs is one panel and
    8 columns: its second panel's multiply-adds were three quarters padding)."""
    if rows == 8:
        _half8(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 7:
        _half7(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 6:
        _half6(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 5:
        _half5(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 4:
        _half4(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 3:
        _half3(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    elif rows == 2:
        _half2(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
    else:
        _half1(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)


@_jit
def _dense_half_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc,
                     k_len):
    """:func:`_half_tile` for 1..12 rows: 9..12 as 8 and the rest (a last panel's half is not
    worth a kernel of its own)."""
    if rows > STRIP_ROWS:
        _half8(a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
        _half_tile(rows - STRIP_ROWS, a, a_offset + STRIP_ROWS * lda, lda, panels, panel_offset,
                   ldw, c, c_offset + STRIP_ROWS * ldc, ldc, k_len)
    else:
        _half_tile(rows, a, a_offset, lda, panels, panel_offset, ldw, c, c_offset, ldc, k_len)
