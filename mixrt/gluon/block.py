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
attribute) and child blocks (assigned as attributes). Names follow MXNet 1.x's: a block's
prefix is its class's alias and a counter (``dense0_``; at the top level the counter is the
symbol name manager's, as in MXNet), nested under its parent's ``name_scope()``, which also
prefixes the names of the symbols made inside it; a parameter is its block's parameter
prefix plus its role (``dense0_weight``). A block made with ``params=`` of another shares
them: its parameter names are the other's.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections import OrderedDict

from mixrt import name as naming
from mixrt.gluon.parameter import Parameter, ParameterDict
from mixrt.gluon import param_files
from mixrt.gluon.summary import print_summary


class _BlockScope:
    """The ``name_scope()`` of a block: children made inside count their prefixes here,
    and symbols made inside take the block's prefix (MXNet's ``_BlockScope``)."""

    _current = threading.local()

    def __init__(self, block: "Block"):
        self._block = block
        self._counter: dict = {}
        self._old_scope = None
        self._symbol_names = None

    @staticmethod
    def create(prefix: str | None, params: ParameterDict | None, hint: str):
        """(the block's prefix, its ParameterDict) for a block made now."""
        current = getattr(_BlockScope._current, "value", None)
        if current is None:
            if prefix is None:
                prefix = naming.current().get(None, hint) + "_"
            shared_prefix = prefix if params is None else params.prefix
            return prefix, ParameterDict(prefix=shared_prefix, shared=params)
        if prefix is None:
            count = current._counter.get(hint, 0)
            prefix = f"{hint}{count}_"
            current._counter[hint] = count + 1
        parent = current._block.params
        if params is None:
            params = ParameterDict(prefix=parent.prefix + prefix, shared=parent._shared)
        else:
            params = ParameterDict(prefix=params.prefix, shared=params)
        return current._block.prefix + prefix, params

    def __enter__(self):
        if self._block._empty_prefix:  # MXNet: a block named "" scopes nothing
            return self
        self._old_scope = getattr(_BlockScope._current, "value", None)
        _BlockScope._current.value = self
        self._symbol_names = naming.Prefix(self._block.prefix)
        self._symbol_names.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._block._empty_prefix:
            return
        self._symbol_names.__exit__(*exc_info)
        self._symbol_names = None
        _BlockScope._current.value = self._old_scope


class HookHandle:
    """What ``register_forward_hook`` and friends return: ``detach()`` removes the hook
    (also on leaving a ``with`` block)."""

    _next_key = 0

    def __init__(self, hooks: OrderedDict, hook):
        self._hooks = hooks
        self._key = HookHandle._next_key
        HookHandle._next_key += 1
        hooks[self._key] = hook

    def detach(self) -> None:
        self._hooks.pop(self._key, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.detach()


class Block:
    """The base of every layer and model; ``forward`` is plain imperative Python."""

    # class facts read where importing the subclass would make an import loop:
    # whether the block can run as one traced graph (HybridBlock), and whether it only
    # chains its children (a summary's rows are then its children's)
    _hybridizable = False
    _container = False

    def __init__(self, prefix: str | None = None, params: ParameterDict | None = None):
        object.__setattr__(self, "_children", OrderedDict())
        object.__setattr__(self, "_reg_params", OrderedDict())
        self._empty_prefix = prefix == ""
        self._prefix, self._params = _BlockScope.create(prefix, params, self._alias())
        self._name = self._prefix[:-1] if self._prefix.endswith("_") else self._prefix
        self._scope = _BlockScope(self)
        self._forward_hooks: OrderedDict = OrderedDict()
        self._forward_pre_hooks: OrderedDict = OrderedDict()

    @classmethod
    def _alias(cls) -> str:
        return cls.__name__.lower()

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def name(self) -> str:
        return self._name

    @property
    def params(self) -> ParameterDict:
        """This block's own parameters (not its children's)."""
        return self._params

    def name_scope(self):
        """Children and symbols made inside are named under this block (``net0_dense0_``)."""
        return self._scope

    # -- children and parameters by attribute ----------------------------------------------

    def __setattr__(self, name: str, value) -> None:
        existing = self.__dict__.get(name)
        if isinstance(existing, (Parameter, Block)) and not isinstance(value, type(existing)):
            raise TypeError(f"{type(self).__name__}.{name} is a {type(existing).__name__}; "
                            f"it cannot become a {type(value).__name__}")
        if isinstance(value, Block):
            self.register_child(value, name)
        elif isinstance(value, Parameter):
            self._reg_params[name] = value
            if value.name not in self._params:
                self._params[value.name] = value
        object.__setattr__(self, name, value)

    def register_child(self, block: "Block", name: str | None = None) -> "Block":
        """Make ``block`` a child (``name``: its key, by default its position)."""
        self._children[str(len(self._children)) if name is None else name] = block
        return block

    def collect_params(self, select: str | None = None) -> ParameterDict:
        """Every parameter of this block and its children (``select``: a regex that the
        names must match, as ``re.match``)."""
        self._warn_unregistered_blocks()
        found = ParameterDict(prefix=self._params.prefix)
        pattern = re.compile(select) if select else None
        found.update({key: param for key, param in self._params.items()
                      if pattern is None or pattern.match(key)})
        for child in self._children.values():
            found.update(child.collect_params(select))
        return found

    def _warn_unregistered_blocks(self) -> None:
        """Blocks kept in a list, tuple or dict attribute are not children: their
        parameters would be missed silently, so say so (as MXNet does)."""
        children = set(map(id, self._children.values()))
        for key, value in self.__dict__.items():
            if key.startswith("__") or not isinstance(value, (list, tuple, dict)):
                continue
            if _holds_unregistered_block(value, children):
                warnings.warn(f'"{type(self).__name__}.{key}" is an unregistered container '
                              f"with Blocks; Blocks inside a list, tuple or dict are not "
                              f"registered automatically: register them with "
                              f"register_child() or use nn.Sequential/nn.HybridSequential",
                              stacklevel=3)

    def _collect_params_with_prefix(self, prefix: str = "") -> dict:
        """Parameters by their path of attribute names (``fc1.weight``): what
        ``save_parameters`` writes, independent of the name prefixes."""
        dotted = prefix + "." if prefix else ""
        found = {dotted + key: param for key, param in self._reg_params.items()}
        for name, child in self._children.items():
            found.update(child._collect_params_with_prefix(dotted + name))
        return found

    # -- lifecycle ---------------------------------------------------------------------------

    def initialize(self, init=None, ctx=None, verbose: bool = False,
                   force_reinit: bool = False) -> None:
        """Initialize every parameter (``init`` is the default for those without their own;
        parameters of unknown shape wait for the first forward)."""
        self.collect_params().initialize(init, ctx, verbose, force_reinit)

    def hybridize(self, active: bool = True, **options) -> None:
        """Hybridize every HybridBlock among the children (options: see HybridBlock)."""
        for child in self._children.values():
            child.hybridize(active, **options)

    def cast(self, dtype) -> None:
        """Convert every parameter of the block and its children to ``dtype``."""
        for child in self._children.values():
            child.cast(dtype)
        for param in self._params.values():
            param.cast(dtype)

    def apply(self, fn) -> "Block":
        """``fn(block)`` on every child, recursively, then on this block."""
        for child in self._children.values():
            child.apply(fn)
        fn(self)
        return self

    def zero_grad(self) -> None:
        self.collect_params().zero_grad()

    def reset_ctx(self, ctx) -> None:
        self.collect_params().reset_ctx(ctx)

    # -- parameter files ---------------------------------------------------------------------

    def save_parameters(self, filename, deduplicate: bool = False) -> None:
        """Write the parameters in MXNet's ``.params`` format (``nd.save``), by their path
        of attribute names (``fc1.weight``), so a block of the same structure loads them
        whatever its prefix. ``deduplicate``: a parameter shared by several paths is
        written once."""
        param_files.save(self, filename, deduplicate)

    def load_parameters(self, filename, ctx=None, allow_missing: bool = False,
                        ignore_extra: bool = False, cast_dtype: bool = False,
                        dtype_source: str = "current") -> None:
        """Set the parameters from a ``save_parameters`` file (also MXNet's files with
        prefixed names, and mixrt's earlier ``.npz`` ones). Every value must have its
        parameter's shape (0: not known yet) and dtype; ``cast_dtype=True`` converts
        numbers, to the parameter's dtype (``dtype_source="current"``) or the parameter
        to the file's (``"saved"``). Nothing changes unless the whole file fits."""
        param_files.load(self, filename, ctx, allow_missing, ignore_extra, cast_dtype,
                         dtype_source)

    def save_params(self, filename) -> None:
        """Deprecated in MXNet 1.x: the parameters by their prefixed names."""
        warnings.warn("save_params is deprecated; use save_parameters", DeprecationWarning,
                      stacklevel=2)
        param_files.save_prefixed(self, filename)

    def load_params(self, filename, ctx=None, allow_missing: bool = False,
                    ignore_extra: bool = False) -> None:
        """Deprecated in MXNet 1.x: ``load_parameters``."""
        warnings.warn("load_params is deprecated; use load_parameters", DeprecationWarning,
                      stacklevel=2)
        self.load_parameters(filename, ctx, allow_missing, ignore_extra)

    def _relative(self, name: str) -> str:
        prefix = self._params.prefix
        return name[len(prefix):] if name.startswith(prefix) else name

    # -- calling ----------------------------------------------------------------------------

    def register_forward_hook(self, hook) -> HookHandle:
        """``hook(block, inputs, outputs)`` after every call."""
        return HookHandle(self._forward_hooks, hook)

    def register_forward_pre_hook(self, hook) -> HookHandle:
        """``hook(block, inputs)`` before every call."""
        return HookHandle(self._forward_pre_hooks, hook)

    def register_op_hook(self, callback, monitor_all: bool = False) -> None:
        """MXNet's op hook, installed on every child (a plain Block runs no graph of its
        own; see ``HybridBlock.register_op_hook``)."""
        for child in self._children.values():
            child.register_op_hook(callback, monitor_all)

    def __call__(self, *args):
        for hook in list(self._forward_pre_hooks.values()):
            hook(self, args)
        outputs = self.forward(*args)
        for hook in list(self._forward_hooks.values()):
            hook(self, args, outputs)
        return outputs

    def forward(self, *args):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def summary(self, *inputs) -> None:
        """Print each layer's output shape and parameter count for one call on
        ``inputs`` (the block must not be hybridized: its layers would not be called)."""
        print_summary(self, inputs)

    def __repr__(self) -> str:
        children = [(key, value) for key, value in self.__dict__.items()
                    if isinstance(value, Block)]
        return _nested_repr(type(self).__name__, children)


def _nested_repr(name: str, children: list) -> str:
    lines = [f"  ({key}): {_indent(repr(child), 2)}" for key, child in children]
    return f"{name}(\n" + "\n".join(lines) + "\n)"


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


def _holds_unregistered_block(value, children: set) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds_unregistered_block(item, children) for item in value)
    if isinstance(value, dict):
        return any(_holds_unregistered_block(item, children) for item in value.values())
    return isinstance(value, Block) and id(value) not in children


class ChildChain:
    """What Sequential and HybridSequential share: ``add``, ``len``, indexing and slicing,
    and the chained call (the extra arguments go to the first child only; a child's tuple
    output feeds the next one's arguments)."""

    _container = True

    def add(self, *blocks):
        for block in blocks:
            self.register_child(block)
        return self

    def _chain(self, x, args):
        for block in self._children.values():
            x = block(x, *args)
            args = ()
            if isinstance(x, (tuple, list)):
                x, args = x[0], tuple(x[1:])
        return (x, *args) if args else x

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, index):
        picked = list(self._children.values())[index]
        if not isinstance(index, slice):
            return picked
        net = type(self)(prefix=self._prefix)
        with net.name_scope():
            net.add(*picked)
        return net

    def __repr__(self) -> str:
        return _nested_repr(type(self).__name__, list(self._children.items()))


class Sequential(ChildChain, Block):
    """Children called one after another."""

    def forward(self, x, *args):
        return self._chain(x, args)

    def hybridize(self, active: bool = True, **options) -> None:
        children = list(self._children.values())
        if children and all(c._hybridizable for c in children):
            warnings.warn(f"All children of the Sequential {self.prefix!r} are HybridBlocks; "
                          f"HybridSequential would run them as one graph", stacklevel=2)
        super().hybridize(active, **options)
