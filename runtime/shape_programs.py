"""One shape program per form: a new signature's shapes and shape arithmetic as arithmetic.

Planning a new signature from inference (``runtime/inferred_plans.py``) walked the graph in
Python, node by node, at every new length a service sent: ~1 ms of a 2-layer BERT's
3.8 ms new length, against the 1.1 ms of a length met before (2026-11-27). Yet what it
computes is the same function of the feeds' sizes each time. A :class:`FormProgram` is
that function, written once per form as Python source: the graph is traced with every feed
dimension a variable (``runtime/symbolic_dims.py``), each op's shape rule
(``runtime/shape_rules.py``) writes its arithmetic, and the program returns every planned
value's shape (a :class:`~mixrt.runtime.executor.Shaped`) and every frozen value (the
arrays of Shape -> Gather -> Concat chains, made from their elements; the few a rule does
not follow, such as Range over a length, by their kernels, called from the program).

A program holds only where its guards hold: each comparison of dims a rule made (an axis
of 1 or not, two dims equal) is checked first, and a signature where one goes the other
way gets None, and the concrete way. Dims are arithmetic of the feeds' sizes alone, so
the program writes every line of dims and guards before any line that makes an array (a
kernel's call, a frozen value, a Shaped): a form keeps a program per set of guards (a
batch of one and a batch of more), and asking the other one first ran its kernels up to
its first failed guard (DistilBERT's: ~16 us warm, 0.4 now; 2026-11-30). A program is
trusted only once it gave, at the signature it was traced at, every shape and value
concrete inference gave there (:func:`trace`); the plan it makes is checked by its first
run as every inferred plan is.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.executor import Shaped, is_random
from mixrt.runtime.run_loop import call_step
from mixrt.runtime.passes.infer import infer_attributes
from mixrt.runtime.shape_rules import Known, NoRule, output_shapes, output_values
from mixrt.runtime.symbolic_dims import Dim, NotSymbolic, Trace, code_of

_VIEWS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity"})
_FAILURES = (NotSymbolic, TypeError, ValueError, IndexError, KeyError, ZeroDivisionError)


class FormProgram:
    """The compiled program of one form (and one set of guards): ``evaluate(signature)``
    gives ``(observed, frozen)`` (name -> Shaped for each planned value, name -> array for
    each frozen one) or None where a guard fails or a kernel it calls fails."""

    def __init__(self, source: str, namespace: dict, planned: tuple, frozen: tuple):
        self.source = source
        exec(compile(source, "<mixrt shape program>", "exec"), namespace)  # noqa: S102
        self._function = namespace["program"]
        self.planned, self.frozen = planned, frozen
        # agreed with concrete inference at a signature other than its own (plan_for_form)
        self.confirmed = False

    def evaluate(self, signature: tuple):
        try:
            made = self._function(signature)
        except _FAILURES:
            return None
        if made is None:
            return None
        shapes, values = made
        return dict(zip(self.planned, shapes)), dict(zip(self.frozen, values))


class ExactTypes:
    """Name -> type as inference would give it, read off a program's shapes and values:
    what ``executor.make_plan``'s probes ask of the few values they ask about."""

    __slots__ = ("observed",)

    def __init__(self, observed: dict):
        self.observed = observed

    def get(self, name, default=None):
        value = self.observed.get(name)
        if value is None:
            return default
        return TensorType(np.dtype(value.dtype), tuple(value.shape))


def trace(steps, constants: dict, signature: tuple, inferred: dict, frozen: dict,
          planned: list[str]) -> FormProgram | None:
    """The program of ``signature``'s form, traced at ``signature``, or None where an op has
    no rule or the program does not give what concrete inference gave there (``inferred``
    types, ``frozen`` values; ``planned``: the names whose shapes the plan reads)."""
    try:
        program = _Tracer(constants, signature, inferred, frozen).run(steps, planned)
    except _FAILURES:
        return None
    made = program.evaluate(signature)
    if made is None or not agrees(made, inferred, frozen):
        return None
    return program


def agrees(made, inferred: dict, frozen: dict) -> bool:
    observed, values = made
    for name, shaped in observed.items():
        expected = inferred.get(name)
        if expected is None or tuple(expected.shape) != shaped.shape \
                or np.dtype(expected.dtype) != shaped.dtype:
            return False
    for name, value in values.items():
        expected = frozen.get(name)
        if not isinstance(expected, np.ndarray) or expected.dtype != value.dtype \
                or expected.shape != value.shape or not np.array_equal(expected, value):
            return False
    return set(values) == set(frozen)


class _Tracer:
    """One walk of the graph over dims, writing the program's lines as it goes."""

    def __init__(self, constants: dict, signature: tuple, inferred: dict, frozen: dict):
        self.trace = Trace()
        # the lines that make arrays (kernel calls, frozen values, Shaped), written after
        # every line of dims: a program's dims and guards are arithmetic of the feeds' sizes
        # alone, so a signature its guards exclude is told so before any kernel runs
        self.arrays: list[str] = []
        self.constants, self.inferred, self.frozen = constants, inferred, frozen
        self.known: dict = {}
        self.namespace = {"_np_array": np.array, "_call": call_step, "_Shaped": Shaped,
                          "_empty": np.empty}
        self.runtime: dict = {}  # a frozen value a kernel of the program makes -> its local
        self.made: dict = {}  # an expression the program computes -> the local holding it
        self.dtypes: dict = {}  # a dtype's string -> the constant naming it
        self.header = self._feeds(signature)
        for name, value in constants.items():
            if isinstance(value, np.ndarray):
                self.known[name] = Known(value.shape, value)

    def _feeds(self, signature: tuple) -> list[str]:
        """The lines that name each feed's dims (``d0``, ``d1``, ...) from the signature."""
        lines, count = [], 0
        for index, (name, part) in enumerate(signature):
            if part is None or not isinstance(part[0], tuple):
                raise NotSymbolic(f"feed {name!r} is not a tensor")
            shape = part[0]
            dims = []
            for size in shape:
                dims.append(self.trace.variable(f"d{count}", size))
                count += 1
            self.known[name] = Known(tuple(dims))
            codes = "".join(f"{dim.code}, " for dim in dims)
            lines.append(f"({codes}) = signature[{index}][1][0]" if dims else "")
            for dim in dims:  # a size of 0 takes the concrete way (plans treat it apart)
                if dim.value < 1:
                    raise NotSymbolic(f"feed {name!r} has a dim of 0")
                lines.append(f"if {dim.code} < 1: return None")
        return [line for line in lines if line]

    def run(self, steps, planned: list[str]) -> FormProgram:
        for step in steps:
            self._step(step)
        return self._program(planned)

    def _step(self, step) -> None:
        node = step.node
        if step.subgraphs or is_random(node):
            raise NotSymbolic(f"node {node.label} runs a subgraph or draws random numbers")
        outputs = [name for name in node.outputs if name]
        inputs = [self._input(name) for name in node.inputs]
        if outputs and all(name in self.frozen for name in outputs):
            self._frozen_step(step, inputs, outputs)
            return
        kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
        try:
            shapes = output_shapes(node, kernel, inputs)
        except NoRule:
            shapes = self._named_inference(node, kernel, inputs)
        for name, shape in zip(node.outputs, shapes):
            if name:
                self.known[name] = Known(tuple(shape))

    def _named_inference(self, node, kernel, inputs: list) -> list[tuple]:
        """An op without a rule of its own (a classifier, a regressor: rows in, rows out)
        typed by its infer function, each dim of its inputs given as a *name*, the way a
        model declares a symbolic dim: what the function answers for a name holds for any
        size, so an output dim it gives as an input's name is that dim, and one it cannot
        give (None: arithmetic over a name) leaves the op to concrete inference."""
        if kernel is None or kernel.infer_fn is None:
            raise NotSymbolic(f"node {node.label}: no infer function")
        named, arguments = {}, []
        for name, known in zip(node.inputs, inputs):
            if known is None:
                arguments.append(None)
                continue
            dims = []
            for dim in known.shape:
                if dim.__class__ is Dim:
                    named[f"mixrt:{dim.code}"] = dim
                    dim = f"mixrt:{dim.code}"
                dims.append(dim)
            value = known.elements if known.elements is not None \
                and known.elements.dtype != object else None
            arguments.append(TensorType(self._dtype(name), tuple(dims), value=value))
        typed = kernel.infer_fn(*arguments, **infer_attributes(kernel, node))
        shapes = []
        for value_type, name in zip(typed, node.outputs):
            shape = getattr(value_type, "shape", None)
            if shape is None:
                raise NotSymbolic(f"node {node.label}: its infer function leaves a shape open")
            dims = []
            for dim in shape:
                if dim.__class__ is str and dim in named:
                    dims.append(named[dim])
                elif isinstance(dim, (int, np.integer)) and dim.__class__ is not bool:
                    dims.append(int(dim))
                else:
                    raise NotSymbolic(f"node {node.label}: a dim its infer function computes")
            shapes.append(tuple(dims))
        return shapes

    def _dtype(self, name: str):
        constant = self.constants.get(name)
        if isinstance(constant, np.ndarray):
            return constant.dtype
        found = self.inferred.get(name)
        if found is None or found.dtype is None:
            raise NotSymbolic(f"value {name!r}: no dtype")
        return np.dtype(found.dtype)

    def _input(self, name: str):
        if not name:
            return None
        found = self.known.get(name)
        if found is None:
            raise NotSymbolic(f"value {name!r} is not known to the trace")
        return found

    def _frozen_step(self, step, inputs: list, outputs: list[str]) -> None:
        """A node the signature's sizes fix: its values from the constants it reads, from
        its elements' rule, or from its kernel, called by the program."""
        node = step.node
        present = [known for known in inputs if known is not None]
        if all(known.elements is not None and known.elements.dtype != object
               for known in present) and node.op_type not in ("Shape", "Size"):
            for name in outputs:  # made of constants alone: the same at every signature
                self.known[name] = Known(self.frozen[name].shape, self.frozen[name])
            return
        kernel = REGISTRY.find(node.domain, node.op_type, node.opset)
        shapes = [tuple(shape) for shape, name in zip(output_shapes(node, kernel, inputs),
                                                      node.outputs) if name]
        try:
            values = output_values(node, inputs, shapes)
        except _FAILURES:
            self._called(step, inputs, outputs, shapes)
            return
        for name, value in zip(outputs, values):
            if not any(element.__class__ is Dim for element in value.reshape(-1)):
                value = value.astype(self.frozen[name].dtype)
            self.known[name] = Known(value.shape, value)

    def _called(self, step, inputs: list, outputs: list[str], shapes: list) -> None:
        """The program calls the frozen node's kernel over its inputs' values, and checks
        the shape it gives (the trace knows its shape, not its elements)."""
        if len(outputs) != 1 or len(step.node.outputs) != 1:
            raise NotSymbolic(f"node {step.node.label}: a kernel call of several outputs")
        arguments = ["None" if not name else self._materialized(name, self.known[name])
                     for name in step.inputs]
        made = self.trace.local("r")
        expected = "(" + "".join(f"{code_of(dim)}, " for dim in shapes[0]) + ")"
        node = step.node
        if node.op_type in _VIEWS and not node.domain:
            # a kernel call costs ~10 us; these only reshape what the program made
            self.arrays.append(f"{made} = {arguments[0]}.reshape({expected})")
        else:
            step_name = self.trace.local("_step")
            self.namespace[step_name] = step
            self.arrays.append(f"{made} = _call({step_name}, [{', '.join(arguments)}])")
            self.arrays.append(f"if {made}.shape != {expected}: return None")
        self.runtime[outputs[0]] = made
        self.known[outputs[0]] = Known(shapes[0])

    def _materialized(self, name: str, known: Known) -> str:
        """Source for ``name``'s value in the program: a constant, a kernel's result, or an
        array made from its elements."""
        if name in self.runtime:
            return self.runtime[name]
        elements = known.elements
        if elements is None:
            raise NotSymbolic(f"value {name!r}: neither its elements nor its kernel are known")
        if elements.dtype != object:
            return self._constant(elements)
        dtype = self._dtype_constant(self.frozen[name].dtype)
        codes = "".join(f"{code_of(element)}, " for element in elements.reshape(-1))
        return self._computed(f"_np_array(({codes}), {dtype}).reshape({tuple(elements.shape)!r})")

    def _computed(self, expression: str) -> str:
        """A local holding ``expression``'s value, computed once where first needed: a
        transformer's layers reshape to the same shapes (a 5-layer RoBERTa's program made
        149 frozen arrays and 168 Shaped, most of them alike; one each now, shared by the
        values that are the same, read only as every frozen value is)."""
        local = self.made.get(expression)
        if local is None:
            local = self.made[expression] = self.trace.local("f")
            self.arrays.append(f"{local} = {expression}")
        return local

    def _constant(self, value) -> str:
        local = self.trace.local("_k")
        self.namespace[local] = value
        return local

    def _dtype_constant(self, dtype) -> str:
        """The one constant naming ``dtype`` (so that expressions over it read alike)."""
        dtype = np.dtype(dtype)
        local = self.dtypes.get(dtype.str)
        if local is None:
            local = self.dtypes[dtype.str] = self._constant(dtype)
        return local

    def _program(self, planned: list[str]) -> FormProgram:
        shapes = []
        for name in planned:
            known = self.known.get(name)
            if known is None or name in self.frozen:
                raise NotSymbolic(f"planned value {name!r} not traced")
            dtype = self._dtype_constant(self.inferred[name].dtype)
            codes = "".join(f"{code_of(dim)}, " for dim in known.shape)
            shapes.append(self._computed(f"_Shaped(({codes}), {dtype})"))
        frozen_names = tuple(self.frozen)
        values = [self._materialized(name, self._input(name)) for name in frozen_names]
        body = self.header + self.trace.lines + self.arrays + [
            f"return ({''.join(s + ', ' for s in shapes)}), "
            f"({''.join(v + ', ' for v in values)})"]
        source = "def program(signature):\n" + "".join(f"    {line}\n" for line in body)
        return FormProgram(source, self.namespace, tuple(planned), frozen_names)


def planned_names(steps, frozen: dict) -> list[str]:
    """The values a plan reads the shapes of: every named output of a step but the frozen."""
    return [name for step in steps for name in step.node.outputs
            if name and name not in frozen]


__all__ = ["ExactTypes", "FormProgram", "agrees", "planned_names", "trace"]
