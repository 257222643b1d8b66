"""Fused attention heads (``ops/attention/fused_attention.py``) on the packed-panel tile, with the
softmax as vector IR (``ops/panels/_jit_vector_softmax.py``), and their split over the native worker
pool. Compiled so that a head's scores stay in L1 between the two products and no transposed copy
of Q, K or V is made.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from mixrt.ops.compiled.first_use import first_use_cfunc
from mixrt.ops.panels._jit_native_pool import (
    ATT_BATCH, ATT_BOUNDS, ATT_HAS_MASK, ATT_HEADS, ATT_K, ATT_KEY_COUNT, ATT_KEYS, ATT_MASK,
    ATT_MASK_STRIDES, ATT_OUT, ATT_Q, ATT_QUERIES, ATT_SCALE, ATT_SCORES, ATT_SIZE, ATT_SPILL,
    ATT_V, ATT_VALUE_SIZE, ATT_VALUES, ATTENTION_JOB, BLOCK_WORDS, ITEMSIZE, JOB,
    JOB_SIGNATURE, PARTS, begin, claim, finish, get1, get2, get3, publish, put, register_job)
from mixrt.ops.panels._jit_vector_softmax import _softmax_row, softmax_rows  # noqa: F401
from mixrt.ops.panels._jit_tile import STRIP_ROWS, _tile

_jit = njit(nogil=True, cache=True, boundscheck=False)


# -- attention ---------------------------------------------------------------------------------
#
# ``ops/attention/fused_attention.py``'s heads. Q, K, V and the output stay in the (batch, seq,
# heads, size) layout the dense layers use: a head is a column band of each row, read and written
# with the row stride, so the transposes the unfused graph copies through never happen. Per (batch,
# head) pair, K's head is packed transposed into panels (size x 32 keys) and V's into panels of its
# columns (keys x 32); then each strip of up to eight queries gets its scores from the tile into an
# (8, keys) scratch that stays in L1, turns them into probabilities in place (scaled, masked,
# softmax), and multiplies them by V's panels straight into the output. The softmax is the
# vector IR of ops/panels/_jit_vector_softmax.py.


@_jit
def _pack_columns(m, panels, width):
    """The columns of ``m`` (rows, columns; any strides) in ``panels`` (P, rows, width):
    [p, r, c] = m[r, p * width + c], zero past the last column. Attention packs K's head
    transposed (size x keys) and V's head (keys x size) this way."""
    rows, columns = m.shape
    for p in range(panels.shape[0]):
        for r in range(rows):
            for c in range(width):
                at = p * width + c
                panels[p, r, c] = m[r, at] if at < columns else 0


@_jit
def _scale_and_mask(flat, start, keys, scale, mask, at, step, has_mask):
    """A row of scores times ``scale``, plus the mask's row (``mask[at + j * step]``): the
    unfused Mul, then Add."""
    if has_mask:
        for j in range(keys):
            flat[np.uint64(start + j)] = flat[np.uint64(start + j)] * scale + mask[at + j * step]
    elif scale != 1:
        for j in range(keys):
            flat[np.uint64(start + j)] *= scale


@_jit
def attention(q, k, v, mask, mask_strides, has_mask, out, scale, pair0, pair1, row0, row1,
              key_panels, value_panels, scores, spill):
    """``out[b, i, h] = softmax(scale * q[b, i, h] . k[b, :, h] + mask[b, h, i]) @ v[b, :, h]``
    for the (batch, head) pairs pair0..pair1 (pair = b * heads + h) and query rows
    row0..row1. ``q``, ``k``, ``v`` and ``out`` are C-contiguous (batch, seq, heads, size);
    the mask (batch, heads, queries, keys) is read at ``mask[b * strides[0] + h * strides[1]
    + i * strides[2] + j * strides[3]]`` (a broadcast mask has zero strides). Scratch:
    ``key_panels`` (ceil(keys / width), size, width), ``value_panels`` (ceil(v size /
    width), keys, width), ``scores`` (STRIP_ROWS, ceil(keys / width) * width), ``spill``
    (STRIP_ROWS, width)."""
    heads, size = q.shape[2], q.shape[3]
    keys, value_size = k.shape[1], v.shape[3]
    width = spill.shape[1]
    lda, ldo, lds = heads * size, heads * value_size, scores.shape[1]
    flat_scores, flat_out = scores.reshape(-1), out.reshape(-1)
    for pair in range(pair0, pair1):
        b, h = pair // heads, pair % heads
        _pack_columns(k[b, :, h, :].T, key_panels, width)
        _pack_columns(v[b, :, h, :], value_panels, width)
        for s in range(row0, row1, STRIP_ROWS):
            count = min(STRIP_ROWS, row1 - s)
            q_at = (b * q.shape[1] + s) * lda + h * size
            for p in range(key_panels.shape[0]):
                _tile(count, q, q_at, lda, key_panels, p * size * width, width, scores,
                      p * width, lds, size)
            for r in range(count):
                at = b * mask_strides[0] + h * mask_strides[1] + (s + r) * mask_strides[2]
                _scale_and_mask(flat_scores, r * lds, keys, scale, mask, at, mask_strides[3],
                                has_mask)
                _softmax_row(flat_scores, r * lds, keys)
            out_at = (b * out.shape[1] + s) * ldo + h * value_size
            for p in range(value_panels.shape[0]):
                column = p * width
                panel_at = p * keys * width
                if column + width <= value_size:
                    _tile(count, scores, 0, lds, value_panels, panel_at, width, out,
                          out_at + column, ldo, keys)
                    continue
                _tile(count, scores, 0, lds, value_panels, panel_at, width, spill, 0, width,
                      keys)
                for r in range(count):
                    for c in range(value_size - column):
                        flat_out[out_at + r * ldo + column + c] = spill[r, c]


# -- split between threads in native code (see ops/panels/_jit_native_pool.py, JOB) --------------

@_jit
def native_attention(block, parts, bounds, q, k, v, mask, mask_strides, has_mask, out, scale,
                     scratch, worker_scratch):
    """:func:`attention` over the parts ``bounds[p]`` = (pair0, pair1, row0, row1), taken by
    this thread and the pool's worker. ``scratch``: (key_panels, value_panels, scores,
    spill), one set per thread."""
    keys_, values_, scores_, spill_ = scratch
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        for part in range(parts):
            attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                      bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_,
                      scores_, spill_)
        return
    block[JOB] = ATTENTION_JOB
    put(block, ATT_Q, q.reshape(-1))
    put(block, ATT_K, k.reshape(-1))
    put(block, ATT_V, v.reshape(-1))
    put(block, ATT_OUT, out.reshape(-1))
    put(block, ATT_MASK, mask)
    put(block, ATT_MASK_STRIDES, mask_strides)
    put(block, ATT_BOUNDS, bounds)
    put(block, ATT_KEYS, worker_scratch[0])
    put(block, ATT_VALUES, worker_scratch[1])
    put(block, ATT_SCORES, worker_scratch[2])
    put(block, ATT_SPILL, worker_scratch[3])
    block[ATT_BATCH], block[ATT_QUERIES], block[ATT_HEADS], block[ATT_SIZE] = q.shape
    block[ATT_KEY_COUNT], block[ATT_VALUE_SIZE] = k.shape[1], v.shape[3]
    block[ATT_HAS_MASK] = has_mask
    held_scale = np.empty(1, q.dtype)  # in the dtype, so both threads scale alike
    held_scale[0] = scale
    put(block, ATT_SCALE, held_scale)
    block[ITEMSIZE], block[PARTS] = q.itemsize, parts
    publish(block, sequence)
    part = claim(block, parts)
    while part >= 0:
        attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                  bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_, scores_,
                  spill_)
        part = claim(block, parts)
    finish(block)


@_jit
def _worker_attention(block, zero):
    batch, queries, heads = block[ATT_BATCH], block[ATT_QUERIES], block[ATT_HEADS]
    size, keys, value_size = block[ATT_SIZE], block[ATT_KEY_COUNT], block[ATT_VALUE_SIZE]
    q = get1(block, ATT_Q, zero).reshape((batch, queries, heads, size))
    k = get1(block, ATT_K, zero).reshape((batch, keys, heads, size))
    v = get1(block, ATT_V, zero).reshape((batch, keys, heads, value_size))
    out = get1(block, ATT_OUT, zero).reshape((batch, queries, heads, value_size))
    mask, mask_strides = get1(block, ATT_MASK, zero), get1(block, ATT_MASK_STRIDES, np.int64(0))
    bounds = get2(block, ATT_BOUNDS, np.int64(0))
    keys_, values_ = get3(block, ATT_KEYS, zero), get3(block, ATT_VALUES, zero)
    scores_, spill_ = get2(block, ATT_SCORES, zero), get2(block, ATT_SPILL, zero)
    scale = get1(block, ATT_SCALE, zero)[0]
    has_mask = block[ATT_HAS_MASK] != 0
    parts = block[PARTS]
    part = claim(block, parts)
    while part >= 0:
        attention(q, k, v, mask, mask_strides, has_mask, out, scale, bounds[part, 0],
                  bounds[part, 1], bounds[part, 2], bounds[part, 3], keys_, values_, scores_,
                  spill_)
        part = claim(block, parts)


# the worker's side, in each dtype, through the pool's job table (_jit_native_pool.register_job)
@first_use_cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _attention_job_f(raw, unused):
    _worker_attention(carray(raw, (BLOCK_WORDS,)), np.float32(0))


@first_use_cfunc(JOB_SIGNATURE, nopython=True, cache=True, error_model="numpy")
def _attention_job_d(raw, unused):
    _worker_attention(carray(raw, (BLOCK_WORDS,)), np.float64(0))


register_job(ATTENTION_JOB, _attention_job_f, _attention_job_d)
