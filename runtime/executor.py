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

The arenas themselves, their pools and the memory they lie on are ``runtime/arenas.py``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from mixrt.base.settings import batch_invariant
from mixrt.ops.compiled.worker_wakes import WakeChoice
from mixrt.ops.ir.registry import (IN_PLACE, REGISTRY, RESHAPE, SHRINKING_IN_PLACE, SLICES,
                                   VIEWS)
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import to_host
from mixrt.runtime.concat_in_place import (composite_lives, concat_composites,
                                           concat_in_place, lay_out)
from mixrt.runtime.memory import MemoryPlan, TensorLife
from mixrt.runtime.placements import smallest_plan, stored_plan
from mixrt.runtime.passes.transposed_operands import swaps_last_two, takes_transposed

# a graph output of up to this many bytes whose shape inference predicted gets a slot like
# any tensor (its node then writes into the arena: the bound, replayed call) and is copied
# out as the run returns it; a larger one is made by its kernel, copying it would cost more.
# A node without ``out=`` took its kernel's full route on every run: BERT h64's last
# LayerNorm and pooler 28 and 19 us of a 210 us run, their bound calls ~3 each
ARENA_OUTPUT_BYTES = 1 << 16


# -- what an op may do with memory ---------------------------------------------------------
# declared where its kernel is registered (``@op(..., memory=IN_PLACE)``, ops/ir/registry.py),
# read here for each node of a plan


def memory_of(node) -> str | None:
    return REGISTRY.memory_of(node.domain, node.op_type)


def is_random(node) -> bool:
    """Whether the node's outputs are not a function of its inputs alone (random draws):
    never frozen per signature."""
    return REGISTRY.is_random(node.domain, node.op_type)


class Shaped:
    """What a plan reads of a value (shape, dtype, size, bytes) where it is made without the
    value itself: a plan from shape inference (``runtime/inferred_plans.py``)."""

    __slots__ = ("shape", "dtype", "size", "nbytes")

    def __init__(self, shape: tuple, dtype: np.dtype):
        self.shape, self.dtype = shape, dtype
        self.size = math.prod(shape)
        self.nbytes = self.size * dtype.itemsize


def _is_array(value) -> bool:
    return value.__class__ is np.ndarray or value.__class__ is Shaped


class Slot(NamedTuple):
    """Where a planned value lives in the arena (a plan keeps them as :class:`Slots`)."""

    offset: int
    shape: tuple
    dtype: np.dtype
    static: bool  # shape predicted by inference: safe to pass as ``out=``

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class Lifetimes(Sequence):
    """A kept plan's lifetimes (``MemoryPlan.lifetimes``) as tuples of plain values, which
    the cycle collector stops tracking, read back as :class:`TensorLife`: a service keeps
    hundreds of plans, each with a lifetime a planned value (a 5-layer RoBERTa's ~140),
    and every full collection walked them (NamedTuples stay tracked; plain tuples do not)."""

    __slots__ = ("_lives",)

    def __init__(self, lives):
        self._lives = tuple(tuple(life) for life in lives)

    def __len__(self) -> int:
        return len(self._lives)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [TensorLife._make(life) for life in self._lives[index]]
        return TensorLife._make(self._lives[index])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Lifetimes({list(self)!r})"


class Slots(Mapping):
    """A plan's slots by value name, kept as tuples of plain values, which the cycle
    collector stops tracking, and read back as :class:`Slot`: a service keeps hundreds of
    plans, each with a slot a planned value (a 5-layer RoBERTa's ~140), and every full
    collection walked them (with the lifetimes, :class:`Lifetimes`, 274 of the 440
    tracked objects a plan held, 2026-11-27; NamedTuples stay tracked)."""

    __slots__ = ("_raw",)

    def __init__(self, slots: dict):
        self._raw = {name: tuple(slot) for name, slot in slots.items()}

    @classmethod
    def of_tuples(cls, raw: dict) -> "Slots":
        """From name -> (offset, shape, dtype, static) as they are kept."""
        made = cls.__new__(cls)
        made._raw = raw
        return made

    def tuples(self):
        """(name, (offset, shape, dtype, static)) for every slot, without making Slots."""
        return self._raw.items()

    def __getitem__(self, name: str) -> Slot:
        return Slot._make(self._raw[name])

    def __contains__(self, name) -> bool:
        return name in self._raw

    def __iter__(self):
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


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
    # may split their work over them), and, where it finds them asleep, what its runs
    # learned of waking them (ops/compiled/worker_wakes.py)
    wakes_workers: bool = True
    wake_choice: WakeChoice = field(default_factory=WakeChoice)
    # view value -> its shape, for RESHAPE outputs (of arena tensors, or of values the
    # arena does not hold, such as strings) whose shape inference predicted (so
    # every run of the signature has it): the host loop reshapes input 0 itself, ~0.4 us
    # against ~2-4 us through the kernel (which reads and checks the shape tensor each
    # run); a one-token GPT-2 step has 48 such Reshapes
    reshapes: dict = field(default_factory=dict)
    # values that view an arena tensor without a slot of their own (the outputs of VIEW and
    # RESHAPE ops, transposed MatMul operands, Split's parts): made again each run, over the
    # same memory
    views: frozenset = frozenset()
    # planned from shape inference, without a discovery run, and not yet run once
    # (runtime/inferred_plans.py): its first run falls back to a discovery run if it fails
    unproven: bool = False
    # the in-place pairs the placement kept (placements.smallest_plan): all, same size, none
    pairing: str | None = None
    # when a run last took one of its arenas (acquire): which plans trim_idle_calls spares
    used: int = 0
    # made by Session.wait_compiled's runs on zeros (a ladder's batch sizes): its calls are
    # kept whenever it last ran (trim_idle_calls), and its making trims no other plan's
    prepared: bool = False
    # [its steps' call templates, or None until a first arena needs them]: shared by the
    # plans of one PlanStructure (runtime/call_forms.py)
    call_templates: list = field(default_factory=lambda: [None])

    @property
    def arena_bytes(self) -> int:
        return self.memory.arena_bytes


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


def _views_input(node, observed: dict) -> bool:
    """Whether the node's first output is a view of its first input: a view op, or a
    gradient's SumToShapeOf whose input already has the shape it reduces to (autodiff emits
    one wherever it could not prove the shapes equal, as with a symbolic batch axis; its
    kernel then returns its input, and a slot of its own would only cost a copy: 17 of
    them, 12.5 ms of ResNet-18's training step at batch 32)."""
    if memory_of(node) in VIEWS:
        return bool(node.inputs)
    if node.op_type != "SumToShapeOf" or node.domain != "mixrt" or len(node.inputs) < 2:
        return False
    grad, result = observed.get(node.inputs[0]), observed.get(node.outputs[0])
    return getattr(grad, "shape", None) is not None \
        and getattr(result, "shape", False) == grad.shape


def _transposed_operands(steps, outputs: set) -> frozenset:
    """Outputs of Transposes that swap the last two axes and are read only as a MatMul's
    second operand (attention's ``Q @ K^T``): planned as views, so the product reads K
    transposed in place. A decoder step's copy of its key cache, (1, 4, 513, 64) into (1, 4,
    64, 513), took 81 us of NumPy's strided copy where the product itself takes ~9, and for
    the scores of a whole sequence the BLAS on the view was as fast as the copy and the
    panels (2 x 4 heads of 128 x 64: 209 against 204 us; 1 x 12: 253 against 288)."""
    swapped = {node.outputs[0] for node in (step.node for step in steps)
               if node.op_type == "Transpose" and node.domain in ("", "ai.onnx")
               and node.outputs and node.outputs[0] not in outputs
               and swaps_last_two(node.attributes.get("perm"))}
    for step in steps:
        for name in swapped & set(step.reads):
            if not takes_transposed(step.node, name):
                swapped.discard(name)
    return frozenset(swapped)


def _views_part(node) -> bool:
    """Whether every output of the node is a view of a part of its first input: Split's
    slices (a slot of their own cost a copy each; GPT-2's fused q, k, v: three a layer)."""
    return memory_of(node) == SLICES and bool(node.inputs)


# -- making a plan ---------------------------------------------------------------------------

def make_plan(signature: tuple, steps: list, graph_outputs: list[str], observed: dict,
              inferred: dict, frozen: dict, strategy: str, stored=(),
              plannable=None, pairing: str | None = None,
              order: int | None = None, structures: dict | None = None,
              from_inference: bool = False) -> ExecutionPlan:
    """``steps``: the bound nodes in order (each with ``.node`` and ``.reads``, the names it
    reads, outer-scope reads of its subgraphs included); ``observed``: name -> array from the
    discovery run; ``inferred``: name -> type from shape inference; ``stored``: plans a
    compiled model carries, used as they are when one was made for these very tensors.

    ``frozen`` (name -> value, from :class:`FrozenValues` run as inference's settle hook) are
    the values the signature alone fixes: their discovery results are kept and planned runs
    skip the nodes that make them. ``pairing``, ``order``: the in-place pairing and the
    greedy order to place with (:func:`~mixrt.runtime.placements.smallest_plan`; by default those that give the
    smallest arena). ``structures``: where a form's new signatures keep the plan's
    :class:`PlanStructure`, reused while its size-dependent answers hold.
    ``from_inference``: ``observed`` holds inference's own shapes (:class:`Shaped`), so a
    yes to whether such a value was predicted, or to whether it is plannable where it has
    elements, holds as it held (:meth:`PlanStructure.holds_for`)."""
    plannable = plannable or _plannable_on_cpu
    kept = None if structures is None else structures.setdefault(frozenset(frozen), [])
    structure = next((made for made in kept
                      if made.holds_for(observed, inferred, plannable, from_inference)),
                     None) if kept else None
    if structure is None:
        structure = plan_structure(signature, steps, graph_outputs, observed, inferred,
                                   frozen, plannable)
        if kept is not None:
            if len(kept) >= MAX_STRUCTURES:
                kept.pop(0)
            kept.append(structure)
    return structure.plan(signature, observed, frozen, strategy, stored, pairing, order)


MAX_STRUCTURES = 8  # a form's structures kept per set of frozen values


@dataclass
class PlanStructure:
    """What :func:`make_plan` decides before any size: which steps run, which values get a
    slot (with the steps that write and last read each), which are views, held outside the
    arena or detached, the in-place candidates, and the answers about sizes those decisions
    took (``probes``: a value planned at all, a graph output small enough for the arena, a
    SumToShapeOf that views its input). A new signature of a form whose answers are the
    same has the same structure: only the slots' shapes, the sizes and the placement are
    its own (with the placement of :func:`~mixrt.runtime.memory.plan_memory`'s neighbour
    scan, a 5-layer RoBERTa's plan of a new length went from ~2.6 to ~1.2 ms)."""

    steps: list
    slots: list  # (name, first, last, static) in planning order
    candidates: list  # (source, output, whether the output must have the source's layout)
    reshapes: tuple  # names whose views the host loop reshapes (ExecutionPlan.reshapes)
    views: frozenset
    detached: frozenset
    shared: frozenset
    probes: list  # (kind, step, name, answer)
    # Concats whose inputs the plan lays inside their output: (output, its inputs in order)
    composites: tuple = ()
    # the probes, graph outputs' sizes first (holds_for's order for plans from inference)
    _outputs_first: list | None = field(default=None, repr=False, compare=False)
    # pairing -> its kept placement, the offsets of new sizes (runtime/placements.py)
    stackings: dict = field(default_factory=dict, repr=False, compare=False)
    # its plans' call templates (ExecutionPlan.call_templates), made by the first to run
    call_templates: list = field(default_factory=lambda: [None], repr=False, compare=False)

    def holds_for(self, observed: dict, inferred: dict, plannable,
                  from_inference: bool = False) -> bool:
        """Do this structure's answers hold for these values? ``from_inference`` (see
        :func:`make_plan`): the sizes of graph outputs are asked first (a form's
        structures differ there, and asking all ~310 of a 5-layer RoBERTa's answers of
        the wrong one first cost ~0.3 ms of a new length's plan; 2026-11-27), and a yes to
        whether inference predicted a value it shaped, or to whether such a value with
        elements is plannable on the CPU, holds without being asked."""
        if not from_inference:
            return all(_probe(kind, step, name, observed, inferred, plannable) == answer
                       for kind, step, name, answer in self.probes)
        probes = self._outputs_first
        if probes is None:
            probes = self._outputs_first = sorted(
                self.probes, key=lambda probe: probe[0] != "arena output")
        on_cpu = plannable is _plannable_on_cpu
        for kind, step, name, answer in probes:
            if answer and (kind == "predicted" or kind == "plannable" and on_cpu):
                value = observed.get(name)
                if value.__class__ is Shaped and value.size > 0:
                    continue
            if _probe(kind, step, name, observed, inferred, plannable) != answer:
                return False
        return True

    def plan(self, signature: tuple, observed: dict, frozen: dict, strategy: str, stored,
             pairing: str | None, order: int | None) -> ExecutionPlan:
        # each slot made once, at its offset (they were made, then remade at it: ~0.1 ms
        # of a 2-layer BERT's new length)
        inplace = [(source, name) for source, name, same in self.candidates
                   if (_same_layout if same else _fits_inside)(observed[source],
                                                                observed[name])]
        inside, starts = composite_lives(self.composites, self.slots)
        lifetimes = [TensorLife(name, observed[name].nbytes, starts.get(name, first), last)
                     for name, first, last, _ in self.slots if name not in inside]
        memory = stored_plan(stored, signature, lifetimes)
        if memory is None:
            memory, pairing = smallest_plan(lifetimes, strategy, inplace, pairing, order,
                                            self.stackings)
        memory.signature = signature
        offsets = memory.offsets
        if inside:  # each input its slice of its output
            offsets = dict(offsets)
            lay_out(self.composites, offsets, observed)
        slots = {}
        for name, _, _, static in self.slots:
            value = observed[name]
            slots[name] = (offsets[name], tuple(value.shape), value.dtype, static)
        slots = Slots.of_tuples(slots)
        memory.lifetimes = Lifetimes(memory.lifetimes)
        reshapes = {name: tuple(observed[name].shape) for name in self.reshapes}
        return ExecutionPlan(signature, memory, slots, self.steps, frozen, self.shared,
                             self.detached, reshapes=reshapes, views=self.views,
                             pairing=pairing, call_templates=self.call_templates)


def _probe(kind: str, step, name: str, observed: dict, inferred: dict, plannable) -> bool:
    """One size-dependent answer :func:`plan_structure` takes about value ``name``."""
    value = observed.get(name)
    if kind == "views input":
        return _views_input(step.node, observed)
    if kind == "predicted":
        return _predicted(inferred.get(name), value)
    if kind == "plannable":
        return plannable(value)
    if kind == "concat in place":
        return concat_in_place(step.node, observed)
    return _arena_output(step, value, inferred.get(name))  # "arena output"


def plan_structure(signature: tuple, steps: list, graph_outputs: list[str], observed: dict,
                   inferred: dict, frozen: dict, plannable) -> PlanStructure:
    """:func:`make_plan`'s decisions over these values, and the size answers they took."""
    probes: list = []

    def ask(kind: str, step, name: str) -> bool:
        answer = _probe(kind, step, name, observed, inferred, plannable)
        probes.append((kind, step, name, answer))
        return answer

    steps = [step for step in steps if not all(n in frozen for n in step.node.outputs if n)]
    outputs = set(graph_outputs)
    fed = {name for name, _ in signature}
    operand_views = _transposed_operands(steps, outputs)
    slots: dict[str, bool] = {}  # planned value -> static
    root: dict[str, str] = {}  # view value -> the slot it views
    holds: dict[str, frozenset] = {}  # non-arena value -> slots it may reference
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    candidates: list[tuple[str, str, bool]] = []
    detached: set[str] = set()
    reshapes: list[str] = []

    def referenced(name: str) -> frozenset:
        if name in slots:
            return frozenset([name])
        if name in root:
            return frozenset([root[name]])
        return holds.get(name, frozenset())

    def views_input(step) -> bool:
        node = step.node
        if node.op_type == "SumToShapeOf" and node.domain == "mixrt":
            return ask("views input", step, node.outputs[0])
        return _views_input(node, observed)

    for index, step in enumerate(steps):
        node = step.node
        for name in step.reads:
            for target in referenced(name):
                last[target] = max(last[target], index)
        reads_slots = frozenset().union(*(referenced(n) for n in step.reads)) \
            if step.reads else frozenset()
        reshaping = memory_of(node) == RESHAPE
        for position, name in enumerate(node.outputs):
            if not name:
                continue
            if position == 0 and node.inputs and node.inputs[0] in fed and name not in outputs \
                    and reshaping and views_input(step) and ask("predicted", step, name):
                # a feed's reshape (GPT-2's input ids and mask): the host loop's view of the
                # feed, where a slot of its own cost the kernel and a copy, ~4.6 us a run
                holds[name] = frozenset()
                reshapes.append(name)
                continue
            if (position == 0 and (views_input(step) or name in operand_views)
                    or _views_part(node)) \
                    and node.inputs[0] in slots | root.keys() and name not in outputs:
                root[name] = root.get(node.inputs[0], node.inputs[0])
                if reshaping and ask("predicted", step, name):
                    reshapes.append(name)
                continue
            if name in outputs and ask("plannable", step, name) and not step.subgraphs \
                    and not ask("arena output", step, name):
                detached.add(name)  # copied out when made if it views the arena
                continue
            if name in outputs and not ask("arena output", step, name) \
                    or not ask("plannable", step, name) or step.subgraphs:
                holds[name] = reads_slots
                if position == 0 and name not in outputs and reshaping \
                        and views_input(step) and ask("predicted", step, name):
                    reshapes.append(name)  # strings: a text model's reshapes
                continue
            slots[name] = ask("predicted", step, name)
            first[name] = last[name] = index
            kind = memory_of(node)
            if kind in (IN_PLACE, SHRINKING_IN_PLACE):
                same = kind == IN_PLACE
                candidates.extend((source, name, same) for source in node.inputs
                                  if source in slots)
    end = len(steps)
    for name in graph_outputs:
        for target in referenced(name):
            last[target] = end
    shared = frozenset(n for n in graph_outputs if referenced(n) or n in frozen)
    composites = concat_composites(steps, slots, first, last, outputs, ask)
    inside = {name for _, inputs in composites for name in inputs}
    candidates = [pair for pair in candidates if not inside & {pair[0], pair[1]}]
    return PlanStructure(steps, [(name, first[name], last[name], static)
                                 for name, static in slots.items()],
                         candidates, tuple(reshapes), frozenset(root), frozenset(detached),
                         shared, probes, tuple(composites))


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
        if is_random(node) or node.subgraphs():
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


def _arena_output(step, value, inferred) -> bool:
    """Whether a graph output gets an arena slot (ARENA_OUTPUT_BYTES): the one output of a
    kernel that writes into ``out=`` (a classifier's label and scores, or an Identity's
    copy, would only be copied into the slot and out again: scikit-learn's and LightGBM's
    classifiers at one row ran 5-15% slower)."""
    node = step.node
    # with MIXRT_BATCH_INVARIANT, whatever its size: a kernel called without ``out=`` may
    # take another path (LayerNormalization's NumPy passes), so a batch's output past the
    # size would have other bits than one request's under it
    return _is_array(value) and value.dtype != object and 0 < value.nbytes \
        and (value.nbytes <= ARENA_OUTPUT_BYTES or batch_invariant()) \
        and _predicted(inferred, value) \
        and getattr(step, "writes_into", False) and memory_of(node) not in VIEWS \
        and sum(1 for name in node.outputs if name) == 1


def _plannable_on_cpu(value) -> bool:
    return _is_array(value) and value.dtype != object and value.size > 0


def plannable_on_gpu(value) -> bool:
    """CuPy arrays of CuPy's own dtypes (it has no bfloat16, float8 or int4)."""
    return (hasattr(value, "__cuda_array_interface__") and value.size > 0
            and value.dtype.kind in "biuf")


def _predicted(value_type, value) -> bool:
    return (isinstance(value_type, TensorType) and value_type.shape is not None
            and tuple(value_type.shape) == tuple(value.shape)
            and value_type.dtype is not None and np.dtype(value_type.dtype) == value.dtype)


def _same_layout(a, b) -> bool:
    """Whether two values (arrays, Shaped, or Slots) have one shape and dtype."""
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def _fits_inside(source, output) -> bool:
    return source.dtype == output.dtype and output.nbytes <= source.nbytes
