"""Gradients of DFT and STFT.

DFT is linear in its input, so its gradient is the adjoint transform: the kernel
``mixrt::DFTGrad``, which reads the input only for its shape and dtype. With ``n`` the
transform's length (``dft_length``, else the input's length along the axis):

* full spectrum, forward: Y = F x (x cut or zero-padded to n), so dX = F^H dY = n ifft(dY),
  zero-padded or cut back to the input's length; the inverse Y = F^H x / n gives
  dX = F dY / n;
* one-sided (a real-to-complex transform keeping n//2 + 1 bins): dY is zero-padded to n bins
  first;
* one-sided inverse (complex-to-real, irfft): y_t = (1/n) sum over the Hermitian spectrum,
  so bin k of dX is rfft(dy)_k / n, doubled for the bins that stand for two (0 < k < n/2);
* a real input (a trailing axis of 1) gets the real part.

DFTGrad is linear in dY and its adjoint is the forward DFT, so its own gradient is a DFT of
the incoming gradient: DFT differentiates to any order.

STFT's gradient goes through its expansion (``Kernel.expand_fn``): the frames gathered from
the signal, times the window, then a one-sided or full DFT along the frame. Every one of
those ops has a gradient, so the signal and the window both get theirs, to any order.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.signal import signal
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.training.grad_support import MIXRT
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import normalize_axis, same_as_input


# -- DFT ---------------------------------------------------------------------------------

@op("DFTGrad", since=1, domain=MIXRT, dtypes=FLOATS)
def dft_grad(xp, dy, x, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """d loss / d x of ``y = DFT(x, dft_length, axis)``, shaped like x."""
    axis = normalize_axis(signal._scalar(axis, -2), x.ndim)
    length = x.shape[axis]
    n = signal._scalar(dft_length)
    if onesided and inverse:
        n = 2 * (length - 1) if n is None else n
        grad = _irfft_adjoint(xp, dy[..., 0], n, axis)
    else:
        n = length if n is None else n
        spectrum = signal._to_complex(xp, dy)
        if onesided:
            spectrum = _fitted(xp, spectrum, n, axis)
        if inverse:
            grad = xp.fft.fft(spectrum, axis=axis) / n
        else:
            grad = xp.fft.ifft(spectrum, axis=axis) * n
    grad = _fitted(xp, grad, length, axis)
    if x.shape[-1] == 1:
        return grad.real[..., None].astype(x.dtype, copy=False)
    return signal._from_complex(xp, grad, x.dtype)


@dft_grad.infer
def _(dy, x, *_, **__):
    return same_as_input(x)


def _irfft_adjoint(xp, dy, n: int, axis: int):
    """The gradient of irfft(z, n) for its n // 2 + 1 complex bins. (The imaginary parts of
    bin 0 and of an even n's bin n/2, which irfft never reads, come out 0: rfft of a real
    signal is real there.)"""
    grad = xp.fft.rfft(dy, n=n, axis=axis) / n
    weights = np.full(grad.shape[axis], 2.0)
    weights[0] = 1.0
    if n % 2 == 0:
        weights[-1] = 1.0  # the Nyquist bin stands for itself alone
    shape = [1] * grad.ndim
    shape[axis] = weights.size
    return grad * xp.asarray(weights.reshape(shape), dtype=grad.real.dtype)


def _fitted(xp, z, length: int, axis: int):
    """``z`` cut or zero-padded to ``length`` along ``axis`` (the adjoint of the other)."""
    have = z.shape[axis]
    if have > length:
        return xp.take(z, xp.arange(length), axis=axis)
    if have < length:
        pad = [(0, 0)] * z.ndim
        pad[axis] = (0, length - have)
        return xp.pad(z, pad)
    return z


def _dft_input_grad(b, node, dy, axis: str):
    inverse = int(node.attributes.get("inverse", 0))
    onesided = int(node.attributes.get("onesided", 0))
    length = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    return b.emit("DFTGrad", dy, node.inputs[0], length, axis, domain=MIXRT,
                  inverse=inverse, onesided=onesided)


@signal.dft.grad
def _(b, node, dy):
    axis = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else b.ints(-2)
    return [_dft_input_grad(b, node, dy[0], axis), None, None]


@signal.dft_17.grad
def _(b, node, dy):
    axis = b.ints(int(node.attributes.get("axis", 1)))
    return [_dft_input_grad(b, node, dy[0], axis), None]


@dft_grad.grad
def _(b, node, ddx):
    """DFTGrad is dX = A^T dY for the DFT's matrix A, so its gradient is A ddX."""
    _, _, length, axis = (list(node.inputs) + ["", ""])[:4]
    forward = b.emit("DFT", ddx[0], length or None, axis or None, opset=20,
                     inverse=int(node.attributes.get("inverse", 0)),
                     onesided=int(node.attributes.get("onesided", 0)))
    return [forward, None, None, None]


# -- STFT --------------------------------------------------------------------------------

@signal.stft.expansion
def _(b, node):
    """STFT as frames gathered from the signal, times the window, through a DFT along the
    frame (the kernel's own steps, in ops with gradients)."""
    signal_name, step, window, frame_length = (list(node.inputs) + ["", "", ""])[:4]
    scalar = b.ints([])
    samples = b.emit("Reshape", b.emit("Shape", signal_name, start=1, end=2), scalar)
    if frame_length:
        length = b.emit("Reshape", frame_length, scalar)
    elif window:
        length = b.emit("Reshape", b.emit("Shape", window), scalar)
    else:
        length = samples
    step = b.emit("Reshape", step, scalar)
    count = b.emit("Add", b.emit("Div", b.emit("Sub", samples, length), step), b.ints(1))
    starts = b.emit("Mul", b.emit("Range", b.ints(0), count, b.ints(1)), step)
    offsets = b.emit("Range", b.ints(0), length, b.ints(1))
    indices = b.emit("Add", b.emit("Unsqueeze", starts, b.ints([1])),
                     b.emit("Unsqueeze", offsets, b.ints([0])))
    frames = b.emit("Gather", signal_name, indices, axis=1)  # (batch, frames, length, 1|2)
    if window:
        if b.dtype(window) != b.dtype(signal_name):
            window = b.emit("CastLike", window, signal_name)
        frames = b.emit("Mul", frames, b.emit("Unsqueeze", window, b.ints([1])))
    onesided = int(node.attributes.get("onesided", 1))
    return [b.emit("DFT", frames, None, b.ints(2), opset=20, onesided=onesided)]
