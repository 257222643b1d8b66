"""Parameters: a named array on one or more devices, its gradient and whether it trains
(``grad_req``); :class:`ParameterDict`, the parameters of a block by name.

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

This module is MXNet's ``mxnet.gluon.parameter``: it defines :class:`ParameterDict`
(naming by prefix, creating parameters on first ``get``, sharing, and saving and loading
all of them in MXNet's ``.params`` format) and keeps the names code imports from here. The
Parameter itself is put together from three modules, one per concern: its declaration,
shape bookkeeping and deferred initialization (``parameter_declaration.py``, with
``Constant``), its per-context copies and gradients (``parameter_storage.py``) and what it
reads through its Trainer (``parameter_trainer.py``).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError, ShapeError
from mixrt.gluon.param_files import _without_kind
from mixrt.gluon.parameter_declaration import (  # noqa: F401  (MXNet's names, imported from here)
    Constant, GRAD_REQS, Parameter, ParameterStypeError, STYPES)
from mixrt.gluon.parameter_storage import ParameterStorageError  # noqa: F401  (as above)


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
