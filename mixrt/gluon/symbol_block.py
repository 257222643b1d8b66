"""``SymbolBlock``: a Symbol as a HybridBlock (MXNet's ``gluon.SymbolBlock``), so a graph
built with ``mixrt.sym`` or exported by a hybridized block runs, trains and nests like any
other block.

    block = gluon.SymbolBlock.imports("net-symbol.json", ["data"], "net-0000.params")
    out = block(x)

The symbol's variables other than its inputs become the block's Parameters, under their
own names (a ``params`` dict given supplies the existing ones: a model's
``collect_params()``). Called on arrays it always runs the compiled graph (MXNet's cached
op); called on Symbols it gives the symbol with the inputs substituted.
"""

from __future__ import annotations

from mixrt import sym
from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import HybridBlock
from mixrt.gluon.parameter import ParameterDict
from mixrt.sym.symbol import Group, Symbol


class SymbolBlock(HybridBlock):
    """``outputs`` (a Symbol, or a list of them) as a function of ``inputs`` (Variables)."""

    def __init__(self, outputs, inputs, params=None):
        super().__init__(prefix="")
        # the symbol's variables keep their names whatever dict supplies them (MXNet's)
        object.__setattr__(self, "_params", ParameterDict(prefix="", shared=params))
        self._symbol = _one_symbol("outputs", outputs)
        self._input_names = [_variable_name(x) for x in _as_list(inputs)]
        missing = [n for n in self._input_names if n not in self._symbol.list_inputs()]
        if missing:
            raise InputError(f"SymbolBlock: inputs {missing} are not variables of the "
                             f"outputs, whose variables are {self._symbol.list_inputs()}")
        auxiliary = set(self._symbol.list_auxiliary_states())
        attributes = self._symbol.attr_dict()
        for name in self._symbol.list_inputs():
            if name not in self._input_names:
                _refuse_sparse(name, attributes.get(name, {}))
                self.params.get(name, allow_deferred_init=True,
                                grad_req="null" if name in auxiliary else "write")
        self._active = True  # arrays always go through the compiled graph

    @staticmethod
    def imports(symbol_file: str, input_names, param_file: str | None = None, ctx=None,
                allow_missing: bool = False, ignore_extra: bool = False) -> "SymbolBlock":
        """The block of an exported model: its symbol file (``*-symbol.json``), the names
        of its inputs, and optionally its parameter file (``*-0000.params``) loaded on
        ``ctx``."""
        names = [input_names] if isinstance(input_names, str) else list(input_names)
        block = SymbolBlock(sym.load(symbol_file), [sym.var(name) for name in names])
        if param_file is not None:
            block.collect_params().load(param_file, ctx=ctx, allow_missing=allow_missing,
                                        ignore_extra=ignore_extra)
        return block

    def hybridize(self, active: bool = True, **options) -> None:
        super().hybridize(active, **options)
        self._active = True  # there is no imperative form to fall back on

    def forward(self, x, *args):
        inputs = (x, *args)
        if len(inputs) != len(self._input_names):
            raise InputError(f"SymbolBlock: takes {len(self._input_names)} inputs "
                             f"{self._input_names}, got {len(inputs)}")
        if not any(isinstance(value, Symbol) for value in inputs):
            self._resolve_deferred(*inputs)
        return super().forward(*inputs)

    def infer_shape(self, *args) -> None:
        """The parameters' unknown shapes, from the symbol and the inputs' shapes."""
        known = {name: tuple(a.shape) for name, a in zip(self._input_names, args)}
        arg_shapes, _, aux_shapes = self._symbol.infer_shape_partial(**known)
        names = self._symbol.list_arguments() + self._symbol.list_auxiliary_states()
        for name, shape in zip(names, list(arg_shapes) + list(aux_shapes)):
            if name in self.params and shape and 0 not in shape:  # () / 0: unknown
                self.params[name].shape = shape

    def hybrid_forward(self, F, *args, **params):
        if F is not sym:  # only reached while a parameter still lacks a value
            pending = [p.name for p in self.params.values() if not p.is_initialized()]
            raise InputError(f"SymbolBlock: parameters {pending} have no value; call "
                             f"initialize() or load them (collect_params().load)")
        composed = self._symbol(**dict(zip(self._input_names, args)), **params)
        if len(composed) == 1:
            return composed
        return [composed[i] for i in range(len(composed))]

    def __repr__(self) -> str:
        outputs = ", ".join(self._symbol.list_outputs())
        return f"SymbolBlock(\n  {self._input_names} -> [{outputs}]\n)"


class SparseParameterError(InputError, AssertionError):
    """A SymbolBlock parameter that is not dense (MXNet asserts the same)."""


def _refuse_sparse(name: str, attributes: dict) -> None:
    storage = attributes.get("__storage_type__", "0")
    if str(storage) not in ("0", "-1"):  # 0: default (dense); -1: undefined
        raise SparseParameterError(f"SymbolBlock does not support parameter {name!r}: its "
                                   f"storage type is {storage} (sparse), only dense ones")


def _as_list(values) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]


def _one_symbol(what: str, values) -> Symbol:
    symbols = _as_list(values)
    if not symbols or not all(isinstance(s, Symbol) for s in symbols):
        raise InputError(f"SymbolBlock: {what} must be a Symbol or a list of Symbols, got "
                         f"{values!r}")
    return symbols[0] if len(symbols) == 1 else Group(symbols)


def _variable_name(value) -> str:
    if not isinstance(value, Symbol) or len(value.list_inputs()) != 1 or \
            value.list_outputs() != value.list_inputs():
        raise InputError(f"SymbolBlock: each input must be a Variable (mx.sym.var), got "
                         f"{value!r}")
    return value.list_inputs()[0]


__all__ = ["SymbolBlock"]
