"""NDArray: an array on one device, with the registry's ops as methods and operators.

The data is a NumPy or CuPy array (``xp`` of its context). Operations run when called
(``mixrt.dispatch``); what runs asynchronously is engine work that writes an array —
a KVStore pull, ``copyto`` another device — so every read first waits for the array's pending
writes (``_read``) and every in-place write for its pending reads and writes (``_write``).
Under ``autograd.record()`` each op leaves a node on the tape; an array remembers the node
that made it (``_entry``) and counts its in-place writes (``_version``), so a backward pass can
tell when a value it saved was overwritten since.

MXNet 1.x's semantics, which its users' code relies on (``tests/test_mxnet_nd_semantics.py``
checks them against MXNet 1.9.1):

* basic indexing whose selection is one contiguous run of memory (``x[1]``, ``x[1:3]``,
  ``x[1, 2:4]``) gives a view: ``x[1:2][:] = 0`` writes into ``x`` (``views.py`` has the
  rule); other keys copy. ``reshape`` is a view too; every other op's result owns its memory
  (``dispatch._own``). A view and its base share one version counter and engine tag, so a
  write through either counts against both: a backward pass that saved one refuses to use
  a value written since, and engine work on one waits for work on the other;
* an integer index of a vector and a reduction over every axis give shape ``(1,)``
  (``reductions.py``), as MXNet has no 0-d results there;
* comparisons (``x > 0``, ``x == y``) give 0/1 in the arrays' dtype (float32), and so do
  ``argmax``/``argmin`` (their indices as floats of ``x``'s dtype, as MXNet);
* ``nd.array`` makes float32 unless ``dtype`` is given or the source is an NDArray
  (``creation.py``).

Where it still differs, on purpose:

* arrays of two float dtypes are promoted (MXNet raises); two other dtypes raise, as there;
* an op given a dtype its ONNX definition does not take raises ``InputError``: ``sqrt``,
  ``exp`` or ``sigmoid`` of an int32 array (MXNet computes them in the integers,
  ``sqrt(2) == 1``; NumPy would promote to float64). ``where`` still takes a numeric
  condition, as in MXNet (non-zero is true);
* ``float(x)`` and ``int(x)`` of a one-element array work (MXNet 1.9 raises TypeError).
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt import dispatch, tape
from mixrt.array_methods import ArrayMethods
from mixrt.tape.arrays import use_array_type
from mixrt.context import as_context, Context
from mixrt.base import STORAGE_TYPE_IDS
from mixrt.base.errors import DeviceMismatchError, GradientError, InputError
from mixrt.nd import views
from mixrt.nd.array_functions import CopyToDevice, FloorMod, Index
from mixrt.ops.device import to_host
from mixrt.ops.shape import shape_mxnet
from mixrt.runtime.engine import get_engine

_GRAD_REQS = ("write", "add", "null")
py_slice = slice  # MXNet's name for Python's slice (its module shadows it with nd.slice)
# MXNet's storage type codes (its NDArray files use them too: nd/serialization.py)
_STORAGE_TYPE_STR_TO_ID = STORAGE_TYPE_IDS
_STORAGE_TYPE_ID_TO_STR = {code: name for name, code in _STORAGE_TYPE_STR_TO_ID.items()}


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
    __slots__ = ("_data", "ctx", "_var", "_entry", "_versions", "_base", "_grad",
                 "_grad_req", "_on_grad", "_grad_seen", "__weakref__")
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
        self._versions = [0]  # in-place writes so far; one list shared with views
        self._base = None  # the array whose memory this one views (MXNet's basic indexing)
        self._grad = None
        self._grad_req = "null"
        self._on_grad = None  # called with this array once backward stored its gradient
        self._grad_seen = 0  # the gradient's version when _fresh_grad was last cleared

    # -- engine synchronisation ----------------------------------------------------------

    def _read(self):
        var = self._var if self._base is None else self._base._var
        if var is not None:
            _engine().wait_to_read(var)
        return self._data

    def _read_carrying(self):
        """The data once pending writes are done, and the error they left that no wait has
        raised yet (None when there is none): for a copy or a view, which carries the
        error on instead of raising it, as MXNet's asynchronous copies do (an op does the
        same in ``dispatch._carried_failure``)."""
        var = self._var if self._base is None else self._base._var
        failure = None if var is None else _engine().failure_of(var)
        return (self._data if failure is not None else self._read()), failure

    def _write(self):
        """The data, for an in-place write that follows (bumps the version)."""
        if tape.is_recording() and (self._entry is not None or self._grad is not None):
            raise GradientError(
                "in-place write to an array autograd is recording (it was computed under "
                "record() or has a gradient attached); write `y = x + v` instead of "
                "`x += v`, or do the update under autograd.pause()")
        var = self._var if self._base is None else self._base._var
        if var is not None:
            _engine().wait_to_write(var)
        self._versions[0] += 1
        return self._data

    @property
    def _version(self) -> int:
        """In-place writes to this array's memory so far (through it or a view)."""
        return self._versions[0]

    def _share_memory_of(self, source: "NDArray") -> "NDArray":
        """Mark this array as a view of ``source``'s memory: one version counter and one
        engine tag for both."""
        root = source if source._base is None else source._base
        self._base = root
        self._versions = root._versions
        return self

    def engine_var(self):
        """This array's engine tag, for work pushed to ``mixrt.runtime.engine`` (a view's
        is its base's)."""
        if self._base is not None:
            return self._base.engine_var()
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

    @property
    def writable(self) -> bool:
        return True

    def __len__(self) -> int:
        if not self.shape:
            raise UnsizedArrayError("len() of a 0-d NDArray")
        return self.shape[0]

    def __repr__(self) -> str:
        """MXNet's: the values as NumPy prints them, then ``<NDArray 2x3 @cpu(0)>``."""
        return f"\n{self.asnumpy()}\n<NDArray {'x'.join(map(str, self.shape))} @{self.ctx}>"

    __hash__ = object.__hash__  # == builds an array, so identity is the hash

    # -- leaving mixrt -----------------------------------------------------------------

    def asnumpy(self) -> np.ndarray:
        return np.array(to_host(self._read()), copy=True)

    def __array__(self, dtype=None, copy=None):
        data = self._read()
        host = to_host(data) if dtype is None else to_host(data).astype(dtype, copy=False)
        return host.copy() if copy and host is data else host  # np.array(x) must not alias x

    def asscalar(self):
        """The one element as a NumPy scalar of the array's dtype (MXNet's)."""
        if self.size != 1:
            raise NotScalarError(f"asscalar needs an array of one element, this one is "
                                 f"{self.shape}")
        return self.asnumpy().reshape(())[()]

    def item(self):
        """The one element as a Python number."""
        return self.asscalar().item()

    def __float__(self) -> float:
        return float(self.asscalar())

    def __int__(self) -> int:
        return int(self.asscalar())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be an index, not {self.dtype}")
        return int(self.asscalar())

    def __bool__(self) -> bool:
        """MXNet's rule: an empty array is false, one element is its truth, more are
        ambiguous (``ValueError``)."""
        if self.size == 0:
            return False
        if self.size > 1:
            raise AmbiguousTruthError("The truth value of an NDArray with multiple elements "
                                      "is ambiguous.")
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

    def to_dlpack_for_read(self):
        """A DLPack capsule of this array's memory (MXNet's; ``nd.from_dlpack`` takes it)."""
        return self.__dlpack__()

    to_dlpack_for_write = to_dlpack_for_read

    def tostype(self, stype: str) -> "NDArray":
        """A copy in storage ``stype``: ``'default'``, ``'row_sparse'`` or ``'csr'``
        (``mixrt/nd/sparse.py``)."""
        return sparse_module().cast_storage(self, stype)

    def as_nd_ndarray(self) -> "NDArray":
        return self

    def as_np_ndarray(self):
        raise InputError("as_np_ndarray: mixrt has no mx.np arrays; use asnumpy() for a "
                         "NumPy copy")

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
        source, failure = self._read_carrying()
        with target.device.active():  # put() leaves an array already there as it is
            copied = NDArray(target.device.put(source).copy(), target)
        if failure is not None:
            _engine().inherit(failure, [copied.engine_var()])
        return copied

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
        """The same memory, cut off from the recorded graph (no gradient flows through).
        Its in-place writes are counted apart from this array's: a tape that reads the
        detached array reads no gradient through it (BatchNorm's moving statistics)."""
        return NDArray(self._read(), self.ctx)

    # -- autograd ----------------------------------------------------------------------

    @_on_its_device
    def attach_grad(self, grad_req: str = "write", stype=None) -> None:
        """Give this array a gradient buffer that ``backward`` fills (``"write"``) or adds
        to (``"add"``); ``"null"`` detaches it. ``stype`` is the gradient's storage type
        (by default this array's own)."""
        if grad_req not in _GRAD_REQS:
            raise InputError(f"grad_req must be one of {_GRAD_REQS}, got {grad_req!r}")
        self._grad_req = grad_req
        self._grad = None if grad_req == "null" else \
            _zeros_of(self, self.stype if stype is None else stype)
        self._entry = None  # a variable is a leaf, whatever made it
        self._grad_seen = 0

    @property
    def grad(self) -> "NDArray | None":
        return self._grad

    @property
    def _fresh_grad(self) -> bool:
        """MXNet's flag: a backward pass wrote the gradient since it was last cleared."""
        return self._grad is not None and self._grad._version != self._grad_seen

    @_fresh_grad.setter
    def _fresh_grad(self, fresh: bool) -> None:
        current = self._grad._version if self._grad is not None else 0
        self._grad_seen = current - 1 if fresh else current

    @property
    def grad_req(self) -> str:
        return self._grad_req

    def backward(self, out_grad=None, retain_graph: bool = False,
                 train_mode: bool = True) -> None:
        tape.backward([self], None if out_grad is None else [out_grad],
                      retain_graph=retain_graph, train_mode=train_mode)

    # -- operators ---------------------------------------------------------------------

    def _binary(self, op_type: str, other, reverse: bool = False) -> "NDArray":
        left, right = (other, self) if reverse else (self, other)
        return dispatch.invoke("", op_type, [left, right], {})

    def __mod__(self, other): return _mod(self, other)
    def __rmod__(self, other): return _mod(other, self)

    @_on_its_device
    def _compare(self, op_type: str, other, negate: bool = False):
        """MXNet's comparisons: 0/1 in the arrays' dtype (float32), not booleans. The
        cast is not an op: a comparison has no gradient, so nothing is recorded."""
        if other is None or isinstance(other, str):
            return NotImplemented  # `x == None` is False, as for any object
        truth = self._binary(op_type, other)._data
        if negate:
            truth = self.ctx.xp.logical_not(truth)
        dtype = np.result_type(self.dtype, other.dtype) if isinstance(other, NDArray) \
            else self.dtype
        return NDArray(truth.astype(dtype), self.ctx)

    def __eq__(self, other): return self._compare("Equal", other)
    def __ne__(self, other): return self._compare("Equal", other, negate=True)
    def __gt__(self, other): return self._compare("Greater", other)
    def __lt__(self, other): return self._compare("Less", other)
    def __ge__(self, other): return self._compare("GreaterOrEqual", other)
    def __le__(self, other): return self._compare("LessOrEqual", other)

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
        _refuse_recorded_value(result, f"in-place {op_type}")
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
        """The selected part: a view of this array's memory where MXNet gives one (a
        contiguous selection by integers and slices, ``views.py``), else a copy. A
        selection of one element by integers has shape ``(1,)``. An NDArray of floats
        indexes as integers, as in MXNet."""
        key = views.mxnet_key(views.raw_key(key, self.ctx), self.ndim)
        try:
            view = views.basic_view(self._read_carrying()[0], key)  # a view shares its var
            result = Index(key, view)(self)
        except (IndexError, TypeError, ValueError) as exc:
            raise views.index_error(exc, "indexing", key, self.shape) from exc
        return result if view is None else result._share_memory_of(self)

    @_on_its_device
    def __setitem__(self, key, value) -> None:
        key = views.raw_key(key, self.ctx)
        if isinstance(value, NDArray):
            if value.ctx != self.ctx:
                raise DeviceMismatchError(f"setitem: the value is on {value.ctx}, the "
                                          f"array on {self.ctx}; move it with "
                                          f".as_in_context({self.ctx})")
            _refuse_recorded_value(value, "x[key] = value")
            value = value._read()
        target = self._write()
        try:
            views.assign_into(self.ctx.xp, target, key, value)
        except (IndexError, TypeError, ValueError) as exc:
            raise views.index_error(exc, "setitem", key, self.shape) from exc

    def slice_assign(self, rhs, begin, end, step=()) -> "NDArray":
        """MXNet's: ``rhs`` written into the region ``begin:end:step`` of the first axes
        (``None`` entries take the whole axis), in place; returns this array."""
        self[views.region(begin, end, step)] = rhs
        return self

    def slice_assign_scalar(self, value, begin, end, step=()) -> "NDArray":
        """MXNet's: ``value`` written into the region ``begin:end:step``, in place."""
        self[views.region(begin, end, step)] = value
        return self

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # -- MXNet's meanings where the shared methods (mixrt/array_methods.py) differ ---------

    def _reshaped(self, codes: list[int], reverse: bool) -> "NDArray":
        # every code is resolved here against the known shape (a bad one is an InputError
        # naming it), so the op run is ONNX Reshape with sizes only
        target = mxnet_shape(self.shape, codes, reverse)
        return self._op("Reshape", [self, self._int_tensor(target)], {})

    def argmax(self, axis=None, keepdims: bool = False, out=None) -> "NDArray":
        """Indices of the largest values along ``axis`` (``None``, MXNet's default: over the
        flattened array, shape ``(1,)``), as floats of this array's dtype (MXNet's); so
        ``np.argmax(x, axis=1)`` is an NDArray too, as with MXNet."""
        return self._arg_index(ArrayMethods.argmax, axis, keepdims, out)

    def argmin(self, axis=None, keepdims: bool = False, out=None) -> "NDArray":
        """Indices of the smallest values along ``axis``, as ``argmax``."""
        return self._arg_index(ArrayMethods.argmin, axis, keepdims, out)

    def _arg_index(self, method, axis, keepdims: bool, out) -> "NDArray":
        if axis is None:
            flat = method(self.reshape(-1), 0, False)
            index = flat.reshape((1,) * self.ndim if keepdims else (1,))
        else:
            index = method(self, axis, keepdims)
        index = index.astype(self.dtype)
        if out is not None:
            out[:] = index
            return out
        return index

    def flatten(self, inplace: bool = False) -> "NDArray":
        """``(n, rest)``: a copy, or with ``inplace`` a view (MXNet's)."""
        if inplace:
            return self.reshape((self.shape[0] if self.ndim else 1, -1))
        return ArrayMethods.flatten(self)

    def expand_dims(self, axis: int, inplace: bool = False) -> "NDArray":
        """A new length-1 axis at ``axis``: a copy, or with ``inplace`` a view."""
        if inplace:
            axis = axis + self.ndim + 1 if axis < 0 else axis
            return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])
        return ArrayMethods.expand_dims(self, axis)

    def squeeze(self, axis=None, inplace: bool = False) -> "NDArray":
        """Without the length-1 axes (``axis``: those named); all of them squeezed gives
        shape ``(1,)``, as MXNet has no 0-d arrays there. ``inplace``: a view."""
        if not inplace:
            squeezed = ArrayMethods.squeeze(self, axis)
            return squeezed.reshape((1,)) if squeezed.ndim == 0 else squeezed
        named = range(self.ndim) if axis is None else \
            {a % self.ndim for a in np.atleast_1d(axis)}
        kept = tuple(d for a, d in enumerate(self.shape) if a not in named or d != 1)
        return self.reshape(kept or (1,))

    # the test MXNet's basic indexing makes to give a view (a key of slices, one shape)
    _basic_indexing_slice_is_contiguous = staticmethod(views.slice_is_contiguous)

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



def _refuse_recorded_value(value: NDArray, what: str) -> None:
    """MXNet's rule: while recording, an in-place write of a value autograd follows would
    lose its gradient (the target is no node of the tape)."""
    if tape.is_recording() and (value._entry is not None or value._grad is not None):
        raise GradientError(f"{what}: Inplace operations (+=, -=, x[:]=, etc) are not "
                            f"supported when recording with autograd: the value is on the "
                            f"tape and its gradient would be lost; compute a new array "
                            f"instead (e.g. nd.where, nd.concat), or write under "
                            f"autograd.pause()")


class ReshapeError(InputError, ValueError):
    """A reshape whose target does not fit; a ``ValueError`` too, as in MXNet."""


class AmbiguousTruthError(InputError, ValueError):
    """``bool()`` of an array of several elements; a ``ValueError`` too, as in MXNet."""


class NotScalarError(InputError, ValueError):
    """``asscalar()`` of an array that is not one element; a ``ValueError`` too, as in
    MXNet."""


class UnsizedArrayError(InputError, TypeError):
    """``len()`` or iteration of a 0-d array; a ``TypeError`` too, as in NumPy."""


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
        raise ReshapeError(f"reshape: {exc}") from None


# mixrt/nd/sparse.py builds on NDArray, so it cannot be imported here: it hands itself in as
# it loads (mixrt/nd/__init__.py imports it, so it is there before any array exists)
_SPARSE: list = []


def hand_in_sparse(module) -> None:
    _SPARSE[:] = [module]


def sparse_module():
    """mixrt.nd.sparse (the csr and row_sparse arrays and their operators)."""
    return _SPARSE[0]


def _zeros_of(array: NDArray, stype: str) -> NDArray:
    """Zeros of ``array``'s shape, dtype and context in storage ``stype``."""
    if stype == "default":
        return NDArray(array.ctx.xp.zeros_like(array._read()), array.ctx)
    return sparse_module().zeros(stype, array.shape, ctx=array.ctx, dtype=array.dtype)


def _ints(values, ctx: Context):
    with ctx.device.active():
        return ctx.xp.asarray([int(v) for v in values], dtype=np.int64)


def _engine():
    return get_engine()


dispatch.NDArray = NDArray


use_array_type(NDArray)  # autograd hands its values back as NDArrays
