"""Parameter and Constant: what a parameter is declared as, and how it gets its first value.

A :class:`Parameter` is declared with a name, a shape whose unknown dimensions are 0 (or
None), a dtype, storage types, ``grad_req``, learning-rate and weight-decay multipliers and
an initializer. This module keeps that bookkeeping: the shape filled in as it becomes
known (a known dimension cannot change), ``initialize`` deferred until the shape is
complete, a loaded value checked against the declaration (``_load_init``), and the Symbol
variable that stands for the parameter when a block is traced (``var``). Where the value
lives once it exists is :class:`~mixrt.gluon.parameter_storage.ParameterStorage`'s concern
(the per-context copies and gradients), and what it reads through its Trainer is its
part :class:`~mixrt.gluon.parameter_trainer.TrainerLink`'s (``_link``), whose methods the
class names below.
``grad_req`` and the storage types are checked against the tuples ``mixrt.nd`` (and
``mixrt.sym``'s Executor) check theirs against (``GRAD_REQS``, ``STYPES``).
"""

from __future__ import annotations

import numpy as np

from mixrt.context import as_context
from mixrt.base.errors import InputError, ShapeError
from mixrt.gluon.parameter_storage import context_list, ParameterStorage
from mixrt.gluon.parameter_trainer import TrainerLink
from mixrt.initializer import Constant as ConstantInit, create, Uniform
from mixrt.nd.ndarray import GRAD_REQS, NDArray, _STORAGE_TYPE_STR_TO_ID
from mixrt.nd.sparse import STYPES
from mixrt.sym.symbol import variable_named


class ParameterStypeError(InputError, AssertionError):
    """An unknown ``stype``/``grad_stype``; an ``AssertionError`` too, as MXNet's check."""


class Parameter(ParameterStorage):
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
        self._link = TrainerLink(self)  # the Trainer that row_sparse_data fetches rows through
        self._stepped_version = -1  # the gradient's version at the Trainer's last step
        self.differentiable = differentiable  # False: an auxiliary state (BN statistics)
        if data is not None:
            array = np.array(data)  # our own, writable copy (the optimizer updates in place)
            self._shape, self._dtype = tuple(array.shape), array.dtype
            self._place(array, [as_context("cpu")])
        else:
            self._shape = None if shape is None else _shape_tuple(shape)
            self._dtype = np.dtype(dtype or np.float32)

    # -- through the Trainer (parameter_trainer.TrainerLink) ---------------------------------

    @property
    def _trainer(self):
        return self._link.trainer

    @_trainer.setter
    def _trainer(self, trainer) -> None:  # MXNet's attribute, writable as there
        self._link.trainer = trainer

    def row_sparse_data(self, row_id):
        return self._link.row_sparse_data(row_id)

    def list_row_sparse_data(self, row_id) -> list:
        return self._link.list_row_sparse_data(row_id)

    def _set_trainer(self, trainer) -> None:
        self._link.set_trainer(trainer)

    def _stale_store(self) -> None:
        self._link.stale_store()

    def _reduce(self) -> NDArray:
        return self._link.reduce()

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
        self._deferred = (chosen, context_list(ctx))
        if _complete(self._shape):
            self._finish_deferred_init()
        elif not self.allow_deferred_init:
            raise ShapeError(f"parameter {self.name!r} has unknown dimensions {self._shape} "
                             f"and allow_deferred_init=False")

    def _finish_deferred_init(self) -> None:
        initializer, contexts = self._deferred
        self._deferred = None
        self._place(initializer(self.name, self._shape, self._dtype), contexts)

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
            contexts = context_list(ctx) if ctx is not None else \
                self._deferred[1] if self._deferred is not None else [as_context(None)]
            self._deferred = None
            self._place(host, contexts)
        else:
            self.set_data(host)

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
