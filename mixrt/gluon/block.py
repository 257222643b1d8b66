"""Blocks: models written as Python classes, run imperatively or traced into a graph.

    class Net(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.fc1 = nn.Dense(64, activation="relu")
                self.fc2 = nn.Dense(10)
        def hybrid_forward(self, F, x):      # F is mixrt.nd, or mixrt.sym when traced
            return self.fc2(self.fc1(x))

    net = Net(); net.initialize(); y = net(x)  # imperative: every op runs as called
    net.hybridize(); y = net(x)                # traced once, then the planned executor

A block owns parameters (``self.params.get(...)``, or a ``Parameter`` assigned as an
attribute) and child blocks (assigned as attributes). Names follow MXNet's: a block's
prefix is its class's alias and a counter (``dense0_``), nested under its parent's
``name_scope()``; a parameter is the prefix plus its role (``dense0_weight``).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict, defaultdict

import numpy as np

from mixrt.base.errors import InputError
from mixrt.gluon.parameter import Parameter, ParameterDict
from mixrt.runtime.npz import read_npz, write_npz


class _NameScope(threading.local):
    current: "Block | None" = None
    counters: defaultdict = None


_scope = _NameScope()
_global_counters: defaultdict = defaultdict(int)


def _next_prefix(alias: str) -> str:
    parent = _scope.current
    counters = parent._child_counters if parent is not None else _global_counters
    index = counters[alias]
    counters[alias] += 1
    return (parent.prefix if parent is not None else "") + f"{alias}{index}_"


class Block:
    """The base of every layer and model; ``forward`` is plain imperative Python."""

    def __init__(self, prefix: str | None = None, params: ParameterDict | None = None):
        object.__setattr__(self, "_children", OrderedDict())
        object.__setattr__(self, "_child_counters", defaultdict(int))
        self._prefix = _next_prefix(self._alias()) if prefix is None else \
            ((_scope.current.prefix if _scope.current is not None else "") + prefix)
        self._params = ParameterDict(prefix=self._prefix, shared=params)
        self._forward_hooks: list = []
        self._forward_pre_hooks: list = []

    @classmethod
    def _alias(cls) -> str:
        return cls.__name__.lower()

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def name(self) -> str:
        return self._prefix[:-1] if self._prefix.endswith("_") else self._prefix

    @property
    def params(self) -> ParameterDict:
        """This block's own parameters (not its children's)."""
        return self._params

    def name_scope(self):
        """Children made inside are named under this block (``net0_dense0_``)."""
        return _ScopeGuard(self)

    # -- children and parameters by attribute ----------------------------------------------

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, Block):
            self.register_child(value, name)
        elif isinstance(value, Parameter):
            self._params[value.name] = value
        object.__setattr__(self, name, value)

    def register_child(self, block: "Block", name: str | None = None) -> "Block":
        self._children[name or str(len(self._children))] = block
        return block

    def collect_params(self, select: str | None = None) -> ParameterDict:
        """Every parameter of this block and its children (``select``: a regex on names)."""
        found = ParameterDict(prefix=self._prefix)
        found.update(self._params)
        for child in self._children.values():
            found.update(child.collect_params())
        if select is None:
            return found
        pattern = re.compile(select)
        return ParameterDict([(k, v) for k, v in found.items() if pattern.match(k)],
                             prefix=self._prefix)

    # -- lifecycle ---------------------------------------------------------------------------

    def initialize(self, init=None, ctx=None, verbose: bool = False,
                   force_reinit: bool = False) -> None:
        """Initialize every parameter (``init`` is the default for those without their own;
        parameters of unknown shape wait for the first forward)."""
        self.collect_params().initialize(init, ctx, verbose, force_reinit)

    def hybridize(self, active: bool = True, **options) -> None:
        for child in self._children.values():
            child.hybridize(active, **options)

    def cast(self, dtype) -> None:
        for child in self._children.values():
            child.cast(dtype)
        for param in self._params.values():
            param.cast(dtype)

    def zero_grad(self) -> None:
        self.collect_params().zero_grad()

    def save_parameters(self, filename) -> None:
        """An ``.npz`` of every parameter by its name relative to this block (no pickle)."""
        params = self._relative_params()
        write_npz(filename, {key: p.data().asnumpy() for key, p in params.items()},
                  f"save_parameters {str(filename)!r}")

    def load_parameters(self, filename, ctx=None, allow_missing: bool = False,
                        ignore_extra: bool = False, cast_dtype: bool = False) -> None:
        """Set the parameters from a ``save_parameters`` file. Every value must have its
        parameter's shape and dtype (``cast_dtype=True``: any numeric dtype, converted, as
        MXNet's option); nothing is changed unless the whole file fits."""
        params = self._relative_params()
        stored = read_npz(filename, "parameter file")
        where = f"parameter file {str(filename)!r}"
        missing = sorted(set(params) - set(stored))
        extra = sorted(set(stored) - set(params))
        if missing and not allow_missing:
            raise InputError(f"{where}: no values for parameters {missing} (pass "
                             f"allow_missing=True to keep their current values)")
        if extra and not ignore_extra:
            raise InputError(f"{where}: values for parameters the block does not have: "
                             f"{extra} (pass ignore_extra=True to skip them)")
        loaded = {key: _fitting(params[key], value, f"{where}: parameter {key!r}", cast_dtype)
                  for key, value in stored.items() if key in params}
        for key, value in loaded.items():
            param = params[key]
            if not param.is_initialized():
                param.initialize(ctx=ctx)
            param.set_data(value)

    def _relative_params(self) -> dict:
        found = self.collect_params()
        params = {self._relative(name): p for name, p in found.items()}
        if len(params) != len(found):  # "x" and "<prefix>x" would collide in the file
            raise InputError(f"block {self.name!r}: two parameters share a name relative to "
                             f"its prefix {self._prefix!r}: {list(found)}")
        return params

    def _relative(self, name: str) -> str:
        return name[len(self._prefix):] if name.startswith(self._prefix) else name

    # -- calling ----------------------------------------------------------------------------

    def register_forward_hook(self, hook) -> None:
        """``hook(block, inputs, outputs)`` after every call."""
        self._forward_hooks.append(hook)

    def register_forward_pre_hook(self, hook) -> None:
        """``hook(block, inputs)`` before every call."""
        self._forward_pre_hooks.append(hook)

    def __call__(self, *args):
        for hook in self._forward_pre_hooks:
            hook(self, args)
        outputs = self.forward(*args)
        for hook in self._forward_hooks:
            hook(self, args, outputs)
        return outputs

    def forward(self, *args):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}("]
        for key, child in self._children.items():
            inner = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({key}): {inner}")
        return "\n".join(lines) + "\n)" if len(lines) > 1 else f"{type(self).__name__}()"


def _fitting(param: Parameter, value: np.ndarray, where: str, cast_dtype: bool) -> np.ndarray:
    """``value`` when it can become ``param``'s value (a 0 in the parameter's shape is a
    dimension not known yet); an InputError naming it otherwise."""
    shape = param.shape
    if shape is not None and (len(shape) != value.ndim or any(
            known not in (0, None) and known != got for known, got in zip(shape, value.shape))):
        raise InputError(f"{where} has shape {value.shape}; the parameter's is {shape}")
    if value.dtype == param.dtype:
        return value
    if not cast_dtype or value.dtype.kind not in "biuf":
        raise InputError(f"{where} is {value.dtype}; the parameter is {param.dtype} (pass "
                         f"cast_dtype=True to convert numeric values)")
    return value.astype(param.dtype)


class _ScopeGuard:
    def __init__(self, block: Block):
        self._block, self._previous = block, None

    def __enter__(self):
        self._previous, _scope.current = _scope.current, self._block
        return self

    def __exit__(self, *_exc) -> None:
        _scope.current = self._previous


class ChildChain:
    """What Sequential and HybridSequential share: ``add``, ``len`` and the chained call
    (the extra arguments go to the first child only)."""

    def add(self, *blocks):
        for block in blocks:
            self.register_child(block)
        return self

    def _chain(self, x, args):
        for block in self._children.values():
            x = block(x, *args)
            args = ()
        return x

    def __len__(self) -> int:
        return len(self._children)


class Sequential(ChildChain, Block):
    """Children called one after another."""

    def forward(self, x, *args):
        return self._chain(x, args)

    def __getitem__(self, index):
        children = list(self._children.values())
        if isinstance(index, slice):
            picked = type(self)(prefix=self._prefix)
            picked.add(*children[index])
            return picked
        return children[index]
