"""Arena execution: every planned tensor of a run lives at a precomputed offset of one buffer.

For each input-shape signature the session makes an :class:`ExecutionPlan` once:

1. A *discovery* run executes the graph the plain way and records every value's shape and
   dtype. Shape inference runs too; a value whose observed shape inference also predicted is
   *static*, and only static slots are handed to kernels as ``out=`` (a kernel trusts ``out``
   to have the right shape). Values inference could not predict still get a slot, and a result
   is copied into it only when its shape matches what discovery saw.
2. Lifetimes: a node's outputs are written at its step and live until their last reader.
   Outputs of view ops (Reshape, Flatten, ...) get no slot of their own: they alias their
   input, whose life stretches to cover theirs. Values that stay outside the arena (sequences,
   strings, anything a kernel may return as a view of its inputs) stretch the life of every
   arena tensor they might reference, so no view ever outlives its memory. Graph outputs are
   the exception: one that views arena memory is copied out the moment it is made
   (``detached``), so it holds nothing. Otherwise a training graph, whose weight gradients
   are outputs computed from activations, would keep every activation to the end.
3. ``runtime.memory.plan_memory`` places the tensors; elementwise ops may write over an input
   whose last reader they are.

Graph outputs never live in the arena (the caller keeps them; the next run would overwrite
them), and an output that is a view of arena memory is copied before it is returned.

Arenas are pooled per plan: a run takes one, and returns it when done, so concurrent runs of
one session each get their own and a single-threaded service allocates exactly one.
"""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field
import math
from operator import itemgetter

import numpy as np

from mixrt.errors import ExecutionError, MixrtError
from mixrt.ops.ir.types import TensorType, type_of_value
from mixrt.ops import device_checks
from mixrt.ops.device import aligned_empty, to_host
from mixrt.runtime.graph import outer_scope_reads
from mixrt.runtime.memory import MemoryPlan, TensorLife, plan_memory
from mixrt.runtime.passes.infer import infer_types

# ops whose output (for a contiguous input) is a view of input 0
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "BlockGrad"})
# view ops whose output is input 0 reshaped: a planned run that knows the output's shape
# makes the view itself (``ExecutionPlan.reshapes``)
RESHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})

# ops whose kernels compute the output elementwise from same-shaped inputs through ufuncs with
# ``out=``, so the output may share its buffer with an input that dies here
INPLACE_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs",
    "Sqrt", "Clip", "Erf", "BatchNormalization", "FusedElementwise", "LRN",
})

# ops whose smaller output may start at the input's offset: their kernels finish reading each
# plane of the input before they write the part of the output that overlaps it
SHRINKING_INPLACE_OPS = frozenset({"MaxPool", "AveragePool"})

# ops whose outputs are not a function of their inputs alone: never frozen per signature
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
    "Multinomial", "Dropout",
})


@dataclass
class Slot:
    offset: int
    shape: tuple
    dtype: np.dtype
    static: bool  # shape predicted by inference: safe to pass as ``out=``

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass
class ExecutionPlan:
    signature: tuple
    memory: MemoryPlan
    slots: dict[str, Slot]  # value name -> slot
    steps: list  # the bound nodes a planned run executes (frozen ones left out)
    frozen: dict  # values fixed by the signature (shape arithmetic), computed once
    shared_outputs: frozenset  # graph outputs that may view arena or frozen memory
    detached: frozenset = frozenset()  # graph outputs copied out of the arena when made
    pool: list = field(default_factory=list)  # idle arenas
    # GPU plans: id(step) -> {input index: host copy} of the fixed inputs a step only reads
    # on the host (host_copies)
    host_args: dict = field(default_factory=dict)
    # CPU plans: whether a run wakes the native worker threads as it starts (its kernels
    # may split their work over them)
    wakes_workers: bool = True
    # view value -> its shape, for RESHAPE_OPS outputs whose shape inference predicted (so
    # every run of the signature has it): the host loop reshapes input 0 itself, ~0.4 us
    # against ~2-4 us through the kernel (which reads and checks the shape tensor each
    # run); a one-token GPT-2 step has 48 such Reshapes
    reshapes: dict = field(default_factory=dict)

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes


class Arena:
    """One buffer and, for every slot, a ready-made view into it; and the plan's steps as
    :func:`execute` calls them with this arena (made on its first run)."""

    def __init__(self, plan: ExecutionPlan, xp):
        size = max(plan.arena_bytes, 1)
        # the planner aligns offsets within the arena; on the host the arena itself must
        # start aligned for them to be (CuPy's allocations already are)
        self.buffer = aligned_empty(size) if xp is np else xp.empty(size, dtype=np.uint8)
        self.views = {name: _view(self.buffer, slot) for name, slot in plan.slots.items()}
        self.calls: list | None = None


def host_copies(plan: ExecutionPlan, constants: dict) -> dict:
    """For a GPU plan, the host copy of every input a step only reads on the host
    (``Kernel.host_inputs``: a Reshape's shape, an Unsqueeze's axes) that this signature
    fixes, an initializer or a frozen value: each read once here, instead of each run
    waiting for the device to hand it back."""
    copies: dict = {}
    for step in plan.steps:
        for index in step.host_inputs:
            name = step.inputs[index] if index < len(step.inputs) else ""
            value = plan.frozen.get(name, constants.get(name)) if name else None
            if hasattr(value, "shape"):
                copies.setdefault(id(step), {})[index] = to_host(value)
    return copies


def _view(buffer, slot: Slot):
    return buffer[slot.offset:slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)


def _views_input(node, observed: dict) -> bool:
    """Whether the node's first output is a view of its first input: a view op, or a
    gradient's SumToShapeOf whose input already has the shape it reduces to (autodiff emits
    one wherever it could not prove the shapes equal, as with a symbolic batch axis; its
    kernel then returns its input, and a slot of its own would only cost a copy: 17 of
    them, 12.5 ms of ResNet-18's training step at batch 32)."""
    if node.op_type in VIEW_OPS:
        return bool(node.inputs)
    if node.op_type != "SumToShapeOf" or node.domain != "mixrt" or len(node.inputs) < 2:
        return False
    grad, result = observed.get(node.inputs[0]), observed.get(node.outputs[0])
    return getattr(grad, "shape", None) is not None \
        and getattr(result, "shape", False) == grad.shape


def acquire(plan: ExecutionPlan, xp) -> Arena:
    # list.pop and list.append are atomic: two runs never take one arena
    try:
        return plan.pool.pop()
    except IndexError:
        return Arena(plan, xp)


def release(plan: ExecutionPlan, arena: Arena) -> None:
    plan.pool.append(arena)


# -- making a plan ---------------------------------------------------------------------------

def make_plan(signature: tuple, steps: list, graph_outputs: list[str], observed: dict,
              inferred: dict, frozen: dict, strategy: str, stored=(),
              plannable=None) -> ExecutionPlan:
    """``steps``: the bound nodes in order (each with ``.node`` and ``.reads``, the names it
    reads, outer-scope reads of its subgraphs included); ``observed``: name -> array from the
    discovery run; ``inferred``: name -> type from shape inference; ``stored``: plans a
    compiled model carries, used as they are when one was made for these very tensors.

    ``frozen`` (name -> value, from :class:`FrozenValues` run as inference's settle hook) are
    the values the signature alone fixes: their discovery results are kept and planned runs
    skip the nodes that make them."""
    plannable = plannable or _plannable_on_cpu
    steps = [step for step in steps if not all(n in frozen for n in step.node.outputs if n)]
    outputs = set(graph_outputs)
    slots: dict[str, Slot] = {}
    root: dict[str, str] = {}  # view value -> the slot it views
    holds: dict[str, frozenset] = {}  # non-arena value -> slots it may reference
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    inplace: list[tuple[str, str]] = []
    detached: set[str] = set()
    reshapes: dict[str, tuple] = {}

    def referenced(name: str) -> frozenset:
        if name in slots:
            return frozenset([name])
        if name in root:
            return frozenset([root[name]])
        return holds.get(name, frozenset())

    for index, step in enumerate(steps):
        node = step.node
        for name in step.reads:
            for target in referenced(name):
                last[target] = max(last[target], index)
        reads_slots = frozenset().union(*(referenced(n) for n in step.reads)) \
            if step.reads else frozenset()
        for position, name in enumerate(node.outputs):
            if not name:
                continue
            value = observed.get(name)
            if position == 0 and _views_input(node, observed) \
                    and node.inputs[0] in slots | root.keys() and name not in outputs:
                root[name] = root.get(node.inputs[0], node.inputs[0])
                if node.op_type in RESHAPE_OPS and node.domain in ("", "ai.onnx") \
                        and _predicted(inferred.get(name), value):
                    reshapes[name] = tuple(value.shape)
                continue
            if name in outputs and plannable(value) and not node.subgraphs():
                detached.add(name)  # copied out when made if it views the arena
                continue
            if name in outputs or not plannable(value) or node.subgraphs():
                holds[name] = reads_slots
                continue
            slots[name] = Slot(0, tuple(value.shape), np.dtype(value.dtype),
                               static=_predicted(inferred.get(name), value))
            first[name] = last[name] = index
            if node.op_type in INPLACE_OPS | SHRINKING_INPLACE_OPS:
                fits = _same_layout if node.op_type in INPLACE_OPS else _fits_inside
                inplace.extend((source, name) for source in node.inputs
                               if source in slots and fits(slots[source], slots[name]))
    end = len(steps)
    for name in graph_outputs:
        for target in referenced(name):
            last[target] = end
    lifetimes = [TensorLife(name, slot.nbytes, first[name], last[name])
                 for name, slot in slots.items()]
    memory = _stored_plan(stored, signature, lifetimes) or _smallest_plan(lifetimes, strategy,
                                                                          inplace)
    memory.signature = signature
    for name, slot in slots.items():
        slot.offset = memory.offsets[name]
    shared = frozenset(n for n in graph_outputs if referenced(n) or n in frozen)
    return ExecutionPlan(signature, memory, slots, steps, frozen, shared, frozenset(detached),
                         reshapes=reshapes)


class FrozenValues:
    """The values one input signature fixes, found while shape inference walks the graph (an
    ``infer_types`` settle hook): Shape/Size of a tensor whose shape inference predicted, and
    anything computed only from such values and constants. Typing them with their values
    lets inference see through a transformer's Shape -> Gather -> Concat -> Reshape chains,
    so the tensors after them get static slots (``out=`` buffers, in-place pairs)."""

    def __init__(self, steps, observed: dict, constants):
        self.reads = {id(step.node): step.reads for step in steps}
        self.observed = observed
        self.known = set(constants)
        self.values: dict = {}

    def __call__(self, node, types: dict) -> dict:
        if node.op_type in NONDETERMINISTIC_OPS or node.subgraphs():
            return {}
        if node.op_type in ("Shape", "Size") and not node.domain:
            source = node.inputs[0]
            value = self.observed.get(source)
            fixed = source in self.known or (hasattr(value, "shape")
                                             and _predicted(types.get(source), value))
        else:
            reads = self.reads.get(id(node), [n for n in node.inputs if n])
            fixed = all(name in self.known for name in reads)
        outputs = [n for n in node.outputs if n]
        if not (fixed and outputs and all(n in self.observed for n in outputs)):
            return {}
        self.known.update(outputs)
        found = {n: self.observed[n] for n in outputs}
        self.values.update(found)
        typed = {n: _on_host(v) for n, v in found.items()}
        return {n: v for n, v in typed.items() if v is not None}


# the largest device value the settle hook copies to the host to type it (shape arithmetic
# is a few ints; a frozen weight gains inference nothing)
_SETTLE_HOST_LIMIT = 4096


def _on_host(value):
    """A frozen value as inference can hold it: NumPy's as it is, a small device array
    copied to the host (once, at plan time), anything else None."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__cuda_array_interface__") and value.size <= _SETTLE_HOST_LIMIT:
        return to_host(value)
    return None


def _smallest_plan(lifetimes, strategy: str, inplace) -> MemoryPlan:
    """The planner places an in-place pair as one block of the input's size for both lives,
    so a shrinking pair (MaxPool over its input) can cost more than it saves: plan with all
    pairs, with same-size pairs only and with none, and keep the smallest arena."""
    sizes = {life.name: life.size for life in lifetimes}
    same_size = [(a, b) for a, b in inplace if sizes.get(a) == sizes.get(b)]
    plans = [plan_memory(lifetimes, strategy, inplace)]
    if len(same_size) < len(inplace):
        plans.append(plan_memory(lifetimes, strategy, same_size))
    if inplace:  # greedy by size can also place better without any pairs (DenseNet)
        plans.append(plan_memory(lifetimes, strategy, []))
    return min(plans, key=lambda plan: plan.arena_bytes)


def _stored_plan(stored, signature: tuple, lifetimes: list[TensorLife]) -> MemoryPlan | None:
    for memory in stored:
        if tuple(memory.signature) == signature and list(memory.lifetimes) == lifetimes:
            return memory
    return None


def _plannable_on_cpu(value) -> bool:
    return (isinstance(value, np.ndarray) and value.dtype != object and value.size > 0)


def plannable_on_gpu(value) -> bool:
    """CuPy arrays of CuPy's own dtypes (it has no bfloat16, float8 or int4)."""
    return (hasattr(value, "__cuda_array_interface__") and value.size > 0
            and value.dtype.kind in "biuf")


def _predicted(value_type, value) -> bool:
    return (isinstance(value_type, TensorType) and value_type.shape is not None
            and tuple(value_type.shape) == tuple(value.shape)
            and value_type.dtype is not None and np.dtype(value_type.dtype) == value.dtype)


def _same_layout(a: Slot, b: Slot) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype


def _fits_inside(source: Slot, output: Slot) -> bool:
    return source.dtype == output.dtype and output.nbytes <= source.nbytes


# -- running ---------------------------------------------------------------------------------

class Subgraph:
    """A GRAPH attribute as control-flow kernels see it: call it with the body's inputs and
    get its outputs; names it reads from enclosing graphs resolve in the scope it was made in.
    Subgraphs run the plain way (their shapes change from iteration to iteration)."""

    def __init__(self, bound, scope, xp):
        self._bound, self._scope, self._xp = bound, scope, xp
        self.graph = bound.graph  # its structure, for kernels that decide by it
        self.input_names = bound.graph.input_names
        self.output_names = bound.graph.output_names

    def infer(self, *input_types) -> list:
        """The body's output types given its inputs' types, the values it reads from
        enclosing graphs typed as they are now (for a loop that ran no iteration, whose
        scan outputs still need a shape)."""
        graph = self._bound.graph
        known = {name: type_of_value(self._scope[name]) for name in outer_scope_reads(graph)
                 if name in self._scope}
        types = infer_types(graph, known, inputs=dict(zip(self.input_names, input_types)))
        return [types.get(name) for name in self.output_names]

    def __call__(self, *values) -> list:
        if len(values) > len(self.input_names):
            raise ExecutionError(f"subgraph {self._bound.graph.name!r} takes "
                                 f"{len(self.input_names)} inputs, got {len(values)}")
        env = ChainMap(dict(zip(self.input_names, values)), self._bound.constants, self._scope)
        execute(self._bound.nodes, env, self._xp)
        return [env[name] for name in self.output_names]


def execute(steps, env, xp, arena: Arena | None = None, plan: ExecutionPlan | None = None,
            profiler=None) -> None:
    """Run the bound nodes ``steps`` in order, reading and writing ``env``; with an arena
    (``steps`` its plan's), planned outputs are written into (or copied into) their
    views."""
    if arena is not None and plan is not None:
        calls = _calls(arena, plan)
        if xp is np and profiler is None and not plan.host_args:
            _run_host_calls(calls, env, arena.buffer)
        else:
            _run_calls(calls, env, xp, arena.buffer, plan.host_args, profiler)
        return
    calls = [(step, step.inputs, step.attributes,
              tuple((name, None, False) for name in step.node.outputs), None)
             for step in steps]
    _run_calls(calls, env, xp, None, {}, profiler)


def _calls(arena: Arena, plan: ExecutionPlan) -> list:
    """The plan's steps as this arena runs them: (step, the names it reads, its
    attributes with ``out=`` its output's view when it has a static one, each output as
    (name, view or None, detached), and the step's form for :func:`_run_host_calls` (None
    where it needs the general loop's care: subgraphs, several outputs, absent inputs)).
    Working these out per node and run was ~1.5 us of the ~3.5 the run loop spent around
    each kernel."""
    if arena.calls is None:
        views, slots = arena.views, plan.slots
        calls = []
        for step in plan.steps:
            outputs = step.node.outputs
            first = outputs[0] if outputs else ""
            attributes = step.attributes
            if first in views and step.writes_into and slots[first].static:
                attributes = dict(attributes, out=views[first])
            placed = tuple((name, views.get(name), name in plan.detached) for name in outputs)
            form = _reshape_form(step, plan) if first in plan.reshapes \
                else _host_form(step, placed)
            calls.append((step, tuple(step.inputs), attributes, placed, form))
        arena.calls = calls
    return arena.calls


def _host_form(step, outputs):
    """(arity, the input names or their getter, output name, view, detached, node state) of
    a step the host loop runs on its own: every input present, no subgraph, and one named
    output, or several (a classifier's label and scores), which the form names by None
    with the outputs' (name, view, detached) where one output has its view."""
    names = tuple(step.inputs)
    if step.subgraphs or not outputs or not all(names):
        return None
    fetch = itemgetter(*names) if len(names) > 1 else (names[0] if names else None)
    if len(outputs) > 1:
        return len(names), fetch, None, outputs, False, node_state(step.attributes)
    name, view, detach = outputs[0]
    if not name:
        return None
    return len(names), fetch, name, view, detach, node_state(step.attributes)


def _reshape_form(step, plan):
    """The host loop's form of a reshape whose output shape the plan knows (arity -1: the
    input's name, the output's, and the shape where a plain form has its view). Such an
    output views an arena tensor, input 0, and is no graph output (make_plan): it has no
    slot and is never detached."""
    name = step.node.outputs[0]
    return -1, step.inputs[0], name, plan.reshapes[name], False, None


def node_state(attributes) -> dict | None:
    """The node's state dict (``_node``) when its kernel may leave a prepared call there:
    ``state["call"](xp, *inputs)``, set by the kernel's first call once it has turned its
    attributes into a model (ops/ir/node_state.py), runs the node from then on without
    passing the attributes again (a tree ensemble's twenty keyword arguments cost ~3 us a
    call to bind). Kernels that write into ``out=`` keep none."""
    state = attributes.get("_node")
    return state if state is not None and "out" not in attributes else None


def _run_host_calls(calls, env, buffer) -> None:
    """:func:`_run_calls` for a CPU arena run without a profiler or host copies: the same
    steps, results and errors, with each plain step's inputs fetched and output stored in
    a few bytecodes (a one-node model spent ~2 us of ~16 in the general loop)."""
    for call in calls:
        form = call[4]
        if form is None:
            _run_calls((call,), env, np, buffer, {}, None)
            continue
        step, _, attributes, _, _ = call
        arity, fetch, name, view, detach, state = form
        if arity < 0:  # a reshape of known shape (_reshape_form): view is that shape
            source = env.get(fetch)
            if source is not None and source.size == math.prod(view):
                env[name] = source.reshape(view)
            else:  # not what the plan saw: the kernel says why
                _run_calls((call,), env, np, buffer, {}, None)
            continue
        try:
            args = (env[fetch],) if arity == 1 else fetch(env) if arity else ()
        except KeyError as exc:
            raise _unread(step, exc) from None
        try:
            prepared = state.get("call") if state is not None else None
            result = step.fn(np, *args, **attributes) if prepared is None \
                else prepared(np, *args)
        except MixrtError:
            raise
        except Exception as exc:
            raise _failed(step, exc, args) from exc
        if name is None:  # several outputs: view holds each one's (name, view, detached)
            _store_outputs(view, result, env, buffer, np)
            continue
        if isinstance(result, tuple):
            if result:
                result = result[0]
            else:
                continue
        if detach:
            env[name] = _detached(result, buffer, np)
        elif view is None or result is view:
            env[name] = result
        else:
            env[name] = _placed(result, view)


def _store_outputs(outputs, values, env, buffer, xp) -> None:
    """A step's results into ``env``: each output's (name, view, detached) with its value
    (an output the node leaves unnamed is dropped)."""
    values = values if isinstance(values, tuple) else (values,)
    for (name, view, detach), value in zip(outputs, values):
        if detach:
            env[name] = _detached(value, buffer, xp)
        elif name:
            env[name] = value if view is None or value is view else _placed(value, view)


def _unread(step, exc: KeyError) -> ExecutionError:
    return ExecutionError(f"node {step.label!r} ({step.node.op_type}) reads "
                          f"{exc.args[0]!r}, which has no value")


def _run_calls(calls, env, xp, buffer, host_args, profiler) -> None:
    """:func:`execute` over its calls (an arena's, or made for a run without one)."""
    for step, inputs, attributes, outputs, _ in calls:
        try:
            args = [env[name] if name else None for name in inputs]
        except KeyError as exc:
            raise _unread(step, exc) from None
        if host_args:
            for index, value in host_args.get(id(step), {}).items():
                args[index] = value
        if step.subgraphs:
            attributes = dict(attributes)
            for key, sub in step.subgraphs.items():
                attributes[key] = ([Subgraph(s, env, xp) for s in sub] if isinstance(sub, list)
                                   else Subgraph(sub, env, xp))
        if profiler is not None:
            started = profiler.clock()
        result = _call(step, xp, args, attributes)
        values = result if isinstance(result, tuple) else (result,)
        _store_outputs(outputs, values, env, buffer, xp)
        if profiler is not None:
            profiler.kernel(step, started, args, values)


def _call(step, xp, args, attributes):
    if xp is not np:
        device_checks.at_node(step.label)
    state = node_state(attributes)
    prepared = state.get("call") if state is not None else None
    try:
        if prepared is not None:
            return prepared(xp, *args)
        return step.fn(xp, *args, **attributes)
    except MixrtError:
        raise
    except Exception as exc:
        raise _failed(step, exc, args) from exc


# an input whose values an infer function is shown when explaining a failure (Reshape's
# shape, Resize's scales), up to this many elements: a shape rule reads only small ones
VALUES_SHOWN = 4096


def _failed(step, exc, args=()) -> ExecutionError:
    """The error for a kernel that raised ``exc``: the op's own shape rule on the operands
    it was given, where that rule refuses them ("W has shape (2, 16, 5); expected ..."),
    then what the kernel raised (NumPy's "operands could not be broadcast ...")."""
    node = step.node
    where = f"node {step.label!r} ({node.domain or 'ai.onnx'}::{node.op_type}, opset {node.opset})"
    raised = f"{type(exc).__name__}: {exc}"
    problem = _shape_problem(node, args) if isinstance(exc, (ValueError, IndexError)) else None
    if problem and str(exc) in problem:  # the kernel ran the same rule
        return ExecutionError(f"{where} failed: {problem}")
    if problem:
        return ExecutionError(f"{where} failed: {problem} [the kernel raised {raised}]")
    return ExecutionError(f"{where} failed: {raised}")


def _shape_problem(node, args) -> str | None:
    """What the op's infer function refuses in the operands a run gave it (their shapes now
    static), as the load-time check (runtime/passes/typecheck.py) says it; None when it
    accepts them or cannot tell."""
    from mixrt.runtime.passes.typecheck import operand_shape_problem  # noqa: PLC0415
    types = {}
    for name, value in zip(node.inputs, args):
        if not name or value is None:
            continue
        value_type = type_of_value(value)
        if isinstance(value, np.ndarray) and value.size <= VALUES_SHOWN:
            value_type = TensorType(value_type.dtype, value_type.shape, value=value)
        types[name] = value_type
    try:
        return operand_shape_problem(node, types)
    except Exception:  # noqa: BLE001  (explaining a failure must not fail in its turn)
        return None


def _detached(value, buffer, xp):
    """A graph output that owns its memory: a copy when it may view the arena."""
    if xp is np and value.__class__ is np.ndarray and value.base is None:
        return value  # it owns its memory: a new array, no view of the arena
    share = getattr(xp, "may_share_memory", None)
    if share is None or share(value, buffer):
        return xp.array(value, copy=True)
    return value


def _placed(value, view):
    """The value as the run keeps it: in its arena view when it has one that fits."""
    if view is None or value is view:
        return value
    if getattr(value, "shape", None) == view.shape and value.dtype == view.dtype:
        view[...] = value
        return view
    return value  # a shape discovery did not see (data-dependent): keep the kernel's array


def feed_signature(feeds: dict) -> tuple:
    """What a memory plan depends on: each feed's shape and dtype (sequences by element)."""
    return tuple((name, _value_signature(value)) for name, value in sorted(feeds.items()))


def _value_signature(value):
    if value is None:
        return None
    if isinstance(value, dict):  # a map: its size sizes what is made from it (CastMap)
        return ("map", len(value))
    if isinstance(value, list):
        return ("seq",) + tuple(_value_signature(v) for v in value)
    return (tuple(value.shape), np.dtype(value.dtype).str)
