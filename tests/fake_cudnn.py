"""A stand-in for libcudnn's convolution calls, for the fake CuPy only (tests/fake_cupy): it
takes the same arguments ops/conv/cudnn.py passes through ctypes (out-pointers made with
``ctypes.byref``, int arrays, device pointers) and convolves in NumPy on the memory those
pointers name, which on the fake CuPy is host memory. On a real GPU it would read device
pointers as host ones: tests install it only where ``cupy.IS_FAKE``.

Its convolutions are written here from the definition (a loop over kernel taps, einsum over
the rest), apart from mixrt's kernels, so a descriptor, pointer, pad or group passed wrong
shows as a wrong result. It also keeps what a test checks: each query and launch, the
algorithm and math mode each launch ran with, and the descriptors still alive.

Its heuristics rank four algorithms a direction: one unsupported, one over any workspace
limit, one on tensor cores whatever the requested math, then one that keeps the requested
math with a small workspace; a caller must skip the first three (the third where float32 is
to stay exact).
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np

NOT_SUPPORTED = 3000
TENSOR_OP_MATH, FMA_MATH = 1, 3
DTYPES = {0: np.float32, 1: np.float64, 2: np.float16}
# algorithm -> (status, workspace bytes, math mode offered: None for the requested one)
RANKED = {0: (NOT_SUPPORTED, 0, None), 1: (0, 4 << 30, None), 2: (0, 0, TENSOR_OP_MATH),
          7: (0, 4096, None)}


class FakeCudnn:
    def __init__(self):
        self.objects: dict = {}   # descriptor or handle id -> its settings
        self.queries: list = []   # (direction, the requested math)
        self.launches: list = []  # (direction, algorithm, math, workspace bytes, stream)
        self._next = 1000

    # -- what a test reads ----------------------------------------------------------------

    def live_descriptors(self) -> int:
        return sum(1 for o in self.objects.values() if o["kind"] != "handle")

    # -- creating and setting --------------------------------------------------------------

    def _create(self, kind: str, out) -> int:
        self._next += 1
        self.objects[self._next] = {"kind": kind}
        out._obj.value = self._next
        return 0

    def cudnnCreate(self, out):
        return self._create("handle", out)

    def cudnnSetStream(self, handle, stream):
        self.objects[handle]["stream"] = stream
        return 0

    def cudnnCreateTensorDescriptor(self, out):
        return self._create("tensor", out)

    def cudnnCreateFilterDescriptor(self, out):
        return self._create("filter", out)

    def cudnnCreateConvolutionDescriptor(self, out):
        return self._create("convolution", out)

    def cudnnSetTensorNdDescriptor(self, desc, data_type, rank, dims, strides):
        dims, strides = list(dims[:rank]), list(strides[:rank])
        packed = [int(np.prod(dims[i + 1:])) for i in range(rank)]
        if strides != packed:
            return 2000  # BAD_PARAM: the fake takes packed tensors only, as mixrt gives them
        self.objects[desc].update(dtype=DTYPES[data_type], shape=tuple(dims))
        return 0

    def cudnnSetFilterNdDescriptor(self, desc, data_type, layout, rank, dims):
        assert layout == 0, "filters are NCHW"
        self.objects[desc].update(dtype=DTYPES[data_type], shape=tuple(dims[:rank]))
        return 0

    def cudnnSetConvolutionNdDescriptor(self, desc, rank, pads, strides, dilations, mode,
                                        compute):
        assert mode == 1, "ONNX convolutions are cross-correlations"
        self.objects[desc].update(pads=tuple(pads[:rank]), strides=tuple(strides[:rank]),
                                  dilations=tuple(dilations[:rank]), compute=compute, group=1,
                                  math=0)
        return 0

    def cudnnSetConvolutionGroupCount(self, desc, group):
        self.objects[desc]["group"] = group
        return 0

    def cudnnSetConvolutionMathType(self, desc, math):
        self.objects[desc]["math"] = math
        return 0

    def _destroy(self, desc):
        self.objects.pop(desc)
        return 0

    cudnnDestroyTensorDescriptor = cudnnDestroyFilterDescriptor = _destroy
    cudnnDestroyConvolutionDescriptor = _destroy

    def cudnnGetErrorString(self, status):
        return f"fake status {status}".encode()

    # -- the heuristics -------------------------------------------------------------------

    def _rank(self, direction, convolution, asked, count, results):
        math = self.objects[convolution]["math"]
        self.queries.append((direction, math))
        ranked = [(algo, status, memory, math if offered is None else offered)
                  for algo, (status, memory, offered) in RANKED.items()]
        for slot, (algo, status, memory, offered) in zip(results, ranked[:asked]):
            slot.algo, slot.status, slot.memory, slot.mathType = algo, status, memory, offered
        count._obj.value = min(asked, len(ranked))
        return 0

    def cudnnGetConvolutionForwardAlgorithm_v7(self, handle, x, w, conv, y, asked, count, out):
        return self._rank("forward", conv, asked, count, out)

    def cudnnGetConvolutionBackwardDataAlgorithm_v7(self, handle, w, dy, conv, dx, asked,
                                                    count, out):
        return self._rank("data", conv, asked, count, out)

    def cudnnGetConvolutionBackwardFilterAlgorithm_v7(self, handle, x, dy, conv, dw, asked,
                                                      count, out):
        return self._rank("filter", conv, asked, count, out)

    # -- the launches -----------------------------------------------------------------------

    def _array(self, desc, pointer):
        settings = self.objects[desc]
        dtype, shape = np.dtype(settings["dtype"]), settings["shape"]
        size = int(np.prod(shape)) * dtype.itemsize
        memory = (ctypes.c_byte * size).from_address(pointer)
        return np.frombuffer(memory, dtype=dtype).reshape(shape)

    def _launch(self, direction, handle, algo, workspace, workspace_bytes, conv):
        settings = self.objects[conv]
        status, memory, offered = RANKED[algo]
        if status:
            return status
        if workspace_bytes < memory or (memory and not workspace):
            return 2000  # the algorithm's workspace was not given
        if offered is not None and settings["math"] != offered:
            return 2000  # run with another math mode than the one it was ranked with
        self.launches.append((direction, algo, settings["math"], workspace_bytes,
                              self.objects[handle].get("stream")))
        return 0

    def _convolved(self, direction, call, compute, target) -> int:
        """A launch's bookkeeping, then ``compute(settings, target shape)`` blended into the
        ``target`` (descriptor, pointer) with ``call``'s alpha and beta."""
        handle, alpha, algo, workspace, workspace_bytes, conv, beta = call
        status = self._launch(direction, handle, algo, workspace, workspace_bytes, conv)
        if status == 0:
            into = self._array(*target)
            _blend(into, compute(self.objects[conv], into.shape), alpha, beta)
        return status

    def cudnnConvolutionForward(self, handle, alpha, x_desc, x, w_desc, w, conv, algo,
                                workspace, workspace_bytes, beta, y_desc, y):
        return self._convolved(
            "forward", (handle, alpha, algo, workspace, workspace_bytes, conv, beta),
            lambda settings, _: forward(self._array(x_desc, x), self._array(w_desc, w),
                                        settings), (y_desc, y))

    def cudnnConvolutionBackwardData(self, handle, alpha, w_desc, w, dy_desc, dy, conv, algo,
                                     workspace, workspace_bytes, beta, dx_desc, dx):
        return self._convolved(
            "data", (handle, alpha, algo, workspace, workspace_bytes, conv, beta),
            lambda settings, shape: data_gradient(self._array(dy_desc, dy),
                                                  self._array(w_desc, w), settings, shape),
            (dx_desc, dx))

    def cudnnConvolutionBackwardFilter(self, handle, alpha, x_desc, x, dy_desc, dy, conv,
                                       algo, workspace, workspace_bytes, beta, dw_desc, dw):
        return self._convolved(
            "filter", (handle, alpha, algo, workspace, workspace_bytes, conv, beta),
            lambda settings, shape: filter_gradient(self._array(x_desc, x),
                                                    self._array(dy_desc, dy), settings, shape),
            (dw_desc, dw))


def _blend(target, result, alpha, beta) -> None:
    alpha, beta = alpha._obj.value, beta._obj.value
    target[...] = (alpha * result + (beta * target if beta else 0)).astype(target.dtype)


# -- the convolutions, from the definition ------------------------------------------------

def _taps(w_shape, settings, x_shape):
    """Each kernel tap with the slices of the padded input it reads for every output."""
    pads, strides, dilations = settings["pads"], settings["strides"], settings["dilations"]
    out = [(x + 2 * p - d * (k - 1) - 1) // s + 1
           for x, p, d, k, s in zip(x_shape[2:], pads, dilations, w_shape[2:], strides)]
    for tap in itertools.product(*(range(k) for k in w_shape[2:])):
        yield tap, tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                         for t, d, o, s in zip(tap, dilations, out, strides)), out


def _padded(x, pads):
    return np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in pads])


def forward(x, w, settings):
    g = settings["group"]
    n, m = x.shape[0], w.shape[0]
    xp = _padded(x, settings["pads"])
    y = None
    for tap, window, out in _taps(w.shape, settings, x.shape):
        part = xp[(slice(None), slice(None)) + window].reshape((n, g, -1) + tuple(out))
        weights = w[(slice(None), slice(None)) + tap].astype(np.float64).reshape(g, m // g, -1)
        term = np.einsum("ngc...,gmc->ngm...", part, weights)
        y = term if y is None else y + term
    return y.reshape((n, m) + y.shape[3:])


def data_gradient(dy, w, settings, x_shape):
    g, pads = settings["group"], settings["pads"]
    n, m = dy.shape[0], w.shape[0]
    dx = _padded(np.zeros(x_shape), pads)
    grouped = dy.astype(np.float64).reshape((n, g, m // g) + dy.shape[2:])
    for tap, window, _ in _taps(w.shape, settings, x_shape):
        weights = w[(slice(None), slice(None)) + tap].astype(np.float64).reshape(g, m // g, -1)
        part = np.einsum("ngm...,gmc->ngc...", grouped, weights)
        dx[(slice(None), slice(None)) + window] += part.reshape((n, -1) + dy.shape[2:])
    inner = tuple(slice(p, p + size) for p, size in zip(pads, x_shape[2:]))
    return dx[(slice(None), slice(None)) + inner]


def filter_gradient(x, dy, settings, w_shape):
    g = settings["group"]
    n, m = x.shape[0], w_shape[0]
    xp = _padded(x, settings["pads"])
    grouped = dy.astype(np.float64).reshape((n, g, m // g) + dy.shape[2:])
    dw = np.zeros(w_shape)
    for tap, window, out in _taps(w_shape, settings, x.shape):
        part = xp[(slice(None), slice(None)) + window].reshape(n, g, -1, int(np.prod(out)))
        dw[(slice(None), slice(None)) + tap] = np.einsum(
            "ngcl,ngml->gmc", part, grouped.reshape(n, g, m // g, -1)).reshape(m, -1)
    return dw
