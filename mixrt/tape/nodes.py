"""The tape: what ``autograd.record()`` remembers, and the backward walk over it.

Every recorded call leaves a node: the op (or a Python ``Function``), where each input came
from (an earlier node's output, a leaf array with a gradient attached, or nothing that
needs a gradient), and the values its backward reads. An output array points at its node
(``NDArray._entry``), so the graph lives exactly as long as the arrays that can reach it,
and a backward pass frees the nodes it walked unless asked to retain them.
"""

from __future__ import annotations

import itertools
import traceback
import weakref

from mixrt.tape import opgrad
from mixrt.tape.arrays import new_array
from mixrt.tape.replay import replay
from mixrt.base.errors import GradientError


_sequence = itertools.count()


class Node:
    """One recorded call. ``parents[i]``: (node, output) | leaf NDArray | None."""

    __slots__ = ("seq", "name", "parents", "versions", "out_meta", "ctx", "freed")

    def __init__(self, name: str, inputs, ctx, out_meta):
        self.seq = next(_sequence)
        self.name = name
        self.parents = [_parent_of(x) for x in inputs]
        self.versions = [(x, x._version) for x in inputs if _is_ndarray(x)]
        self.out_meta = out_meta  # (shape, dtype) per output
        self.ctx = ctx
        self.freed = False

    def check_unchanged(self) -> None:
        for array, version in self.versions:
            if array._version != version:
                raise GradientError(
                    f"an input of {self.name} was modified in place after {self.name} read it "
                    f"(shape {array.shape}); its gradient would be computed from the new "
                    f"value. Write `y = x + v` instead of `x += v` while recording",
                    op_type=self.name)

    def release(self) -> None:
        """Drop the values saved for backward. The links to the parents stay: a later
        backward may still pass through a node whose gradient reads nothing saved (a
        Transpose that two gradients of one forward share, as MXNet's graph lets them)."""
        self.versions = []
        self.freed = True
        self._release_saved()

    def _release_saved(self) -> None:
        pass

    def reads_saved(self, dys: list) -> bool:
        """Whether the backward for ``dys`` reads values a release dropped."""
        return True

    def input_grads(self, dys: list) -> list:
        raise NotImplementedError

    def recorded_grads(self, dys: list) -> list:
        raise GradientError(f"create_graph=True cannot differentiate through {self.name}: "
                            f"its backward runs as one compiled graph the tape cannot record "
                            f"(a hybridized block: call hybridize(False) for the code whose "
                            f"gradients you differentiate)", op_type=self.name)


class OpNode(Node):
    """A registered op: backward is its compiled gradient graph (``opgrad``)."""

    __slots__ = ("spec", "attributes", "sig", "xs", "ys", "pushed_at", "outputs")

    def __init__(self, spec, attributes, sig, inputs, raw, results, ctx, out_meta):
        super().__init__(spec.op_type, inputs, ctx, out_meta)
        self.spec, self.attributes, self.sig = spec, attributes, sig
        self.xs, self.ys = list(raw), list(results)
        self.pushed_at = ""
        self.outputs = []  # (weakref, version) per output array: see watch_outputs

    def watch_outputs(self, outputs) -> None:
        """Remember the output arrays' versions: ``ys`` is their memory, so an in-place write
        to one would silently change what this node's backward reads."""
        self.outputs = [(weakref.ref(o), o._version) for o in outputs]

    def _release_saved(self) -> None:
        self.xs = self.ys = None

    def reads_saved(self, dys: list) -> bool:
        plan = opgrad.backward_plan(self.sig, self.attributes, self._seeded(dys))
        return any(kind in ("x", "y") for _, kind, _ in plan.feeds)

    def input_grads(self, dys: list) -> list:
        plan = opgrad.backward_plan(self.sig, self.attributes, self._seeded(dys))
        self._check_outputs_unchanged(plan.feeds)
        values = {"x": self.xs, "y": self.ys, "dy": dys}
        feeds = {name: values[kind][index] for name, kind, index in plan.feeds}
        return self._by_input(plan.grads, plan.session.run_on_device(None, feeds))

    def recorded_grads(self, dys: list) -> list:
        """``input_grads`` for create_graph: NDArrays in and out, the backward's ops run
        imperatively (``replay``) so the tape records them. The forward's inputs and
        outputs enter as arrays that lead back into the tape, so the gradient of a gradient
        reaches them (tanh's backward reads its output)."""
        plan = opgrad.recorded_backward(self.sig, self.attributes, self._seeded(dys))
        self._check_outputs_unchanged(plan.feeds)
        xs, ys = self.xs or [], self.ys or []  # none once released (reads_saved said so)
        values = {"x": self._taped(xs, self.parents),
                  "y": self._taped(ys, [(self, j) for j in range(len(ys))]),
                  "dy": dys}
        feeds = {name: values[kind][index] for name, kind, index in plan.feeds}
        return self._by_input(plan.grads, replay(plan.session, feeds, self.ctx))

    def _seeded(self, dys: list) -> tuple:
        forward = opgrad.forward_plan(self.sig, self.attributes)
        if forward.error is not None:
            raise GradientError(f"{self.name} (called at {self.pushed_at}) has no gradient: "
                                f"{forward.error}; keep it out of the recorded graph with "
                                f"autograd.pause() or .detach() its input",
                                op_type=self.name) from forward.error
        return tuple(j for j in forward.float_outputs if dys[j] is not None)

    def _by_input(self, indices: list, results) -> list:
        grads = [None] * len(self.parents)
        for index, value in zip(indices, results):
            grads[index] = value
        return grads

    def _taped(self, raws: list, entries: list) -> list:
        """NDArrays over ``raws`` that point where the values came from: a leaf is itself,
        an earlier node's output its entry; anything else is a constant."""
        arrays = []
        for raw, entry in zip(raws, entries):
            if raw is None:
                arrays.append(None)
            elif entry is not None and not isinstance(entry, tuple):
                arrays.append(entry)  # a leaf: the array itself
            else:
                array = new_array(raw, self.ctx)
                array._entry = entry
                arrays.append(array)
        return arrays

    def _check_outputs_unchanged(self, feeds) -> None:
        for _, kind, index in feeds:
            if kind != "y" or index >= len(self.outputs):
                continue
            ref, version = self.outputs[index]
            array = ref()
            if array is not None and array._version != version:
                raise GradientError(
                    f"output {index} of {self.name} was modified in place after it was "
                    f"recorded (shape {array.shape}), and the gradient of {self.name} reads "
                    f"it; write `z = y + v` instead of `y += v`", op_type=self.name)


class FunctionNode(Node):
    """A Python ``autograd.Function``: backward is its ``backward`` method on NDArrays."""

    __slots__ = ("function",)

    def __init__(self, function, inputs, ctx, out_meta):
        super().__init__(type(function).__name__, inputs, ctx, out_meta)
        self.function = function

    def _release_saved(self) -> None:
        self.function = None

    def input_grads(self, dys: list) -> list:
        grads = self.recorded_grads([None if dy is None else new_array(dy, self.ctx)
                                     for dy in dys])
        return [None if g is None else (g._read() if _is_ndarray(g) else g) for g in grads]

    def recorded_grads(self, dys: list) -> list:
        """The Function's backward on NDArrays (recorded when create_graph records)."""
        wrapped = [dy if dy is not None else new_array(_zeros(self.ctx, meta), self.ctx)
                   for dy, meta in zip(dys, self.out_meta)]
        grads = self.function.backward(*wrapped)
        grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
        if len(grads) != len(self.parents):
            raise GradientError(f"{self.name}.backward returned {len(grads)} gradients for "
                                f"{len(self.parents)} inputs", op_type=self.name)
        return [g if g is None or _is_ndarray(g) else new_array(self.ctx.xp.asarray(g), self.ctx)
                for g in grads]


def _zeros(ctx, meta):
    shape, dtype = meta
    return ctx.xp.zeros(shape, dtype=dtype)


def _is_ndarray(value) -> bool:
    return hasattr(value, "_entry") and hasattr(value, "_version")


def _parent_of(value):
    if not _is_ndarray(value):
        return None
    if value._entry is not None:
        return value._entry
    return value if value._grad is not None else None


def call_site() -> str:
    """The innermost Python line outside mixrt that led here (for error messages)."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        if "/mixrt/" not in frame.filename.replace("\\", "/") or "/tests/" in frame.filename:
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


# -- the backward walk ---------------------------------------------------------------------

def run_backward(heads: list, seeds: list, retain_graph: bool, on_leaf=None,
                 create_graph: bool = False) -> dict:
    """Propagate ``seeds`` (one raw array per head) back through the tape; returns
    {id(leaf): (leaf, gradient)} for every leaf reached. With ``create_graph`` the seeds
    and gradients are NDArrays and every backward op is recorded (the caller records), so
    the gradients can be differentiated again. With ``on_leaf(leaf, gradient)``,
    each leaf is handed over the moment its gradient is complete (after the last node that
    read it), while the walk goes on: what lets a Trainer start communicating a gradient
    while the rest of backward still runs (MXNet's overlap of KVStore and backward)."""
    node_grads: dict = {}
    leaf_grads: dict = {}
    for head, seed in zip(heads, seeds):
        _accumulate(head._entry if head._entry is not None else head, seed, node_grads,
                    leaf_grads)
    nodes = _nodes_behind(heads)
    head_nodes = {id(h._entry[0]) for h in heads if h._entry is not None}
    last_reader = _last_readers(nodes) if on_leaf is not None else {}
    for node in nodes:
        dys = [_as_value_dtype(node_grads.pop((id(node), j), None), meta)
               for j, meta in enumerate(node.out_meta)]
        if all(dy is None for dy in dys):
            continue
        # a head's own graph, once freed, is refused (as MXNet refuses a head whose
        # recording a backward cleared); inside, only a node that needs what it dropped
        if node.freed and (id(node) in head_nodes or node.reads_saved(dys)):
            raise GradientError(f"backward reached {node.name}, whose graph an earlier "
                                f"backward() freed; pass retain_graph=True to the first "
                                f"backward to run another", op_type=node.name)
        node.check_unchanged()
        parents = list(node.parents)
        with node.ctx.device.active():  # its backward's kernels go to its own GPU
            grads = node.recorded_grads(dys) if create_graph else node.input_grads(dys)
        for parent, dx in zip(parents, grads):
            if parent is not None and dx is not None:
                _accumulate(parent, dx, node_grads, leaf_grads)
        if not retain_graph:
            node.release()
        for parent in parents:
            if last_reader.get(id(parent)) is node and id(parent) in leaf_grads:
                on_leaf(*leaf_grads.pop(id(parent)))
    if on_leaf is not None:
        for leaf, grad in list(leaf_grads.values()):
            on_leaf(leaf, grad)
        leaf_grads.clear()
    return leaf_grads


def _as_value_dtype(dy, meta):
    """A gradient has its value's dtype. Mixed-precision arithmetic downstream (a float32
    output minus a float64 label) sends a float64 gradient back to a float32 output, and the
    op's backward plan was made for float32."""
    if dy is None or dy.dtype == meta[1]:
        return dy
    return dy.astype(meta[1])


def _last_readers(nodes: list) -> dict:
    """{id(leaf): the node that reads it and runs last in backward} (``nodes`` is in
    backward order, so that is the last one listed)."""
    last: dict = {}
    for node in nodes:
        for parent in node.parents:
            if parent is not None and not isinstance(parent, tuple):
                last[id(parent)] = node
    return last


def _accumulate(target, grad, node_grads: dict, leaf_grads: dict) -> None:
    """Add ``grad`` to what ``target`` (a leaf, or a node's output) has gathered, on the
    target's own device (a copy between GPUs sends its gradient back across)."""
    if isinstance(target, tuple):
        key = (id(target[0]), target[1])
        previous = node_grads.get(key)
        if previous is None:
            node_grads[key] = grad
        else:
            with target[0].ctx.device.active():
                node_grads[key] = previous + grad
        return
    previous = leaf_grads.get(id(target))
    if previous is None:
        leaf_grads[id(target)] = (target, grad)
    else:
        with target.ctx.device.active():
            leaf_grads[id(target)] = (target, previous[1] + grad)


def _nodes_behind(heads) -> list:
    """Every node a head depends on, latest first (recording order is topological)."""
    seen: dict = {}
    stack = [h._entry[0] for h in heads if h._entry is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        stack.extend(p[0] for p in node.parents if isinstance(p, tuple))
    return sorted(seen.values(), key=lambda n: n.seq, reverse=True)
