"""The arrays an Executor binds: how they are given, checked, allocated and filled.

``bind`` takes the caller's arrays (an NDArray already on the executor's context is used
itself, so writing into it changes the next forward; anything else is copied in);
``simple_bind`` allocates every argument and auxiliary state from inferred shapes; the
gradient arrays follow each argument's grad_req ("write", "add", "null"); ``reshape``
makes arrays that are views of the old ones (``Resizer``). ``copy_params_from`` and
``init_params`` fill the parameters.

This is the Executor's memory, apart from how it runs (``mixrt.sym.executor_running``):
:class:`BoundArrays` is a base of ``mixrt.sym.executor.Executor``, whose ``__init__`` sets
what its methods read (``symbol``, ``_ctx``, ``device``, ``_xp``, ``_arg_names``,
``_aux_names``, ``_grad_req``, the dicts of arrays and ``data_names``).
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError, MixrtError, ShapeError
from mixrt.initializer import create, Xavier
from mixrt.ops.device import on_own_device
from mixrt.nd import NDArray
from mixrt.nd.ndarray import GRAD_REQS
from mixrt.sym.symbol import DEFAULT_DTYPE, Symbol


def grad_reqs(grad_req, names: list[str]) -> dict[str, str]:
    if isinstance(grad_req, str):
        reqs = dict.fromkeys(names, grad_req)
    elif isinstance(grad_req, (list, tuple)):
        reqs = dict(zip(names, grad_req))
    elif isinstance(grad_req, dict):
        unknown = set(grad_req) - set(names)
        if unknown:
            raise InputError(f"grad_req names {sorted(unknown)}, which are not arguments")
        reqs = {n: grad_req.get(n, "null") for n in names}
    else:
        raise InputError(f"grad_req must be a string, a list or a dict; got {grad_req!r}")
    for name, req in reqs.items():
        if req not in GRAD_REQS:
            raise InputError(f"grad_req of {name!r} must be one of {GRAD_REQS}; got {req!r}")
    return reqs


def simple_bind_reqs(grad_req, symbol: Symbol, arg_types: list):
    """A plain grad_req string is every float argument's, data and labels included
    (MXNet's simple_bind); an integer argument (class labels, indices) has no gradient to
    hold and gets none."""
    if not isinstance(grad_req, str):
        return grad_req
    return {name: grad_req if np.dtype(dtype or DEFAULT_DTYPE).kind in "fc" else "null"
            for name, dtype in zip(symbol.list_arguments(), arg_types)}


def inferred_shapes(symbol: Symbol, shapes: dict, what: str) -> tuple:
    """Every argument's and auxiliary state's shape from ``shapes``; arrays cannot be
    allocated otherwise, so one left unknown is a ShapeError naming it (as MXNet's)."""
    inferred = symbol._known_shapes((), shapes)
    names = symbol.list_arguments() + symbol.list_auxiliary_states()
    unknown = {name: tuple(0 if d is None else d for d in shape or ())
               for name, shape in zip(names, inferred[0] + inferred[2])
               if shape is None or None in shape}
    if unknown:
        raise ShapeError(f"{what}: cannot decide the shapes of {unknown} (0 is an unknown "
                         f"dimension) from the shapes given, {shapes}; give them too")
    if any(shape is None or None in shape for shape in inferred[1]):
        given = dict(zip(symbol.list_arguments(), inferred[0]))
        raise ShapeError(f"{what}: the outputs {symbol.list_outputs()} have no shape for "
                         f"the argument shapes {given}; their operators do not accept them "
                         f"together")
    return inferred


class UnknownParameterError(InputError, ValueError):
    """``copy_params_from`` was given a name the symbol lacks (MXNet raises ValueError)."""


class BoundArrays:
    """The Executor's arrays (MXNet's ``arg_arrays``, ``grad_arrays``, ``aux_arrays``,
    ``output_dict``, ``grad_req``), made at bind and filled with parameter values."""

    @property
    def arg_arrays(self) -> list:
        return [self.arg_dict[n] for n in self._arg_names]

    @property
    def grad_arrays(self) -> list:
        return [self.grad_dict.get(n) for n in self._arg_names]

    @property
    def aux_arrays(self) -> list:
        return [self.aux_dict[n] for n in self._aux_names]

    @property
    def output_dict(self) -> dict:
        return dict(zip(self.symbol.list_outputs(), self.outputs))

    @property
    def grad_req(self) -> dict:
        return dict(self._grad_req)

    def _ndarray(self, value, name: str):
        """``value`` as an NDArray of this executor's context: an NDArray already there is
        used itself (shared memory), anything else is copied in."""
        if isinstance(value, NDArray) and _same_memory(value.ctx, self._ctx):
            return value
        if isinstance(value, NDArray):
            value = value.asnumpy()
        if value is None:
            raise InputError(f"bind: no array given for {name!r}")
        return NDArray(self.device.put(value), self._ctx)

    def _bound(self, what: str, given, names: list[str]) -> dict:
        if given is None:
            given = {}
        if isinstance(given, (list, tuple)):
            if len(given) != len(names):
                raise InputError(f"bind: {what} has {len(given)} arrays; the symbol has "
                                 f"{len(names)}: {names}")
            given = dict(zip(names, given))
        unknown = set(given) - set(names)
        if unknown:
            raise InputError(f"bind: {what} names {sorted(unknown)}, which the symbol does "
                             f"not have; expected names from {names}")
        missing = [n for n in names if n not in given]
        if missing:
            raise InputError(f"bind: {what} lacks arrays for {missing}; simple_bind "
                             f"allocates them from shapes")
        return {n: self._ndarray(given[n], n) for n in names}

    def _gradient_arrays(self, args_grad) -> dict:
        wanted = [n for n in self._arg_names if self._grad_req[n] != "null"]
        if isinstance(args_grad, (list, tuple)):
            args_grad = dict(zip(self._arg_names, args_grad))
        args_grad = args_grad or {}
        arrays = {}
        for name in wanted:
            given = args_grad.get(name)
            arrays[name] = self._zeros_like(self.arg_dict[name]) if given is None \
                else self._ndarray(given, name)
        return arrays

    def _zeros_like(self, array):
        return NDArray(self._xp.zeros(array.shape, array.dtype), self._ctx)

    def _output_arrays(self) -> list:
        """The output arrays, allocated at bind when the bound shapes determine them (as
        MXNet's are, so a reshaped executor can share them); otherwise at first forward."""
        try:
            shapes = {n: a.shape for n, a in {**self.arg_dict, **self.aux_dict}.items()}
            _, out_shapes, _ = self.symbol._known_shapes((), shapes)
            _, out_types, _ = self.symbol.infer_type(
                **{n: a.dtype for n, a in self.arg_dict.items()})
        except MixrtError:
            return []
        if any(s is None or None in s for s in out_shapes):
            return []
        with self.device.active():
            return [NDArray(self._xp.zeros(s, t or DEFAULT_DTYPE), self._ctx)
                    for s, t in zip(out_shapes, out_types)]

    @on_own_device
    def copy_params_from(self, arg_params: dict, aux_params: dict | None = None,
                         allow_extra_params: bool = False) -> None:
        """Copy parameter values in (shapes must match the bound arrays); names the symbol
        lacks are an error unless ``allow_extra_params``."""
        for source, target, what in ((arg_params, self.arg_dict, "argument"),
                                     (aux_params or {}, self.aux_dict, "auxiliary state")):
            for name, value in source.items():
                if name not in target:
                    if allow_extra_params:
                        continue
                    raise UnknownParameterError(
                        f"copy_params_from: the symbol has no {what} {name!r} "
                        f"(allow_extra_params=True skips such names)")
                _assign(target[name], name, value, self.device)

    @on_own_device
    def init_params(self, initializer=None, *, overwrite: bool = True) -> None:
        """Fill every parameter and auxiliary state (not the data arguments) with its
        Variable's own ``init`` when it declared one, else ``initializer`` (Xavier)."""
        default = create(initializer) if initializer is not None else Xavier()
        declared = {n.name: n.info for n in self.symbol._variables()}
        for target in (self.arg_dict, self.aux_dict):
            for name, array in target.items():
                if name in self.data_names or (not overwrite and np.any(array._read())):
                    continue
                init = declared[name].get("init")
                chosen = create(init) if init is not None else default
                value = chosen(name, array.shape, array.dtype)
                array._write()[...] = self.device.put(value)


def _same_memory(a, b) -> bool:
    """Whether arrays of contexts ``a`` and ``b`` live in the same memory: every host
    context (``cpu(0)``, ``cpu(1)``) is main memory, as in MXNet."""
    return a == b or (a.device_type == b.device_type == "cpu")


def _assign(target, name: str, value, device) -> None:
    value = device.put(value.asnumpy() if isinstance(value, NDArray) else value)
    if tuple(value.shape) != target.shape:
        raise InputError(f"{name!r}: the bound array has shape {target.shape}, the new "
                         f"value {tuple(value.shape)}")
    target._write()[...] = value


class Resizer:
    """Arrays for :meth:`Executor.reshape`: the old array, a view of its first elements,
    or (``allow_up_sizing``) a new one."""

    def __init__(self, ctx, device, partial_shaping: bool, allow_up_sizing: bool,
                 named: dict):
        self.ctx, self.device = ctx, device
        self.partial_shaping, self.allow_up_sizing = partial_shaping, allow_up_sizing
        self.named = named

    def __call__(self, name: str, old, shape):
        return self.view(old, shape, repr(name), named=name in self.named)

    def view(self, old, shape, what: str, *, named: bool):
        shape = tuple(shape)
        if old.shape == shape:
            return old
        if not named and not self.partial_shaping:
            raise InputError(f"reshape: the shape of {what} changes from {old.shape} to "
                             f"{shape} without being given; pass partial_shaping=True to "
                             f"allow it")
        size = int(np.prod(shape))
        if size > old.size:
            if not self.allow_up_sizing:
                raise InputError(f"reshape: {what} grows from {old.shape} to {shape}; pass "
                                 f"allow_up_sizing=True to allocate a larger array")
            with self.device.active():
                return NDArray(self.device.xp.zeros(shape, old.dtype), self.ctx)
        flat = old._read().reshape(-1)
        return NDArray(flat[:size].reshape(shape), self.ctx)._share_memory_of(old)
