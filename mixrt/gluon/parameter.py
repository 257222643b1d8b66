"""Parameters: a named array, its gradient and whether it trains (``grad_req``)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mixrt.errors import InputError

GRAD_REQS = ("write", "add", "null")


class Parameter:
    """``grad_req``: ``"write"`` (each backward overwrites the gradient), ``"add"``
    (gradients accumulate until ``zero_grad``) or ``"null"`` (frozen)."""

    def __init__(self, name: str, data, *, grad_req: str = "write", lr_mult: float = 1.0,
                 wd_mult: float = 1.0):
        if grad_req not in GRAD_REQS:
            raise InputError(f"parameter {name!r}: grad_req must be one of {GRAD_REQS}, got "
                             f"{grad_req!r}")
        self.name, self.grad_req = name, grad_req
        self.lr_mult, self.wd_mult = float(lr_mult), float(wd_mult)
        self._data = np.array(data)  # our own, writable copy (the optimizer updates in place)
        self._grad = None

    def data(self) -> np.ndarray:
        return self._data

    def set_data(self, value) -> None:
        value = np.asarray(value)
        if value.shape != self._data.shape:
            raise InputError(f"parameter {self.name!r} has shape {self._data.shape}; "
                             f"set_data got {value.shape}")
        self._data[...] = value

    def grad(self) -> np.ndarray | None:
        return self._grad

    def set_grad(self, value) -> None:
        if self.grad_req == "null":
            return
        if self.grad_req == "add" and self._grad is not None:
            self._grad += value
        else:
            self._grad = np.array(value, dtype=self._data.dtype)

    def zero_grad(self) -> None:
        if self._grad is not None:
            self._grad[...] = 0

    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self):
        return self._data.dtype

    def __repr__(self) -> str:
        return f"Parameter({self.name!r}, shape={self.shape}, dtype={self.dtype}, " \
               f"grad_req={self.grad_req!r})"


class ParameterDict(OrderedDict):
    """Parameters by name, in a stable order (the order optimizers and checkpoints see)."""

    def trainable(self) -> list[Parameter]:
        return [p for p in self.values() if p.grad_req != "null"]

    def setattr(self, attribute: str, value) -> None:
        """``params.setattr("grad_req", "null")`` freezes every parameter (MXNet's idiom)."""
        for param in self.values():
            setattr(param, attribute, value)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: param.data() for name, param in self.items()}
