"""QuantizeLinear and DequantizeLinear on the CPU: per-tensor float32 <-> 8-bit through the
compiled loops of ``ops/_jit_quantize.py``, every other form through ``ops/quantize.py``.

Per tensor (one scale, one zero point), float32 values, int8/uint8 codes, no blocks: what
onnxruntime's static quantizer writes around every QDQ operator, where the NumPy forms cost
2-3 ns an element against the compiled loop's fraction of one.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops import jit_cpu
from mixrt.ops.contrib_quant import contrib_dequantize_linear, contrib_quantize_linear
from mixrt.ops.quantize import (dequantize_linear, dequantize_linear_10, dequantize_linear_13,
                                dequantize_linear_21, dequantize_linear_23, integer_range,
                                quantize_linear, quantize_linear_10, quantize_linear_13,
                                quantize_linear_19, quantize_linear_21, quantize_linear_23)

EIGHT_BITS = (np.dtype(np.int8), np.dtype(np.uint8))
FLOAT32 = np.dtype(np.float32)
_KERNELS: list = []  # ops/_jit_quantize.py once imported (jit_cpu._import_once)


def quantize_cpu(xp, x, y_scale, y_zero_point=None, *, out=None, **attributes):
    codes = _code_dtype(y_zero_point, attributes)
    kernels = None if x.dtype != FLOAT32 else \
        _kernels(xp, x, y_scale, y_zero_point, attributes, codes)
    if kernels is None:
        return _into(out, quantize_linear(xp, x, y_scale, y_zero_point, **attributes))
    y = _target(out, x.shape, codes)
    low, high = integer_range(codes)
    kernels.quantize(np.ascontiguousarray(x).reshape(-1), FLOAT32.type(y_scale.reshape(-1)[0]),
                     _zero(y_zero_point), float(low), float(high), y.reshape(-1))
    return _into(out, y)


def dequantize_cpu(xp, x, x_scale, x_zero_point=None, *, out=None, **attributes):
    kernels = None
    if x.dtype in EIGHT_BITS and x_scale.dtype == FLOAT32 \
            and attributes.get("output_dtype", 0) in (0, 1):
        kernels = _kernels(xp, x, x_scale, x_zero_point, attributes, x.dtype)
    if kernels is None:
        return _into(out, dequantize_linear(xp, x, x_scale, x_zero_point, **attributes))
    y = _target(out, x.shape, FLOAT32)
    kernels.dequantize(np.ascontiguousarray(x).reshape(-1),
                       FLOAT32.type(x_scale.reshape(-1)[0]), _zero(x_zero_point), y.reshape(-1))
    return _into(out, y)


def _code_dtype(zero_point, attributes) -> np.dtype | None:
    if zero_point is not None:
        return zero_point.dtype
    return None if attributes.get("output_dtype", 0) else np.dtype(np.uint8)


def _kernels(xp, values, scale, zero_point, attributes, codes):
    """ops/_jit_quantize.py when this call is the per-tensor 8-bit case it covers."""
    if xp is not np or codes not in EIGHT_BITS or attributes.get("block_size", 0) \
            or attributes.get("precision", 0) not in (0, 1) or not jit_cpu.enabled():
        return None
    if not isinstance(values, np.ndarray) or scale.size != 1 or scale.dtype != FLOAT32 \
            or (values.dtype != FLOAT32 and values.dtype not in EIGHT_BITS):
        return None
    if zero_point is not None and (zero_point.size != 1 or zero_point.dtype != codes):
        return None
    return jit_cpu._import_once(_KERNELS, "mixrt.ops._jit_quantize")


def _zero(zero_point) -> int:
    return 0 if zero_point is None else int(zero_point.reshape(-1)[0])


def _target(out, shape, dtype):
    """``out`` when the loop can write it directly, else a new array."""
    if out is not None and out.shape == tuple(shape) and out.dtype == dtype \
            and out.flags.c_contiguous:
        return out
    return np.empty(shape, dtype)


def _into(out, result):
    if out is None or out is result:
        return result
    np.copyto(out, result)
    return out


for _handle in (quantize_linear_10, quantize_linear_13, quantize_linear_19, quantize_linear_21,
                quantize_linear_23):
    _handle.fast("cpu")(quantize_cpu)
for _handle in (dequantize_linear_10, dequantize_linear_13, dequantize_linear_21,
                dequantize_linear_23, contrib_dequantize_linear):
    _handle.fast("cpu")(dequantize_cpu)


@contrib_quantize_linear.fast("cpu")
def contrib_quantize_cpu(xp, x, y_scale, y_zero_point=None, *, axis=1, out=None):
    """com.microsoft QuantizeLinear: the standard one with the division in float32."""
    return quantize_cpu(xp, x, y_scale, y_zero_point, axis=axis, precision=1, out=out)
