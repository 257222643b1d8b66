"""Dense matrix products on the CPU: MatMul, Gemm and the fused products.

A constant weight and attention's stacked products take the packed-panel tiles of
``ops/panels/_jit_panels.py`` (the section at the end). Without them (no AVX-512, MIXRT_JIT=0, a
weight computed in the graph), a batch of a few requests through a dense layer takes the
forms below.

OpenBLAS's sgemm is slow when the left operand has a handful of rows. Through a 2048 x 2048
layer on this 2-core machine, one row (a gemv) took 0.09 ms and 8 rows took 1.0 ms; the same
8 rows computed as the transposed product ``out.T = B.T @ A.T`` into a contiguous (N, m)
scratch, then copied back, took 0.50 ms, and 0.16 ms against 0.37 ms for the MLP's 784 x 2048
layer (2.3x). Past 64 rows the plain product wins again. ``B.T`` is fastest contiguous: the
(N, K) weight of a Gemm with ``transB=1`` already is; a constant (K, N) weight gets a
contiguous transposed copy kept in its session node's prepacked dict (``workspace.packed``).

Up to eight rows, a compiled loop (``row_kernels.few_rows_product``) beats that too: sixteen dot
products per pass over K, each weight value loaded once for eight rows. 8 x 784 @ 784 x
2048: 95 against 167 us; 8 x 2048 @ 2048 x 2048: 345 against 574; two rows 0.55-0.71x. From
16 rows on it re-reads the weight per group of eight and loses (0.78-1.59x).

**Batch invariance** (``MIXRT_BATCH_INVARIANT=1``, which ``mixrt serve`` sets where it joins
requests). The forms above are chosen by the number of rows, and each sums a row's K
products in its own order: a request's row through OpenBLAS's gemv alone and through its
sgemm or the panels beside other rows differs in the last bits. With the switch on, every
product against a constant weight (and attention's stacks) takes the panels, whose sums for
a row do not depend on the other rows (their thread split only divides rows and panels),
and the one-row BLAS, the tiny layers and the small-weight shortcut are off.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from mixrt.base.settings import batch_invariant
from mixrt.ops.compiled import jit_cpu, replay
from mixrt.ops.nn import row_kernels
from mixrt.ops.nn.panel_calls import ProductCall, panel_action
from mixrt.ops.nn.product_parts import load_packed_entry, native_parts, shared_packs
from mixrt.ops.compiled.workspace import named_buffer, packed, per_shape
from mixrt.ops.compiled.parallel import parallel_for, thread_parts

FEW_ROWS = (2, 64)  # rows of the left operand for which the transposed product is faster
MIN_WEIGHT = 1 << 16  # elements of B below which the choice does not matter


def suits(A, B) -> bool:
    """Whether ``A @ B`` (A (..., m, K) with its leading axes merged, B (K, N)) is a few-rows
    product of native floats that the transposed form computes faster."""
    if A.ndim < 2 or B.ndim != 2 or A.dtype != B.dtype \
            or A.dtype not in (np.float32, np.float64):
        return False
    rows = math.prod(A.shape[:-1])
    return FEW_ROWS[0] <= rows <= FEW_ROWS[1] and B.size >= MIN_WEIGHT \
        and (A.ndim == 2 or A.flags.c_contiguous)


def product_into(A, B, out, prepacked=None, B_rows=None):
    """``out = A @ B`` through the transposed product. ``B_rows``, when given, is B.T as a
    contiguous (N, K) array (a Gemm's transB weight); otherwise B.T comes from ``prepacked``
    (made once) or is read as a view."""
    if not out.flags.c_contiguous:  # both paths write through a reshaped view of it
        return np.matmul(A, B, out=out)
    a = A.reshape(-1, A.shape[-1])
    rows = a.shape[0]
    if B_rows is None:
        B_rows = packed(prepacked, "rows_of_transpose", lambda: np.ascontiguousarray(B.T)) \
            if prepacked is not None else B.T
    n = B_rows.shape[0]
    target = out.reshape(rows, n)
    if row_kernels.few_rows_suits(a, B_rows, target):
        row_kernels.few_rows_product(a, B_rows, target)  # up to eight rows: a compiled loop
        return out
    transposed_call(a.shape, B_rows, target)(a)
    return out


def transposed_call(a_shape, B_rows, target):
    """``target = a @ B_rows.T`` for a of ``a_shape`` as a call of ``a``: B^T a^T into this
    thread's scratch, then copied over transposed (the scratch looked up once: a bound call
    keeps it for its arena and thread, ``ops/nn/bound_products.py``)."""
    n, rows = B_rows.shape[0], a_shape[0]
    scratch = named_buffer("few_rows", n * rows * B_rows.itemsize).view(B_rows.dtype) \
        .reshape(n, rows)

    def call(a):
        np.matmul(B_rows, a.T, out=scratch)
        np.copyto(target, scratch.T)
    return call


def stacked_product(A, B, out):
    """``out = A @ B`` for A (..., m, K) and a 2-D B: a C-contiguous stack of A is one (rows, K)
    matrix, so the product is one sgemm rather than NumPy's one per stacked matrix. The
    BERT-shaped encoder at batch 8, (8, 128, 768) @ (768, 3072): 9.4 ms merged against
    11.8 ms as eight products (OpenBLAS splits a 1024-row product across its threads
    better than eight 128-row ones)."""
    if A.ndim > 2 and B.ndim == 2 and A.flags.c_contiguous and out.flags.c_contiguous \
            and out.shape == A.shape[:-1] + B.shape[1:]:
        np.matmul(A.reshape(-1, A.shape[-1]), B, out=out.reshape(-1, B.shape[1]))
        return out
    return np.matmul(A, B, out=out)


def dense_product(A, B, out, prepacked=None, replays=None, recorded=()):
    """``out = A @ B`` (native floats, ``out`` apart from B) in the fastest form here: the
    packed panels for a constant weight, the transposed form for a few rows, else one
    product per C-contiguous stack. ``replays``, ``recorded``: as for
    :func:`panel_product`, which alone records."""
    if B.ndim == 2 and B.size < MIN_WEIGHT and A.size * B.shape[1] < PANEL_MIN_WORK \
            and not streamed(B) and not batch_invariant():
        return stacked_product(A, B, out)  # what the checks below come to (~1 us of them)
    if panels_suit(A, B, out, prepacked):
        return panel_product(A, B, out, prepacked, None, replays, recorded)
    if stacks_suit(A, B, out):
        return stacked_panel_product(A, B, out)
    if suits(A, B) and not np.may_share_memory(out, A):
        return product_into(A, B, out, prepacked)
    return stacked_product(A, B, out)


def biased_gemm_product(A, B, C, transA, transB, out, prepacked, replays=None,
                        recorded=(), limits=None) -> bool:
    """``out = A' B' + C`` with C one value per column, the bias added in the panels
    (:func:`biased_panel_product`); False, nothing written, where that does not apply. The
    node's rows route (:class:`RowsRoute`) is kept by B as the node has it, transposed or
    not (``B.T`` is a new view each call)."""
    return C is not None and not transA and biased_panel_product(
        A, B.T if transB else B, C, out, prepacked, replays, recorded, source=B,
        limits=limits)


def graph_output(A, B, transA=0, transB=0):
    """A new array for ``A' @ B'`` where the product is a graph output (the executor passes
    no ``out=`` for those: a language model's logits, a classifier's scores), so that it takes
    the forms an arena's view takes, the panels included; None where the generic product
    applies (1-D or mixed-dtype operands). Through NumPy's own matmul a GPT-2's 2 x 16 x 64
    @ 64 x 1000 head was one BLAS call a stacked row, each split over the BLAS's threads:
    ~100 us a run on a loaded 2-core machine against ~25 for one call."""
    if A.ndim < 2 or B.ndim < 2 or A.dtype != B.dtype or A.dtype not in jit_cpu.NATIVE \
            or (transA or transB) and not A.ndim == B.ndim == 2:
        return None
    rows = A.shape[-1] if transA else A.shape[-2]
    columns = B.shape[-2] if transB else B.shape[-1]
    if (A.shape[-2] if transA else A.shape[-1]) != (B.shape[-1] if transB else B.shape[-2]):
        return None  # the generic product raises its own error
    batch = A.shape[:-2] if B.ndim == 2 else np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    return np.empty(batch + (rows, columns), A.dtype)


def one_row_blas(A, B, out) -> bool:
    """Whether ``A @ B`` into ``out`` is one row (any leading ones) of native floats under
    ONE_ROW_WORK multiply-adds, a weight the native workers would not stream
    (:func:`streamed`) and not a transposed one (:func:`transposed_weight`): neither the
    panels nor the few-rows form take it, the BLAS does."""
    return B.ndim == 2 and A.shape[-1] == B.shape[0] and A.size == A.shape[-1] \
        and A.dtype == B.dtype == out.dtype and A.dtype in jit_cpu.NATIVE \
        and out.size == B.shape[1] and A.size * B.shape[1] < ONE_ROW_WORK \
        and not streamed(B) and not batch_invariant() and not transposed_weight(B)


def transposed_weight(B) -> bool:
    """Whether the (K, N) operand B is a transposed view of a row-major (N, K) weight, as a
    Gemm's transB (a PyTorch Linear's) hands it: the panels take it at any rows, one
    included (:func:`panels_suit`)."""
    return B.flags.f_contiguous and not B.flags.c_contiguous


def small_one_row(A, B, transA, transB, out) -> bool:
    """:func:`one_row_blas` for Gemm's ``A' B'`` (A not transposed)."""
    return not transA and A.ndim == 2 and one_row_blas(A, B.T if transB else B, out)


def gemm_product(A, B, transA, transB, out, prepacked=None):
    """``out = A' B'`` (2-D, native floats), a few-rows product in its faster form."""
    left, right = A.T if transA else A, B.T if transB else B
    if panels_suit(left, right, out, prepacked):
        return panel_product(left, right, out, prepacked)
    if suits(left, right) and not np.may_share_memory(out, left):
        return product_into(left, right, out, prepacked,
                            B_rows=B if transB and B.flags.c_contiguous else None)
    return np.matmul(left, right, out=out)


# -- products against a constant weight packed into panels ---------------------------------------
#
# For a weight that is a constant of the session, the compiled kernels of ops/panels/_jit_panels.py
# beat OpenBLAS from PANEL_MIN_ROWS rows on (it packs the weight again on every call and
# splits a 128-row product poorly over two threads). On this machine, 2 threads:
# 128 x 768 @ 768 x 768 0.32 against 0.39 ms, 128 x 3072 @ 3072 x 768 1.27 against 1.69,
# 1024 x 768 @ 768 x 3072 10.7 against 11.2.

PANEL_MIN_ROWS = 2
# multiply-adds below which the product stays with the BLAS. From 2^18 (OpenBLAS's own
# threshold, 65536 x GEMM_MULTITHREAD_THRESHOLD 4) OpenBLAS splits an sgemm over its threads,
# and a thread asleep since the last BLAS call takes ~20-40 us to wake: measured on the
# 2-core EPYC, each product 100 us of Python after the last, one-thread panels against the
# BLAS: 32 x 64 @ 64 x 256 7.3 against 10.0 us, 16 x 256 @ 256 x 256 12.1 against 55.7,
# 32 x 64 @ 64 x 1000 23.9 against 60.8 (back to back 6.2/8.0, 12.0/22.0, 24.6/26.0).
# Up to 2^18 OpenBLAS stays on one thread and is as fast or faster (16 x 64 @ 64 x 64: 1.9
# against 1.9 us; a scikit-learn MLP's 64 x 64 @ 64 x 64 layers: its run 50 against 59 us).
PANEL_MIN_WORK = (1 << 18) + 1
# the same for the stacked products of attention (stacks_suit), which were measured from 2^20
STACK_MIN_WORK = 1 << 20
# multiply-adds from which the panels are split over the intra-op threads: handing a part to
# a sleeping thread costs ~20 us, a one-thread 100 x 100 @ 100 x 100 takes 10. Inside a run
# that woke the workers the hand-off is cheaper: 1 << 22 (a 64-token 256 x 256 layer split)
# took small BERT, DistilBERT and T5 exports 7-10% faster than 1 << 23; 1 << 20 was slower
# then. Since the native workers spin through a run, 1 << 20 is faster (2026-11-25, one
# process per setting, alternating): EfficientNet-B0 at 96 x 96 5.9 -> 5.0 ms (a 192 x 1152
# weight is 0.9 MB, streamed at twice the rate by two threads), a 2-layer BERT with hidden
# 256 at 2 x 16 tokens 1.24 -> 1.07, GPT-2 hidden 256 at 16 tokens 0.90 -> 0.75, RegNet-Y
# at 224 ~3%; BERT-base at 128 tokens and hidden 64 even. Since a product of few panels is
# split over bands of rows too (native_parts), 1 << 18 (2026-11-26, two sessions in one
# process alternating, two runs): ShuffleNetV2 at 1 x 96 0.91-0.92, MobileNetV2 0.96-0.97,
# RegNet-Y 0.96-0.98, BERT h256 at 2 x 16 0.95, BERT h64 at 2 x 16 0.94-0.99, GPT-2 h256
# at 1 x 8 0.96-1.00; 1 << 17 lost on the transformers (1.06-1.11)
PANEL_SPLIT_WORK = 1 << 18
# multiply-adds from which a stack of products (attention's) is split over the threads. Its
# parts go to Python threads (parallel_for), whose hand-off with the GIL costs far more than
# the native pool's: on the 2-core Zen 4 (2026-11-26), us split / one thread, 2 x (128 x 64
# @ 64 x 128) 143 / 44, 8 x the same 190 / 167, 24 x 361 / 496, 2 x (512 x 64 @ 64 x 512)
# 461 / 668; inside a 2-layer BERT with hidden 64 at 2 x 128 tokens each score product took
# ~630 us split, where 2^20 had it split. Inside models the split lost even at 2^23-2^25 (one
# process, settings alternated, ms a run, 2^23 / 2^26): BERT h256 2 x 128 9.16 / 8.96, BERT
# h768 1 x 128 25.9 / 24.5, GPT-2 h768 2 x 128 49.6 / 49.2, GPT-2 h256 2 x 128 10.9 / 10.3
STACK_SPLIT_WORK = 1 << 26
# One row (a request at batch 1) through a dense layer of at least this many multiply-adds
# takes the panels too, split over the native threads however small: inside a run OpenBLAS's
# gemv took the MLP's 784 x 2048 and 2048 x 2048 layers at 1.6-1.9x onnxruntime's whole run,
# the split panels at 1.1-1.15x (one thread streams the weight at about half the speed). A
# gemv alone, back to back on one weight, is as fast (50 against 58 us, 144 against 137).
# From 2^19 rather than 2^20: a MobileNetV3-small's classifier, 1 x 576 @ 576 x 1024 and
# 1 x 1024 @ 1024 x 1000, took 35 and 61 us through the gemv, 13 and 34 split (back to back).
ONE_ROW_WORK = 1 << 19
# Bytes of a constant weight from which a product is split over the native workers (and taken
# by the panels) whatever its work. With a few rows a product streams its weight, which in a
# model's run comes from L3: one thread reads it at ~28 GB/s on this machine, two at ~55, as
# onnxruntime does (~50 GB/s through any chain of one-row layers). Back to back over a chain
# of distinct weights, us a product, split / one thread / the BLAS: one row 256 x 256 4.8 /
# 9.6 / 9.4, 512 x 512 19.0 / 37.4 / 36.8, 128 x 256 3.5 / 5.2 / 5.1, eight rows 128 x 256
# 5.0 / 5.6 / 7.7; 128 x 128 2.6 / 3.1 / 2.8 and 64 x 64 1.7 / 0.9 / 0.8 (the hand-off
# costs more than it saves).
SPLIT_WEIGHT_BYTES = 1 << 17


def streamed(B) -> bool:
    """Whether a product against the 2-D weight ``B`` is worth splitting for its weight's
    sake alone (SPLIT_WEIGHT_BYTES), where the native workers are there to take a part."""
    return B.ndim == 2 and B.size * B.itemsize >= SPLIT_WEIGHT_BYTES \
        and jit_cpu.native_pool() is not None


def panels_suit(A, B, out, prepacked, min_work: int | None = None) -> bool:
    """Whether ``out = A @ B`` takes the packed-panel kernels: B a 2-D constant weight
    (``prepacked`` is its node's dict), A a C-contiguous (..., m, K) stack of at least
    PANEL_MIN_ROWS rows (or one row: through a transposed weight, or of ONE_ROW_WORK
    multiply-adds with the native pool to split it), all one native float dtype, ``out``
    C-contiguous and apart from A, and at least ``min_work`` multiply-adds or a weight the
    workers stream (:func:`streamed`)."""
    if prepacked is None or B.ndim != 2 or A.ndim < 2 or A.shape[-1] != B.shape[0] \
            or not A.dtype == B.dtype == out.dtype or A.dtype not in jit_cpu.NATIVE:
        return False
    rows = A.size // max(A.shape[-1], 1)
    work = A.size * B.shape[1]
    large = streamed(B) or batch_invariant() and rows > 0
    # a transposed weight (Gemm's transB: a PyTorch Linear's) takes the panels below
    # PANEL_MIN_WORK too: the few-rows and BLAS forms over it were slower at every size
    # tried (2026-11-27, one thread's call with its route: 3 x 307 @ (65 x 307)^T 4.7 ->
    # 2.4 us, 3 x 24 @ (307 x 24)^T 6.2 -> 1.6; a 5-layer MLP at 3 rows 82 -> 70 us a run),
    # one row too: the gemv and an epilogue pass took that MLP's layers 13-35 us each at
    # batch 1, the panels 8-10 (2026-12-04, docs/cpu-kernels.md)
    transposed = min_work is None and transposed_weight(B)
    if rows < PANEL_MIN_ROWS and not batch_invariant() and not (rows == 1 and (
            (work >= ONE_ROW_WORK or large) and jit_cpu.native_pool() is not None
            or transposed)):
        return False
    return (large or transposed or work >= (PANEL_MIN_WORK if min_work is None else min_work)) \
        and A.flags.c_contiguous and out.flags.c_contiguous \
        and out.size == rows * B.shape[1] and not np.may_share_memory(out, A) \
        and jit_cpu.panel_kernels() is not None


def panel_width(dtype) -> int:
    kernels = jit_cpu.panel_kernels()
    return kernels.PANEL_VECTORS * kernels.VECTOR_BYTES // np.dtype(dtype).itemsize


def pack_panels(B) -> np.ndarray:
    """B (K, N) as (P, K, width) panels of consecutive columns, the last one zero-padded."""
    k, n = B.shape
    width = panel_width(B.dtype)
    count = -(-n // width)
    panels = np.zeros((count, k, width), B.dtype)
    for p in range(count):
        panels[p, :, :min(width, n - p * width)] = B[:, p * width:(p + 1) * width]
    return panels


def panel_product(A, B, out, prepacked, bias=None, replays=None, recorded=(), source=None,
                  limits=None):
    """``out = A @ B`` (:func:`panels_suit`), plus ``bias`` (one value per column, A's
    dtype, contiguous) when given, added to each tile as it is finished, then the
    activation ``limits`` (``direct_forms.layer_limits``, with a bias alone) in the same registers;
    the panels split over the intra-op threads: through the native pool where there is one
    (its hand-off never takes the GIL), else ``parallel_for``. The call is kept as the
    node's replay in ``replays`` (its prepacked dict, ``ops/compiled/replay.py``) under the
    node's arrays ``recorded``, whose first is A and last ``out``: the checks and the
    arguments cost ~7 us of a 64 x 256 @ 256 x 256 product's ~32. ``source``: the node's
    weight, where B is a view made of it (Gemm's transposed B), for its rows route."""
    call = panel_call(A, B, prepacked, bias, limits)
    call(A, out)
    if replays is not None:
        replay.record(replays, recorded, panel_action(call), silent=True)
        replays[ROWS_ROUTE] = RowsRoute(B, bias, A.dtype, B if source is None else source,
                                        limits)
    return out


# -- a node's next shapes: the route of its panel product by rows --------------------------
#
# A service's new sequence length makes every product of a transformer a new shape, and each
# took the full route again: the product forms' checks, the panels' arguments, a new replay
# (~20-30 us a product, cold, against its ~15 us replay; 36-72 products a 6-12 layer
# encoder's new length). Yet a node whose weight and bias are constants takes the same
# route at every number of rows past the thresholds that choose it: only the rows, their
# split and the reshapes differ. So its panel product also keeps a RowsRoute, and a call
# with arrays the replay does not know goes straight to the panels when the checks that
# keep it there hold for the new rows.

# multiply-adds under which a dense layer is one compiled call (its product, bias and Relu) and
# nothing else is asked (a scikit-learn MLP's 1 x 64 @ 64 x 64: ~2 us of ~5 were the checks
# that choose among the product forms and the compiled epilogue). 2^16 rather than 2^14
# (2026-11-26, one process, two sessions alternating): the MLP at 4 and 8 rows 0.89, at 16
# 1.02, small transformers (hidden 64, 8-16 tokens; GPT-2 h256's decode step) 0.98-1.00
TINY_WORK = 1 << 16

ROWS_ROUTE = ("panel rows route",)  # its place in the node's prepacked dict


class RowsRoute:
    """What a node's panel product at any rows needs from its last full route: the
    constant weight and bias it was settled for (compared by identity: ``source``, the
    weight as the node has it, B the (K, N) operand made of it), their dtype, and the
    thread, native pool and scratch it ran on (as a replay is tied to them); and the
    calls it made, by rows (``workspace.per_shape``'s last few), which hold only what
    those fix."""

    __slots__ = ("B", "source", "bias", "limits", "dtype", "thread", "pool", "scratch",
                 "streamed", "calls", "kit")

    def __init__(self, B, bias, dtype, source=None, limits=None):
        self.B, self.bias, self.dtype = B, bias, np.dtype(dtype)
        self.limits = limits
        self.source = B if source is None else source
        self.thread = threading.get_ident()
        self.pool = jit_cpu.native_pool()
        self.scratch = jit_cpu.scratch_generation()
        self.streamed = streamed(B)
        self.calls: dict = {}
        self.kit: _RowsKit | None = None  # made at the first call the route makes


def rows_route(prepacked, A, B, bias, out, recorded, limits=None) -> bool:
    """``out = A @ B (+ bias)``, then the activation ``limits`` (``direct_forms.layer_limits``),
    through the node's panels at A's rows, recorded as its replay under ``recorded`` (the
    node's arrays, A first and ``out`` last), where its RowsRoute holds for these arrays:
    the same weight (B as the node has it: a Gemm's untransposed one), bias, activation,
    dtype, thread, pool and scratch; A and ``out`` C-contiguous and apart; two rows or more
    (one goes to the BLAS); past the few-rows and tiny forms (PANEL_MIN_WORK unless the
    weight is streamed, TINY_WORK always). Else False, nothing written: the full route."""
    route = None if prepacked is None else prepacked.get(ROWS_ROUTE)
    if route is None or route.source is not B or route.bias is not bias \
            or route.limits is not limits or A.__class__ is not np.ndarray \
            or out.__class__ is not np.ndarray or A.dtype != route.dtype \
            or out.dtype != route.dtype:
        return False
    B = route.B
    k, n = B.shape
    if A.ndim < 2 or A.shape[-1] != k or not A.flags.c_contiguous \
            or not out.flags.c_contiguous:
        return False
    rows = A.size // k
    work = A.size * n
    if rows < 2 or out.size != rows * n or work < TINY_WORK \
            or (work < PANEL_MIN_WORK and not route.streamed) \
            or route.thread != threading.get_ident() or route.pool is not jit_cpu.native_pool() \
            or route.scratch != jit_cpu.scratch_generation() or batch_invariant() \
            or jit_cpu.panel_kernels() is None or np.may_share_memory(out, A):
        return False
    # a shape that comes back (its plan's second run, not bound yet) made the call again:
    # its split, scratch and closures, ~55 us of a product's ~80 of Python there
    call = per_shape(route.calls, rows, lambda: _call_at(_kit(route, prepacked), rows))
    call(A, out)
    replay.record(prepacked, recorded, panel_action(call), silent=True)
    return True


def _kit(route: RowsRoute, prepacked) -> _RowsKit:
    """The route's :class:`_RowsKit`, made once (rows_route checked that the thread, pool
    and scratch it holds for are the route's)."""
    kit = route.kit
    if kit is None:
        kit = route.kit = _RowsKit(route.B, prepacked, route.bias, route.dtype, route.limits)
    return kit


def native_call_arguments(rows: int, B, prepacked, dtype, bias=None) -> tuple | None:
    """``(block, parts, panels, bounds, spill, worker_spill, bias)``: the arguments of
    ``native_product`` (and of the kernels that call it) for ``rows`` rows against the
    weight ``B`` (K, N), split where :func:`panel_call` splits (else one part, on the calling
    thread); None without the native pool. The scratch is this thread's."""
    if jit_cpu.native_pool() is None:
        return None
    kit = _RowsKit(B, prepacked, bias, dtype, None)
    bounds = _bounds(kit, rows, _split(rows, kit.k, kit.n, kit.itemsize))
    return (kit.native.block, len(bounds) // 4, kit.panels, bounds, kit.spill,
            kit.worker_spill, kit.bias)


def _bounds(kit, rows: int, split: bool) -> np.ndarray:
    """The parts (``product_parts.native_parts``) of ``kit``'s product at ``rows`` rows; one
    part, on the calling thread, where it is not ``split``."""
    if not split:
        return np.array([0, kit.count, 0, rows], np.int64)
    kit.kernels.job_ready(kit.kernels.PRODUCT_JOB, kit.dtype.itemsize)  # the worker's side
    kernels = kit.kernels
    packed_rows = -(-rows // kernels.DENSE_ROWS) * kernels.PACKED_STRIDE  # A as strips
    return native_parts(kit.count, rows, kernels.DENSE_ROWS, kit.panels.shape[2],
                        kit.panels.nbytes + packed_rows * kit.k * kit.itemsize)


def _split(rows: int, k: int, n: int, itemsize: int) -> bool:
    """Is a product of ``rows`` rows against a (k, n) weight split over the threads?"""
    return rows * k * n >= (PANEL_SPLIT_WORK if rows > 1 else ONE_ROW_WORK) \
        or k * n * itemsize >= SPLIT_WEIGHT_BYTES


def panel_call(A, B, prepacked, bias=None, limits=None):
    """:func:`panel_product` for A's shape as a call to make, ``call(A, out)``, on arrays of
    the shapes and dtype of these (its scratch is this thread's)."""
    return _call_at(_RowsKit(B, prepacked, bias, A.dtype, limits), A.size // B.shape[0])


class _RowsKit:
    """What a product's calls against one packed weight share at any number of rows: the
    panels, the bias and activation arrays, the kernels and this thread's spill buffers
    and native pool. A RowsRoute keeps one (while its thread, pool and scratch hold): a
    transformer's new length made them again for each product, ~10 of its ~25 us, cold."""

    __slots__ = ("k", "n", "itemsize", "count", "panels", "bias", "limits", "kernels",
                 "spill", "worker_spill", "native", "dtype")

    def __init__(self, B, prepacked, bias, dtype, limits):
        self.panels = packed(prepacked, "panels", lambda: pack_panels(B))
        self.k, self.n = B.shape
        self.itemsize, self.count = B.itemsize, self.panels.shape[0]
        self.dtype = dtype = np.dtype(dtype)
        self.bias = _NO_BIAS[dtype.char] if bias is None else bias
        self.limits = _NO_BIAS[dtype.char] if limits is None else limits  # (empty: none)
        self.kernels = kernels = jit_cpu.panel_kernels()
        spill_shape = (kernels.DENSE_ROWS, self.panels.shape[2])
        self.spill = jit_cpu.scratch_array("panel_spill", dtype, spill_shape)
        self.native = jit_cpu.native_pool()
        self.worker_spill = None if self.native is None else \
            jit_cpu.scratch_array("panel_spill_worker", dtype, spill_shape)
        load_packed_entry(self)  # before a request's parts share rows (once a process)


def _call_at(kit: _RowsKit, rows: int):
    """``call(A, out)``: the product of ``rows`` rows with ``kit``'s weight, split over the
    native pool (or Python threads without one) where :func:`_split` says so."""
    k, n, panels, bias, limits = kit.k, kit.n, kit.panels, kit.bias, kit.limits
    kernels, count = kit.kernels, kit.count
    if not _split(rows, k, n, kit.itemsize):
        return ProductCall(kernels.panel_product, (), panels,
                           (0, count, kit.spill, bias, limits), rows, k, n)
    if kit.native is not None:
        bounds = _bounds(kit, rows, True)
        run, shared = _native_run(kit, rows, bounds)
        return ProductCall(run, (kit.native.block, len(bounds) // 4), panels,
                           (bounds, kit.spill, kit.worker_spill, bias, limits, *shared),
                           rows, k, n)
    dtype, spill_shape = kit.dtype, kit.spill.shape

    def threads(A, out):
        a, c = A.reshape(rows, k), out.reshape(rows, n)

        def part(p0, p1):
            kernels.panel_product(a, panels, c, p0, p1,
                                  jit_cpu.scratch_array("panel_spill", dtype, spill_shape),
                                  bias, limits)
        parallel_for(thread_parts(count, rows * k * n), part)
    return threads


def _native_run(kit: _RowsKit, rows: int, bounds: np.ndarray) -> tuple:
    """The native driver of ``kit``'s product over the parts ``bounds``, and its arguments
    past ``native_product``'s: where parts share rows, A's strips packed once for all of
    them into this thread's scratch (:func:`product_parts.shared_packs`)."""
    kernels = kit.kernels
    packs = shared_packs(bounds, rows, kernels.DENSE_ROWS)
    if not packs:
        return kernels.native_product, ()
    strips = jit_cpu.scratch_array("panel_strips", kit.dtype,
                                   (rows // kernels.DENSE_ROWS * kernels.PACKED_STRIDE * kit.k,))
    return kernels.native_packed_product, (strips, packs)


# the panel kernels' "no bias" (an empty vector of the product's dtype)
_NO_BIAS = {np.dtype(t).char: np.zeros(0, t) for t in (np.float32, np.float64)}


def biased_panel_product(A, B, bias, out, prepacked, replays=None, recorded=(),
                         source=None, limits=None) -> bool:
    """``out = A @ B + bias`` through the panels, the bias added as each tile is finished
    (the same float additions as ``out += bias`` afterwards), then the activation
    ``limits`` (``direct_forms.layer_limits``), when :func:`panels_suit` and ``bias`` is one
    contiguous value per column of A's dtype; False, nothing written, otherwise.
    ``replays``, ``recorded``, ``source``: as for :func:`panel_product`."""
    if bias.ndim != 1 or bias.dtype != A.dtype or not bias.flags.c_contiguous \
            or B.ndim != 2 or bias.shape[0] != B.shape[1] \
            or not panels_suit(A, B, out, prepacked):
        return False
    panel_product(A, B, out, prepacked, bias, replays, recorded, source, limits)
    return True


def stacks_suit(A, B, out) -> bool:
    """Whether ``out = A @ B`` for two stacks of matrices with the same leading axes (the
    products of attention: scores ``Q @ K^T`` and ``P @ V`` per head) takes the panel
    kernels, with B's panels read in place. All C-contiguous, one native float dtype."""
    if A.ndim < 3 or A.ndim != B.ndim or A.shape[:-2] != B.shape[:-2] \
            or A.shape[-1] != B.shape[-2] or not A.dtype == B.dtype == out.dtype \
            or A.dtype not in jit_cpu.NATIVE or out.shape != A.shape[:-1] + B.shape[-1:]:
        return False
    return A.shape[-2] >= PANEL_MIN_ROWS \
        and (A.size * B.shape[-1] >= STACK_MIN_WORK or batch_invariant()) \
        and A.flags.c_contiguous and B.flags.c_contiguous and out.flags.c_contiguous \
        and not np.may_share_memory(out, A) and not np.may_share_memory(out, B) \
        and jit_cpu.panel_kernels() is not None


def stacked_panel_product(A, B, out):
    """``out = A @ B`` (:func:`stacks_suit`), the stacked matrices split over the threads.
    Keeping attention off the BLAS also keeps OpenBLAS's threads from spinning into the
    dense layers' panel products (see runtime/blas_policy.py, ``OPENBLAS_THREAD_TIMEOUT``)."""
    (m, k), n = A.shape[-2:], B.shape[-1]
    a, b, c = A.reshape(-1, m, k), B.reshape(-1, k, n), out.reshape(-1, m, n)
    kernels = jit_cpu.panel_kernels()
    width = panel_width(A.dtype)

    def part(n0, n1):
        edge = jit_cpu.scratch_array("panel_edge", A.dtype, (k, width))
        spill = jit_cpu.scratch_array("panel_spill", A.dtype, (kernels.DENSE_ROWS, width))
        kernels.batched_product(a, b, c, n0, n1, edge, spill)
    work = A.size * n
    if work < STACK_SPLIT_WORK:
        part(0, a.shape[0])
    else:
        parallel_for(thread_parts(a.shape[0], work), part)
    return out
