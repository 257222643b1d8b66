"""The run loop: a planned run's kernel calls over its arena, and the plain execution a
discovery run (and any run without a plan) takes. Each step's call is prepared once per
arena (its arguments' views, its ``out=`` view, the attributes it binds), so a run does
little more than call the kernels in order (``runtime/executor.py`` makes the plans)."""

from __future__ import annotations

import math
import os
import threading
from collections import ChainMap

import numpy as np

from mixrt.base import run_options
from mixrt.base.errors import ExecutionError, MixrtError, RunTerminated
from mixrt.ops import device_checks
from mixrt.ops.compiled import jit_cpu, jit_tier, replay
from mixrt.ops.compiled.bound_calls import (binder_for, binds_fresh, binds_several,
                                             reads_any_input, reads_feed_at)
from mixrt.ops.ir.types import TensorType, type_of_value
from mixrt.runtime.arenas import Arena
from mixrt.runtime.call_forms import arena_calls as _calls, node_state
from mixrt.runtime.executor import ExecutionPlan
from mixrt.runtime.graph import outer_scope_reads
from mixrt.runtime.passes.infer import infer_types
from mixrt.runtime.passes.typecheck import operand_shape_problem

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
        if xp is np and profiler is None:
            run_host_calls(arena, plan, env)
        else:
            _run_calls(_calls(arena, plan), env, xp, arena.buffer, plan.host_args, profiler)
        return
    calls = [(step, step.inputs, step.attributes,
              tuple((name, None, False) for name in step.node.outputs), None)
             for step in steps]
    _run_calls(calls, env, xp, None, {}, profiler)


def run_host_calls(arena: Arena, plan: ExecutionPlan, env: dict, key: tuple | None = None) -> None:
    """:func:`execute` of a CPU arena's plan without a profiler (the steady run lane's):
    the arena's bound calls (``ops/compiled/bound_calls.py``) for this tier and thread where an
    earlier run made them, else the kernels' calls, binding them after the run from the
    key's BIND_AT_RUN-th run on. ``key``: :func:`bound_key` of this run, where the caller
    made it already."""
    calls = _calls(arena, plan)
    if plan.host_args:
        _run_calls(calls, env, np, arena.buffer, plan.host_args, None)
        return
    run = _run_host_calls if run_options.current() is None else _run_host_calls_limited
    if not BIND:
        _run_unbound(run, calls, env, arena, None)
        return
    if key is None:
        key = bound_key(plan, env)
    bound = arena.bound.get(key)
    if bound is not None:
        run(bound, env, arena.buffer)
        return
    if arena.ran.get(key, 0) < BIND_AT_RUN - 1:  # a shape met once or twice never binds
        _run_unbound(run, calls, env, arena, key)
        return
    run(calls, env, arena.buffer)
    if len(arena.bound) >= MAX_BINDINGS:  # threads come and go: keep the latest few
        arena.bound.pop(next(iter(arena.bound)))
        arena.settled = None
    arena.bound[key] = bind_calls(calls, env, arena, plan, key[-1])


def _run_unbound(run, calls: list, env: dict, arena: Arena, key) -> None:
    """The kernels' calls, counted as a run under ``key``; the arena's first run records only
    where arenas mostly come back (``ops/compiled/replay.py``), and its second says it did."""
    runs = sum(arena.ran.values())
    if runs == 1:  # its second run, whatever its key: its size came back
        replay.arena_returned()
    if runs:
        run(calls, env, arena.buffer)
    else:
        replay.first_run(run, calls, env, arena.buffer)
    arena.ran[key] = arena.ran.get(key, 0) + 1


def run_bound(bound: list, env: dict, buffer) -> None:
    """:func:`run_host_calls` of an arena's bound calls, as the steady lane found them
    settled (``steady_run.settled_calls``)."""
    if run_options.current() is None:
        _run_host_calls(bound, env, buffer)
    else:
        _run_host_calls_limited(bound, env, buffer)


def bound_key(plan: ExecutionPlan, env: dict) -> tuple:
    """What an arena's bound calls are kept by (the tier, the thread, the native pool's
    settings and process, the thread's scratch buffers, whether the feeds are in order);
    its first and third items are what the native pool is found by."""
    return (jit_tier.compiled_allowed(), threading.get_ident(), jit_cpu.native_pool_key(),
            jit_cpu.scratch_generation(), feeds_in_order(plan, env))


def feeds_in_order(plan: ExecutionPlan, env: dict) -> bool:
    """Is every feed of the run a C-contiguous, aligned array (what a bound call that
    reads feeds was bound on, ``bound_calls.binds(feeds=True)``)?"""
    for name, _ in plan.signature:
        flags = getattr(env.get(name), "flags", None)
        if flags is None or not (flags.c_contiguous and flags.aligned):
            return False
    return True


# bound calls on (MIXRT_BIND=0: every run calls the kernels, to compare or to bisect)
BIND = os.environ.get("MIXRT_BIND", "1") != "0"
# an arena's run under one key that binds its calls (a DistilBERT's binding ~0.4 ms, saving
# ~0.2 a run: bound in the second, a shape sent twice paid for nothing; docs/execution.md)
BIND_AT_RUN = 3
MAX_BINDINGS = 4  # bound call lists an arena keeps (per tier, thread, pool and scratch)


def bind_calls(calls: list, env: dict, arena: Arena, plan: ExecutionPlan,
               fed: bool = False) -> list:
    """The arena's calls with each bindable step's kernel replaced by its binder's closure,
    made from ``env`` as the run that just ended left it. A step is bindable when it writes
    into its static view and every input is stable: a constant (an initializer or a frozen
    value, the same object each run), or a value the plan keeps in a static view (a step's
    output that the run left as that view, written there by its kernel or copied there,
    or a known-shape reshape of one). Feeds are not, as a caller may pass arrays of any
    layout, except to a binder that reads its inputs as given (``binds(feeds=True)``) when
    ``fed``: this run's feeds were all C-contiguous and aligned, and the list is kept for
    runs whose feeds are too."""
    feeds = {name for name, _ in plan.signature}
    made = {name for step in plan.steps for name in step.node.outputs}
    stable: set = set()

    def constant(name):
        return name not in made and name not in feeds and name in env

    def steady(name):
        return name in stable or constant(name)

    def ready(step, inputs):
        """Is each input steady, or a feed its binder reads as given (this run's feeds
        being C-contiguous and aligned), or any value for a binder that reads any input
        as given (``binds(any_inputs=True)``: what an earlier step made is in ``env``
        by the time the call runs, as the plan orders them)?"""
        if reads_any_input(step.fn):
            return all(not name or name in env for name in inputs)
        return all(not name or steady(name)
                   or (fed and name in feeds and reads_feed_at(step.fn, position))
                   for position, name in enumerate(inputs))

    bound = []
    for call in calls:
        step, inputs, attributes, placed, form = call
        if form is not None and form[0] < 0:  # a reshape of known shape
            if steady(form[1]):
                stable.add(form[2])
            elif form[1] in feeds:  # a C-contiguous view of a feed where the feeds are
                feeds.add(form[2])
        elif form is not None and inputs and _makes_views(placed, plan) \
                and steady(inputs[0]) and all(constant(name) for name in inputs[1:]):
            call = _bound_views(call, env)
            stable.update(name for name, _, _ in placed if name)
        elif form is not None and binds_fresh(step.fn) \
                and all(view is None for _, view, _ in placed):
            # outputs the kernel makes anew each run (a classifier's label and scores, graph
            # outputs without a view): the binder's closure makes them the same way
            if ready(step, inputs):
                call = _bound(call, None, env)
        elif form is not None and form[2] is None:  # several outputs, each placed in its view
            placed_all = all(name and view is not None and env.get(name) is view
                             for name, view, _ in form[3])
            if placed_all and binds_several(step.fn) and ready(step, inputs):
                # the binder gets the outputs' views as its ``out`` (DynamicQuantizeLinear's
                # codes, scale and zero point)
                call = _bound(call, tuple(view for _, view, _ in form[3]), env)
            elif binds_fresh(step.fn) and ready(step, inputs):
                # outputs the closure makes anew, stored as the kernel's are: copied into
                # their views or detached (a classifier whose scores feed a Normalizer:
                # ~5.5 us a run on the kernel's full route, 2026-11-27)
                call = _bound(call, None, env)
            stable.update(name for name, view, _ in form[3]
                          if view is not None and env.get(name) is view)
        elif form is not None and form[2] is not None and form[3] is not None \
                and env.get(form[2]) is form[3]:  # the value is its view, as every run
            out = attributes.get("out")
            if out is form[3] and ready(step, inputs):
                call = _bound(call, out, env)
            stable.add(form[2])
        bound.append(call)
    return _with_segments(bound, steady, env)


# a form's arity for a run of steps taken as one (:class:`_Segment`)
SEGMENT = -2
SEGMENT_MIN_STEPS = 2


def _with_segments(calls: list, steady, env: dict) -> list:
    """``calls`` with each run of consecutive fixed steps (:func:`_fixed`) made one
    :class:`_Segment` call."""
    result, run = [], []
    for call in calls:
        fixed = _fixed(call, steady, env)
        if fixed is not None:
            run.append((call, fixed))
            continue
        _close_run(run, result, env)
        result.append(call)
    _close_run(run, result, env)
    return result


def _close_run(run: list, result: list, env: dict) -> None:
    if len(run) >= SEGMENT_MIN_STEPS:
        segment = _Segment(run, env)
        first = run[0][0]
        result.append((first[0], (), {}, (), (SEGMENT, segment) + (None,) * 5))
    else:
        result.extend(call for call, _ in run)
    run.clear()


def each_call(calls):
    """A bound list's calls with each segment as its steps' own calls (bound, or a reshape's
    form): what a profiler times step by step, and what a test asks of a step's binding."""
    for call in calls:
        form = call[4]
        if form is not None and form[0] == SEGMENT:
            yield from form[1].calls
        else:
            yield call


def _fixed(call, steady, env: dict):
    """The arguments of a bound call (or a reshape of known shape) that reads and writes the
    same arrays on every run: every input steady (a constant, or a value in its static view),
    its one output the array this run left (its view, or a view step's view), not a graph
    output copied out. () for a reshape (the segment hands its view on); None otherwise."""
    step, inputs, _, _, form = call
    if form is None or form[2] is None or form[4]:
        return None
    if form[0] < 0:
        return () if form[0] == -1 and steady(form[1]) and steady(form[2]) else None
    if form[6] is None or not all(name and steady(name) for name in inputs) \
            or not steady(form[2]) or form[2] not in env:
        return None
    return tuple(env[name] for name in inputs)


class _Segment:
    """Consecutive steps that read and write the same arrays on every run (bound calls over
    stable inputs, view steps, known-shape reshapes of stable values), run as one call: each
    bound call on the arguments it was bound with, their outputs then put into the run's
    values at once. The loop's per-step work (the form's unpacking, the inputs' lookup, the
    output's store) was ~0.5 us a step: ~25 us of a 2-layer BERT's ~140 at hidden 64 over 8
    tokens, 58 of whose 71 steps are such calls."""

    __slots__ = ("calls", "program", "outputs")

    def __init__(self, run: list, env: dict):
        self.calls = [call for call, _ in run]  # each step's own call (a profiler times them)
        # (bound call, its arguments, the array it returns, the output's name)
        self.program = tuple((call[4][6], args, env[call[4][2]], call[4][2])
                             for call, args in run if call[4][0] >= 0)
        self.outputs = {call[4][2]: env[call[4][2]] for call, _ in run}

    def __call__(self, env: dict) -> None:
        position = 0
        program = self.program
        try:
            for fn, args, made, _ in program:
                result = fn(*args)
                if result is not made:  # not this run's view: placed there, as the loop does
                    self._misplaced(position, result)
                position += 1
        except MixrtError:
            raise
        except Exception as exc:
            step = next(call[0] for call in self.calls
                        if call[4][2] == program[position][3])
            raise _failed(step, exc, program[position][1]) from exc
        env.update(self.outputs)

    def _misplaced(self, position: int, result) -> None:
        _, _, made, name = self.program[position]
        if _placed(result, made) is not made:
            raise ExecutionError(f"value {name!r} came out as {getattr(result, 'shape', '?')} "
                                 f"where the plan's static view holds {made.shape}")


def _makes_views(placed, plan: ExecutionPlan) -> bool:
    """Is every output of the step a view of an arena tensor without a slot of its own
    (``ExecutionPlan.views``: Split's parts, a transposed MatMul operand, reshapes whose
    shape the plan does not know)?"""
    names = [name for name, _, _ in placed if name]
    return bool(names) and all(name in plan.views for name in names)


def _bound_views(call, env):
    """A view step over a stable input with constant parameters makes the same views of the
    same memory every run (a GPT-2 layer's split of q, k and v; the transposed keys its
    scores read): bound to hand back the views this run made. Its readers then see stable
    inputs and are bound in turn (GPT-2 with hidden 64 over 8 tokens had 14 steps a layer
    left to their kernels' full route behind its Split)."""
    step, inputs, attributes, placed, form = call
    if form[2] is None:  # several outputs: handed back in order
        made = tuple(env.get(name) for name, _, _ in placed)
    else:
        made = env[form[2]]
    return step, inputs, attributes, placed, form[:6] + (lambda *args: made,)


def _bound(call, out, env):
    step, inputs, attributes, placed, form = call
    binder = binder_for(step.fn)
    if binder is None:
        return call
    try:
        fn = binder([env[name] if name else None for name in inputs], out, attributes)
    except Exception:  # noqa: BLE001  (a binder that fails leaves the kernel's call)
        fn = None
    return call if fn is None else (step, inputs, attributes, placed, form[:5] + (None, fn))


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
        arity, fetch, name, view, detach, state, bound = form
        if arity == SEGMENT:  # fetch: the _Segment
            fetch(env)
            continue
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
            if bound is not None:  # the arena's bound call: the kernel's route, settled
                result = bound(*args)
            else:
                prepared = state.get("call") if state is not None else None
                result = step.fn(np, *args, **attributes) if prepared is None \
                    else prepared(np, *args)
        except RunTerminated as error:  # in a subgraph's node: this node holds it
            raise _inside(step, error) from None
        except MixrtError:
            raise
        except jit_tier.CompileForbidden as exc:
            result = _on_numpy_path(step, np, args, attributes, exc)
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


def _run_host_calls_limited(calls, env, buffer) -> None:
    """:func:`_run_host_calls` for a run with limits (``base/run_options.py``): checked
    before each step (a segment of bound steps counts as its first)."""
    limits = run_options.current()
    for call in calls:
        try:
            limits.check()
        except run_options.Expired as expired:
            raise terminated(call[0], expired) from None
        _run_host_calls((call,), env, buffer)


def terminated(step, expired) -> RunTerminated:
    """The error of a run that reached its limit at (or inside) ``step``."""
    return RunTerminated(f"the run stopped at {_named(step)}: {expired}")


def _inside(step, error: RunTerminated) -> RunTerminated:
    """``error``, raised in a node of ``step``'s subgraph (a Loop's body), naming ``step``
    too."""
    return RunTerminated(f"{error} (inside {_named(step)})")


def _named(step) -> str:
    node = step.node
    return f"node {step.label!r} ({node.domain or 'ai.onnx'}::{node.op_type})"


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
    limits = run_options.current()
    for step, inputs, attributes, outputs, _ in calls:
        if limits is not None:
            try:
                limits.check()
            except run_options.Expired as expired:
                raise terminated(step, expired) from None
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


def call_step(step, args):
    """One host call of ``step``'s kernel on ``args`` outside a run (the inferred plans'
    shape arithmetic, ``runtime/inferred_plans.py``), failing as a run's step fails."""
    return _call(step, np, args, step.attributes)


def _call(step, xp, args, attributes):
    if xp is not np:
        device_checks.at_node(step.label)
    state = node_state(attributes)
    prepared = state.get("call") if state is not None else None
    try:
        if prepared is not None:
            return prepared(xp, *args)
        return step.fn(xp, *args, **attributes)
    except RunTerminated as error:  # in a subgraph's node: this node holds it
        raise _inside(step, error) from None
    except MixrtError:
        raise
    except jit_tier.CompileForbidden as exc:
        return _on_numpy_path(step, xp, args, attributes, exc)
    except Exception as exc:
        raise _failed(step, exc, args) from exc


def _on_numpy_path(step, xp, args, attributes, forbidden):
    """The step again on its NumPy path, where its compiled kernel is in no cache and a
    run may not compile (``jit_tier.loading_only``: a session's first run of a new shape,
    whose kernels load from the caches): the rest of the run stays compiled, and the miss,
    noted already, goes to the background compiler. Until 2026-11-26 such a miss took the
    whole request to the NumPy tier, again for every new shape that met it (a 6-layer BERT
    whose products change form with the length). A step whose output shares memory with
    an input (an in-place pair) may have written part of it before the miss: that one
    cannot be done again, and the run fails as before (the caller answers on NumPy)."""
    out = attributes.get("out")
    if out is not None and any(isinstance(arg, np.ndarray) and np.may_share_memory(out, arg)
                               for arg in args):
        raise forbidden
    state = node_state(attributes)
    prepared = state.get("call") if state is not None else None
    try:
        with jit_tier.using(False, jit_tier.compile_misses()):
            return prepared(xp, *args) if prepared is not None \
                else step.fn(xp, *args, **attributes)
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
    jit_cpu.release_abandoned_pool()  # a native driver that raised may have left it taken
    if isinstance(exc, run_options.Expired):  # a kernel's long loop reached the run's limit
        return terminated(step, exc)  # (a RunTerminated, an ExecutionError)
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
