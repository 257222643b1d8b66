"""Signal operators: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix.

ONNX carries complex values as a trailing axis of length 2 (real, imaginary); a real signal has
a trailing axis of length 1. The kernels convert to the array module's complex type, use its FFT,
and convert back.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS, INTS, to_numpy_dtype
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, merge_types, normalize_axis


def _scalar(a, default=None):
    """A scalar input (a length, a step, an axis) as a Python number on the host."""
    if a is None or a.size == 0:
        return default
    a = a.get() if hasattr(a, "get") else a
    return np.asarray(a).reshape(-1)[0].item()


def _complex_dtype(dtype):
    return np.complex128 if np.dtype(dtype) == np.float64 else np.complex64


def _to_complex(xp, x):
    """[..., 1] real or [..., 2] (re, im) -> complex array without the trailing axis."""
    values = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    if x.shape[-1] == 1:
        return values[..., 0].astype(_complex_dtype(x.dtype))
    if x.shape[-1] == 2:
        return values[..., 0] + 1j * values[..., 1]
    raise ValueError(f"expected a last axis of 1 (real) or 2 (complex), got shape {x.shape}")


def _from_complex(xp, z, dtype):
    return xp.stack([z.real, z.imag], axis=-1).astype(dtype, copy=False)


def _dft(xp, x, length, axis, inverse, onesided):
    axis = normalize_axis(axis, x.ndim)
    if axis == x.ndim - 1:
        raise ValueError("DFT: the last axis holds (real, imaginary) and cannot be transformed")
    z = _to_complex(xp, x)
    if onesided and inverse:  # IRFFT: a one-sided spectrum back to a real signal
        n = length if length is not None else 2 * (z.shape[axis] - 1)
        return xp.fft.irfft(z, n=n, axis=axis)[..., None].astype(x.dtype, copy=False)
    transform = xp.fft.ifft if inverse else xp.fft.fft
    y = transform(z, n=length, axis=axis)
    if onesided:
        bins = y.shape[axis] // 2 + 1
        y = xp.take(y, xp.arange(bins), axis=axis)
    return _from_complex(xp, y, x.dtype)


@op("DFT", since=20, dtypes=FLOATS)
def dft(xp, input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    return _dft(xp, input, _scalar(dft_length), _scalar(axis, -2), inverse, onesided)


@op("DFT", since=17, dtypes=FLOATS)
def dft_17(xp, input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(xp, input, _scalar(dft_length), axis, inverse, onesided)


def _infer_dft(input, dft_length=None, axis=None, *, inverse=0, onesided=0, **attrs):
    if input.shape is None:
        return [TensorType(input.dtype, None)]
    rank = len(input.shape)
    length = None if dft_length is None or dft_length.value is None else int(
        np.asarray(dft_length.value).item())
    if axis is None:  # absent: opset 20's default, or opset 17's attribute
        axes = [attrs.get("_axis_attr", -2)]
    elif axis.value is not None:
        axes = [int(np.asarray(axis.value).item())]
    else:  # known only at run time: any signal axis, so keep what they all agree on
        axes = range(rank - 1)
    candidates = [_transformed(input, normalize_axis(a, rank), length, inverse, onesided)
                  for a in axes]
    return [functools.reduce(merge_types, candidates)]


def _transformed(input, axis, length, inverse, onesided):
    """The output type of a DFT along ``axis`` (of a known rank)."""
    dim = input.shape[axis]
    if onesided and inverse:
        if length is None and isinstance(dim, int):
            length = 2 * (dim - 1)
        return TensorType(input.dtype, (*input.shape[:axis], length,
                                        *input.shape[axis + 1:-1], 1))
    n = dim if length is None else length
    if onesided:
        n = n // 2 + 1 if isinstance(n, int) else None
    return TensorType(input.dtype, (*input.shape[:axis], n, *input.shape[axis + 1:-1], 2))


dft.infer(_infer_dft)


@dft_17.infer
def _infer_dft_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0, **_):
    return _infer_dft(input, dft_length, None, inverse=inverse, onesided=onesided,
                      _axis_attr=axis)


@op("STFT", since=17, dtypes=FLOATS)
def stft(xp, signal, frame_step, window=None, frame_length=None, *, onesided=1):
    z = _to_complex(xp, signal)  # (batch, signal_length)
    length = _scalar(frame_length)
    if length is None:
        length = window.shape[0] if window is not None else z.shape[1]
    if window is not None and window.shape[0] != length:
        raise ValueError(f"STFT: window has length {window.shape[0]}, frame_length is {length}")
    step = _scalar(frame_step)
    frames = (z.shape[1] - length) // step + 1
    starts = xp.arange(frames) * step
    framed = z[:, starts[:, None] + xp.arange(length)]  # (batch, frames, frame_length)
    if window is not None:
        framed = framed * window.astype(framed.real.dtype, copy=False)
    spectrum = xp.fft.fft(framed, axis=-1)
    if onesided:
        spectrum = spectrum[..., : length // 2 + 1]
    return _from_complex(xp, spectrum, signal.dtype)


@stft.infer
def _infer_stft(signal, frame_step, window=None, frame_length=None, *, onesided=1, **_):
    return [TensorType(signal.dtype, None if signal.shape is None
                       else (signal.shape[0], None, None, 2))]


# -- windows ---------------------------------------------------------------------------------

def _cosine_window(xp, size, periodic, output_datatype, coefficients):
    """sum_k c_k * cos(2*pi*k*n / N), with N = size (periodic) or size - 1 (symmetric)."""
    size = int(_scalar(size))
    denominator = size if periodic else size - 1
    n = xp.arange(size, dtype=np.float64)
    phase = 2 * math.pi * n / denominator if denominator > 0 else xp.zeros_like(n)
    window = sum(c * xp.cos(k * phase) for k, c in enumerate(coefficients))
    return window.astype(to_numpy_dtype(output_datatype))


@op("HannWindow", since=17, dtypes=INTS)
def hann_window(xp, size, *, output_datatype=1, periodic=1):
    return _cosine_window(xp, size, periodic, output_datatype, (0.5, -0.5))


@op("HammingWindow", since=17, dtypes=INTS)
def hamming_window(xp, size, *, output_datatype=1, periodic=1):
    alpha = 25 / 46
    return _cosine_window(xp, size, periodic, output_datatype, (alpha, alpha - 1))


@op("BlackmanWindow", since=17, dtypes=INTS)
def blackman_window(xp, size, *, output_datatype=1, periodic=1):
    return _cosine_window(xp, size, periodic, output_datatype, (0.42, -0.5, 0.08))


def _infer_window(size, *, output_datatype=1, **_):
    length = None if size.value is None else int(np.asarray(size.value).item())
    return [TensorType(to_numpy_dtype(output_datatype), (length,))]


for _window in (hann_window, hamming_window, blackman_window):
    _window.infer(_infer_window)


# -- MelWeightMatrix ---------------------------------------------------------------------------

def _hz_to_mel(hz):
    return 2595 * np.log10(1 + hz / 700)


def _mel_to_hz(mel):
    return 700 * (10 ** (mel / 2595) - 1)


@op("MelWeightMatrix", since=17, dtypes=INTS)
def mel_weight_matrix(xp, num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
                      upper_edge_hertz, *, output_datatype=1):
    """Triangular filters, evenly spaced in mel, peaking at 1, over the one-sided DFT bins."""
    mel_bins, length, rate = (int(_scalar(v)) for v in (num_mel_bins, dft_length, sample_rate))
    low, high = float(_scalar(lower_edge_hertz)), float(_scalar(upper_edge_hertz))
    low_mel, high_mel = _hz_to_mel(low), _hz_to_mel(high)
    # ONNX (and onnxruntime) step by (high - low) / (bins + 2), so the last edge falls short
    # of upper_edge_hertz; we match them rather than the textbook linspace.
    edges_mel = low_mel + np.arange(mel_bins + 2) * (high_mel - low_mel) / (mel_bins + 2)
    # Each band edge snaps down to the DFT bin holding its frequency.
    edges = np.floor((length + 1) * _mel_to_hz(edges_mel) / rate).astype(np.int64)
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    j = np.arange(length // 2 + 1)[:, None]
    rising = (j - lower) / np.maximum(center - lower, 1)
    falling = (upper - j) / np.maximum(upper - center, 1)
    weights = np.where((j >= lower) & (j <= center), np.where(center == lower, 1.0, rising), 0.0)
    weights = np.where((j >= center) & (j < upper), falling, weights)
    return xp.asarray(weights.astype(to_numpy_dtype(output_datatype)))


@mel_weight_matrix.infer
def _infer_mel(num_mel_bins, dft_length, *_, output_datatype=1, **__):
    bins = None if num_mel_bins.value is None else int(np.asarray(num_mel_bins.value).item())
    spectrum = None if dft_length.value is None else int(
        np.asarray(dft_length.value).item()) // 2 + 1
    return [TensorType(to_numpy_dtype(output_datatype), (spectrum, bins))]
