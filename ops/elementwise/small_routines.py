"""FusedElementwise over a small output as one generated function (``Program.routine`` in
``fused_elementwise.py``).

A small output is one block and no compiled loop takes it, so the program is a fixed list
of ufunc calls over fixed buffers: _run_block's choices (which buffer each step writes,
what it may reuse) depend only on the operands' shapes and on whether ``out`` is one of
them. Made once per such layout into a Python function, a step costs its ufunc call:
~0.3 us over a (1, 16) tensor, against ~5 us of choosing buffers again at every step.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.ops.elementwise import jit_elementwise
from mixrt.ops.elementwise.simd_cpu import filled

MAX_ROUTINES = 64  # layouts per program


class Layout:
    """What :meth:`Program.routine` knows of one operand layout: the output's ``shape`` and
    ``size``, whether a compiled loop can run it (``compilable``, kept per dtype with the
    program's compiled kernels; whether one does is asked at each call, as its threshold
    is a setting), and the generated routines, for ``out`` apart from the inputs and for
    ``out`` one of them, each made only when a call first takes it. A new sequence length
    gave a BERT layer's chains layouts that the compiled loop runs, and each generated its
    routine anyway (~0.15 ms a chain, never called)."""

    __slots__ = ("shape", "size", "compilable", "routines")

    def __init__(self, program, dtype, shapes):
        first = shapes[0]  # operands of one shape need no broadcasting (~4 us a new shape)
        self.shape = tuple(first) if all(s == first for s in shapes) \
            else np.broadcast_shapes(*shapes)
        self.size = math.prod(self.shape)
        kernels = program.jit_kernels  # as jit_elementwise.suits keeps the answer
        self.compilable = kernels.get(dtype.char)
        if self.compilable is None:
            self.compilable = kernels[dtype.char] = jit_elementwise.compilable(
                program.steps, dtype)
        self.routines = [None, None]  # out apart from the inputs, out one of them


def generated(program, dtype, shapes, over: bool, ops: dict):
    """The function for operands of ``shapes`` and ``dtype`` (``over``: ``out`` is one of
    them), an output below blocks' size (:class:`Layout` says)."""
    full = np.broadcast_shapes(*shapes)
    dtype = np.dtype(dtype)
    names = [f"x{i}" for i in range(len(shapes))]  # the variable holding each register
    shape_of = dict(zip(names, shapes), out=full)
    owned = [False] * len(names)
    pool = [] if over else ["out"]  # buffers free to write: out, then dead temporaries
    space = {"empty": np.empty, "dtype": dtype, "full": full}
    made, lines = [], []
    final = len(program.steps) - 1
    for index, step in enumerate(program.steps):
        if step.op == "Scalar":
            name = f"c{index}"
            space[name], shape_of[name] = dtype.type(step.params[0]), ()
            names.append(name)
            owned.append(False)
            continue
        args = [names[r] for r in step.operands]
        shape = np.broadcast_shapes(*(shape_of[a] for a in args))
        dying = [r for r in dict.fromkeys(step.operands)
                 if owned[r] and program.last_use[r] == index]
        if index == final:
            target = "out"
        else:
            target = next((names[r] for r in dying if shape_of[names[r]] == shape), None)
            if target is None:
                target = next((b for b in pool if shape_of[b] == shape), None)
                if target is not None:
                    pool.remove(target)
            if target is None:
                target = f"t{len(made)}"
                space[f"s{len(made)}"], shape_of[target] = shape, shape
                made.append(target)
        lines.append(_call_source(ops[step.op].cpu, step, index, args, target,
                                  shape_of[target], dtype, space))
        names.append(target)
        owned.append(True)
        for r in dying:
            if names[r] != target and shape_of[names[r]] == full:
                pool.append(names[r])
            names[r] = None
    source = "\n".join(
        [f"def routine({', '.join(f'x{i}' for i in range(len(shapes)))}, out):",
         "    if out is None:",
         "        out = empty(full, dtype)"]
        + [f"    {t} = empty(s{k}, dtype)" for k, t in enumerate(made)]
        + [f"    {line}" for line in lines] + ["    return out"])
    exec(_compiled_source(source, len(program.steps)), space)
    return space["routine"]


# The generated source names shapes, buffers and functions through its namespace, so two
# layouts of one program that choose the same buffers have the same text: compiled once,
# each new layout only executes the definition in a namespace of its own (a new sequence
# length compiled two functions a BERT layer, ~0.15 ms each, on every new length).
_CODES: dict = {}
MAX_CODES = 1024


def _compiled_source(source: str, steps: int):
    code = _CODES.get(source)
    if code is None:
        if len(_CODES) >= MAX_CODES:
            _CODES.clear()
        code = _CODES[source] = compile(source, f"<FusedElementwise {steps} steps>", "exec")
    return code


def _call_source(cpu, step, index: int, args: list[str], target: str, shape, dtype,
                 space: dict) -> str:
    """One step as a line of the generated function: the call its op's CPU step ``cpu``
    makes, made directly where it is one ufunc call (or ReLU's maximum against zeros)."""
    ufunc = getattr(cpu, "ufunc", None)
    operands = ", ".join(args)
    if step.op == "Relu":  # relu_: maximum against a stepping zero operand of target's shape
        space[f"f{index}"], space[f"z{index}"] = np.maximum, filled(0, np.empty(shape, dtype))
        return f"f{index}({operands}, z{index}, out={target})"
    if ufunc is not None:
        space[f"f{index}"] = ufunc
        if ufunc in (np.maximum, np.minimum):  # NumPy deprecates their positional out
            return f"f{index}({operands}, out={target})"
        return f"f{index}({operands}, {target})"
    space[f"f{index}"], space[f"p{index}"] = cpu, step.params
    return f"{target} = f{index}([{operands}], p{index}, {target})"
