"""A Parameter's storage: one NDArray copy per context, each with its gradient attached.

:class:`ParameterStorage` is the half of :class:`~mixrt.gluon.Parameter` that holds and
reads the values once there are values: placing a host array on each context (in the
parameter's storage type, with a fresh gradient), finding the copy on a context, reading
the copies and their gradients, writing new values or gradients into them, moving them to
other contexts. It stands apart from the declaration (``parameter_declaration.py``: name,
shape, dtype, when the first value comes), which decides *what* is stored; this module is
*how* the copies are kept. It is a mixin: the attributes it reads (``name``, ``_data``,
``_deferred``, ``_stype``, ``_grad_stype``, ``_grad_req``, ``_dtype``, ``shape``,
``_stepped_version``) are set by ``Parameter.__init__``, and ``set_data`` tells the
Trainer's store of new values through ``_stale_store`` (``parameter_trainer.py``).
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import DeviceMismatchError, InputError
from mixrt.context import as_context, current_context
from mixrt.nd.ndarray import NDArray
from mixrt.nd.sparse_arrays import RowSparseNDArray


class ParameterStorageError(InputError, RuntimeError):
    """A parameter read in a way its storage type (or its missing Trainer) does not allow;
    a ``RuntimeError`` too, as MXNet raises."""


class ParameterStorage:
    """The copies of a parameter's value, one per context, and their gradients."""

    @property
    def _nd(self):
        """The first copy (the one single-device code reads), or None."""
        return None if self._data is None else self._data[0]

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

    def reset_ctx(self, ctx) -> None:
        """Move the parameter (with fresh gradients) to ``ctx`` (one or a list)."""
        contexts = context_list(ctx)
        if self._data is None:
            if self._deferred is not None:
                self._deferred = (self._deferred[0], contexts)
            return
        self._place(self._data[0].asnumpy(), contexts)

    def cast(self, dtype) -> None:
        self._dtype = np.dtype(dtype)
        if self._data is not None:
            self._place(self._data[0].asnumpy().astype(self._dtype), self.list_ctx())

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


def context_list(ctx) -> list:
    """``ctx`` (a context, its name, a list of them, or None: the current one) as a list."""
    if ctx is None:
        return [current_context()]
    if isinstance(ctx, (list, tuple)):
        if not ctx:
            raise InputError("a parameter needs at least one context, got an empty list")
        return [as_context(c) for c in ctx]
    return [as_context(ctx)]
