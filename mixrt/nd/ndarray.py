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

This module holds the class itself (its state, moving and copying, autograd, operators,
indexing) and the functions it shares with the rest of ``mixrt.nd``. The class is composed
of parts that live beside it, each one concern: the engine synchronisation of its reads and
writes (``ndarray_sync.py``), its values leaving mixrt (``ndarray_host.py``) and MXNet's
meanings of the methods it shares with Symbol (``ndarray_methods.py``).
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
from mixrt.nd.ndarray_host import HostValues
from mixrt.nd.ndarray_methods import NDArrayMethods
from mixrt.nd.ndarray_sync import _engine, EngineSync

GRAD_REQS = ("write", "add", "null")  # sym's Executor and gluon's Parameter check these too
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


class NDArray(EngineSync, HostValues, NDArrayMethods):
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

    # -- moving and copying ------------------------------------------------------------

    def tostype(self, stype: str) -> "NDArray":
        """A copy in storage ``stype``: ``'default'``, ``'row_sparse'`` or ``'csr'``
        (``mixrt/nd/sparse.py``)."""
        return sparse_module().cast_storage(self, stype)

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
        if grad_req not in GRAD_REQS:
            raise InputError(f"grad_req must be one of {GRAD_REQS}, got {grad_req!r}")
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


class UnsizedArrayError(InputError, TypeError):
    """``len()`` or iteration of a 0-d array; a ``TypeError`` too, as in NumPy."""


def _mod(a, b):
    """``a % b`` as in MXNet: the sign of ``b`` (Python's rule) for floats as for ints."""
    arrays = [v for v in (a, b) if isinstance(v, NDArray)]
    if all(v.dtype.kind == "f" for v in arrays):
        return FloorMod()(a, b)
    return dispatch.invoke("", "Mod", [a, b], {"fmod": 0})  # integers: Python's rule too


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


dispatch.NDArray = NDArray


use_array_type(NDArray)  # autograd hands its values back as NDArrays
