"""Each step of a plan as the host loop calls it with one arena: the names it reads, its
attributes with ``out=`` its output's view, its outputs' views, and the few words the loop
unpacks (``run_loop._run_host_calls``). Made once per arena, on its first run.

Most of that is the same for every plan of a form (which steps write into a static view,
which outputs are detached, reshaped or fetched how); only the views are the arena's own.
So the part that is not is worked out once per plan structure (``executor.PlanStructure``,
shared by the plans of a form's new sizes) and an arena fills in its views: a new sequence
length's calls were ~2 us a step to make (~0.15 ms of a 2-layer BERT, ~0.4 ms of a 5-layer
RoBERTa), about half of it what the structure already knew.
"""

from __future__ import annotations

from operator import itemgetter

# what a step's call is, as its template says (the host form's arity comes with it)
RESHAPED, GENERAL, ONE_OUTPUT, SEVERAL_OUTPUTS = range(4)


def arena_calls(arena, plan) -> list:
    """The plan's steps as this arena runs them: (step, the names it reads, its
    attributes with ``out=`` its output's view when it has a static one, each output as
    (name, view or None, detached), and the step's form for ``run_loop._run_host_calls``
    (None where it needs the general loop's care: subgraphs, absent first inputs, no
    named output)). Working these out per node and run was ~1.5 us of the ~3.5 the run
    loop spent around each kernel: they are made once per arena."""
    if arena.calls is None:
        templates = plan.call_templates[0]
        if templates is None:
            templates = plan.call_templates[0] = _templates(plan)
        views, reshapes = arena.views, plan.reshapes
        calls = []
        for step, inputs, attributes, into, outputs, kind, arity, fetch, state in templates:
            if into is not None:
                attributes = dict(attributes, out=views[into])
            placed = tuple((name, views.get(name), detached) for name, detached in outputs)
            if kind == ONE_OUTPUT:
                name, view, detached = placed[0]
                form = arity, fetch, name, view, detached, state, None
            elif kind == RESHAPED:
                name = outputs[0][0]
                form = -1, inputs[0], name, reshapes[name], False, None, None
            elif kind == SEVERAL_OUTPUTS:
                form = arity, fetch, None, placed, False, state, None
            else:
                form = None
            calls.append((step, inputs, attributes, placed, form))
        arena.calls = calls
    return arena.calls


def _templates(plan) -> list:
    """Per step, what its call is whatever the arena: (step, inputs, attributes, the output
    written into its view as ``out=`` or None, each output as (name, detached), the kind
    of call, and the host form's arity, fetch and node state)."""
    slots, templates = plan.slots, []
    for step in plan.steps:
        outputs = step.node.outputs
        first = outputs[0] if outputs else ""
        into = first if first in slots and step.writes_into and slots[first].static else None
        named = tuple((name, name in plan.detached) for name in outputs)
        kind, arity, fetch, state = _kind(step, first in plan.reshapes)
        templates.append((step, tuple(step.inputs), step.attributes, into, named, kind,
                          arity, fetch, state))
    return templates


def _kind(step, reshaped: bool) -> tuple:
    """(kind, arity, fetch, node state) of a step's call: a reshape whose output shape the
    plan knows (the loop makes the view itself); the general loop's (subgraphs, no output,
    an absent first input, an unnamed output); else a host form over its inputs, fetched
    as one name, an ``itemgetter`` or a function where some are absent."""
    if reshaped:
        return RESHAPED, -1, None, None
    names = tuple(step.inputs)
    outputs = step.node.outputs
    if step.subgraphs or not outputs or (names and not names[0]) \
            or (len(outputs) == 1 and not outputs[0]):
        return GENERAL, 0, None, None
    if all(names):
        fetch = _fetch(names) if len(names) > 1 else (names[0] if names else None)
    else:  # an absent optional input between present ones reads None, as in _run_calls
        fetch = _with_absent(names)
    kind = SEVERAL_OUTPUTS if len(outputs) > 1 else ONE_OUTPUT
    return kind, len(names), fetch, node_state(step.attributes)


def _fetch(names: tuple):
    """``itemgetter(*names)``, one per tuple of names for every arena and session (each
    arena of a new shape made its own: ~40 objects a small BERT's plan for the collector)."""
    found = _FETCHES.get(names)
    if found is None:
        if len(_FETCHES) >= MAX_FETCHES:
            _FETCHES.clear()
        found = _FETCHES[names] = itemgetter(*names)
    return found


_FETCHES, MAX_FETCHES = {}, 1 << 14  # (the getters, how many before starting over)


def _with_absent(names):
    """``env -> args`` for inputs some of which are absent (empty names): None for those."""
    def fetch(env):
        return tuple(env[name] if name else None for name in names)
    return fetch


def node_state(attributes) -> dict | None:
    """The node's state dict (``_node``) when its kernel may leave a prepared call there:
    ``state["call"](xp, *inputs)``, set by the kernel's first call once it has turned its
    attributes into a model (ops/ir/node_state.py), runs the node from then on without
    passing the attributes again (a tree ensemble's twenty keyword arguments cost ~3 us a
    call to bind). Kernels that write into ``out=`` keep none."""
    state = attributes.get("_node")
    return state if state is not None and "out" not in attributes else None
