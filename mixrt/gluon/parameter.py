"""Parameters: a named array on a device, its gradient and whether it trains (``grad_req``).

    weight = Parameter("dense0_weight", shape=(10, 0), init="xavier")   # 0: not known yet
    weight.initialize(ctx=mixrt.cpu())      # deferred until the first forward fixes the 0
    weight.data()                           # NDArray; under autograd.record() a leaf

The value is an NDArray with its gradient attached, so imperative code and the tape use it
directly; the Trainer and the Module update ``raw()`` (the NumPy/CuPy array behind it) in
place, so the NDArray sees every update. A parameter made from an array (``Parameter(name,
array)``, what ``Module`` does for an imported model's weights) is initialized at once.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mixrt.context import as_context
from mixrt.base.errors import DeviceMismatchError, InputError, ShapeError
from mixrt.initializer import create, Uniform
from mixrt.nd.ndarray import NDArray
from mixrt.sym.symbol import variable_named

GRAD_REQS = ("write", "add", "null")


class Parameter:
    """``grad_req``: ``"write"`` (each backward overwrites the gradient), ``"add"``
    (gradients accumulate until ``zero_grad``) or ``"null"`` (frozen)."""

    def __init__(self, name: str, data=None, *, shape=None, dtype=None, init=None,
                 grad_req: str = "write", lr_mult: float = 1.0, wd_mult: float = 1.0,
                 allow_deferred_init: bool = True, differentiable: bool = True):
        _check_grad_req(name, grad_req)
        self.name = name
        self._grad_req = grad_req if differentiable else "null"
        self.lr_mult, self.wd_mult = float(lr_mult), float(wd_mult)
        self.init = init
        self.allow_deferred_init = allow_deferred_init
        self._nd = None
        self._deferred = None  # (initializer, ctx) waiting for the shape
        self._stepped_version = -1  # the gradient's version at the Trainer's last step
        self.differentiable = differentiable  # False: an auxiliary state (BN statistics)
        if data is not None:
            array = np.array(data)  # our own, writable copy (the optimizer updates in place)
            self._shape, self._dtype = tuple(array.shape), array.dtype
            self._place(array, as_context("cpu"))
        else:
            self._shape = None if shape is None else _shape_tuple(shape)
            self._dtype = np.dtype(dtype or np.float32)

    # -- shape and type ---------------------------------------------------------------------

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
    def grad_req(self) -> str:
        return self._grad_req

    @grad_req.setter
    def grad_req(self, req: str) -> None:
        _check_grad_req(self.name, req)
        self._grad_req = req
        if self._nd is not None:
            self._attach_grad()

    # -- initialization ---------------------------------------------------------------------

    def initialize(self, init=None, ctx=None, default_init=None,
                   force_reinit: bool = False) -> None:
        """Give the parameter its first value from ``init``, else its own ``init``, else
        ``default_init`` (uniform); deferred while the shape has unknown dimensions."""
        if self._nd is not None and not force_reinit:
            return
        chosen = create(init if init is not None else self.init if self.init is not None
                        else default_init or Uniform())
        ctx = as_context(ctx[0] if isinstance(ctx, (list, tuple)) else ctx)
        self._deferred = (chosen, ctx)
        if _complete(self._shape):
            self._finish_deferred_init()
        elif not self.allow_deferred_init:
            raise ShapeError(f"parameter {self.name!r} has unknown dimensions {self._shape} "
                             f"and allow_deferred_init=False")

    def _finish_deferred_init(self) -> None:
        initializer, ctx = self._deferred
        self._deferred = None
        self._place(initializer(self.name, self._shape, self._dtype), ctx)

    def _place(self, host: np.ndarray, ctx) -> None:
        raw = host if ctx.device.kind == "cpu" else ctx.device.put(host)
        self._nd = NDArray(raw, ctx)
        self._attach_grad()

    def _attach_grad(self) -> None:
        self._nd.attach_grad(self._grad_req)
        if self._nd._grad is not None:  # a new gradient is stale until a backward writes it
            self._stepped_version = self._nd._grad._version

    def _checked(self):
        if self._nd is None:
            if self._deferred is not None:
                raise InputError(f"parameter {self.name!r} has shape {self._shape}, not fully "
                                 f"known yet: the first forward pass sets it (its block's "
                                 f"infer_shape) and initializes the parameter")
            raise InputError(f"parameter {self.name!r} has not been initialized; call "
                             f"block.initialize() or block.collect_params().initialize()")
        return self._nd

    def is_initialized(self) -> bool:
        return self._nd is not None

    # -- values -----------------------------------------------------------------------------

    def data(self, ctx=None):
        """The value as an NDArray (on ``ctx``, which must be where it lives)."""
        value = self._checked()
        if ctx is not None and as_context(ctx) != value.ctx:
            raise DeviceMismatchError(f"parameter {self.name!r} lives on {value.ctx}, not "
                                      f"{as_context(ctx)}; move it with reset_ctx()")
        return value

    def list_data(self) -> list:
        return [self.data()]

    def list_ctx(self) -> list:
        return [self._checked().ctx]

    def raw(self):
        """The NumPy or CuPy array behind ``data()`` (updated in place by optimizers), once
        pending engine writes to it (a KVStore pull) are done."""
        return self._checked()._read()

    def set_data(self, value) -> None:
        host = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        if self._nd is None:
            self.shape = host.shape
            self._place(np.array(host, dtype=self._dtype), as_context(None))
            return
        if tuple(host.shape) != self.shape:
            raise InputError(f"parameter {self.name!r} has shape {self.shape}; set_data got "
                             f"{tuple(host.shape)}")
        target = self._nd._write()
        with self._nd.ctx.device.active():
            target[...] = self._nd.ctx.device.put(host) if self._nd.ctx.device.kind != "cpu" \
                else host

    def reset_ctx(self, ctx) -> None:
        """Move the parameter (and a fresh gradient) to ``ctx``."""
        if self._nd is None:
            if self._deferred is not None:
                self._deferred = (self._deferred[0], as_context(ctx))
            return
        self._place(self.raw() if as_context(ctx).device.kind != "cpu" else
                    np.asarray(self._nd.asnumpy()), as_context(ctx))

    def cast(self, dtype) -> None:
        self._dtype = np.dtype(dtype)
        if self._nd is not None:
            self._place(self._nd.asnumpy().astype(self._dtype), self._nd.ctx)

    # -- gradients --------------------------------------------------------------------------

    def grad(self, ctx=None):
        """The gradient NDArray (None while frozen)."""
        del ctx
        value = self._checked()
        return value._grad

    def list_grad(self) -> list:
        return [self.grad()]

    def raw_grad(self):
        grad = self.grad()
        return None if grad is None else grad._read()

    def set_grad(self, value) -> None:
        """Write (``"add"``: add) ``value`` into the gradient (what Module's backward does)."""
        if self._grad_req == "null":
            return
        raw = self.grad()._write()  # waits for engine work still reading it; a new version
        with self._nd.ctx.device.active():
            if self._grad_req == "add":
                raw += value
            else:
                raw[...] = value

    def zero_grad(self) -> None:
        grad = self.grad() if self._nd is not None else None
        if grad is not None:
            with grad.ctx.device.active():
                grad._write()[...] = 0

    def grad_is_fresh(self) -> bool:
        """Whether a backward wrote the gradient since the Trainer's last step."""
        grad = self.grad()
        return grad is not None and grad._version != self._stepped_version

    def mark_stepped(self) -> None:
        grad = self.grad()
        self._stepped_version = -1 if grad is None else grad._version

    # -- symbolic -------------------------------------------------------------------------

    def var(self):
        """The Symbol variable standing for this parameter when a block is traced."""
        shape = self.shape if self.shape is not None and _complete(self.shape) else None
        return variable_named(self.name, shape=shape, dtype=self.dtype,
                              aux=not self.differentiable, lr_mult=self.lr_mult,
                              wd_mult=self.wd_mult)

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.shape}, dtype={self.dtype}, " \
               f"grad_req={self.grad_req!r})"


class ParameterDict(OrderedDict):
    """Parameters by name, in a stable order (the order optimizers and checkpoints see).

    ``get(name, **options)`` returns the parameter ``prefix + name``, creating it with
    ``options`` (shape, init, dtype, grad_req, ...) the first time: how blocks declare
    their parameters."""

    def __init__(self, *args, prefix: str = "", shared: "ParameterDict | None" = None):
        super().__init__(*args)
        self.prefix = prefix
        self._shared = shared

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

    def update(self, other) -> None:
        for name, param in dict(other).items():
            if name in self and self[name] is not param:
                raise InputError(f"two different parameters are both named {name!r}")
            self[name] = param


def _check_grad_req(name: str, req: str) -> None:
    if req not in GRAD_REQS:
        raise InputError(f"parameter {name!r}: grad_req must be one of {GRAD_REQS}, got "
                         f"{req!r}")


def _shape_tuple(shape) -> tuple:
    shape = (shape,) if isinstance(shape, int) else shape
    return tuple(0 if d is None else int(d) for d in shape)


def _complete(shape) -> bool:
    return shape is not None and all(d not in (0, None) for d in shape)
