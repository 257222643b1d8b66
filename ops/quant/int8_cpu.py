"""Exact 8-bit integer products on AVX-512 VNNI (``ops/quant/_jit_int8.py``) for the quantized
matrix products against a constant weight: MatMulInteger, com.microsoft's
MatMulIntegerToFloat and DynamicQuantizeMatMul.

The float route (``quantize.exact_integer_product``: codes less their zero points as
float32, through the float panels) is exact too, but a dynamically quantized BERT ran its
products at float32 speed where onnxruntime's u8s8 kernels run ~4x the multiply-adds an
instruction. Here the raw codes are multiplied: activations as unsigned bytes, weights as
signed ones (a signed activation or an unsigned weight is shifted by 128 into that range,
its zero point with it), and the zero points are applied to the int32 sums afterwards:

    sum_k (a - za)(b - zb) = sum_k a b - za sum_k b - zb sum_k a + K za zb

with the weight's column sums made once. Every step is integer arithmetic: the results are
the exact sums, as onnxruntime's are.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.compiled import jit_cpu, prebuilt
from mixrt.ops.compiled.parallel import intra_op_threads

_VNNI: list = []  # whether this CPU has AVX-512 VNNI (asked once)
# multiply-adds from which a product is split with the native pool's worker, and the parts
# per thread (claimed one at a time, so a worker that wakes late takes fewer). Alone, back
# to back, a split 64 x 256 @ 256 x 1024 took 51 us against 80 on one thread. Inside a run
# the split once cost more than it saved, while the worker slept between the products; it
# spins through a run now (ops/panels/_jit_native_pool.py), and the dynamically quantized
# GPT-2 (17 products of 4-17 M multiply-adds, 64 tokens) ran 1.61 ms split from 1 << 23,
# 1.62 from 1 << 21, 1.70 unsplit (1 << 26); BERT 1.79, 1.84, 1.87 (one process each,
# sessions alternating, 2026-11-24)
SPLIT_WORK = 1 << 23
PARTS_PER_THREAD = 4


def available() -> bool:
    """The compiled tier is on and this CPU has AVX-512 VNNI, and so does the CPU numba
    compiles for where it is told one (``NUMBA_CPU_NAME``: its features are then those of
    ``NUMBA_CPU_FEATURES``; LLVM aborts the process on vpdpbusd for a target without it)."""
    if not _VNNI:
        try:
            from llvmlite import binding  # noqa: PLC0415  (with numba, on first use)
            features = binding.get_host_cpu_features()
            _VNNI.append(bool(features.get("avx512vnni", False)
                              and features.get("avx512bw", False))
                         and prebuilt.told_features_have(("avx512vnni",)))
        except ImportError:
            _VNNI.append(False)
    return _VNNI[0] and jit_cpu.enabled()


def integer_product(A, a_zero, B, b_zero, prepacked):
    """sum_k (A[..., k] - a_zero)(B[k, :] - b_zero) as int32 (A's leading axes kept), for
    8-bit A (any leading axes) and a constant 2-D 8-bit B whose zero point is one value or
    one per column, kept packed in ``prepacked`` (the node's dict, given only when B and its
    zero point are constants of the session); None where this path does not apply (no
    VNNI, other dtypes or layouts), nothing computed."""
    prepared = _prepared(A, a_zero, B, b_zero, prepacked)
    if prepared is None:
        return None
    weight, a, codes, za = prepared
    k, n = B.shape
    total = _raw_product(codes, a.shape[0], weight)[:, :n]
    if za:
        total -= np.int32(za) * weight.column_sums
    zb = weight.zero
    if weight.has_zero:
        row_sums = codes[:, :k].sum(axis=1, dtype=np.int32)
        total -= row_sums[:, None] * zb
        total += np.int32(k * za) * zb
    return np.ascontiguousarray(total).reshape(*A.shape[:-1], n)


def integer_product_to_float(A, a_zero, B, b_zero, multiplier, bias, prepacked):
    """float32(:func:`integer_product`) * multiplier (one float32 value, or one per column)
    + bias (float32 per column, or None): MatMulIntegerToFloat's output stage, in one
    compiled pass over the sums; None where :func:`integer_product` does not apply."""
    prepared = _prepared(A, a_zero, B, b_zero, prepacked)
    if prepared is None:
        return None
    weight, a, codes, za = prepared
    k, n = B.shape
    sums = _raw_product(codes, a.shape[0], weight)
    out = np.empty((a.shape[0], n), np.float32)
    kernels = jit_cpu.load("mixrt.ops.quant._jit_int8")
    scale = np.asarray(multiplier, np.float32).reshape(-1)
    if scale.size != n:  # one value for every column (np.broadcast_to took ~5 us)
        scale = np.full(n, scale[0], np.float32)
    kernels.to_float(sums.reshape(-1), sums.shape[1], codes.reshape(-1), codes.shape[1], k,
                     za, np.int32(za) * weight.column_sums, weight.zero, weight.has_zero,
                     scale, scale if bias is None else np.ascontiguousarray(bias, np.float32),
                     bias is not None, out)
    return out.reshape(*A.shape[:-1], n)


def bound_product_to_float(A, B, b_zero, b_scale, bias, prepacked, out):
    """:func:`integer_product_to_float` as a call ``(A, a_scale, a_zero) -> out`` for the
    operands of a planned step (``ops/compiled/bound_calls.py``), everything the kernel asks
    on each call settled once: the packed weight, the rows, the output's (rows, N) view, the
    float32 B scales and bias, the compiled module. Per call it makes the same calls on the
    same values (the a_scale * b_scale products, the codes, the raw sums, the one output
    pass), so the same bits; a dynamically quantized BERT's products spent ~40 us a call in
    those questions against ~16 in the product. None where the route does not apply."""
    prepared = _prepared(A, None, B, b_zero, prepacked)
    k, n = B.shape
    if prepared is None or out is None or out.dtype != np.float32 \
            or not out.flags.c_contiguous or out.shape != A.shape[:-1] + (n,):
        return None
    weight, a, _, a_shift = prepared
    rows = a.shape[0]
    target = out.reshape(rows, n)
    b_scales = np.ascontiguousarray(b_scale, np.float32).reshape(-1)
    scale = np.empty(n, np.float32)
    added = scale if bias is None else np.ascontiguousarray(bias, np.float32)
    kernels = jit_cpu.load("mixrt.ops.quant._jit_int8")
    to_float, sums_of, activation_codes = kernels.to_float, _raw_product, _activation_codes
    column_sums, zero, has_zero, groups = weight.column_sums, weight.zero, weight.has_zero, \
        weight.k_groups

    def call(A, a_scale, a_zero):
        za = (0 if a_zero is None else int(a_zero)) + a_shift
        codes = activation_codes(A.reshape(rows, k), a_shift, groups)
        sums = sums_of(codes, rows, weight)
        np.multiply(np.float32(a_scale), b_scales, out=scale)  # one value, or one a column
        to_float(sums.reshape(-1), sums.shape[1], codes.reshape(-1), codes.shape[1], k, za,
                 np.int32(za) * column_sums, zero, has_zero, scale, added, bias is not None,
                 target)
        return out
    return call


def _prepared(A, a_zero, B, b_zero, prepacked):
    """(the packed weight, A as rows, their unsigned codes, the shifted a_zero), or None
    where the VNNI product does not apply."""
    if prepacked is None or not available() or A.dtype not in _EIGHT_BITS \
            or B.dtype not in _EIGHT_BITS or B.ndim != 2 or A.ndim < 1 \
            or A.shape[-1] != B.shape[0] or not A.size or not B.size:
        return None
    weight = prepacked.get("int8_weight")
    if weight is None:  # two threads may both make it; either copy is the same
        weight = prepacked.setdefault("int8_weight", _Weight(B, b_zero))
    if not weight.matches(b_zero):
        return None
    a = A.reshape(-1, B.shape[0])
    a_shift = 128 if A.dtype == np.int8 else 0
    codes = _activation_codes(a, a_shift, weight.k_groups)
    return weight, a, codes, (0 if a_zero is None else int(a_zero)) + a_shift


_EIGHT_BITS = (np.dtype(np.uint8), np.dtype(np.int8))


class _Weight:
    """A constant 8-bit weight (K, N) as signed codes in VNNI panels, with its zero point
    (shifted with the codes) and its column sums."""

    def __init__(self, B, b_zero):
        self.zero_given = None if b_zero is None else np.array(b_zero, copy=True)
        shift = 128 if B.dtype == np.uint8 else 0
        signed = (B.astype(np.int16) - shift).astype(np.int8)
        k, n = signed.shape
        self.k_groups = -(-k // 4)
        count = -(-n // 32)
        padded = np.zeros((self.k_groups * 4, count * 32), np.int8)
        padded[:k, :n] = signed
        # panel p, group g: columns 32p..32p+31, each as its four codes of k = 4g..4g+3
        self.panels = np.ascontiguousarray(
            padded.reshape(self.k_groups, 4, count, 32).transpose(2, 0, 3, 1)).reshape(-1)
        self.count = count
        self.column_sums = signed.sum(axis=0, dtype=np.int32)
        zero = np.zeros(n, np.int32) if b_zero is None else \
            np.broadcast_to(np.asarray(b_zero).astype(np.int32).reshape(-1), (n,))
        self.zero = np.ascontiguousarray(zero - shift)
        self.has_zero = bool(self.zero.any())

    def matches(self, b_zero) -> bool:
        """The zero point given now is the one packed (a constant, so it always is)."""
        if b_zero is None or self.zero_given is None:
            return b_zero is None and self.zero_given is None
        return np.array_equal(b_zero, self.zero_given)


def _activation_codes(a, shift: int, k_groups: int):
    """The activation rows as unsigned codes padded with zeros to 4 * k_groups (a scratch
    of this thread's), or ``a`` itself when it already is."""
    rows, k = a.shape
    if shift == 0 and k == 4 * k_groups and a.flags.c_contiguous:
        return a
    codes = jit_cpu.scratch_array("int8_codes", np.uint8, (rows, 4 * k_groups))
    if shift:
        np.add(a.view(np.uint8), np.uint8(128), out=codes[:, :k])
    else:
        codes[:, :k] = a
    codes[:, k:] = 0
    return codes


def _raw_product(codes, rows: int, weight: _Weight):
    """The int32 sums of the unsigned codes times the weight's signed ones, (rows, 32 *
    panels): split by panels between this thread and the native pool's worker from
    SPLIT_WORK multiply-adds (its hand-off stays in native code), else here."""
    kernels = jit_cpu.load("mixrt.ops.quant._jit_int8")
    ldc = weight.count * 32
    out = np.empty((rows, ldc), np.int32)
    lda = codes.shape[1]
    native = jit_cpu.native_pool() if rows * lda * ldc >= SPLIT_WORK else None
    if native is None or weight.count < 2:
        kernels.product(codes.reshape(-1), rows, lda, weight.panels, weight.k_groups,
                        out.reshape(-1), ldc, 0, weight.count)
        return out
    parts = min(weight.count, PARTS_PER_THREAD * intra_op_threads())
    words = np.array([rows, lda, weight.k_groups, ldc, weight.count, parts, codes.size,
                      weight.panels.size, out.size], np.int64)
    # (the array interface's address: ``.ctypes.data`` built a ctypes object per array, ~2 us)
    addresses = np.array([a.__array_interface__["data"][0]
                          for a in (words, codes, weight.panels, out)], np.uint64)
    jit_cpu.panel_kernels().native_for(native.block, kernels.product_part.address, addresses,
                                       parts)
    return out
