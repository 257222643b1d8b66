"""Concats whose inputs the plan makes in place (``runtime/executor.py`` asks).

A Concat copies its inputs into its output. Where every dim before its axis is 1 (a CNN
at batch 1 joining channels), each input is one contiguous run of the output's bytes, so
the plan can lay the input's slot there: the node that makes the input writes it in
place, and the Concat's kernel finds nothing to copy. SqueezeNet's fire modules joined
their two expand convolutions by a copy on the calling thread of ~0.5 ms of a 7 ms run,
2.2 ms of 12.8 on cores without a shared cache, where half the bytes came from the other
core (2026-11-27, BENCHMARKS.md "cores near and far").
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.runtime.memory import ALIGNMENT


def concat_composites(steps, slots: dict, first: dict, last: dict, outputs: set,
                      ask) -> list:
    """(output, inputs) of each Concat whose inputs can be made inside its output: each
    input a static slot of its own that this Concat reads last and no other Concat takes,
    written by an earlier step, named once, not a graph output; the output a static slot
    too; and at these sizes (``ask``: a probe of the structure) contiguous runs at aligned
    offsets."""
    taken: set = set()
    found = []
    for index, step in enumerate(steps):
        node = step.node
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") \
                or len(node.outputs) != 1 or len(node.inputs) < 2:
            continue
        output, inputs = node.outputs[0], list(node.inputs)
        if not slots.get(output) or output in outputs or len(set(inputs)) != len(inputs):
            continue
        if not all(slots.get(name) and name not in outputs and name not in taken
                   and last[name] == index and first[name] < index for name in inputs):
            continue
        if not ask("concat in place", step, output):
            continue
        taken.update(inputs)
        found.append((output, tuple(inputs)))
    return found


def concat_in_place(node, observed: dict) -> bool:
    """Whether the Concat's inputs, at these shapes, are contiguous runs of its output's
    bytes, each starting at an aligned offset (kernels write them as any slot)."""
    output = observed.get(node.outputs[0])
    values = [observed.get(name) for name in node.inputs]
    if output is None or any(value is None for value in values):
        return False
    shape = tuple(output.shape)
    axis = node.attributes.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape) or math.prod(shape[:axis]) != 1:
        return False
    at = 0
    for value in values:
        if np.dtype(value.dtype) != np.dtype(output.dtype) or at % ALIGNMENT:
            return False
        at += value.nbytes
    return at == output.nbytes


def composite_lives(composites, slots: list) -> tuple[set, dict]:
    """The inputs laid inside outputs (no lives of their own), and each such output's
    first step: its first input's, so that nothing else is placed there meanwhile. An
    output may itself be an input of a later Concat (DenseNet's blocks), whose first step
    is then the earliest of them all."""
    firsts = {name: first for name, first, _, _ in slots}
    inside, starts = set(), {}
    for output, inputs in composites:  # in the order of their steps
        inside.update(inputs)
        starts[output] = min(starts.get(name, firsts[name]) for name in inputs)
    return inside, starts


def lay_out(composites, offsets: dict, observed: dict) -> None:
    """Each input's offset: its place in its output, the later Concats first, so that an
    output inside another has its own offset before its inputs take theirs."""
    for output, inputs in reversed(composites):
        at = offsets[output]
        for name in inputs:
            offsets[name], at = at, at + observed[name].nbytes
