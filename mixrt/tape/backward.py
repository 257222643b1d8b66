"""Backward passes over the tape: ``backward`` writes the gradients into the variables'
``.grad``, ``grad`` returns them (recorded again with ``create_graph=True``), and
``mark_variables`` makes arrays leaves whose gradients land in given arrays.
"""

from __future__ import annotations

from mixrt.base.errors import GradientError, InputError
from mixrt.tape import nodes
from mixrt.tape.arrays import new_array
from mixrt.tape.recording import scope



def mark_variables(variables, gradients, grad_reqs="write") -> None:
    """Make ``variables`` leaves whose gradients land in ``gradients`` (same shapes)."""
    variables, gradients = _as_list(variables), _as_list(gradients)
    reqs = [grad_reqs] * len(variables) if isinstance(grad_reqs, str) else list(grad_reqs)
    if not len(variables) == len(gradients) == len(reqs):
        raise InputError(f"mark_variables: {len(variables)} variables, {len(gradients)} "
                         f"gradients and {len(reqs)} grad_reqs must match")
    for variable, gradient, req in zip(variables, gradients, reqs):
        if gradient.shape != variable.shape:
            raise InputError(f"mark_variables: gradient shape {gradient.shape} does not match "
                             f"the variable's {variable.shape}")
        variable.attach_grad(req)
        variable._grad = gradient


def backward(heads, head_grads=None, retain_graph: bool = False,
             train_mode: bool = True) -> None:
    """Compute the gradients of ``heads`` and write (or add, per ``grad_req``) them into the
    ``.grad`` of every variable they were computed from."""
    del train_mode  # the recorded ops already ran in the mode they were recorded in
    heads = _as_list(heads)
    nodes.run_backward(heads, _seeds(heads, head_grads), retain_graph, on_leaf=_store_grad)


def grad(heads, variables, head_grads=None, retain_graph: bool | None = None,
         create_graph: bool = False, train_mode: bool = True) -> list:
    """The gradients of ``heads`` with respect to ``variables``, returned (``.grad`` is left
    alone). With ``create_graph=True`` the gradients are recorded as they are computed, so
    they can be differentiated again (``(g * g).sum().backward()`` for a gradient
    penalty); the graph is then kept unless ``retain_graph=False``."""
    del train_mode
    heads, variables = _as_list(heads), _as_list(variables)
    seeds = _seeds(heads, head_grads)
    if create_graph:
        seeds = [new_array(seed, head.ctx) for seed, head in zip(seeds, heads)]
        keep = True if retain_graph is None else bool(retain_graph)
        with scope(True, None):
            leaf_grads = nodes.run_backward(heads, seeds, keep, create_graph=True)
    else:
        leaf_grads = nodes.run_backward(heads, seeds, bool(retain_graph))
    results = []
    for index, variable in enumerate(variables):
        found = leaf_grads.get(id(variable))
        if found is None:
            raise GradientError(
                f"grad: variable {index} (shape {variable.shape}) does not influence the "
                f"heads: it was not used under autograd.record(), or it was not marked with "
                f"attach_grad() before use, or the path to it went through .detach()")
        if not create_graph:
            results.append(new_array(found[1], variable.ctx))
        elif found[1]._entry is None:
            results.append(_constant_of(variable, found[1]))
        else:
            results.append(found[1])
    return results


class _ConstantGradient:
    """The tape's node for a gradient that does not depend on its variable (that of a
    function linear in it): differentiating it again gives zeros, as in MXNet, where the
    gradient stays in the recorded graph, instead of a head that is in no graph."""

    def __init__(self, variable):
        self.shape, self.dtype, self.ctx = variable.shape, variable.dtype, variable.ctx

    def backward(self, _dy):
        with self.ctx.device.active():
            return new_array(self.ctx.xp.zeros(self.shape, dtype=self.dtype), self.ctx)


def _constant_of(variable, gradient):
    """``gradient`` recorded as a constant function of ``variable``."""
    node = nodes.FunctionNode(_ConstantGradient(variable), [variable], gradient.ctx,
                             [(gradient.shape, gradient.dtype)])
    node.name = "constant gradient"
    gradient._entry = (node, 0)
    return gradient


def _seeds(heads, head_grads) -> list:
    if head_grads is not None:
        head_grads = _as_list(head_grads)
        if len(head_grads) != len(heads):
            raise InputError(f"backward: {len(heads)} heads but {len(head_grads)} head_grads")
    seeds = []
    for index, head in enumerate(heads):
        if head._entry is None and head._grad is None:
            raise GradientError(
                f"backward: head {index} (shape {head.shape}) was not computed under "
                f"autograd.record() from any array with a gradient attached; call "
                f"x.attach_grad() on the inputs and compute the head inside "
                f"`with autograd.record():` (a gradient from grad(create_graph=True) of "
                f"a function linear in the variables is a constant, with nothing to "
                f"differentiate)")
        given = None if head_grads is None else head_grads[index]
        with head.ctx.device.active():  # the seed goes to the head's GPU
            seeds.append(head.ctx.xp.ones(head.shape, dtype=head.dtype) if given is None
                         else _seed_array(given, head))
    return seeds


def _seed_array(given, head):
    raw = given._read() if hasattr(given, "_read") else head.ctx.xp.asarray(given)
    if tuple(raw.shape) != head.shape:
        raise InputError(f"backward: head gradient shape {tuple(raw.shape)} does not match "
                         f"the head's {head.shape}")
    return raw.astype(head.dtype, copy=False)


def _store_grad(variable, grad) -> None:
    if variable._grad is None or variable._grad_req == "null":
        return
    target = variable._grad._write()  # waits for engine work still reading it
    with variable.ctx.device.active():
        if variable._grad_req == "add":
            target += grad
        else:
            target[...] = grad
    # _write counted one version; a Trainer tells a fresh gradient from a stale one by it
    if variable._on_grad is not None:
        variable._on_grad(variable)


def _as_list(values) -> list:
    return list(values) if isinstance(values, (list, tuple)) else [values]
