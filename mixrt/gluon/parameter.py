"""Parameters: a named array on one or more devices, its gradient and whether it trains
(``grad_req``).

    weight = Parameter("dense0_weight", shape=(10, 0), init="xavier")   # 0: not known yet
    weight.initialize(ctx=[mixrt.gpu(0), mixrt.gpu(1)])  # one copy per context; deferred
    weight.data(mixrt.gpu(1))                # NDArray; under autograd.record() a leaf
    weight.list_data(), weight.list_grad()   # the copies, in the order of the contexts

Each copy is an NDArray with its gradient attached, so imperative code and the tape use it
directly; the Trainer and the Module update ``raw()`` (the NumPy/CuPy array behind the first
copy) or every copy of ``list_data()`` in place, so the NDArrays see every update. A
parameter made from an array (``Parameter(name, array)``, what ``Module`` does for an
imported model's weights) is initialized at once.

Storage types, as MXNet's: ``stype='row_sparse'`` keeps the value as a RowSparseNDArray,
read through ``row_sparse_data(row_id)`` (the rows a batch needs, fetched through the
Parameter's Trainer) instead of ``data()``; ``grad_stype='row_sparse'`` makes the gradient
one (an embedding's gradient touches the rows the batch used).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mixrt import nd
from mixrt.context import as_context, current_context
from mixrt.base.errors import DeviceMismatchError, InputError, ShapeError
from mixrt.initializer import Constant as ConstantInit, create, Uniform
from mixrt.nd.ndarray import NDArray, _STORAGE_TYPE_STR_TO_ID
from mixrt.nd import sparse as nd_sparse
from mixrt.nd.sparse_arrays import RowSparseNDArray
from mixrt.sym.symbol import variable_named

GRAD_REQS = ("write", "add", "null")
STYPES = ("default", "row_sparse", "csr")


class ParameterStorageError(InputError, RuntimeError):
    """A parameter read in a way its storage type (or its missing Trainer) does not allow;
    a ``RuntimeError`` too, as MXNet raises."""


class ParameterStypeError(InputError, AssertionError):
    """An unknown ``stype``/``grad_stype``; an ``AssertionError`` too, as MXNet's check."""


class Parameter:
    """``grad_req``: ``"write"`` (each backward overwrites the gradient), ``"add"``
    (gradients accumulate until ``zero_grad``) or ``"null"`` (frozen). ``stype`` and
    ``grad_stype``: the storage types of the value and of the gradient."""

    def __init__(self, name: str, data=None, *, shape=None, dtype=None, init=None,
                 grad_req: str = "write", lr_mult: float = 1.0, wd_mult: float = 1.0,
                 allow_deferred_init: bool = True, differentiable: bool = True,
                 stype: str = "default", grad_stype: str = "default"):
        _check_grad_req(name, grad_req)
        self.name = name
        self._stype = _checked_stype(name, "stype", stype)
        self._grad_stype = _checked_stype(name, "grad_stype", grad_stype)
        self._grad_req = grad_req if differentiable else "null"
        self.lr_mult, self.wd_mult = float(lr_mult), float(wd_mult)
        self.init = init
        self.allow_deferred_init = allow_deferred_init
        self._data = None  # one NDArray per context, once initialized
        self._deferred = None  # (initializer, [ctx, ...]) waiting for the shape
        self._trainer = None  # the Trainer that row_sparse_data fetches rows through
        self._stepped_version = -1  # the gradient's version at the Trainer's last step
        self.differentiable = differentiable  # False: an auxiliary state (BN statistics)
        if data is not None:
            array = np.array(data)  # our own, writable copy (the optimizer updates in place)
            self._shape, self._dtype = tuple(array.shape), array.dtype
            self._place(array, [as_context("cpu")])
        else:
            self._shape = None if shape is None else _shape_tuple(shape)
            self._dtype = np.dtype(dtype or np.float32)

    @property
    def _nd(self):
        """The first copy (the one single-device code reads), or None."""
        return None if self._data is None else self._data[0]

    # -- shape, type and storage ------------------------------------------------------------

    @property
    def shape(self):
        return self._nd.shape if self._nd is not None else self._shape

    @shape.setter
    def shape(self, new_shape) -> None:
        """Fill in unknown (0 or None) dimensions; a known one cannot change."""
        new_shape = _shape_tuple(new_shape)
        old = self.shape
        if old is not None and (len(old) != len(new_shape) or any(
                a not in (0, None) and a != b for a, b in zip(old, new_shape))):
            raise ShapeError(f"parameter {self.name!r} has shape {old}; it cannot become "
                             f"{new_shape}")
        self._shape = new_shape
        if self._deferred is not None and _complete(new_shape):
            self._finish_deferred_init()

    @property
    def dtype(self):
        return self._nd.dtype if self._nd is not None else self._dtype

    @property
    def stype(self) -> str:
        return self._stype

    @property
    def grad_stype(self) -> str:
        return self._grad_stype

    @property
    def grad_req(self) -> str:
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req: str) -> None:
        _check_grad_req(self.name, req)
        self._grad_req = req
        if self._data is not None:
            self._attach_grad()

    # -- initialization ---------------------------------------------------------------------

    def initialize(self, init=None, ctx=None, default_init=None,
                   force_reinit: bool = False) -> None:
        """Give the parameter its first value from ``init``, else its own ``init``, else
        ``default_init`` (uniform), on each context of ``ctx`` (one or a list; the
        current context by default); deferred while the shape has unknown dimensions."""
        if self._data is not None and not force_reinit:
            return
        chosen = create(init if init is not None else self.init if self.init is not None
                        else default_init or Uniform())
        self._deferred = (chosen, _contexts(ctx))
        if _complete(self._shape):
            self._finish_deferred_init()
        elif not self.allow_deferred_init:
            raise ShapeError(f"parameter {self.name!r} has unknown dimensions {self._shape} "
                             f"and allow_deferred_init=False")

    def _finish_deferred_init(self) -> None:
        initializer, contexts = self._deferred
        self._deferred = None
        self._place(initializer(self.name, self._shape, self._dtype), contexts)

    def _place(self, host: np.ndarray, contexts: list) -> None:
        """One copy of ``host`` per context, each with a fresh gradient."""
        self._data = [self._copy_on(host, ctx) for ctx in contexts]
        self._attach_grad()

    def _copy_on(self, host: np.ndarray, ctx) -> NDArray:
        raw = np.array(host, copy=True) if ctx.device.kind == "cpu" else ctx.device.put(host)
        if self._stype == "row_sparse":  # every row stored, as MXNet's initializers leave it
            return RowSparseNDArray(raw, ctx, np.arange(raw.shape[0], dtype=np.int64))
        array = NDArray(raw, ctx)
        return array if self._stype == "default" else array.tostype(self._stype)

    def _attach_grad(self) -> None:
        for copy in self._data:
            copy.attach_grad(self._grad_req, stype=self._grad_stype)
        if self._nd._grad is not None:  # a new gradient is stale until a backward writes it
            self._stepped_version = self._nd._grad._version

    def _checked(self) -> list:
        if self._data is None:
            if self._deferred is not None:
                raise InputError(f"parameter {self.name!r} has shape {self._shape}, not fully "
                                 f"known yet: the first forward pass sets it (its block's "
                                 f"infer_shape) and initializes the parameter")
            raise InputError(f"parameter {self.name!r} has not been initialized; call "
                             f"block.initialize() or block.collect_params().initialize()")
        return self._data

    def _check_and_get(self, arrays: list, ctx):
        """The array of ``arrays`` (one per context) on ``ctx``; ``ctx=list``: all of them;
        ``ctx=None``: the only one, or the current context's."""
        if ctx is list:
            return list(arrays)
        if ctx is None:
            if len(arrays) == 1:
                return arrays[0]
            ctx = current_context()
        ctx = as_context(ctx)
        for array in arrays:
            if array.ctx == ctx:
                return array
        raise DeviceMismatchError(f"parameter {self.name!r} was not initialized on {ctx}; "
                                  f"it lives on {[a.ctx for a in arrays]} (reset_ctx() moves "
                                  f"it)")

    def is_initialized(self) -> bool:
        return self._data is not None

    # -- values -----------------------------------------------------------------------------

    def _dense_only(self, what: str) -> None:
        if self._stype != "default":
            raise ParameterStorageError(
                f"Cannot return a copy of Parameter {self.name!r} via {what}() because its "
                f"storage type is {self._stype}. Please use row_sparse_data() instead.")

    def data(self, ctx=None):
        """The value on ``ctx`` as an NDArray (a dense parameter's; a row_sparse one is
        read with ``row_sparse_data``)."""
        self._dense_only("data")
        return self._check_and_get(self._checked(), ctx)

    def list_data(self) -> list:
        """The copies, one per context, in the order of ``list_ctx()``."""
        self._dense_only("list_data")
        return list(self._checked())

    def list_ctx(self) -> list:
        if self._data is None and self._deferred is not None:
            return list(self._deferred[1])
        return [array.ctx for array in self._checked()]

    def raw(self):
        """The NumPy or CuPy array behind the first copy (updated in place by optimizers),
        once pending engine writes to it (a KVStore pull) are done."""
        return self._checked()[0]._read()

    def set_data(self, value) -> None:
        """Write ``value`` into every copy (initializing the parameter if it was not)."""
        host = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        if self._data is None:
            self.shape = host.shape
            contexts = self._deferred[1] if self._deferred is not None else [as_context(None)]
            self._deferred = None
            self._place(np.array(host, dtype=self._dtype), contexts)
            return
        if tuple(host.shape) != self.shape:
            raise InputError(f"parameter {self.name!r} has shape {self.shape}; set_data got "
                             f"{tuple(host.shape)}")
        for copy in self._data:
            target = copy._write()
            with copy.ctx.device.active():
                target[...] = copy.ctx.device.put(host) if copy.ctx.device.kind != "cpu" \
                    else host
        self._stale_store()

    def _stale_store(self) -> None:
        """New values make the copy in the Trainer's store stale where the store updates
        the weights: MXNet's Trainer then drops its store and starts a fresh one."""
        trainer = self._trainer
        if trainer is not None and trainer._kv_initialized and trainer._update_on_kvstore \
                and self not in trainer._params_to_init:
            trainer._reset_kvstore()

    def reset_ctx(self, ctx) -> None:
        """Move the parameter (with fresh gradients) to ``ctx`` (one or a list)."""
        contexts = _contexts(ctx)
        if self._data is None:
            if self._deferred is not None:
                self._deferred = (self._deferred[0], contexts)
            return
        self._place(self._data[0].asnumpy(), contexts)

    def cast(self, dtype) -> None:
        self._dtype = np.dtype(dtype)
        if self._data is not None:
            self._place(self._data[0].asnumpy().astype(self._dtype), self.list_ctx())

    # -- row_sparse values (MXNet's; fetched through the Trainer's store) ---------------------

    def row_sparse_data(self, row_id):
        """The rows ``row_id`` names, as a RowSparseNDArray on ``row_id``'s context (this
        parameter's copy there, refreshed by its Trainer)."""
        self._sparse_only("row_sparse_data")
        return self._get_row_sparse(self._check_and_get(self._checked(), row_id.ctx), row_id)

    def list_row_sparse_data(self, row_id) -> list:
        """``row_sparse_data`` on every context: the copies, with the rows ``row_id``
        names."""
        self._sparse_only("list_row_sparse_data")
        return self._get_row_sparse(list(self._checked()), row_id)

    def _sparse_only(self, what: str) -> None:
        if self._stype != "row_sparse":
            raise ParameterStorageError(
                f"Cannot return a copy of Parameter {self.name!r} via {what}() because its "
                f"storage type is {self._stype}. Please use data() instead.")

    def _get_row_sparse(self, out, row_id, full_idx: bool = False):
        if self._trainer is None:
            raise ParameterStorageError(f"Cannot get row_sparse data for Parameter "
                                        f"{self.name!r} when no Trainer is created with it.")
        pull = getattr(self._trainer, "_row_sparse_pull", None)
        if pull is None:
            raise ParameterStorageError(f"parameter {self.name!r}: its Trainer "
                                        f"({type(self._trainer).__name__}) cannot fetch "
                                        f"row_sparse rows (it has no _row_sparse_pull)")
        pull(self, out, row_id, full_idx)
        return out

    def _set_trainer(self, trainer) -> None:
        """Record the Trainer that updates this parameter; a sparse parameter takes one."""
        if self._stype != "default" and self._trainer is not None and trainer is not None \
                and self._trainer is not trainer:
            raise ParameterStorageError(
                f"Failed to set the trainer for Parameter {self.name!r} because it was "
                f"already set. More than one trainers for a {self._stype} Parameter is not "
                f"supported.")
        self._trainer = trainer

    def _reduce(self) -> NDArray:
        """The value on the CPU: the mean of the copies (a row_sparse parameter's every
        row, fetched through its Trainer), what checkpoints save."""
        cpu = as_context("cpu")
        if self._stype == "default":
            copies = self._checked()
            total = copies[0].copyto(cpu)
            for copy in copies[1:]:
                total += copy.copyto(cpu)
            return total / len(copies) if len(copies) > 1 else total
        full = nd_sparse.zeros("row_sparse", self.shape, ctx=cpu, dtype=self.dtype)
        self._get_row_sparse(full, nd.arange(0, self.shape[0], dtype="int64", ctx=cpu),
                             full_idx=True)
        return full

    def _load_init(self, value, ctx=None, cast_dtype: bool = False,
                   dtype_source: str = "current") -> None:
        """A loaded value: the parameter's shape is checked (its unknown dimensions
        filled) and so is its dtype, unless ``cast_dtype`` says which one wins
        (``dtype_source``: the parameter's ``'current'`` one or the ``'saved'`` one); then
        it initializes the parameter on ``ctx`` or is written into it."""
        host = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        self.shape = host.shape
        if not cast_dtype and host.dtype != np.dtype(self.dtype):
            raise InputError(f"Failed loading Parameter {self.name!r} from saved params: "
                             f"dtype incompatible expected {np.dtype(self.dtype)} vs saved "
                             f"{host.dtype}. Set cast_dtype=True to cast the dtype of saved "
                             f"params.")
        if cast_dtype and dtype_source not in ("current", "saved"):
            raise InputError(f"load: dtype_source must be 'current' or 'saved', got "
                             f"{dtype_source!r}")
        if cast_dtype and dtype_source == "saved" and host.dtype != np.dtype(self.dtype):
            self.cast(host.dtype)
        host = host.astype(self.dtype)
        if self._data is None:
            contexts = _contexts(ctx) if ctx is not None else \
                self._deferred[1] if self._deferred is not None else [as_context(None)]
            self._deferred = None
            self._place(host, contexts)
        else:
            self.set_data(host)

    # -- gradients --------------------------------------------------------------------------

    def grad(self, ctx=None):
        """The gradient NDArray on ``ctx`` (None while frozen)."""
        copy = self._check_and_get(self._checked(), ctx)
        return copy._grad

    @property
    def _grad(self):
        """MXNet's internal list of gradients, one per context, or None before
        initialization and while frozen: code written against MXNet reads it."""
        if self._data is None or self._grad_req == "null":
            return None
        return self.list_grad()

    def list_grad(self) -> list:
        """The gradients, one per context (None while frozen)."""
        return [copy._grad for copy in self._checked()]

    def raw_grad(self):
        grad = self._checked()[0]._grad
        return None if grad is None else grad._read()

    def set_grad(self, value) -> None:
        """Write (``"add"``: add) ``value`` into the first copy's gradient (what Module's
        backward does)."""
        if self._grad_req == "null":
            return
        first = self._checked()[0]
        raw = first._grad._write()  # waits for engine work still reading it; a new version
        with first.ctx.device.active():
            if self._grad_req == "add":
                raw += value
            else:
                raw[...] = value

    def zero_grad(self) -> None:
        for grad in (self.list_grad() if self._data is not None else []):
            if grad is not None:
                with grad.ctx.device.active():
                    grad._write()[...] = 0

    def grad_is_fresh(self) -> bool:
        """Whether a backward wrote the gradient since the Trainer's last step."""
        grad = self.grad(self._checked()[0].ctx)
        return grad is not None and grad._version != self._stepped_version

    def mark_stepped(self) -> None:
        grad = self._checked()[0]._grad
        self._stepped_version = -1 if grad is None else grad._version

    # -- symbolic -------------------------------------------------------------------------

    def var(self):
        """The Symbol variable standing for this parameter when a block is traced, carrying
        its initializer (``__init__``, what a Module's ``init_params`` uses); a sparse one
        says its storage type in ``__storage_type__``, as MXNet's. The same Variable is
        returned until the shape, dtype or initializer changes."""
        shape = self.shape if self.shape is not None and _complete(self.shape) else None
        key = (shape, self.dtype, id(self.init), self.lr_mult, self.wd_mult)
        cached = getattr(self, "_var", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        attr = {} if self._stype == "default" else \
            {"__storage_type__": str(_STORAGE_TYPE_STR_TO_ID[self._stype])}
        if self.init is not None:  # MXNet's spelling: a name, or the initializer's dumps()
            attr["__init__"] = self.init if isinstance(self.init, str) else \
                create(self.init).dumps()
        symbol = variable_named(self.name, shape=shape, dtype=self.dtype, init=self.init,
                                aux=not self.differentiable, lr_mult=self.lr_mult,
                                wd_mult=self.wd_mult, attr=attr)
        self._var = (key, symbol)
        return symbol

    def _mxnet_repr(self) -> str:
        return f"Parameter {self.name} (shape={self.shape}, dtype={self.dtype})"

    def __repr__(self) -> str:
        stype = "" if self._stype == "default" else f", stype={self._stype!r}"
        return f"Parameter({self.name!r}, shape={self.shape}, dtype={self.dtype}, " \
               f"grad_req={self.grad_req!r}{stype})"


class Constant(Parameter):
    """A parameter that holds ``value`` and is never trained (``grad_req="null"``): its
    initializer is the value, whatever initializer the block is given (MXNet's
    ``gluon.Constant``; a value not an array becomes a float32 one)."""

    def __init__(self, name: str, value):
        value = value.asnumpy() if isinstance(value, NDArray) else \
            np.asarray(value, dtype=np.float32)
        self.value = value
        super().__init__(name, shape=value.shape, dtype=value.dtype, grad_req="null",
                         init=ConstantInit(value))

    def _mxnet_repr(self) -> str:
        return f"Constant {self.name} (shape={self.shape}, dtype={self.dtype})"


class ParameterDict(OrderedDict):
    """Parameters by name, in a stable order (the order optimizers and checkpoints see).

    ``get(name, **options)`` returns the parameter ``prefix + name``, creating it with
    ``options`` (shape, init, dtype, grad_req, ...) the first time: how blocks declare
    their parameters."""

    def __init__(self, prefix="", shared: "ParameterDict | None" = None):
        # MXNet's signature (prefix, shared); mixrt also takes the parameters themselves
        # (a dict or (name, parameter) pairs) in place of the prefix
        contents = () if isinstance(prefix, str) else prefix
        super().__init__(contents)
        self.prefix = prefix if isinstance(prefix, str) else ""
        self._shared = shared

    def __repr__(self) -> str:
        """MXNet's: the prefix, then one line per parameter."""
        lines = "\n".join(f"  {param._mxnet_repr()}" for param in self.values())
        return f"{self.prefix} (\n{lines}\n)"

    def get(self, name: str, default=None, **options) -> Parameter:
        full = self.prefix + name
        if full in self:
            return self[full]
        if self._shared is not None and full in self._shared:
            self[full] = self._shared[full]
            return self[full]
        if default is not None and not options:
            return default
        self[full] = Parameter(full, **options)
        return self[full]

    def get_constant(self, name: str, value=None) -> Constant:
        """The Constant ``prefix + name``, made from ``value`` the first time (a later
        ``value`` must have the same shape)."""
        full = self.prefix + name
        if full not in self and self._shared is not None and full in self._shared:
            self[full] = self._shared[full]
        if full not in self:
            if value is None:
                raise KeyError(f"get_constant: no constant named {full!r}; give its value "
                               f"the first time")
            self[full] = Constant(full, value)
            return self[full]
        found = self[full]
        if not isinstance(found, Constant):
            raise InputError(f"get_constant: {full!r} is a Parameter, not a Constant")
        if value is not None and tuple(np.shape(value)) != tuple(found.shape):
            raise ShapeError(f"get_constant: constant {full!r} has shape {found.shape}, "
                             f"the value given has shape {tuple(np.shape(value))}")
        return found

    def trainable(self) -> list[Parameter]:
        return [p for p in self.values() if p.grad_req != "null"]

    def setattr(self, attribute: str, value) -> None:
        """``params.setattr("grad_req", "null")`` freezes every parameter (MXNet's idiom)."""
        for param in self.values():
            setattr(param, attribute, value)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: param.raw() for name, param in self.items()}

    def initialize(self, init=None, ctx=None, verbose: bool = False,
                   force_reinit: bool = False) -> None:
        del verbose
        for param in self.values():
            param.initialize(None, ctx, default_init=init, force_reinit=force_reinit)

    def zero_grad(self) -> None:
        for param in self.values():
            param.zero_grad()

    def reset_ctx(self, ctx) -> None:
        for param in self.values():
            param.reset_ctx(ctx)

    def save(self, filename, strip_prefix: str = "") -> None:
        """Every parameter's value (the mean of its copies) to ``filename`` in MXNet's
        ``.params`` format, named without ``strip_prefix``."""
        values = {}
        for param in self.values():
            if not param.name.startswith(strip_prefix):
                raise InputError(f"save: prefix {strip_prefix!r} is to be striped before "
                                 f"saving, but Parameter {param.name!r} does not start "
                                 f"with it")
            values[param.name[len(strip_prefix):]] = param._reduce()
        nd.save(filename, values)

    def list_ctx(self) -> list:
        """Every context some parameter lives on."""
        found = []
        for param in self.values():
            found += [ctx for ctx in param.list_ctx() if ctx not in found]
        return found

    def load(self, filename, ctx=None, allow_missing: bool = False,
             ignore_extra: bool = False, restore_prefix: str = "", cast_dtype: bool = False,
             dtype_source: str = "current") -> None:
        """Values saved by ``save`` (names given ``restore_prefix``) into the parameters,
        initializing on ``ctx`` those that are not yet; a parameter the file lacks, or a
        file entry no parameter takes, is an error unless allowed. A dtype that differs
        from the parameter's is an error unless ``cast_dtype`` (``dtype_source``: whose
        dtype is kept, ``'current'`` or ``'saved'``)."""
        loaded = nd.load(filename)
        if not isinstance(loaded, dict):
            raise InputError(f"load {str(filename)!r}: the file holds a list of arrays, not "
                             f"named parameters")
        values = {restore_prefix + _without_kind(name): value for name, value in loaded.items()}
        if not allow_missing:
            missing = [name for name in self if name not in values]
            if missing:
                raise InputError(f"load {str(filename)!r}: parameters {missing} are missing "
                                 f"in the file (allow_missing=True skips them)")
        if not ignore_extra:
            extra = [name for name in values if name not in self]
            if extra:
                raise InputError(f"load {str(filename)!r}: the file has {extra}, which no "
                                 f"parameter here is named (ignore_extra=True skips them)")
        for name, value in values.items():
            if name in self:
                self[name]._load_init(value, ctx, cast_dtype, dtype_source)

    def update(self, other) -> None:
        for name, param in dict(other).items():
            if name in self and self[name] is not param:
                raise InputError(f"two different parameters are both named {name!r}")
            self[name] = param


def _without_kind(name: str) -> str:
    """A saved name without MXNet's ``arg:``/``aux:`` mark (Module checkpoints have it)."""
    return name.split(":", 1)[1] if name.startswith(("arg:", "aux:")) else name


def _contexts(ctx) -> list:
    """``ctx`` (a context, its name, a list of them, or None: the current one) as a list."""
    if ctx is None:
        return [current_context()]
    if isinstance(ctx, (list, tuple)):
        if not ctx:
            raise InputError("a parameter needs at least one context, got an empty list")
        return [as_context(c) for c in ctx]
    return [as_context(ctx)]


def _checked_stype(name: str, what: str, stype) -> str:
    if stype not in STYPES:
        raise ParameterStypeError(f"parameter {name!r}: {what} must be one of {STYPES}, "
                                  f"got {stype!r}")
    return stype


def _check_grad_req(name: str, req: str) -> None:
    if req not in GRAD_REQS:
        raise InputError(f"parameter {name!r}: grad_req must be one of {GRAD_REQS}, got "
                         f"{req!r}")


def _shape_tuple(shape) -> tuple:
    shape = (shape,) if isinstance(shape, int) else shape
    return tuple(0 if d is None else int(d) for d in shape)


def _complete(shape) -> bool:
    return shape is not None and all(d not in (0, None) for d in shape)
