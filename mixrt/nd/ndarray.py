"""NDArray: an array on one device, with the registry's ops as methods and operators.

The data is a NumPy or CuPy array (``xp`` of its context). Operations run when called
(``mixrt.dispatch``); what runs asynchronously is engine work that writes an array —
a KVStore pull, ``copyto`` another device — so every read first waits for the array's pending
writes (``_read``) and every in-place write for its pending reads and writes (``_write``).
Under ``autograd.record()`` each op leaves a node on the tape; an array remembers the node
that made it (``_entry``) and counts its in-place writes (``_version``), so a backward pass can
tell when a value it saved was overwritten since.

Where it differs from MXNet 1.x's NDArray, on purpose (NumPy's conventions, which ONNX and
``mixrt.sym`` share):

* a reduction over every axis (``x.sum()``, ``x.norm()``, ``nd.dot`` of two vectors), an
  integer index of a vector (``x[1]`` of a 1-D ``x``) and ``squeeze`` of an all-ones shape
  give a 0-d array, shape ``()``; MXNet has no 0-d arrays and gives shape ``(1,)``;
* comparisons (``x > 0``, ``x == y``) give bool arrays, MXNet's give 0/1 in ``x``'s dtype;
  a bool array used in arithmetic is cast first (``(x > 0) * x`` is float32, as in MXNet;
  see ``dispatch._numeric_bools``), and one can index (``x[x > 0]``, a NumPy mask);
* ``x[key]`` is always a copy; MXNet's ``x[i]`` and ``x[i:j]`` are views that share ``x``'s
  memory (writing ``x[1:2][:] = 0`` changes ``x`` there, not here: write ``x[1:2] = 0``);
* ``argmax``/``argmin`` give int64 indices (MXNet's are floats of ``x``'s dtype);
* ``nd.array`` of a NumPy array keeps its dtype (MXNet's makes float32);
* arrays of two float dtypes are promoted (MXNet raises); two other dtypes raise, as there;
* an op given a dtype its ONNX definition does not take raises ``InputError``: ``sqrt``,
  ``exp`` or ``sigmoid`` of an int32 array (MXNet computes them in the integers,
  ``sqrt(2) == 1``; NumPy would promote to float64). ``where`` still takes a numeric
  condition, as in MXNet (non-zero is true).
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt import autograd, dispatch
from mixrt.array_methods import ArrayMethods
from mixrt.autograd.arrays import use_array_type
from mixrt.context import as_context, Context
from mixrt.base.errors import DeviceMismatchError, GradientError, InputError
from mixrt.ops.device import add_at, to_host
from mixrt.ops.shape import shape_mxnet
from mixrt.runtime.engine import get_engine

_GRAD_REQS = ("write", "add", "null")


def _on_its_device(method):
    """An NDArray method whose GPU work (copies, new arrays, writes) goes to the array's own
    GPU, with the caller's current device back afterwards."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if self.ctx.device.kind == "cpu":
            return method(self, *args, **kwargs)
        with self.ctx.device.active():
            return method(self, *args, **kwargs)
    return run


class NDArray(ArrayMethods):
    __slots__ = ("_data", "ctx", "_var", "_entry", "_version", "_grad", "_grad_req",
                 "_on_grad", "__weakref__")
    __array_priority__ = 1000.0  # numpy scalars and arrays defer to our operators

    def __init__(self, data, ctx: Context):
        if ctx.device.kind != "cpu" and isinstance(data, np.ndarray):
            # a host array here would fail later, far away, inside some CuPy kernel
            raise DeviceMismatchError(f"internal: an NDArray on {ctx} was given host memory "
                                      f"{data.dtype}{list(data.shape)}; move it with "
                                      f"{ctx}.device.put first")
        self._data = data
        self.ctx = ctx
        self._var = None  # the engine tag, made the first time engine work touches the array
        self._entry = None  # (tape node, output index) when autograd recorded its making
        self._version = 0
        self._grad = None
        self._grad_req = "null"
        self._on_grad = None  # called with this array once backward stored its gradient

    # -- engine synchronisation ----------------------------------------------------------

    def _read(self):
        if self._var is not None:
            _engine().wait_to_read(self._var)
        return self._data

    def _write(self):
        """The data, for an in-place write that follows (bumps the version)."""
        if autograd.is_recording() and (self._entry is not None or self._grad is not None):
            raise GradientError(
                "in-place write to an array autograd is recording (it was computed under "
                "record() or has a gradient attached); write `y = x + v` instead of "
                "`x += v`, or do the update under autograd.pause()")
        if self._var is not None:
            _engine().wait_to_write(self._var)
        self._version += 1
        return self._data

    def engine_var(self):
        """This array's engine tag, for work pushed to ``mixrt.runtime.engine``."""
        if self._var is None:
            self._var = _engine().new_var(f"ndarray{id(self):x}")
        return self._var

    def wait_to_read(self) -> "NDArray":
        self._read()
        return self

    # -- what it is --------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        return tuple(self._data.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def size(self) -> int:
        return int(self._data.size)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def context(self) -> Context:
        return self.ctx

    @property
    def device(self) -> Context:
        return self.ctx

    @property
    def stype(self) -> str:
        return "default"

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"\n{self.asnumpy()!r}\n<NDArray {'x'.join(map(str, self.shape))} @{self.ctx}>"

    __hash__ = object.__hash__  # == builds an array, so identity is the hash

    # -- leaving mixrt -----------------------------------------------------------------

    def asnumpy(self) -> np.ndarray:
        return np.array(to_host(self._read()), copy=True)

    def __array__(self, dtype=None, copy=None):
        data = self._read()
        host = to_host(data) if dtype is None else to_host(data).astype(dtype, copy=False)
        return host.copy() if copy and host is data else host  # np.array(x) must not alias x

    def asscalar(self):
        if self.size != 1:
            raise InputError(f"asscalar needs an array of one element, this one is "
                             f"{self.shape}")
        return self.asnumpy().reshape(()).item()

    item = asscalar

    def __float__(self) -> float:
        return float(self.asscalar())

    def __int__(self) -> int:
        return int(self.asscalar())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be an index, not {self.dtype}")
        return int(self.asscalar())

    def __bool__(self) -> bool:
        return bool(self.asscalar())

    def tolist(self) -> list:
        return self.asnumpy().tolist()

    def __dlpack__(self, stream=None, **kwargs):
        data = self._read()
        if stream is not None:
            kwargs["stream"] = stream
        try:  # max_version matters: NumPy marks what a legacy capsule gives it read-only
            return data.__dlpack__(**kwargs)
        except TypeError:  # a producer that knows only `stream` (CuPy < 14)
            return data.__dlpack__() if stream is None else data.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._read().__dlpack_device__()

    # -- moving and copying ------------------------------------------------------------

    def as_in_context(self, ctx) -> "NDArray":
        """This array on ``ctx``: itself when already there, else a copy (the one explicit
        way across devices; recorded, so gradients flow back to the source device)."""
        ctx = as_context(ctx)
        if ctx == self.ctx:
            return self
        return CopyToDevice(ctx)(self)

    to_device = as_in_context

    @_on_its_device
    def copyto(self, other) -> "NDArray":
        """Copy into ``other`` (an NDArray of the same shape) or onto a context."""
        if isinstance(other, NDArray):
            if other.shape != self.shape:
                raise InputError(f"copyto: shapes differ, {self.shape} into {other.shape}")
            source = self._read()
            target = other._write()
            with other.ctx.device.active():  # the write runs on the target's GPU
                target[...] = other.ctx.device.put(source) if other.ctx != self.ctx else source
            return other
        target = as_context(other)
        with target.device.active():  # put() leaves an array already there as it is
            return NDArray(target.device.put(self._read()).copy(), target)

    def copy(self) -> "NDArray":
        return dispatch.invoke("", "Identity", [self], {}).__copy_data()

    @_on_its_device
    def __copy_data(self) -> "NDArray":
        # Identity returns its input's buffer; a copy must own its memory
        self._data = self._data.copy()
        return self

    def astype(self, dtype, copy: bool = True) -> "NDArray":
        try:
            dtype = np.dtype(dtype)
        except TypeError as exc:
            raise InputError(f"astype: {dtype!r} is not a dtype") from exc
        if dtype == self.dtype and not copy:
            return self
        return ArrayMethods.astype(self, dtype)

    def detach(self) -> "NDArray":
        """The same data, cut off from the recorded graph (no gradient flows through)."""
        return NDArray(self._read(), self.ctx)

    # -- autograd ----------------------------------------------------------------------

    @_on_its_device
    def attach_grad(self, grad_req: str = "write", stype=None) -> None:
        """Give this array a gradient buffer that ``backward`` fills (``"write"``) or adds
        to (``"add"``); ``"null"`` detaches it."""
        del stype
        if grad_req not in _GRAD_REQS:
            raise InputError(f"grad_req must be one of {_GRAD_REQS}, got {grad_req!r}")
        self._grad_req = grad_req
        self._grad = None if grad_req == "null" else \
            NDArray(self.ctx.xp.zeros_like(self._read()), self.ctx)
        self._entry = None  # a variable is a leaf, whatever made it

    @property
    def grad(self) -> "NDArray | None":
        return self._grad

    @property
    def grad_req(self) -> str:
        return self._grad_req

    def backward(self, out_grad=None, retain_graph: bool = False,
                 train_mode: bool = True) -> None:
        autograd.backward([self], None if out_grad is None else [out_grad],
                          retain_graph=retain_graph, train_mode=train_mode)

    # -- operators ---------------------------------------------------------------------

    def _binary(self, op_type: str, other, reverse: bool = False) -> "NDArray":
        left, right = (other, self) if reverse else (self, other)
        return dispatch.invoke("", op_type, [left, right], {})

    def __mod__(self, other): return _mod(self, other)
    def __rmod__(self, other): return _mod(other, self)
    def __eq__(self, other): return self._binary("Equal", other)

    def __ne__(self, other):
        return dispatch.invoke("", "Not", [self._binary("Equal", other)], {})

    def __neg__(self): return dispatch.invoke("", "Neg", [self], {})
    def __abs__(self): return dispatch.invoke("", "Abs", [self], {})
    def __pos__(self): return self

    def _inplace(self, op_type: str, other) -> "NDArray":
        return self._assign(op_type, self._binary(op_type, other))

    @_on_its_device
    def _assign(self, op_type: str, result: "NDArray") -> "NDArray":
        if result.shape != self.shape:
            raise InputError(f"in-place {op_type}: the result's shape {result.shape} is not "
                             f"this array's {self.shape}")
        target = self._write()
        target[...] = result._data
        return self

    def __iadd__(self, other): return self._inplace("Add", other)
    def __isub__(self, other): return self._inplace("Sub", other)
    def __imul__(self, other): return self._inplace("Mul", other)
    def __itruediv__(self, other): return self._inplace("Div", other)
    def __imod__(self, other): return self._assign("Mod", _mod(self, other))

    # -- indexing ----------------------------------------------------------------------

    @_on_its_device
    def __getitem__(self, key) -> "NDArray":
        """A copy of the selected part (see the module's notes: MXNet gives a view for an
        integer or a slice). An NDArray of floats indexes as integers, as in MXNet."""
        key = _raw_key(key, self.ctx)
        try:
            return Index(key)(self)
        except (IndexError, TypeError, ValueError) as exc:
            raise _index_error(exc, "indexing", key, self.shape) from exc

    @_on_its_device
    def __setitem__(self, key, value) -> None:
        key = _raw_key(key, self.ctx)
        if isinstance(value, NDArray):
            if value.ctx != self.ctx:
                raise DeviceMismatchError(f"setitem: the value is on {value.ctx}, the "
                                          f"array on {self.ctx}; move it with "
                                          f".as_in_context({self.ctx})")
            value = value._read()
        target = self._write()
        try:
            target[key] = value
        except (IndexError, TypeError, ValueError) as exc:
            raise _index_error(exc, "setitem", key, self.shape) from exc

    def __iter__(self):
        return (self[i] for i in range(self.shape[0]))

    # -- MXNet's meanings where the shared methods (mixrt/array_methods.py) differ ---------

    def _reshaped(self, codes: list[int], reverse: bool) -> "NDArray":
        # every code is resolved here against the known shape (a bad one is an InputError
        # naming it), so the op run is ONNX Reshape with sizes only
        target = mxnet_shape(self.shape, codes, reverse)
        return self._op("Reshape", [self, self._int_tensor(target)], {})

    def argmax(self, axis=None, keepdims: bool = False) -> "NDArray":
        """Indices of the largest values along ``axis``; ``axis=None`` (MXNet's default)
        over the flattened array."""
        if axis is None:
            return ArrayMethods.argmax(self.reshape(-1), 0, False)._flat_index(self.ndim,
                                                                                keepdims)
        return ArrayMethods.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims: bool = False) -> "NDArray":
        """Indices of the smallest values along ``axis``; ``axis=None`` (MXNet's default)
        over the flattened array."""
        if axis is None:
            return ArrayMethods.argmin(self.reshape(-1), 0, False)._flat_index(self.ndim,
                                                                                keepdims)
        return ArrayMethods.argmin(self, axis, keepdims)

    def _flat_index(self, ndim: int, keepdims: bool) -> "NDArray":
        return self.reshape((1,) * ndim) if keepdims else self

    # -- what the shared methods (mixrt/array_methods.py) run on ------------------------

    def _op(self, op_type: str, inputs: list, attributes: dict):
        return dispatch.invoke("", op_type, inputs, attributes)

    def _int_tensor(self, values):
        return _ints(values, self.ctx)

    @_on_its_device
    def zeros_like(self) -> "NDArray":
        return NDArray(self.ctx.xp.zeros_like(self._read()), self.ctx)

    @_on_its_device
    def ones_like(self) -> "NDArray":
        return NDArray(self.ctx.xp.ones_like(self._read()), self.ctx)



def _raw_key(key, ctx: Context):
    if isinstance(key, NDArray):
        if key.ctx != ctx:
            raise DeviceMismatchError(f"indexing: the index is on {key.ctx}, the array on "
                                      f"{ctx}; move it with .as_in_context({ctx})")
        raw = key._read()
        # MXNet's index arrays are usually float32 (nd.array's default): their values index
        return raw.astype(np.int64) if raw.dtype.kind == "f" else raw
    if isinstance(key, tuple):
        return tuple(_raw_key(k, ctx) for k in key)
    return key


class IndexInputError(InputError, IndexError):
    """An index out of range or of a kind NDArray does not take; an ``IndexError`` too, as
    Python and MXNet raise."""


def _index_error(exc, what: str, key, shape) -> InputError:
    kind = IndexInputError if isinstance(exc, IndexError) else InputError
    return kind(f"{what}: key {key!r} on an array of shape {shape}: {exc}")


def _mod(a, b):
    """``a % b`` as in MXNet: the sign of ``b`` (Python's rule) for floats as for ints."""
    arrays = [v for v in (a, b) if isinstance(v, NDArray)]
    if all(v.dtype.kind == "f" for v in arrays):
        return FloorMod()(a, b)
    return dispatch.invoke("", "Mod", [a, b], {"fmod": 0})  # integers: Python's rule too


def mxnet_shape(source: tuple, codes, reverse: bool = False) -> tuple:
    """The shape MXNet's reshape makes of ``source`` from ``codes`` (its 0/-1/-2/-3/-4, see
    ``NDArray.reshape``), -1 resolved; the rules are mixrt::MXReshape's (ops/shape/shape_mxnet.py),
    which a hybridized block runs instead."""
    try:
        return shape_mxnet.mxnet_shape(source, codes, reverse)
    except ValueError as exc:
        raise InputError(f"reshape: {exc}") from None


def _ints(values, ctx: Context):
    with ctx.device.active():
        return ctx.xp.asarray([int(v) for v in values], dtype=np.int64)


def _engine():
    return get_engine()


dispatch.NDArray = NDArray


# -- the NDArray operations that are not registered ops ----------------------------------------
# indexing and device copies, written as autograd Functions so that gradients flow through

class Index(autograd.Function):
    """``x[key]``: NumPy indexing forward; backward adds the gradient into zeros at ``key``
    (``add.at``, so an index that repeats gets every contribution)."""

    def __init__(self, key):
        super().__init__()
        self.key = key

    def forward(self, x: NDArray) -> NDArray:
        self.source = (x.shape, x.dtype, x.ctx)
        picked = x._read()[self.key]
        xp = x.ctx.xp
        return NDArray(picked.copy() if isinstance(picked, xp.ndarray) else xp.asarray(picked),
                       x.ctx)

    def backward(self, dy: NDArray) -> NDArray:
        shape, dtype, _ = self.source
        return IndexAdd(self.key, shape, dtype)(dy)  # a Function, so create_graph sees it


class IndexAdd(autograd.Function):
    """Index's backward: ``dy`` added into zeros at ``key``. Its own backward reads
    ``key`` again, so gradients of gradients through indexing flow (autograd's
    create_graph records this Function like any other)."""

    def __init__(self, key, shape: tuple, dtype):
        super().__init__()
        self.key, self.shape, self.dtype = key, shape, dtype

    def forward(self, dy: NDArray) -> NDArray:
        xp = dy.ctx.xp
        dx = xp.zeros(self.shape, dtype=self.dtype)
        add_at(xp, dx, self.key, dy._read())
        return NDArray(dx, dy.ctx)

    def backward(self, ddx: NDArray) -> NDArray:
        return Index(self.key)(ddx)


class CopyToDevice(autograd.Function):
    """The one way across devices; the gradient comes back to the source device."""

    def __init__(self, ctx):
        super().__init__()
        self.ctx = ctx

    def forward(self, x: NDArray) -> NDArray:
        self.source = x.ctx
        return _copied_to(x, self.ctx)

    def backward(self, dy: NDArray) -> NDArray:
        return _copied_to(dy, self.source)


def _copied_to(x: NDArray, ctx) -> NDArray:
    """A copy of ``x`` on ``ctx``, made there (``put`` leaves an array already there as it
    is, and a GPU copy goes to the current GPU)."""
    with ctx.device.active():
        return NDArray(ctx.device.put(x._read()).copy(), ctx)


class FloorMod(autograd.Function):
    """``a % b`` of float arrays as MXNet (and Python) compute it: the result takes the sign
    of ``b`` (``-1 % 2 == 1``; ``x % 0 == 0``, as MXNet). ONNX's ``Mod`` on floats is C's
    ``fmod`` (the sign of ``a``) and has no gradient; this one has MXNet's: ``1`` for ``a``,
    ``-floor(a / b)`` for ``b``. Either side may be a Python number (no gradient)."""

    def forward(self, a, b):
        like = a if isinstance(a, NDArray) else b
        ctx = dispatch._common_context("Mod", [a, b])  # DeviceMismatchError for two devices
        xp = ctx.xp
        self.shapes = [v.shape if isinstance(v, NDArray) else None for v in (a, b)]
        ra, rb = (v._read() if isinstance(v, NDArray) else xp.asarray(v, dtype=like.dtype)
                  for v in (a, b))
        self.saved = (ra, rb, ctx)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = xp.mod(ra, rb)
            out = xp.where(rb == 0, xp.zeros((), dtype=out.dtype), out)
        return NDArray(out, ctx)

    def backward(self, dy: NDArray):
        ra, rb, ctx = self.saved
        xp, g = ctx.xp, dy._read()
        with np.errstate(divide="ignore", invalid="ignore"):
            quotient = xp.where(rb == 0, xp.zeros((), dtype=g.dtype), xp.floor(ra / rb))
        grads = (g, -g * quotient)
        return tuple(None if shape is None else
                     NDArray(_sum_to(xp, grad, shape).astype(raw.dtype), ctx)
                     for grad, shape, raw in zip(grads, self.shapes, (ra, rb)))


def _sum_to(xp, grad, shape):
    """``grad`` summed over the axes broadcasting added to ``shape``."""
    grad = xp.asarray(grad)
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return xp.broadcast_to(grad, shape)


use_array_type(NDArray)  # autograd hands its values back as NDArrays
