"""mixrt::FusedAttention (ops/attention/fused_attention.py; its CPU form: attention_cpu.py): the
compiled heads of ops/panels/_jit_panels.py against the composition of ONNX ops it stands for,
computed in float64 with NumPy; and the vector softmax they use."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt.ops.attention import attention_cpu as fa
from mixrt.ops.compiled import jit_cpu, parallel
from mixrt.ops.attention.fused_attention import fused_attention
from mixrt.ops.device import gpu_available
from helpers import until_the_worker_joins

# the CPU's fast path, as a CPU session binds it
fused_attention_cpu = fused_attention.kernels[0].for_device("cpu")
RNG = np.random.default_rng(11)
needs_panels = pytest.mark.skipif(jit_cpu.panel_kernels() is None,
                                  reason="the panel kernels need AVX-512 and numba")
TOLERANCE = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}


def reference(Q, K, V, mask=None, scale=1.0):
    """The unfused graph's arithmetic, in float64."""
    q, k, v = (x.astype(np.float64) for x in (Q, K, V))
    scores = np.matmul(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1)) * scale
    if mask is not None:
        scores = scores + mask
    with np.errstate(invalid="ignore"):
        shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
    return np.matmul(probabilities, v.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)


def heads(batch, queries, keys, count, size, value_size, dtype):
    Q = RNG.standard_normal((batch, queries, count, size)).astype(dtype)
    K = RNG.standard_normal((batch, keys, count, size)).astype(dtype)
    V = RNG.standard_normal((batch, keys, count, value_size)).astype(dtype)
    return Q, K, V


def run(Q, K, V, mask=None, scale=1.0):
    out = np.empty(Q.shape[:3] + V.shape[3:], Q.dtype)
    result = fused_attention_cpu(np, Q, K, V, mask, scale=scale, out=out)
    assert result is out
    return out


# -- the compiled heads ----------------------------------------------------------------------------

GEOMETRIES = [  # batch, queries, keys, heads, size, value size
    (1, 128, 128, 12, 64, 64),  # BERT-base
    (2, 13, 37, 3, 20, 40),  # strips and panels cut short everywhere
    (1, 1, 1, 1, 1, 1),
    (1, 9, 70, 2, 33, 17),  # value columns in one partial panel
    (3, 5, 64, 1, 16, 96),  # fewer (batch, head) pairs than whole panels of keys
]


@needs_panels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_compiled_heads_match_the_composition(geometry, dtype):
    batch, queries, keys, count, size, value_size = geometry
    Q, K, V = heads(*geometry, dtype)
    scale = 1 / np.sqrt(size)
    np.testing.assert_allclose(run(Q, K, V, scale=scale), reference(Q, K, V, scale=scale),
                               **TOLERANCE[dtype])


@needs_panels
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 37), (13, 37), (2, 3, 13, 37), (1, 37)])
def test_masks_broadcast_into_the_scores_and_minus_infinity_weighs_nothing(mask_shape):
    Q, K, V = heads(2, 13, 37, 3, 20, 24, np.float32)
    mask = np.where(RNG.random(mask_shape) < 0.3, -np.inf, RNG.standard_normal(mask_shape))
    mask = mask.astype(np.float32)
    mask[..., 0] = 0.0  # every row keeps a key
    got = run(Q, K, V, mask, scale=0.25)
    np.testing.assert_allclose(got, reference(Q, K, V, mask, 0.25), rtol=2e-5, atol=2e-6)
    # a key masked out for every query changes nothing when its values do
    everywhere = np.broadcast_to(mask, (2, 3, 13, 37))
    hidden = np.all(np.isneginf(everywhere), axis=(1, 2))
    V2 = V.copy()
    V2[np.nonzero(hidden)[0], np.nonzero(hidden)[1]] = 1e30
    np.testing.assert_array_equal(run(Q, K, V2, mask, scale=0.25), got)


@needs_panels
def test_a_nan_score_makes_its_row_nan_and_only_its_row():
    Q, K, V = heads(1, 9, 20, 2, 8, 8, np.float32)
    Q[0, 4, 1, 3] = np.nan
    got = run(Q, K, V)
    assert np.isnan(got[0, 4, 1]).all()
    got[0, 4, 1] = 0
    assert not np.isnan(got).any()


@needs_panels
def test_the_guard_zeroes_the_rows_of_a_query_that_sees_no_key(monkeypatch):
    """``nan_to_zero``: a query whose every key is masked out (a padded row) has no
    probabilities; the guard finds its row not a number in the packed heads' output and
    the composition gives zeros there, the other rows the packed heads' values. Without a
    row to guard, the packed heads' output is the call's."""
    Q, K, V = heads(2, 9, 20, 3, 8, 8, np.float32)
    mask = RNG.standard_normal((2, 1, 9, 20)).astype(np.float32)
    mask[1, 0, 6] = -np.inf
    composed = []
    monkeypatch.setattr(fa.fused_attention, "fn", _counted(fa.fused_attention.fn, composed))
    out = np.empty(Q.shape[:3] + V.shape[3:], Q.dtype)
    with np.errstate(invalid="ignore"):  # the composition's -inf - -inf, as ONNX has it
        fused_attention_cpu(np, Q, K, V, mask, scale=0.5, nan_to_zero=1, out=out)
    assert len(composed) == 1 and not np.isnan(out).any()
    np.testing.assert_array_equal(out[1, 6], 0)
    with np.errstate(invalid="ignore"):
        want = np.nan_to_num(reference(Q, K, V, mask, 0.5))
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)
    mask[1, 0, 6] = 0.0
    fused_attention_cpu(np, Q, K, V, mask, scale=0.5, nan_to_zero=1, out=out)
    assert len(composed) == 1  # nothing to guard: the packed heads' call alone
    np.testing.assert_allclose(out, reference(Q, K, V, mask, 0.5), rtol=2e-5, atol=2e-6)


def _counted(fn, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return counted


@needs_panels
def test_the_heads_split_over_threads_as_pairs_or_as_strips_of_queries(monkeypatch):
    monkeypatch.setattr(fa, "SPLIT_WORK", 0)
    for module in (fa, parallel):
        monkeypatch.setattr(module, "intra_op_threads", lambda: 3)
    big = 1 << 24
    assert fa._parts(12, 128, 8, big) == [(0, 4, 0, 128), (4, 8, 0, 128), (8, 12, 0, 128)]
    assert fa._parts(12, 128, 8, big, 2) == [(2 * p, 2 * p + 2, 0, 128) for p in range(6)]
    assert fa._parts(2, 20, 8, big) == [(0, 2, 0, 8), (0, 2, 8, 16), (0, 2, 16, 20)]
    assert fa._parts(1, 20, 8, big) == [(0, 1, 0, 8), (0, 1, 8, 16), (0, 1, 16, 20)]
    for pairs, rows in ((5, 128), (12, 77), (7, 3)):  # each (pair, query row) once, evenly
        parts = fa._parts(pairs, rows, 8, big, 4)
        covered = np.zeros((pairs, rows), int)
        for p0, p1, r0, r1 in parts:
            covered[p0:p1, r0:r1] += 1
        assert (covered == 1).all() and 3 <= len(parts) <= 12
        ends = [0, 0, 0]
        for p0, p1, r0, r1 in parts:  # claimed in order by whichever thread is free
            ends[ends.index(min(ends))] += (p1 - p0) * -(-(r1 - r0) // 8)
        assert max(ends) <= 1.25 * pairs * -(-rows // 8) / 3 + 1
    for geometry in ((1, 20, 30, 2, 16, 16), (2, 128, 128, 12, 64, 64)):
        Q, K, V = heads(*geometry, np.float32)
        scale = 1 / np.sqrt(geometry[4])
        np.testing.assert_allclose(run(Q, K, V, scale=scale),
                                   reference(Q, K, V, scale=scale), rtol=2e-5, atol=2e-6)


def test_what_the_compiled_kernel_does_not_take_runs_the_composition():
    Q, K, V = heads(1, 6, 7, 2, 4, 5, np.float32)
    widening = RNG.standard_normal((3, 2, 6, 7)).astype(np.float32)  # a batch of 3 masks
    got = fused_attention_cpu(np, Q, K, V, widening, scale=0.5)
    assert got.shape == (3, 6, 2, 5)
    np.testing.assert_allclose(got, reference(Q, K, V, widening, 0.5), rtol=2e-5, atol=2e-6)
    one_head_of_keys = (K[:, :, :1], V[:, :, :1])  # broadcast over the query heads
    got = fused_attention_cpu(np, Q, *one_head_of_keys)
    want = reference(Q, np.repeat(one_head_of_keys[0], 2, 2), np.repeat(one_head_of_keys[1], 2, 2))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    half = fused_attention_cpu(np, *(x.astype(np.float16) for x in (Q, K, V)))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, reference(Q, K, V), rtol=2e-2, atol=2e-3)


def test_inference_gives_the_output_shape_of_the_composition():
    from mixrt.ops.ir.types import TensorType
    infer = fused_attention.kernels[0].infer_fn
    f32 = np.dtype(np.float32)
    q, k, v = (TensorType(f32, ("b", 128, 12, 64)), TensorType(f32, ("b", 96, 12, 64)),
               TensorType(f32, ("b", 96, 12, 32)))
    assert infer(q, k, v)[0].shape == ("b", 128, 12, 32)
    assert infer(q, k, v, TensorType(f32, (3, 1, 1, 96)))[0].shape == (3, 128, 12, 32)
    assert infer(TensorType(f32, None), k, v)[0].shape is None


# -- the vector softmax ----------------------------------------------------------------------

@needs_panels
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 128, 129, 1000])
def test_vector_softmax_rows_match_numpy_with_nan_and_infinities(dtype, n):
    kernels = jit_cpu.panel_kernels()
    x = (RNG.standard_normal((6, n)) * 40).astype(dtype)
    x[1, n // 2] = np.nan
    x[2, :] = -np.inf
    x[3, ::2] = -np.inf
    x[4, :] = np.linspace(-700 if dtype == np.float64 else -87, 0, n)  # exp's whole range
    got = x.copy().reshape(-1)
    kernels.softmax_rows(got, 6, n)
    got = got.reshape(6, n)
    with np.errstate(invalid="ignore"):  # x - max rounds in x's dtype, as the kernel's does
        shifted = np.exp((x - x.max(axis=1, keepdims=True)).astype(np.float64))
        want = shifted / shifted.sum(axis=1, keepdims=True)
    assert (np.isnan(got) == np.isnan(want)).all()
    ulp = np.finfo(dtype).eps
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=8 * ulp,
                               atol=np.finfo(dtype).tiny * 4)
    if n > 1:
        assert (got[3, ::2] == 0).all()  # exp(-inf) is exactly 0


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("masked", [False, True])
def test_on_the_gpu_the_composition_matches_the_cpu(masked):
    import cupy
    Q, K, V = heads(2, 13, 37, 3, 20, 24, np.float32)
    mask = np.zeros((2, 1, 1, 37), np.float32) if masked else None
    if masked:
        mask[..., 5:9] = -np.inf
    on_gpu = [None if x is None else cupy.asarray(x) for x in (Q, K, V, mask)]
    out = cupy.empty((2, 13, 3, 24), cupy.float32)
    got = fused_attention.kernels[0].fn(cupy, *on_gpu, scale=0.3, out=out)
    assert got is out
    np.testing.assert_allclose(cupy.asnumpy(got), reference(Q, K, V, mask, 0.3),
                               rtol=2e-5, atol=2e-6)


@needs_panels
@pytest.mark.skipif(not jit_cpu.NATIVE_POOL_PLATFORM, reason="the native pool is Linux x86-64")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_through_the_native_pool_the_worker_takes_heads_and_the_bits_stay(monkeypatch, dtype):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "2")
    monkeypatch.setattr(fa, "SPLIT_WORK", 0)
    Q, K, V = heads(2, 40, 50, 3, 24, 40, dtype)
    mask = np.where(RNG.random((2, 1, 40, 50)) < 0.2, -np.inf, 0.5).astype(dtype)
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "0")
    expected = run(Q, K, V, mask, scale=0.2)
    np.testing.assert_allclose(expected, reference(Q, K, V, mask, 0.2), **TOLERANCE[dtype])
    monkeypatch.setenv("MIXRT_NATIVE_POOL", "1")
    kernels, native = jit_cpu.panel_kernels(), jit_cpu.native_pool()
    until_the_worker_joins(native.block, kernels.JOINED, lambda: np.testing.assert_array_equal(
        run(Q, K, V, mask, scale=0.2), expected))


# -- heads first, the NaN guard, and a decoder's few queries ----------------------------------------

def laid_out(Q, K, V, heads_first):
    """Q, K, V given (batch, seq, heads, size), each moved heads first where asked."""
    return tuple(np.ascontiguousarray(x.transpose(0, 2, 1, 3)) if first else x
                 for x, first in zip((Q, K, V), heads_first))


@pytest.mark.parametrize("queries", [1, 3, 9])  # the direct loop, then the packed heads
@pytest.mark.parametrize("heads_first", [(0, 1, 1), (1, 1, 1), (1, 0, 0), (0, 0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_heads_first_inputs_give_what_the_sequence_first_ones_do(heads_first, queries, dtype):
    Q, K, V = heads(2, queries, 37, 3, 20, 24, dtype)
    mask = np.where(RNG.random((2, 1, queries, 37)) < 0.3, -np.inf, 0).astype(dtype)
    mask[..., 0] = 0
    out = np.empty(Q.shape[:3] + V.shape[3:], dtype)
    got = fused_attention_cpu(np, *laid_out(Q, K, V, heads_first), mask, scale=0.3,
                              heads_first=list(heads_first), out=out)
    np.testing.assert_allclose(got, reference(Q, K, V, mask, 0.3), **TOLERANCE[dtype])
    generic = fused_attention.fn(np, *laid_out(Q, K, V, heads_first), mask, scale=0.3,
                                 heads_first=list(heads_first))
    np.testing.assert_allclose(generic, reference(Q, K, V, mask, 0.3), **TOLERANCE[dtype])


@pytest.mark.parametrize("queries", [1, 9])
def test_the_nan_guard_zeroes_a_query_that_sees_no_key_and_nothing_else(queries):
    Q, K, V = heads(1, queries, 12, 2, 8, 8, np.float32)
    mask = np.zeros((1, 1, queries, 12), np.float32)
    mask[0, 0, queries - 1] = -np.inf  # the last query sees no key
    out = np.empty(Q.shape[:3] + V.shape[3:], np.float32)
    unguarded = fused_attention_cpu(np, Q, K, V, mask, out=out.copy())
    assert np.isnan(unguarded[0, queries - 1]).all()
    with np.errstate(invalid="ignore"):  # the packed heads' fallback: -inf - -inf, as ONNX has it
        got = fused_attention_cpu(np, Q, K, V, mask, nan_to_zero=1, out=out)
    assert (got[0, queries - 1] == 0).all()
    np.testing.assert_allclose(got[0, :queries - 1], unguarded[0, :queries - 1], rtol=2e-5,
                               atol=2e-6)


def test_heads_first_must_name_three_inputs_with_zero_or_one():
    Q, K, V = heads(1, 1, 4, 1, 2, 2, np.float32)
    with pytest.raises(ValueError, match=r"heads_first is \[q, k, v\] of 0 or 1"):
        fused_attention.fn(np, Q, K, V, heads_first=[0, 2])


def test_inference_reads_heads_first_inputs():
    from mixrt.ops.ir.types import TensorType
    infer = fused_attention.kernels[0].infer_fn
    f32 = np.dtype(np.float32)
    q, k, v = (TensorType(f32, ("b", 1, 12, 64)), TensorType(f32, ("b", 12, 96, 64)),
               TensorType(f32, ("b", 12, 96, 32)))
    assert infer(q, k, v, heads_first=[0, 1, 1])[0].shape == ("b", 1, 12, 32)


# -- grouped-query attention: K and V heads served to several query heads -------------------------

@pytest.mark.parametrize("queries", [1, 3, 9])  # the direct loop, then the packed heads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_heads_give_what_the_repeated_heads_do(queries, dtype):
    Q, K, V = heads(2, queries, 19, 6, 16, 8, dtype)
    q = np.ascontiguousarray(Q.transpose(0, 2, 1, 3))
    # 2 heads of K and V, each serving 3 query heads in a row
    k, v = (np.ascontiguousarray(x[:, :, :2].transpose(0, 2, 1, 3)) for x in (K, V))
    mask = np.where(RNG.random((2, 1, queries, 19)) < 0.3, -np.inf, 0).astype(dtype)
    mask[..., 0] = 0
    repeated = [np.repeat(x, 3, axis=1) for x in (k, v)]
    expected = reference(Q, *(x.transpose(0, 2, 1, 3) for x in repeated), mask, 0.3)
    out = np.empty(Q.shape[:3] + V.shape[3:], dtype)
    got = fused_attention_cpu(np, q, k, v, mask, scale=0.3, heads_first=[1, 1, 1],
                              kv_repeat=3, out=out)
    np.testing.assert_allclose(got, expected, **TOLERANCE[dtype])
    generic = fused_attention.fn(np, q, k, v, mask, scale=0.3, heads_first=[1, 1, 1],
                                 kv_repeat=3)
    np.testing.assert_allclose(generic, expected, **TOLERANCE[dtype])


def test_kv_repeat_needs_heads_first_keys_and_values():
    Q, K, V = heads(1, 1, 4, 2, 2, 2, np.float32)
    with pytest.raises(ValueError, match="kv_repeat is 2"):
        fused_attention.fn(np, Q, K, V, kv_repeat=2)
    with pytest.raises(ValueError, match="kv_repeat is 0"):
        fused_attention.fn(np, Q, K, V, heads_first=[1, 1, 1], kv_repeat=0)


def test_inference_repeats_the_grouped_heads():
    from mixrt.ops.ir.types import TensorType
    infer = fused_attention.kernels[0].infer_fn
    f32 = np.dtype(np.float32)
    q, k, v = (TensorType(f32, ("b", 8, 1, 64)), TensorType(f32, ("b", 2, 96, 64)),
               TensorType(f32, ("b", 2, 96, 32)))
    assert infer(q, k, v, heads_first=[1, 1, 1], kv_repeat=4)[0].shape == ("b", 1, 8, 32)


def test_a_decoder_step_with_new_arrays_of_the_same_layout_takes_the_kept_step():
    """Each step passes a new K and V (the KV cache's Concat): the node keeps the layout it
    worked out and the next steps go straight to the loop, with their own values."""
    from mixrt.ops.attention.attention_cpu import STEP
    node = {}
    for step in range(3):
        Q, K, V = heads(1, 1, 16, 4, 8, 8, np.float32)
        k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (K, V))
        mask = np.zeros((1, 1, 1, 16), np.float32)
        if step == 2:
            mask[..., :] = -np.inf  # no key to see: the guard zeroes the row
            v[0, 1, 3, 0] = np.nan  # a NaN value elsewhere stays what the composition makes
        out = np.empty((1, 1, 4, 8), np.float32)
        got = fused_attention_cpu(np, Q, k, v, mask, scale=0.5, heads_first=[0, 1, 1],
                                  nan_to_zero=1, out=out, _node=node)
        assert node.get(STEP) is not None
        with np.errstate(invalid="ignore"):  # the composition's masked row: -inf - -inf
            expected = fused_attention.fn(np, Q, k, v, mask, scale=0.5,
                                          heads_first=[0, 1, 1], nan_to_zero=1)
        np.testing.assert_allclose(got, expected, **TOLERANCE[np.float32])
    # the guarded row weighs every value by 0: zeros, and NaN where 0 meets the NaN value
    assert np.isnan(got[0, 0, 1, 0]) and (np.nan_to_num(got, nan=0.0) == 0).all()


@needs_panels
def test_the_packed_heads_call_is_kept_and_replays_on_strided_inputs_with_the_guard():
    """A call into the caller's ``out`` (a node's, with its ``_node`` dict) is kept as the
    node's replay: the next call with the same arrays is that call, whose inputs that are
    not C-contiguous (parts of one projection, as GPT-2's Split makes them) are copied into
    buffers of its own each time; new values give new answers, and a query that sees no key
    is zeroed by the guard in the replayed call too."""
    from mixrt.ops.compiled import replay
    batch, queries, count, size = 2, 24, 3, 16
    projection = RNG.standard_normal((batch, queries, 3 * count * size)).astype(np.float32)
    parts = [projection[:, :, i * count * size:(i + 1) * count * size]
             .reshape(batch, queries, count, size) for i in range(3)]
    assert not parts[0].flags.c_contiguous
    mask = np.zeros((batch, 1, queries, queries), np.float32)
    out = np.empty((batch, queries, count, size), np.float32)
    node: dict = {}
    kept = []
    for round_ in range(3):
        projection[:] = RNG.standard_normal(projection.shape)  # new values, same arrays
        mask[...] = 0
        if round_ == 2:
            mask[1, 0, 5] = -np.inf  # query 5 of the second image sees no key
        with jit_cpu.native_run(True):
            fused_attention_cpu(np, *parts, mask, scale=0.25, nan_to_zero=1, out=out,
                                _node=node)
        kept.append(node.get(replay.KEY))
        want = reference(*parts, mask, 0.25)
        want = np.where(np.isnan(want), 0, want)
        np.testing.assert_allclose(out, want, **TOLERANCE[np.float32])
    assert kept[0] is not None and kept[1] is kept[0] and kept[2] is kept[0]  # replayed
    assert np.all(out[1, 5] == 0)


@needs_panels
def test_layers_at_one_length_share_one_compiled_call_and_keep_their_own_answers():
    """Two nodes (a transformer's layers) with arrays of the same layouts take the same
    call of the compiled heads on one thread, strided inputs copied into its buffers one
    call at a time; each answer is its own inputs'. A new length makes a new call."""
    from mixrt.ops.compiled import replay
    batch, queries, count, size = 2, 20, 4, 8
    calls, answers = [], []
    for layer in range(2):
        projection = RNG.standard_normal((batch, queries, 3 * count * size)).astype(np.float32)
        parts = [projection[:, :, i * count * size:(i + 1) * count * size]
                 .reshape(batch, queries, count, size) for i in range(3)]
        out = np.empty((batch, queries, count, size), np.float32)
        node: dict = {}
        fused_attention_cpu(np, *parts, scale=0.5, out=out, _node=node)
        calls.append(node[replay.KEY].action.__closure__)  # the kept call it wraps
        answers.append((out, reference(*parts, scale=0.5)))
    for got, want in answers:
        np.testing.assert_allclose(got, want, **TOLERANCE[np.float32])
    shared = [cell.cell_contents for cell in calls[0] if callable(cell.cell_contents)]
    assert shared and all(any(cell.cell_contents is call for cell in calls[1])
                          for call in shared)
    other = heads(batch, queries + 1, queries + 1, count, size, size, np.float32)
    assert fa._shared_call(*other, None, 0.5) is not fa._shared_call(
        *heads(batch, queries, queries, count, size, size, np.float32), None, 0.5)
