"""Gradients of DFT and STFT (ops/signal/signal_grad.py): against float64 central differences,
first and second order (gradcheck.check_gradient), for every mode (complex and real input,
forward and inverse, one-sided, irfft, a dft_length that pads or cuts, every axis, both
versions); the adjoint kernel against PyTorch's torch.fft autograd; STFT's signal and window
gradients against torch.stft; on the GPU."""

import numpy as np
import pytest

import mixrt  # noqa: F401  (registers every kernel)
from mixrt.ops.signal import signal, signal_grad
from mixrt.ops.device import gpu_available

from grad.gradcheck import check_gradient

rng = np.random.default_rng(20)
needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")


def randn(*shape):
    return rng.standard_normal(shape)


# -- DFT against central differences ------------------------------------------------------

@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("axis", [1, 2, -2, 0])
def test_dft_of_a_complex_signal(inverse, axis):
    check_gradient("DFT", [randn(3, 5, 4, 2), None, np.array(axis)], {"inverse": inverse},
                   constants=(2,), opset=20)


@pytest.mark.parametrize("onesided", [0, 1])
def test_dft_of_a_real_signal(onesided):
    check_gradient("DFT", [randn(2, 6, 3, 1), None, np.array(1)], {"onesided": onesided},
                   constants=(2,), opset=20)


@pytest.mark.parametrize("length", [8, 3, 5])  # pads, cuts, keeps
@pytest.mark.parametrize("onesided, shape", [(0, (2, 5, 2)), (1, (2, 5, 1))])
def test_dft_length_pads_or_cuts_the_signal(length, onesided, shape):
    check_gradient("DFT", [randn(*shape), np.array(length), np.array(-2)],
                   {"onesided": onesided}, constants=(1, 2), opset=20)


@pytest.mark.parametrize("length", [None, 7, 5, 10, 2])
def test_irfft_bins_in_and_a_real_signal_out(length):
    """Bins 4 of a one-sided spectrum: n = 6 by default, 7 (odd: no Nyquist bin), 5 (uses
    3 of the 4 bins), 10 (pads to 6 bins), 2 (DC and Nyquist only)."""
    lengths = None if length is None else np.array(length)
    check_gradient("DFT", [randn(2, 4, 3, 2), lengths, np.array(1)],
                   {"inverse": 1, "onesided": 1}, constants=(1, 2), opset=20)


def test_irfft_of_a_real_spectrum():
    check_gradient("DFT", [randn(2, 4, 1), None, np.array(1)], {"inverse": 1, "onesided": 1},
                   constants=(2,), opset=20)


@pytest.mark.parametrize("attributes", [{}, {"axis": 2}, {"inverse": 1},
                                        {"onesided": 1, "axis": 1}])
def test_dft_17_takes_the_axis_as_an_attribute(attributes):
    x = randn(2, 4, 6, 1) if attributes.get("onesided") else randn(2, 4, 6, 2)
    check_gradient("DFT", [x, None], attributes, opset=17)


# -- the adjoint kernel against PyTorch ---------------------------------------------------

def _torch_input_grad(transform, x: np.ndarray, dy: np.ndarray, complex_input: bool):
    torch = pytest.importorskip("torch")
    leaf = torch.tensor(x, requires_grad=True)
    z = torch.view_as_complex(leaf) if complex_input else leaf[..., 0]
    y = transform(z)
    y = torch.view_as_real(y) if y.is_complex() else y[..., None]
    y.backward(torch.tensor(dy))
    return leaf.grad.numpy()


@pytest.mark.parametrize("n", [6, 7, 5, 10])
def test_irfft_gradient_equals_torch(n):
    torch = pytest.importorskip("torch")
    x, dy = randn(3, 4, 2), randn(3, n, 1)
    want = _torch_input_grad(lambda z: torch.fft.irfft(z, n=n, dim=1), x, dy, True)
    got = signal_grad.dft_grad(np, dy, x, np.array(n), np.array(1), inverse=1, onesided=1)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [6, 9, 4])
def test_rfft_gradient_equals_torch(n):
    torch = pytest.importorskip("torch")
    x, dy = randn(3, 6, 1), randn(3, n // 2 + 1, 2)
    want = _torch_input_grad(lambda z: torch.fft.rfft(z, n=n, dim=1), x, dy, False)
    got = signal_grad.dft_grad(np, dy, x, np.array(n), np.array(1), onesided=1)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("inverse", [0, 1])
def test_complex_dft_gradient_equals_torch(inverse):
    torch = pytest.importorskip("torch")
    x, dy = randn(2, 5, 3, 2), randn(2, 5, 3, 2)
    transform = torch.fft.ifft if inverse else torch.fft.fft
    want = _torch_input_grad(lambda z: transform(z, dim=1), x, dy, True)
    got = signal_grad.dft_grad(np, dy, x, None, np.array(1), inverse=inverse)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# -- STFT ---------------------------------------------------------------------------------

@pytest.mark.parametrize("onesided", [1, 0])
def test_stft_signal_and_window(onesided):
    check_gradient("STFT", [randn(2, 20, 1), np.array(4), randn(8), np.array(8)],
                   {"onesided": onesided}, constants=(1, 3), opset=17)


def test_stft_of_a_complex_signal_without_a_window():
    check_gradient("STFT", [randn(1, 13, 2), np.array(3), None, np.array(5)],
                   {"onesided": 0}, constants=(1, 3), opset=17)


def test_stft_frame_length_from_the_window():
    check_gradient("STFT", [randn(2, 11, 1), np.array(2), randn(6)], {}, constants=(1,),
                   opset=17)


def test_stft_gradients_equal_torch():
    torch = pytest.importorskip("torch")
    signal, window = randn(2, 40, 1), randn(16)
    mixrt_grads = check_gradient("STFT", [signal, np.array(6), window, np.array(16)], {},
                                 constants=(1, 3), opset=17, second_order=False, seed=5)
    # the same loss in PyTorch: sum(Y * R) with check_gradient's weights R
    x = torch.tensor(signal[..., 0], requires_grad=True)
    w = torch.tensor(window, requires_grad=True)
    y = torch.stft(x, n_fft=16, hop_length=6, win_length=16, window=w, center=False,
                   onesided=True, return_complex=True)
    y = torch.view_as_real(y.transpose(1, 2))  # (batch, frames, bins, 2), as ONNX's
    r = np.random.default_rng(5).standard_normal(tuple(y.shape))
    (y * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(mixrt_grads[0][..., 0], x.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(mixrt_grads[2], w.grad.numpy(), rtol=1e-9, atol=1e-10)


# -- the GPU ------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("attributes, shape", [({"onesided": 1, "inverse": 1}, (2, 5, 3, 2)),
                                               ({"onesided": 1}, (2, 8, 3, 1)),
                                               ({"inverse": 1}, (2, 5, 3, 2))])
def test_the_gpu_gives_the_cpus_adjoint(attributes, shape):
    import cupy
    x = randn(*shape).astype(np.float32)
    dy = signal.dft(np, x, None, np.array(1), **attributes)
    dy = rng.standard_normal(dy.shape).astype(np.float32)
    want = signal_grad.dft_grad(np, dy, x, None, np.array(1), **attributes)
    got = signal_grad.dft_grad(cupy, cupy.asarray(dy), cupy.asarray(x), None,
                               cupy.asarray(np.array(1)), **attributes)
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-4, atol=1e-5)

