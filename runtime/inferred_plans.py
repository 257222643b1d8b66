"""Plans from shape inference: a new input shape planned without a discovery run.

A discovery run (``Session._discover``) executes the whole graph the plain way to see every
value's shape before the arena is planned; a service that sends a new sequence length or
batch with nearly every request paid it on nearly every request: a 6-layer BERT encoder
(hidden 384) ran a new length in ~2.3x the time of a length it had seen (2026-11-26).

Shape inference predicts those shapes without running a kernel, given the feeds' shapes
and the values fixed by them (Shape, Size and the arithmetic over them, which
:class:`ComputedFrozenValues` computes as inference reaches it). Inference is trusted for
an input signature's *form* (its feeds' ranks and dtypes: :func:`signature_form`) once a
discovery run of that form showed it predicted every value (:func:`inference_was_exact`):
from then on a new signature of that form is planned from inference alone, and its first
run is already a planned run. A model whose values inference cannot predict (data-dependent
shapes such as NonZero's, strings, sequences, control flow) keeps its discovery runs; so
does a form whose inference-planned run fails, which is then run and planned again the
discovery way (the error, where there is one, named as any run's).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from mixrt.base.settings import setting
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import UNKNOWN, TensorType
from mixrt.runtime.executor import Shaped, is_random, make_plan
from mixrt.runtime.lru import frozen
from mixrt.runtime.passes.infer import infer_attributes, refined
from mixrt.runtime.run_loop import call_step
from mixrt.runtime.shape_programs import ExactTypes, agrees, planned_names, trace


# -- trusting inference for a form ---------------------------------------------------------

def inference_was_exact(steps, observed: dict, inferred: dict, frozen: dict) -> bool:
    """Whether a discovery run saw only what inference predicted: every value a step made
    is a NumPy array of a native dtype whose shape and dtype inference gave (or a frozen
    value, which the planner computes itself), and no step runs a subgraph."""
    for step in steps:
        node = step.node
        if node.subgraphs():
            return False
        for name in node.outputs:
            if not name or name in frozen:
                continue
            value = observed.get(name)
            if value.__class__ is not np.ndarray or value.dtype == object \
                    or not _exact(inferred.get(name), value):
                return False
    return True


def _exact(value_type, value) -> bool:
    return isinstance(value_type, TensorType) and value_type.shape is not None \
        and tuple(value_type.shape) == value.shape and value_type.dtype is not None \
        and np.dtype(value_type.dtype) == value.dtype


# -- planning from inference ---------------------------------------------------------------

class ComputedFrozenValues:
    """:class:`~mixrt.runtime.executor.FrozenValues` without a discovery run: the values
    one input signature fixes (Shape and Size of a tensor whose shape inference knows, and
    every node over such values and constants only), computed by calling their kernels as
    :meth:`ShapeProgram.infer` reaches them, so inference sees through a transformer's
    Shape -> Gather -> Concat -> Reshape chains as it does after a discovery run.

    ``nodes``: the ids of the nodes the form's discovered plan froze, the only ones
    :class:`ShapeProgram` asks it for (which nodes are frozen follows from the graph, not
    the sizes); ``program``: the :class:`ShapeProgram` whose memo keeps the results by what
    they follow from (the op, its attributes and its arguments: :meth:`ShapeProgram.key`),
    across signatures and across nodes. Much of that arithmetic reads only what a new
    length leaves as it was, and every layer of a transformer repeats its neighbour's
    (each takes the Shape of hidden states of one shape): a PyTorch-exported RoBERTa of 5
    layers froze 174 nodes and called 127 of their kernels a new length, one layer's worth
    with the memo shared by op.

    A value this hook computed enters a memo key as its *token*: a number standing for
    its contents, given once when a kernel made it (:meth:`ShapeProgram.token`) and kept
    with the memo's entry, so that a result found in the memo hands its tokens on without
    its bytes being read again. Keys were built from each argument's shape, dtype and bytes
    at every node: ~8 us a frozen node, 0.6-0.9 ms of a 2-layer BERT's new length over its
    85 (2026-11-27)."""

    def __init__(self, steps, constants: dict, nodes: frozenset, program: "ShapeProgram"):
        self.table = program.frozen_table(steps, nodes, constants)
        self.constants = constants
        self.program = program
        self.values: dict = {}
        self.tokens: dict = {}  # name -> the token of a value computed here (None: no key)

    def typed(self, entry: tuple, types: dict) -> tuple | None:
        """``((name, type), ...)`` of the frozen node of ``entry`` (:meth:`ShapeProgram
        .frozen_table`), its values kept in :attr:`values`; None where they cannot be
        computed here (inference then types the node)."""
        step, source, inputs, outputs, op = entry
        program = self.program
        if source is not None:  # Shape or Size: what it reads is a shape
            found = self._known(source)
            if found is None:
                found = _shaped(types.get(source))
                if found is None:
                    return None
            key = (op, found.shape) if op is not None else None
            args = (found,)
        else:
            key = [op] if op is not None else None
            args = []
            for name, constant in inputs:
                if not name:
                    value = token = None
                elif constant is not None:
                    value, token = self.constants.get(name), constant
                else:
                    value = self.values.get(name)
                    if value is None:
                        return None
                    token = self.tokens.get(name)
                args.append(value)
                if key is not None:
                    if token is None and name:
                        key = None
                    else:
                        key.append(token)
            if key is not None:
                key = tuple(key)
        made = program.frozen_memo.get(key, _MISSING) if key is not None else _MISSING
        if made is _MISSING:
            made = _frozen_result(step, args, outputs, program)
            if key is not None:
                _remember(program.frozen_memo, key, made)
        if made is None:
            return None
        arrays, tokens, typed = made  # (kept by what they follow from, not by node)
        self.values.update(zip(outputs, arrays))
        self.tokens.update(zip(outputs, tokens))
        return tuple(zip(outputs, typed))

    def _known(self, name: str):
        value = self.values.get(name)
        return self.constants.get(name) if value is None else value


def _frozen_result(step, args: list, outputs: tuple, program: "ShapeProgram"):
    """(arrays, tokens, types) of one frozen node's kernel over ``args``, or None
    where a result is not a NumPy array. ``outputs``: its output names, in order (an
    unnamed output is dropped)."""
    args = [placeholder_of(arg) if arg.__class__ is Shaped else arg for arg in args]
    result = call_step(step, args)
    made = result if isinstance(result, tuple) else (result,)
    # a kernel over 0-d operands may answer a NumPy scalar (integer Div does): its array
    # (ShuffleNet's channel shuffle divides the channels so, and its new sizes took a
    # discovery run each for want of it)
    named = [np.asarray(value) if isinstance(value, np.generic) else value
             for value, name in zip(made, step.node.outputs) if name]
    if len(named) != len(outputs) or not all(isinstance(v, np.ndarray) for v in named):
        return None
    tokens = tuple(program.token(value) for value in named)
    typed = tuple(TensorType(value.dtype, tuple(value.shape), value=value) for value in named)
    return tuple(named), tokens, typed


_MISSING = object()


def _remember(memo: dict, key, value) -> None:
    """Keep ``value`` under ``key``, starting the memo over once it holds MEMO_ENTRIES (a
    service's recent sizes are what it holds then)."""
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = value


MEMO_ENTRIES = 8192  # frozen results a ShapeProgram keeps (a few hundred shapes' worth)
_MEMO_ELEMENTS = 64  # arguments up to this size enter a memo key by value
_KEYED_ATTRIBUTE_ELEMENTS = 256  # ops with longer list attributes (tree ensembles) get no key


MAX_PROGRAMS = 4  # shape programs a form keeps (a sequence of one, of more: two sets of guards)


@dataclass(frozen=True)
class TrustedForm:
    """What a form's discovered plan settled that its inferred plans take as they are: the
    in-place pairing and greedy order its placement chose (``placements.smallest_plan``,
    ``memory.plan_memory``), and the ids of the nodes it froze (the shape arithmetic)."""

    pairing: str
    order: int | None
    frozen: frozenset
    # the plans' structures (executor.PlanStructure), made once and kept for the next
    # signatures whose sizes answer their questions alike
    structures: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    # the form's shape programs (runtime/shape_programs.py), one per set of guards, and
    # the traces it may still make (one counter in a list: the dataclass is frozen)
    programs: list = field(default_factory=list, compare=False, hash=False, repr=False)
    traces_left: list = field(default_factory=lambda: [MAX_PROGRAMS + 1], compare=False,
                              hash=False, repr=False)
    # the discovered signature, and whether its programs were prepared before any new size
    # (runtime/prepared_forms.py)
    signature: tuple = field(default=(), compare=False, hash=False, repr=False)
    prepared: list = field(default_factory=lambda: [False], compare=False, hash=False,
                           repr=False)

    @classmethod
    def of(cls, plan, steps, frozen: dict) -> "TrustedForm":
        nodes = frozenset(id(step.node) for step in steps if any(step.node.outputs)
                          and all(name in frozen for name in step.node.outputs if name))
        return cls(plan.pairing or "all", plan.memory.order, nodes,
                   signature=tuple(plan.signature))


class ShapeProgram:
    """Shape inference of one graph, made ready once per session for the new shapes of its
    trusted forms: each node's infer function, the arguments it takes (its attributes,
    which inputs are optional) and its outputs, looked up once instead of per node and per
    signature (``passes/infer.py`` finds the kernel, builds the keyword arguments and types
    the bodies at every node: ~11 us a node, 4.4 ms of a 6-layer BERT's new length). It
    gives the types :func:`~mixrt.runtime.passes.infer.infer_types` gives for a graph
    without subgraphs whose inputs are typed by the feeds (``passes.infer.with_input_shapes``);
    the plans made from them are checked by their first run as any inferred plan.

    Inference is a function of the op, its attributes and its arguments' types: within one
    signature its results are kept by those, so the layers of a transformer, each of which
    types hidden states of one shape the way the last did, are typed once. They are not
    kept across signatures, where nearly every type has the new length in it: what they
    would have saved there (nothing measurable) was less than what ~80 more objects a new
    length for the cycle collector to walk would cost. The frozen values' kernels are kept
    across signatures (``frozen_memo``): a batch's arithmetic outlives a length, and their
    results are arrays and bytes, which the collector does not track."""

    def __init__(self, graph):
        self.start: dict = {name: TensorType(array.dtype, tuple(array.shape), value=array)
                            for name, array in graph.initializers.items()}
        # the arrays that live as long as the program: their ids may stand for them in keys
        self.lasting = {id(array) for array in graph.initializers.values()}
        self.inputs = [value for value in graph.inputs if value.name not in graph.initializers]
        self.outputs = [(value.name, value.type) for value in graph.outputs
                        if value.type is not None]
        self.keys: dict = {}  # id(node) -> the op's key (key)
        self._ops: dict = {}  # op and attributes -> a small int standing for them
        self.nodes = [_node_entry(node) + (self.key(node),) for node in graph.nodes]
        self.frozen_memo: dict = {}
        self._contents: dict = {}  # a small value's (shape, dtype, bytes) -> its token
        self._next_token = itertools.count()
        self._tables: dict = {}  # a form's frozen node ids -> frozen_table's answer

    def token(self, value: np.ndarray):
        """A number standing for a small array's contents (equal numbers, equal contents),
        or None for a large array or one of objects (it enters no memo key). Numbers are
        never given twice, so a token outlives the memo's starting over."""
        if value.size > _MEMO_ELEMENTS or value.dtype == object:
            return None
        contents = (value.shape, value.dtype.str, value.tobytes())
        found = self._contents.get(contents)
        if found is None:
            if len(self._contents) >= MEMO_ENTRIES:
                self._contents.clear()
            found = self._contents[contents] = next(self._next_token)
        return found

    def frozen_table(self, steps, nodes: frozenset, constants: dict) -> dict:
        """id(node) -> (step, the name a Shape or Size reads or None, ((input, its key
        where it is a constant, else None), ...), output names, op key) for each of
        ``nodes`` whose values :class:`ComputedFrozenValues` computes: made once per form,
        where each new signature looked its steps up again."""
        found = self._tables.get(nodes)
        if found is None:
            found = self._tables[nodes] = _frozen_entries(steps, nodes, constants, self)
        return found

    def key(self, node):
        """A small int for what the node computes apart from its arguments: its domain, op,
        opset and attributes; equal for two nodes that compute the same function. None for
        ops whose attributes are large (a tree ensemble's) or cannot be hashed."""
        found = self.keys.get(id(node), _MISSING)
        if found is _MISSING:
            found = self.keys[id(node)] = self._op_key(node)
        return found

    def _op_key(self, node):
        attributes = node.attributes
        for value in attributes.values():
            if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) \
                    and len(value) > _KEYED_ATTRIBUTE_ELEMENTS:
                return None
        try:
            op = (node.domain, node.op_type, node.opset, len(node.outputs),
                  frozen(attributes))
            return self._ops.setdefault(op, len(self._ops))
        except TypeError:  # an attribute that cannot be hashed: the node is typed alone
            return None

    def infer(self, feeds: dict, settle: ComputedFrozenValues) -> dict:
        """Name -> type for the graph over ``feeds``' shapes. ``settle`` computes the values
        of its frozen nodes (``settle.table``), whose infer functions are not asked: their
        values type them (half of a PyTorch-exported BERT's nodes, some of whose infer
        functions raise over the unknowns they were meant for)."""
        types = dict(self.start)
        for value in self.inputs:
            fed = feeds.get(value.name)
            types[value.name] = TensorType(np.dtype(fed.dtype), tuple(fed.shape)) \
                if hasattr(fed, "shape") else value.type
        memo: dict = {}
        table = settle.table
        for node, infer, inputs, attributes, outputs, op in self.nodes:
            entry = table.get(id(node))
            if entry is not None:
                settled = settle.typed(entry, types)
                if settled:
                    types.update(settled)
                    continue
            arguments = [_argument(types, name, optional) for name, optional in inputs]
            key = self._infer_key(op, arguments) if infer is not None else None
            inferred = memo.get(key) if key is not None else None
            if inferred is None:
                inferred = _inferred(infer, arguments, attributes)
                if key is not None:
                    memo[key] = inferred
            for name, value_type in zip(outputs, inferred):
                if name:
                    types[name] = value_type
        for name, declared in self.outputs:
            types[name] = refined(declared, types.get(name))
        return types

    def _infer_key(self, op, arguments: list):
        """What an infer function's answer follows from: the op's key and each argument's
        dtype, shape and value (a small one by its bytes, an initializer by its id); None
        where an argument is none of those (not kept)."""
        if op is None:
            return None
        key = [op]
        for argument in arguments:
            if argument.__class__ is not TensorType:
                if argument is not None and argument is not UNKNOWN:
                    return None
                key.append(argument)
                continue
            value = argument.value
            if value is None:
                key.append((argument.dtype, argument.shape))
            elif isinstance(value, np.ndarray) and value.size <= _MEMO_ELEMENTS \
                    and value.dtype != object:
                key.append((argument.dtype, argument.shape, value.tobytes()))
            elif id(value) in self.lasting:
                key.append((argument.dtype, argument.shape, id(value)))
            else:
                return None
        key = tuple(key)
        try:
            hash(key)
        except TypeError:  # a shape of unhashable dims
            return None
        return key


def _frozen_entries(steps, nodes: frozenset, constants: dict, program: ShapeProgram) -> dict:
    entries = {}
    for step in steps:
        node = step.node
        outputs = tuple(name for name in node.outputs if name)
        if id(node) not in nodes or not outputs or is_random(node) \
                or step.subgraphs:
            continue
        shape_of = node.op_type in ("Shape", "Size") and not node.domain
        source = node.inputs[0] if shape_of else None
        # a constant enters keys as its token where small (each layer's own Gather index
        # is another initializer of the same value), else by name
        inputs = () if shape_of else tuple(
            (name, _constant_key(name, constants, program) if name in constants else None)
            for name in step.inputs)
        entries[id(node)] = (step, source, inputs, outputs, program.key(node))
    return entries


def _constant_key(name: str, constants: dict, program: ShapeProgram):
    value = constants[name]
    token = program.token(value) if isinstance(value, np.ndarray) else None
    return ("constant", name) if token is None else token


def _inferred(infer, arguments: list, attributes: dict) -> tuple:
    try:
        return tuple(infer(*arguments, **attributes)) if infer is not None else ()
    except Exception:  # noqa: BLE001  (an infer function that cannot say says nothing)
        return ()


def _argument(types: dict, name: str, optional: bool):
    """As ``passes/infer._input_type``: None for an absent input, UNKNOWN for an optional
    one inference has no type for."""
    if not name:
        return None
    found = types.get(name)
    return UNKNOWN if found is None and optional else found


def _node_entry(node) -> tuple:
    kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
    if kernel is None or kernel.infer_fn is None:
        return node, None, [], {}, node.outputs
    inputs = [(name, kernel.infers_optional_input(index)) for index, name in
              enumerate(node.inputs)]
    return node, kernel.infer_fn, inputs, infer_attributes(kernel, node), node.outputs


def _shaped(value_type) -> Shaped | None:
    """What the planner reads of a value inference typed (its shape and dtype), or None
    where inference left either open or the dtype is one an arena cannot hold."""
    if value_type.__class__ is not TensorType or value_type.shape is None \
            or value_type.dtype is None:
        return None
    shape = value_type.shape
    for dim in shape:
        if dim.__class__ is not int and not isinstance(dim, np.integer) or dim < 0:
            return None
    dtype = np.dtype(value_type.dtype)
    return None if dtype == object else Shaped(tuple(int(d) for d in shape), dtype)


def placeholder_of(shaped: Shaped) -> np.ndarray:
    """An array of ``shaped``'s shape and dtype with no memory of its own (every element
    the same one), for the kernels of Shape and Size, which read nothing else."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, shaped.dtype), shaped.shape,
                                           (0,) * len(shaped.shape), writeable=False)


def plan_from_inference(signature: tuple, steps, graph_outputs: list[str], inferred: dict,
                        frozen: dict, strategy: str, stored=(), form: "TrustedForm" = None):
    """The plan :func:`~mixrt.runtime.executor.make_plan` makes after a discovery run, from
    ``inferred`` types (and the ``frozen`` values :class:`ComputedFrozenValues` computed)
    instead of a run's values; None where inference left a value open."""
    seen: dict = dict(frozen)
    for step in steps:
        if step.subgraphs:
            return None
        for name in step.node.outputs:
            if name and name not in seen:
                value = _shaped(inferred.get(name))
                if value is None:
                    return None
                seen[name] = value
    return make_plan(signature, steps, graph_outputs, seen, inferred, frozen, strategy,
                     stored=stored, pairing=form.pairing if form else None,
                     order=form.order if form else None,
                     structures=form.structures if form else None, from_inference=True)


def plan_from_program(signature: tuple, steps, graph_outputs: list[str], observed: dict,
                      frozen: dict, strategy: str, stored, form: TrustedForm):
    """:func:`plan_from_inference` from a shape program's answer (``observed``: name ->
    Shaped for every planned value; ``frozen``: name -> array), which types every value
    exactly as inference would (``runtime/shape_programs.py``)."""
    seen = dict(frozen)
    seen.update(observed)
    return make_plan(signature, steps, graph_outputs, seen, ExactTypes(seen), frozen, strategy,
                     stored=stored, pairing=form.pairing, order=form.order,
                     structures=form.structures, from_inference=True)


def plan_for_form(form: TrustedForm, signature: tuple, feeds: dict, program: ShapeProgram,
                  bound, graph_outputs: list[str], strategy: str, stored=()):
    """The plan of a new signature of a trusted form: from the first of the form's shape
    programs whose guards hold (``runtime/shape_programs.py``), else from concrete
    inference (``program``), after which the form's programs learn from what it gave: a
    program is traced at the first such signature, and trusted once it agreed with
    inference at another. ``MIXRT_SHAPE_PROGRAMS=0`` leaves every signature to concrete
    inference (to tell the programs' part in a run, or to rule them out)."""
    candidate = answer = None
    enabled = setting("MIXRT_SHAPE_PROGRAMS", "1") != "0"
    for index, made in enumerate(form.programs if enabled else ()):
        answer = made.evaluate(signature)
        if answer is not None:
            candidate = made
            if index:  # the program of the sizes a service sends most is asked first
                _move_first(form.programs, made)
            break
    if candidate is not None and candidate.confirmed:
        return plan_from_program(signature, bound.nodes, graph_outputs, *answer, strategy,
                                 stored, form)
    settle = ComputedFrozenValues(bound.nodes, bound.constants, form.frozen, program)
    inferred = program.infer(feeds, settle)
    plan = plan_from_inference(signature, bound.nodes, graph_outputs, inferred,
                               settle.values, strategy, stored=stored, form=form)
    if plan is not None and enabled:
        _learn(form, candidate, answer, bound, signature, inferred, settle.values)
    return plan


def _learn(form: TrustedForm, candidate, answer, bound, signature: tuple, inferred: dict,
           frozen: dict) -> None:
    if candidate is not None:  # its guards held: confirmed, or dropped with the form's tries
        if agrees(answer, inferred, frozen):
            candidate.confirmed = True
        else:
            form.traces_left[0] = 0
            _move_first(form.programs, candidate, keep=False)
        return
    if form.traces_left[0] <= 0 or len(form.programs) >= MAX_PROGRAMS:
        return
    form.traces_left[0] -= 1
    made = trace(bound.nodes, bound.constants, signature, inferred, frozen,
                 planned_names(bound.nodes, frozen))
    if made is not None:
        form.programs.append(made)


def _move_first(programs: list, program, keep: bool = True) -> None:
    """``program`` moved to the front of ``programs`` (or dropped), as another thread
    planning a signature of the same form may have moved or dropped it already."""
    try:
        programs.remove(program)
    except ValueError:
        return
    if keep:
        programs.insert(0, program)
