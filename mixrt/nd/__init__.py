"""mixrt.nd: imperative arrays on a device (the MXNet paper's shallow embedding, §2.2).

    from mixrt import nd, autograd
    x = nd.array([[1.0, 2.0], [3.0, 4.0]], ctx=mixrt.cpu())
    y = nd.Gemm(x, w, b, transB=1)        # any registered op, as sym has it
    z = (x @ x.T + 1).relu()              # operators and methods
    z.asnumpy()

Every registered operator is a function here with the same arguments as its ``mixrt.sym``
twin (the ONNX default domain at the top level, other domains under ``nd.mixrt``, ``nd.ml``,
...), plus MXNet 1.x's ``mx.nd`` API with its semantics (``creation.py``, ``mxnet_ops.py``
and the modules it gathers, ``reductions.py``, ``special.py``), ``nd.save``/``nd.load`` in
MXNet's file format (``serialization.py``), ``nd.linalg`` and ``nd.contrib``. Arrays on
different devices never meet silently: ``DeviceMismatchError``.
"""

from __future__ import annotations

import numpy as np

import mixrt.ops  # noqa: F401  (registers every kernel)
from mixrt import dispatch, tape
from mixrt.context import as_context
from mixrt.base.errors import InputError
from mixrt.nd.ndarray import NDArray
from mixrt.op_specs import generate, install

tape.connect_dispatcher()

OPERATORS = install(globals(), generate(dispatch.make_function))


# -- making arrays (MXNet's names and float32 default: mixrt/nd/creation.py) ------------------

from mixrt.nd.creation import (arange, array, empty, eye, from_numpy, full,  # noqa: E402
                               identity, linspace, ones, ones_like, zeros, zeros_like)


def from_dlpack(source) -> NDArray:
    """An NDArray sharing ``source``'s memory (a NumPy, CuPy or PyTorch tensor, anything
    with ``__dlpack__``, or a DLPack capsule as ``to_dlpack_for_read`` gives): no copy, on
    the device the producer says it lives on."""
    if type(source).__name__ == "PyCapsule":
        return _from_capsule(source)
    device_type, device_id = source.__dlpack_device__()
    if int(device_type) == 1:  # kDLCPU
        return NDArray(np.from_dlpack(source), as_context("cpu"))
    if int(device_type) in (2, 13):  # kDLCUDA, kDLCUDAManaged
        import cupy  # noqa: PLC0415
        return NDArray(cupy.from_dlpack(source), as_context(f"gpu:{int(device_id)}"))
    raise InputError(f"from_dlpack: device type {device_type} is neither the CPU nor CUDA")


class _HostCapsule:
    """A bare DLPack capsule, offered to NumPy as host memory (NumPy refuses it, without
    using it up, when the tensor lives on a GPU)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def _from_capsule(capsule) -> NDArray:
    try:
        return NDArray(np.from_dlpack(_HostCapsule(capsule)), as_context("cpu"))
    except (BufferError, RuntimeError, TypeError):
        import cupy  # noqa: PLC0415  (a GPU tensor: CuPy is there)
        data = cupy.from_dlpack(capsule)
        return NDArray(data, as_context(f"gpu:{data.device.id}"))


def to_dlpack_for_read(array: NDArray):
    """A DLPack capsule of ``array``'s memory (MXNet's; pass it to ``from_dlpack``)."""
    return array.__dlpack__()


def to_dlpack_for_write(array: NDArray):
    """As ``to_dlpack_for_read``: the consumer may write through it."""
    return array.__dlpack__()


def waitall() -> None:
    """Wait for every piece of engine work pushed so far (and raise the first failure)."""
    get_engine().wait_all()


# -- MXNet's everyday names (shared with mixrt.sym: mixrt/array_methods.py) ---------------------

from mixrt.array_methods import (clip, concat, dot, exp, expand_dims, flatten,  # noqa: E402
                                 log, log_softmax, max, maximum, mean, min, minimum, relu,
                                 sigmoid, softmax, sqrt, square, squeeze, stack, sum,
                                 tanh, transpose)
from mixrt.array_methods import where as _where  # noqa: E402
from mixrt.nd import mxnet_ops as _mx  # noqa: E402  (MXNet's operator names; attaches methods)
globals().update({_name: getattr(_mx, _name) for _name in _mx.FUNCTIONS})
from mixrt.nd import array_layers as _layers  # noqa: E402  (MXNet's layer operators)
from mixrt.runtime.engine import get_engine
globals().update({_name: getattr(_layers, _name)
                  for _name in _layers.FUNCTIONS + _layers.EXTENDED})
from mixrt.nd import random  # noqa: E402  (MXNet's samplers, and nd.random_uniform, ...)
globals().update(random.FLAT)


def reshape(data, shape, reverse: bool = False) -> NDArray:
    """MXNet's ``nd.reshape``, special codes and ``reverse`` included (``NDArray.reshape``)."""
    return data.reshape(shape, reverse=reverse)


def where(condition, x, y):
    """``x`` where ``condition`` is non-zero, else ``y``. As in MXNet, a 1-D condition
    beside higher-rank ``x`` and ``y`` picks whole rows (its length is their first
    dimension); other shapes broadcast, NumPy's way."""
    if isinstance(condition, NDArray) and condition.ndim == 1:
        like = next((v for v in (x, y) if isinstance(v, NDArray)), None)
        if like is not None and like.ndim > 1:
            if condition.shape[0] != like.shape[0]:
                raise InputError(f"where: a 1-D condition of length {condition.shape[0]} "
                                 f"picks rows, and x has {like.shape[0]} (shape {like.shape})")
            condition = condition.reshape((-1,) + (1,) * (like.ndim - 1))
    if isinstance(condition, NDArray) and condition.dtype != np.bool_:
        # MXNet's numeric conditions (non-zero is true); ONNX's Where takes bool
        condition = dispatch.invoke("", "Not", [condition._binary("Equal", 0)], {})
    return _where(condition, x, y)


__all__ = ["NDArray", "from_dlpack", "to_dlpack_for_read", "to_dlpack_for_write",
           "waitall", "dot", "concat", "stack", "where",
           *OPERATORS, *_mx.FUNCTIONS, *_layers.FUNCTIONS]


# -- the rest of MXNet 1.x's mx.nd: reductions giving (1,), files, math, shapes, linalg ------

from mixrt.nd import _internal, contrib, linalg  # noqa: E402,F401  (nd.contrib.*, ...)
from mixrt.nd import sparse  # noqa: E402  (MXNet's mx.nd.sparse: csr and row_sparse arrays)
from mixrt.nd.sparse import cast_storage  # noqa: E402,F401
from mixrt.nd import creation as _creation, reductions as _reductions  # noqa: E402
from mixrt.nd import serialization as _files, special as _special  # noqa: E402
for _module in (_creation, _reductions, _files, _special):
    globals().update({_name: getattr(_module, _name) for _name in _module.FUNCTIONS})
    __all__ += _module.FUNCTIONS
globals().update({f"linalg_{_name}": getattr(linalg, _name) for _name in linalg.FUNCTIONS})
_onnx_cast = Cast  # noqa: F821  (installed from the registry above)


def Cast(*args, dtype=None, **kwargs):  # noqa: F811
    """MXNet's ``Cast(data, dtype=...)`` when called with ``dtype``; else ONNX's
    ``Cast(input, to=...)``."""
    if dtype is None:
        return _onnx_cast(*args, **kwargs)
    kwargs.pop("name", None)
    return _mx.cast(*args, dtype=dtype, **kwargs)
__all__ += ["contrib", "linalg", *(f"linalg_{_name}" for _name in linalg.FUNCTIONS)]


# -- MXNet's optimizer update operators, CachedOp, and out= on every operator ------------------

from mixrt import optimizer_ops as _optimizer_ops  # noqa: E402  (imports nothing of mixrt.nd)
from mixrt.nd.cached_op import CachedOp  # noqa: E402
from mixrt.nd.mxnet_math import accepting_out as _accepting_out  # noqa: E402
globals().update({_name: getattr(_optimizer_ops, _name) for _name in _optimizer_ops.FUNCTIONS})
__all__ += [*_optimizer_ops.FUNCTIONS, "CachedOp"]

# the shared everyday functions (mixrt/array_methods.py) and a few of MXNet's operator and
# layer functions were written without out=; under mx.nd every operator takes it
for _name in (*_mx.FUNCTIONS, *_layers.FUNCTIONS, "concat", "stack", "exp", "expand_dims",
              "flatten", "log", "maximum", "minimum", "relu", "sigmoid", "sqrt", "square",
              "squeeze", "tanh", "transpose", "reshape", "where"):
    globals()[_name] = _accepting_out(globals()[_name])

from mixrt.operator import imperative_custom as Custom  # noqa: E402  (MXNet's nd.Custom)

# NDArray's fluent methods take MXNet's out= and name=, once every module above has attached
# its methods (mixrt/nd/fluent.py)
from mixrt.nd import fluent as _fluent  # noqa: E402
_fluent.attach()

# MXNet's fused RNN under ONNX's operator's name (mixrt/nd/fused_rnn.py)
from mixrt.nd import fused_rnn as _fused_rnn  # noqa: E402
RNN = _fused_rnn.with_onnx_rnn(RNN, _fused_rnn.fused_rnn, "mixrt.nd.fused_rnn")  # noqa: F821

# ``from mxnet.ndarray import *`` gives MXNet's operators and subpackages: those above that
# were imported rather than generated, the samplers' flat names (random_normal, ...)
__all__ += ["Custom", "cast_storage", "exp", "expand_dims", "flatten", "log", "maximum",
            "minimum", "relu", "reshape", "sigmoid", "sqrt", "square", "squeeze", "tanh",
            "transpose", "random", "sparse",
            *(_name for _name in random.FLAT if _name not in __all__)]
