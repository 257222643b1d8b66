"""HybridBlock: one ``hybrid_forward(F, x, ...)`` for imperative runs and for a traced graph.

Imperative (the default): ``F`` is ``mixrt.nd`` and parameters arrive as NDArrays, so
every op runs as called and Python debugging works. ``hybridize()``: the first call traces
``hybrid_forward`` with ``F = mixrt.sym`` and Symbol variables for the inputs and the
parameters; the Symbol is compiled per input-shape signature into planned Sessions (an
inference one, and under ``autograd.record()`` a forward/backward pair from the symbolic
autodiff), and every later call runs those. Under ``record()`` the whole block is one node on
the tape whose backward is the compiled backward graph (MXNet's CachedOp).

Tracing has no values, so Python control flow on a tensor (``if x.sum() > 0:``) cannot be
traced; it raises :class:`HybridizeError` naming the block, the line and the fixes.
"""

from __future__ import annotations

import traceback
import warnings

import numpy as np

from mixrt import autograd, sym, tape
from mixrt.tape import nodes as tape_nodes
from mixrt.base.errors import DeviceMismatchError, HybridizeError, InputError
from mixrt.gluon import op_hooks
from mixrt.gluon.block import Block, ChildChain
from mixrt.runtime.lru import LruCache
from mixrt.runtime.passes.typecheck import promote_mixed_floats
from mixrt.sym import symbol as symbol_module
from mixrt.sym.symbol import variable_named, Group, Symbol
from mixrt.sym.tracing import static_shape  # noqa: F401  (gluon's name for it)
from mixrt import nd
from mixrt.exporters.onnx import save_model
from mixrt.gluon.parameter import Parameter
from mixrt.nd.ndarray import NDArray
from mixrt.runtime.format import save_mxr
from mixrt.runtime.session import Session
from mixrt.sym.training_graphs import feeds_for, HEAD_GRAD, TrainingPair
from mixrt.sym.tracing import tracing as _tracing

# input signatures whose traced graphs (and their Sessions) a hybridized block keeps
MAX_TRACED = 32




class HybridBlock(Block):
    """A block whose computation is ``hybrid_forward(F, x, *args, **params)``.

    Inputs are NDArrays or Symbols (not both), ``None`` for an optional input, or (nested)
    lists of them. Imperatively any other argument (a number) passes through to
    ``hybrid_forward``; hybridized, the inputs' structure is fixed by the first call
    (trailing ``None``s aside, which default arguments stand for)."""

    # the axes of every input that an exported graph leaves free (the batch); a block
    # whose graph holds for any size along more axes (a recurrent layer's time) says so
    _free_axes: tuple = (0,)
    _hybridizable = True

    def __init__(self, prefix: str | None = None, params=None):
        super().__init__(prefix, params)
        self._active = False
        self._flags: dict = {}
        self._op_hook = None  # (callback, monitor_all): register_op_hook's
        self._clear_cached_graph()

    def _clear_cached_graph(self) -> None:
        self._cached = LruCache(MAX_TRACED)  # input signature -> CachedGraph
        self._last_cached = None
        self._in_format = None

    def register_child(self, block, name: str | None = None):
        if not isinstance(block, HybridBlock):
            raise ValueError(f"Children of a HybridBlock must be HybridBlocks too, but "
                             f"{name or block.name!r} is a {type(block).__name__}; for a "
                             f"Sequential, use HybridSequential")
        super().register_child(block, name)
        self._clear_cached_graph()  # the traced graph no longer has this block's shape
        return block

    def hybridize(self, active: bool = True, static_alloc: bool = False,
                  static_shape: bool = False, inline_limit: int = 2,
                  forward_bulk_size: int | None = None,
                  backward_bulk_size: int | None = None, **cached_op_flags) -> None:
        """Trace on the next call and run the compiled graph from then on. The planned
        executor always allocates its arena once per input-shape signature (what
        ``static_alloc``/``static_shape`` ask of MXNet) and compiles the whole graph as one
        (``inline_limit``, the bulk sizes: MXNet's limits on that); they are kept as
        given, as are MXNet's other CachedOp flags (``data_indices``, ``param_indices``:
        which inputs are data and which parameters, which the traced graph knows)."""
        self._active = bool(active)
        self._flags = {"static_alloc": static_alloc, "static_shape": static_shape,
                       "inline_limit": inline_limit, "forward_bulk_size": forward_bulk_size,
                       "backward_bulk_size": backward_bulk_size, **cached_op_flags}
        self._clear_cached_graph()
        if self._active and (self._forward_hooks or self._forward_pre_hooks):
            warnings.warn(f"{self.name!r} is hybridized while it has forward hooks; as a "
                          f"child of a hybridized block its hooks are not called",
                          stacklevel=2)
        for child in self._children.values():
            child.hybridize(active, static_alloc=static_alloc, static_shape=static_shape,
                            inline_limit=inline_limit, forward_bulk_size=forward_bulk_size,
                            backward_bulk_size=backward_bulk_size, **cached_op_flags)

    def register_op_hook(self, callback, monitor_all: bool = False) -> None:
        """MXNet's op hook: while the block runs hybridized, ``callback(node_name, op_name,
        array)`` for each operator of its graph, in order, with each of its outputs
        (``b"dense0_fwd_output"``, ``b"FullyConnected"``) and, with ``monitor_all``, each
        of its inputs first (``b"dense0_fwd_data"``, ``b"dense0_fwd_weight"``). As in MXNet
        the names are bytes, the hook goes to this block and its direct children, and a
        block called imperatively calls no hook. MXNet hands over an array handle; here
        the array is an NDArray. The values come from a second run of the graph that
        keeps every operator's outputs (in training mode it draws its own Dropout masks)."""
        op_hooks.install(self, callback, monitor_all)

    def infer_shape(self, *args) -> None:
        """Set the unknown dimensions of this block's parameters from its inputs' shapes
        (layers with deferred parameters, such as Dense without in_units, override it)."""

    # -- calling -----------------------------------------------------------------------------

    def forward(self, x, *args):
        inputs = (x, *args)
        has_symbol, has_array, contexts = _input_kinds(inputs)
        if has_symbol and has_array:
            raise ValueError(f"{self.name}: the inputs mix NDArrays and Symbols; a "
                             f"HybridBlock takes one kind")
        if not has_symbol and not has_array:
            raise ValueError(f"{self.name}: no NDArray or Symbol among the inputs {inputs!r}")
        if has_symbol:
            return self._traced_forward(*inputs)
        if self._active:
            if len(contexts) > 1:
                raise ValueError(f"{self.name}: the inputs are on several devices "
                                 f"{sorted(map(str, contexts))}; a hybridized block runs "
                                 f"on one")
            return self._cached_call(*inputs)
        self._resolve_deferred(*inputs)
        ctx = next(iter(contexts)) if len(contexts) == 1 else None
        return self.hybrid_forward(nd, *inputs, **self._param_values(ctx))

    def hybrid_forward(self, F, x, *args, **params):
        raise NotImplementedError(f"{type(self).__name__} must define hybrid_forward()")

    def _named_params(self) -> dict:
        named = {self._relative(name): p for name, p in self._params.items()}
        named.update(self._reg_params)
        return named

    def _param_values(self, ctx=None) -> dict:
        """The parameters' copies on ``ctx`` (the inputs' context, as MXNet reads them)."""
        return {key: param.data(ctx) for key, param in self._named_params().items()}

    def _resolve_deferred(self, *args) -> None:
        pending = [p for p in self._params.values() if not p.is_initialized()]
        if pending and all(hasattr(a, "shape") for a in args):
            self.infer_shape(*args)

    # -- tracing -----------------------------------------------------------------------------

    def _traced_forward(self, *args):
        params = {key: _parameter_symbol(p) for key, p in self._named_params().items()}
        _tracing.blocks.append(self)
        try:
            with self.name_scope():
                return self.hybrid_forward(sym, *args, **params)
        finally:
            _tracing.blocks.pop()

    def trace(self, *args) -> "CachedGraph":
        """The Symbol of this block for inputs like ``args`` (run once imperatively first
        when a parameter's shape is still unknown, so every shape is settled)."""
        if any(not p.is_initialized() for p in self.collect_params().values()):
            with autograd.pause(train_mode=False), op_hooks.settling_shapes():
                was_active, self._active = self._active, False
                try:  # the flat call: a subclass's forward may group its arguments
                    HybridBlock.forward(self, *args)
                finally:
                    self._active = was_active
        flat, form = _flatten(args)
        names = _input_names(flat)
        variables = [None if a is None else variable_named(n, dtype=a.dtype)
                     for n, a in zip(names, flat)]
        previous = (_tracing.variables, _tracing.shapes)
        _tracing.variables = {}
        _tracing.shapes = {n: tuple(a.shape) for n, a in zip(names, flat) if a is not None}
        try:
            outputs = self._traced_forward(*_regroup(variables, form))
        finally:
            _tracing.variables, _tracing.shapes = previous
        symbols, out_form = _flatten_outputs(outputs)
        group = outputs if isinstance(outputs, Symbol) else Group(symbols)
        return CachedGraph(self, group, [n for n, a in zip(names, flat) if a is not None],
                           out_form)

    def _cached_call(self, *args):
        """Traced once per input signature: a block may unroll over a static dimension
        (see :func:`static_shape`)."""
        flat, form = _flatten(args)
        self._check_format(form)
        present = [a for a in flat if a is not None]
        key = (form, tuple((tuple(a.shape), str(a.dtype)) for a in present))
        cached = self._cached.get(key)
        if cached is None:
            cached = self._cached.put(key, self.trace(*args))
        self._last_cached = cached
        return cached(*present)

    def _check_format(self, form: tuple) -> None:
        """The first call fixes the inputs' structure, as in MXNet: an input that was None
        stays None and an array stays an array. A call with fewer or more inputs (trailing
        arguments with defaults) is traced on its own."""
        if self._in_format is None:
            self._in_format = form
            return
        common = min(len(form), len(self._in_format))
        if form[:common] != self._in_format[:common]:
            raise ValueError(f"{self.name}: the inputs' structure {form} differs from the "
                             f"one it was hybridized with, {self._in_format} (0: an "
                             f"array, -1: None, (n, ...): a list of n)")

    # -- export ------------------------------------------------------------------------------

    def export(self, path, epoch: int = 0, remove_amp_cast: bool = True, *,
               opset: int | None = None) -> dict:
        """Write the traced graph with its current parameters, as MXNet's export does,
        ``path-symbol.json`` (the Symbol; inputs ``data`` or ``data0``, ``data1``, ...)
        and ``path-<epoch:04d>.params`` (``arg:<name>`` and ``aux:<name>`` entries), which
        ``SymbolBlock.imports`` and ``Module.load`` read; and beside them ``path.onnx``
        (runs in onnxruntime) and ``path.mxr`` (mixrt's compiled format). The block must
        have run hybridized once, so its input shapes are known. ``remove_amp_cast`` is
        MXNet's and changes nothing here (mixrt's graphs hold no AMP casts). Returns the
        paths by kind: ``symbol``, ``params``, ``onnx``, ``mxr``."""
        del remove_amp_cast
        if self._last_cached is None or self._last_cached.last_shapes is None:
            raise InputError(f"export: {self.name} has not run hybridized yet; call "
                             f"hybridize() and run it on an input first")
        cached = self._last_cached
        paths = {"symbol": f"{path}-symbol.json", "params": f"{path}-{int(epoch):04d}.params",
                 "onnx": f"{path}.onnx", "mxr": f"{path}.mxr"}
        cached.symbol.save(paths["symbol"])
        nd.save(paths["params"], cached.checkpoint_values())
        graph = cached.inference_graph()
        save_model(graph, paths["onnx"], opset)
        save_mxr(graph, paths["mxr"])
        return paths


class HybridSequential(ChildChain, HybridBlock):
    """Children called one after another; hybridizes as one graph."""

    def hybrid_forward(self, F, x, *args):
        del F
        return self._chain(x, args)


# -- the inputs' structure -------------------------------------------------------------------

_NONE, _ARRAY = -1, 0


def _input_kinds(inputs) -> tuple:
    """(any Symbol, any NDArray, the NDArrays' contexts) among nested inputs."""
    has_symbol, has_array, contexts = False, False, set()
    for value in inputs:
        if isinstance(value, (list, tuple)):
            symbol, array, inner = _input_kinds(value)
            has_symbol, has_array = has_symbol or symbol, has_array or array
            contexts |= inner
        elif isinstance(value, Symbol):
            has_symbol = True
        elif isinstance(value, NDArray):
            has_array = True
            contexts.add(value.ctx)
    return has_symbol, has_array, contexts


def _flatten(inputs) -> tuple:
    """(the arrays and Nones in order, the structure: one entry per input, ``0`` an array,
    ``-1`` None, ``(n, ...)`` a list of n)."""
    flat, form = [], []
    for value in inputs:
        if value is None:
            flat.append(None)
            form.append(_NONE)
        elif isinstance(value, (NDArray, Symbol)):
            flat.append(value)
            form.append(_ARRAY)
        elif isinstance(value, (list, tuple)):
            inner, inner_form = _flatten(value)
            flat.extend(inner)
            form.append((len(value), *inner_form))
        else:
            raise ValueError(f"a hybridized block's inputs are NDArrays, None or (nested) "
                             f"lists of them; got {value!r} of type {type(value).__name__}")
    return flat, tuple(form)


def _regroup(flat: list, form: tuple) -> list:
    values, position = [], 0
    for entry in form:
        if isinstance(entry, tuple):
            size = _flat_size(entry[1:])
            values.append(_regroup(flat[position:position + size], entry[1:]))
            position += size
        else:
            values.append(flat[position])
            position += 1
    return values


def _flat_size(form: tuple) -> int:
    return sum(_flat_size(e[1:]) if isinstance(e, tuple) else 1 for e in form)


def _flatten_outputs(outputs) -> tuple:
    """(the Symbols of a traced block's outputs in order, their structure): a Symbol is
    its output count; a (nested) list or tuple is ``(its type, its items' structures)``,
    so a block returning ``(out, [h, c])`` gets that shape back hybridized."""
    if isinstance(outputs, Symbol):
        return [outputs], len(outputs)
    if not isinstance(outputs, (list, tuple)):
        raise HybridizeError(f"a hybridized block returns Symbols or (nested) lists or "
                             f"tuples of them, got {type(outputs).__name__}")
    symbols, forms = [], []
    for item in outputs:
        inner, form = _flatten_outputs(item)
        symbols += inner
        forms.append(form)
    return symbols, (type(outputs), tuple(forms))


def _regroup_outputs(arrays: list, form, top: bool = True):
    """The arrays of a traced call in the structure ``_flatten_outputs`` recorded: one
    array for a one-output Symbol; a multi-output Symbol, or the outermost container, as a
    tuple (MXNet's multiple outputs); inner lists and tuples as they were."""
    if isinstance(form, int):
        return (arrays[0] if form == 1 and not top else tuple(arrays[:form])), form
    kind, forms = form
    items, used = [], 0
    for inner in forms:
        item, size = _regroup_outputs(arrays[used:], inner, top=False)
        items.append(item)
        used += size
    return (tuple(items) if top else kind(items)), used


def _input_names(flat: list) -> list:
    """MXNet's names for a traced block's inputs: ``data``, or ``data0``, ``data1``, ..."""
    return ["data"] if len(flat) == 1 else [f"data{i}" for i in range(len(flat))]


def _parameter_symbol(param) -> Symbol:
    """One Symbol per parameter per trace (a parameter shared by two blocks is one input)."""
    cache = _tracing.variables
    if cache is None:
        return param.var()
    if param.name not in cache:
        cache[param.name] = param.var()
    return cache[param.name]


# -- running the traced graph ---------------------------------------------------------------

class CachedGraph:
    """A traced block's Symbol and its compiled Sessions, one set per input signature."""

    def __init__(self, block: HybridBlock, symbol: Symbol, input_names: list, out_form):
        self.block, self.symbol, self.input_names = block, symbol, input_names
        self.out_form = out_form  # see _flatten_outputs
        self.single = out_form == 1
        params = block.collect_params()
        inputs = set(symbol.list_inputs())
        self.params = {name: p for name, p in params.items() if name in inputs}
        unknown = inputs - set(input_names) - set(self.params)
        if unknown:
            raise HybridizeError(f"{block.name}: the traced graph reads {sorted(unknown)}, "
                                 f"which are neither inputs nor parameters of the block")
        self.aux = symbol.list_auxiliary_states()
        self._compiled: dict = {}
        self.last_shapes = None

    def __call__(self, *args):
        arrays = self._check_inputs(args)
        with arrays[0].ctx.device.active():  # the runs, state writes and outputs go there
            ctx = arrays[0].ctx
            outputs = self._call_on(arrays, ctx)
            if op_hooks.wanted(self.block):
                op_hooks.report(self, self._compiled_for(arrays, ctx), arrays, ctx)
            return outputs

    def _call_on(self, arrays: list, ctx):
        params = list(self.params.values())
        values = [p.data(ctx) for p in params]
        for param, value in zip(params, values):
            if value.ctx != ctx:
                raise DeviceMismatchError(f"{self.block.name}: parameter {param.name!r} is on "
                                          f"{value.ctx}, the input on {ctx}; move one with "
                                          f"reset_ctx() or as_in_context()")
        feeds = {name: a._read() for name, a in zip(self.input_names, arrays)}
        feeds.update({p.name: v._read() for p, v in zip(params, values)})
        self.last_shapes = {n: tuple(a.shape) for n, a in zip(self.input_names, arrays)}
        recording = tape.needs_tape([*arrays, *values])
        training = autograd.is_training()
        if not recording and not (training and self._has_training_form()):
            session = self._compiled_for(arrays, ctx).inference(ctx)
            outputs = session.run_on_device(None, feeds_for(feeds, session))
            return self._wrap(outputs, ctx)
        wants = tuple(tape_nodes._parent_of(x) is not None and x.dtype.kind == "f"
                      for x in [*arrays, *values])
        pair = self._compiled_for(arrays, ctx).training(
            ctx, training, wants, [*self.input_names, *self.params])
        named = dict(zip(pair.forward.graph.output_names,
                         pair.forward.run_on_device(None, feeds_for(feeds, pair.forward))))
        for aux, output in pair.aux_updates.items():
            self.params[aux].raw()[...] = named[output]
        outputs = self._wrap([named[n] for n in pair.model_outputs], ctx)
        if recording and pair.backward is not None:
            self._record(pair, feeds, named, [*arrays, *values], outputs, ctx)
        return outputs

    def _check_inputs(self, args) -> list:
        if len(args) != len(self.input_names):
            raise InputError(f"{self.block.name} was traced with {len(self.input_names)} "
                             f"input(s); called with {len(args)}")
        for index, value in enumerate(args):
            if not isinstance(value, NDArray):
                raise InputError(f"{self.block.name}: input {index} is a "
                                 f"{type(value).__name__}; a hybridized block takes NDArrays")
        ctx = args[0].ctx
        for value in args[1:]:
            if value.ctx != ctx:
                raise DeviceMismatchError(f"{self.block.name}: inputs on {ctx} and "
                                          f"{value.ctx}; move one with as_in_context()")
        return list(args)

    def _has_training_form(self) -> bool:
        ops = {n.op for n in self.symbol._topological() if n.op}
        return bool(ops & {"BatchNormalization", "Dropout"})

    def _compiled_for(self, arrays, ctx) -> "_Compiled":
        key = (tuple((a.shape, a.dtype.str) for a in arrays), str(ctx))
        compiled = self._compiled.get(key)
        if compiled is None:
            shapes = {n: a.shape for n, a in zip(self.input_names, arrays)}
            dtypes = {n: a.dtype for n, a in zip(self.input_names, arrays)}
            for name, param in self.params.items():
                shapes[name], dtypes[name] = param.shape, param.dtype
            graph = self.symbol.to_graph(shapes=shapes, dtypes=dtypes)
            if len({d for d in dtypes.values() if np.dtype(d).kind == "f"}) > 1:
                graph = promote_mixed_floats(graph)  # as mixrt.nd promotes imperatively
            compiled = self._compiled[key] = _Compiled(graph, self.aux)
        return compiled

    def _wrap(self, outputs, ctx):
        wrapped = [NDArray(o, ctx) for o in outputs]
        return wrapped[0] if self.single else _regroup_outputs(wrapped, self.out_form)[0]

    def _record(self, pair, feeds, named, inputs, outputs, ctx) -> None:
        outs = [outputs] if self.single else list(outputs)
        meta = [(o.shape, o.dtype) for o in outs]
        saved = {**feeds, **{n: named[n] for n in pair.saved}}
        node = _CachedOpNode(self.block.name, pair, saved, inputs,
                             [*self.input_names, *self.params], ctx, meta)
        for index, output in enumerate(outs):
            output._entry = (node, index)

    def checkpoint_values(self) -> dict:
        """The graph's parameters as an MXNet checkpoint names them: ``arg:<name>``, or
        ``aux:<name>`` for auxiliary states (BatchNorm's running statistics)."""
        aux = set(self.aux)
        return {f"{'aux' if name in aux else 'arg'}:{name}": param._reduce()
                for name, param in self.params.items()}

    def inference_graph(self):
        """The graph with the parameters as initializers and any size along the block's
        free axes (the batch)."""
        free = self.block._free_axes
        shapes = {n: tuple(None if axis in free else d for axis, d in enumerate(s))
                  for n, s in self.last_shapes.items()}
        params = {name: p.data().asnumpy() for name, p in self.params.items()}
        return self.symbol.to_graph(params, shapes=shapes, name=self.block.name)


class _Compiled:
    """The Sessions of one input signature, made when first needed."""

    def __init__(self, graph, aux: list):
        self.graph, self.aux = graph, aux
        self._inference = None
        self._training: dict = {}
        self.op_hook_sessions: dict = {}  # is_train -> the op hook's Session (op_hooks)

    def inference(self, ctx):
        if self._inference is None:
            self._inference = Session(self.graph, device=str(ctx.device))
        return self._inference

    def training(self, ctx, train: bool, wants: tuple, names: list):
        """``wants[i]``: whether ``names[i]`` (inputs, then parameters) needs a gradient."""
        key = (train, wants)
        if key not in self._training:
            wrt = [n for n, w in zip(names, wants) if w]
            self._training[key] = TrainingPair(self.graph, wrt, self.aux,
                                               {"device": str(ctx.device)}, train=train)
        return self._training[key]


class _CachedOpNode(tape_nodes.Node):
    """A hybridized block on the tape: backward runs the compiled backward graph."""

    __slots__ = ("pair", "saved", "names")

    def __init__(self, name, pair, saved, inputs, names, ctx, meta):
        super().__init__(name, inputs, ctx, meta)
        self.pair, self.saved, self.names = pair, saved, names

    def _release_saved(self) -> None:
        self.pair = self.saved = None

    def input_grads(self, dys: list) -> list:
        pair = self.pair
        heads = {}
        for index, name in pair.seeded:
            dy = dys[index]
            heads[HEAD_GRAD.format(name)] = dy if dy is not None else \
                self.ctx.xp.zeros(*self.out_meta[index])
        feeds = {**self.saved, **heads}
        grads = pair.backward.run_on_device(None, feeds_for(feeds, pair.backward))
        by_name = dict(zip(pair.wrt, grads))
        return [by_name.get(name) for name in self.names]


# -- the error for values a trace cannot have ---------------------------------------------------

def value_needed(what: str) -> HybridizeError:
    """The error for a Symbol used where Python needs its value (bool, float, NumPy)."""
    site = _user_line()
    if not _tracing.blocks:
        return HybridizeError(f"a Symbol has no value until its graph runs; it cannot be "
                              f"{what} (at {site})")
    block = _tracing.blocks[-1]
    return HybridizeError(
        f"{type(block).__name__} {block.name!r} is hybridized, and its hybrid_forward "
        f"needs a tensor's value at {site}: the value is {what}. A traced graph has no "
        f"values, so Python control flow cannot depend on them. Fixes: compute both "
        f"branches and pick with F.Where(condition, a, b); or move the decision out of "
        f"hybrid_forward; or leave this block imperative (do not call hybridize() on it)")


def _user_line() -> str:
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/mixrt/" not in path or "/tests/" in path:
            source = f": `{frame.line.strip()}`" if frame.line else ""
            return f"{frame.filename}:{frame.lineno} in {frame.name}{source}"
    return "<unknown>"


symbol_module.value_error = value_needed  # Symbols name the traced block in their refusals
