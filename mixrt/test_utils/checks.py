"""Checks of ``mxnet.test_utils`` that run something: a symbol against expected values,
against numeric gradients or against itself in other dtypes, and two optimizers against
each other.

Symbols are bound here with arrays made here (not ``simple_bind``, which leaves data
arguments without gradients as Module binds them), so every argument can be checked.
"""

from __future__ import annotations

import numpy as np

from mixrt.errors import InputError
from mixrt.nd import array
from mixrt.test_utils.compare import (_host, assert_almost_equal, compare_ndarray_tuple,
                                      default_context, default_numeric_eps, default_rtols,
                                      default_atols)
from mixrt.test_utils.inputs import rand_ndarray

# -- arguments by name ---------------------------------------------------------------------


def _by_name(names: list[str], values, what: str) -> dict:
    """``values`` (a list in ``names`` order or a dict) as a dict by name."""
    if values is None:
        return {}
    if isinstance(values, dict):
        return dict(values)
    values = [values] if hasattr(values, "shape") else list(values)  # one array: one name
    if len(values) != len(names):
        raise InputError(f"{what}: {len(values)} arrays for the {len(names)} names {names}")
    return dict(zip(names, values))


def _arrays(names: list[str], values, ctx, dtype, what: str) -> dict:
    """NDArrays on ``ctx`` in ``dtype`` (``"asnumpy"`` keeps each value's own dtype)."""
    return {name: array(value, ctx=ctx, dtype=_dtype_for(value, dtype))
            for name, value in _by_name(names, values, what).items()}


def _dtype_for(value, dtype):
    if dtype != "asnumpy":
        return dtype
    return value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype


def _grad_reqs(names: list[str], grad_req) -> dict:
    if isinstance(grad_req, str):
        return dict.fromkeys(names, grad_req)
    reqs = _by_name(names, grad_req, "grad_req")
    return {name: reqs.get(name, "null") for name in names}


def _gradient_buffers(args: dict, reqs: dict) -> tuple[dict, dict]:
    """Gradient arrays for the arguments that get one, and their starting values: random
    where gradients are added (so that adding is checked), zeros where they are written."""
    buffers, initial = {}, {}
    for name, req in reqs.items():
        if req == "null":
            continue
        shape, dtype = args[name].shape, args[name].dtype
        start = np.random.normal(size=shape) if req == "add" else np.zeros(shape)
        initial[name] = start.astype(dtype)
        buffers[name] = array(initial[name], ctx=args[name].context, dtype=dtype)
    return buffers, initial


def _run(sym, ctx, args, aux, is_train, args_grad=None, grad_req="null"):
    executor = sym.bind(ctx, args=args, args_grad=args_grad, grad_req=grad_req,
                        aux_states=aux or None)
    outputs = [_host(o) for o in executor.forward(is_train=is_train)]
    return executor, outputs


# -- forward and backward against expected values ------------------------------------------

def simple_forward(sym, ctx=None, is_train=False, **inputs):
    """Run ``sym`` once on ``inputs`` (by argument name); its outputs as NumPy arrays (the
    array itself when there is one output)."""
    ctx = ctx or default_context()
    _, outputs = _run(sym, ctx, {k: array(v, ctx=ctx) for k, v in inputs.items()}, None,
                      is_train)
    return outputs[0] if len(outputs) == 1 else outputs


def check_symbolic_forward(sym, location, expected, rtol=None, atol=None, aux_states=None,
                           ctx=None, equal_nan=False, dtype=np.float32):
    """Assert that ``sym`` on ``location`` (arguments, a list or a dict) gives
    ``expected`` (a list or a dict by output name); the outputs, as NumPy arrays."""
    ctx = ctx or default_context()
    args = _arrays(sym.list_arguments(), location, ctx, dtype, "location")
    aux = _arrays(sym.list_auxiliary_states(), aux_states, ctx, dtype, "aux_states")
    _, outputs = _run(sym, ctx, args, aux, is_train=False)
    wanted = _by_name(sym.list_outputs(), expected, "expected")
    for name, output in zip(sym.list_outputs(), outputs):
        assert_almost_equal(wanted[name], output, rtol, atol,
                            (f"EXPECTED_{name}", f"FORWARD_{name}"), equal_nan=equal_nan)
    return outputs


def check_symbolic_backward(sym, location, out_grads, expected, rtol=None, atol=None,
                            aux_states=None, grad_req="write", ctx=None, grad_stypes=None,
                            equal_nan=False, dtype=np.float32):
    """Assert that the gradients of ``sym`` at ``location`` for the head gradients
    ``out_grads`` are ``expected`` (a list or a dict by argument name); with
    grad_req "add" they must be added to what the gradient arrays held. The gradients,
    as NumPy arrays by name."""
    ctx = ctx or default_context()
    names = sym.list_arguments()
    args = _arrays(names, location, ctx, dtype, "location")
    aux = _arrays(sym.list_auxiliary_states(), aux_states, ctx, dtype, "aux_states")
    reqs = _grad_reqs(names, grad_req)
    buffers, initial = _gradient_buffers(args, reqs)
    executor, _ = _run(sym, ctx, args, aux, True, buffers, reqs)
    heads = _arrays(sym.list_outputs(), out_grads, ctx, dtype, "out_grads")
    executor.backward([heads[n] for n in sym.list_outputs()] if heads else None)
    grads = {name: _host(executor.grad_dict[name]) for name in buffers}
    wanted = _by_name(names, expected, "expected")
    for name, grad in grads.items():
        if name in wanted:
            target = _host(wanted[name]) + (initial[name] if reqs[name] == "add" else 0)
            assert_almost_equal(target, grad, rtol, atol,
                                (f"EXPECTED_{name}", f"BACKWARD_{name}"), equal_nan=equal_nan)
    return grads


# -- numeric gradients ---------------------------------------------------------------------

def numeric_grad(executor, location, aux_states=None, eps=1e-4, use_forward_train=True,
                 dtype=np.float32):
    """Central finite differences of the sum of ``executor``'s outputs with respect to each
    array of ``location`` (a dict by argument name), one element at a time."""
    del aux_states  # bound with the executor already

    def total(**changed):
        outputs = executor.forward(is_train=use_forward_train, **changed)
        return sum(float(_host(o).astype(np.float64).sum()) for o in outputs)

    grads = {}
    for name, value in location.items():
        point = _host(value).astype(dtype)
        grad = np.zeros(point.shape, dtype=np.float64)
        for index in np.ndindex(*point.shape):
            original = point[index]
            point[index] = original + eps / 2
            above = total(**{name: point})
            point[index] = original - eps / 2
            below = total(**{name: point})
            point[index] = original
            grad[index] = (above - below) / eps
        total(**{name: point})  # leave the executor at the unperturbed point
        grads[name] = grad.astype(dtype)
    return grads


def check_numeric_gradient(sym, location, aux_states=None, numeric_eps=None, rtol=None,
                           atol=None, grad_nodes=None, use_forward_train=True, ctx=None,
                           grad_stype_dict=None, dtype=np.float32):
    """Assert that backward's gradients of ``sym`` at ``location`` match finite
    differences. Both are taken of the outputs weighted by a random projection, so every
    output element counts; ``grad_nodes`` (names, or a dict of name to grad_req) picks the
    arguments checked (default: all)."""
    ctx = ctx or default_context()
    names = sym.list_arguments()
    args = _arrays(names, location, ctx, dtype, "location")
    aux = _arrays(sym.list_auxiliary_states(), aux_states, ctx, dtype, "aux_states")
    nodes = grad_nodes if grad_nodes is not None else names
    reqs = {n: "null" for n in names}
    reqs.update(nodes if isinstance(nodes, dict) else dict.fromkeys(nodes, "write"))
    eps = numeric_eps or default_numeric_eps()[np.dtype(dtype)]

    probe, outputs = _run(sym, ctx, args, aux, use_forward_train)
    projections = [np.random.rand(*o.shape) + 0.1 for o in outputs]
    buffers, initial = _gradient_buffers(args, reqs)
    executor, _ = _run(sym, ctx, args, aux, True, buffers, reqs)
    executor.backward([array(p, ctx=ctx, dtype=o.dtype) for p, o in zip(projections, outputs)])

    projected = _Projected(probe, projections)
    expected = numeric_grad(projected, {n: args[n] for n in buffers}, eps=eps,
                            use_forward_train=use_forward_train, dtype=dtype)
    for name in buffers:
        grad = _host(executor.grad_dict[name]) - (initial[name] if reqs[name] == "add" else 0)
        assert_almost_equal(expected[name], grad, rtol, atol,
                            (f"NUMERICAL_{name}", f"BACKWARD_{name}"))


class _Projected:
    """An executor whose one output is the sum of the wrapped one's outputs weighted by
    fixed projections: the scalar function whose gradient backward computed."""

    def __init__(self, executor, projections):
        self.executor, self.projections = executor, projections

    def forward(self, is_train=False, **changed):
        outputs = self.executor.forward(is_train=is_train, **changed)
        return [np.array(sum(float((_host(o).astype(np.float64) * p).sum())
                             for o, p in zip(outputs, self.projections)))]


# -- one symbol in several dtypes ----------------------------------------------------------

def check_consistency(sym, ctx_list, scale=1.0, grad_req="write", arg_params=None,
                      aux_params=None, rtol=None, atol=None, raise_on_err=True,
                      ground_truth=None, equal_nan=False, use_uniform=False,
                      rand_type=np.float64):
    """Run ``sym`` (or one symbol per entry) for each entry of ``ctx_list`` (a dict with
    'ctx', argument shapes by name and an optional 'type_dict') on the same random
    arguments, and assert that outputs and gradients agree with those of the most precise
    entry (or ``ground_truth``, a dict by name). The outputs and gradients of the most
    precise entry, by name."""
    symbols = list(sym) if isinstance(sym, (list, tuple)) else [sym] * len(ctx_list)
    if len(symbols) != len(ctx_list):
        raise InputError(f"check_consistency: {len(symbols)} symbols for {len(ctx_list)} "
                         f"contexts")
    arg_params = dict(arg_params or {})
    aux_params = dict(aux_params or {})
    arg_shapes, aux_shapes = _shapes(symbols[0], ctx_list[0])
    for name, shape in arg_shapes.items():
        if name not in arg_params:
            arg_params[name] = _random(shape, scale, use_uniform, rand_type)
    for name, shape in aux_shapes.items():
        aux_params.setdefault(name, np.zeros(shape, dtype=rand_type))
    results = [_consistency_run(s, spec, grad_req, arg_params, aux_params)
               for s, spec in zip(symbols, ctx_list)]
    precise = max(range(len(results)), key=lambda i: results[i][1])
    truth = ground_truth or results[precise][0]
    for values, _ in results:
        _compare_with_truth(values, truth, rtol, atol, equal_nan, raise_on_err)
    return truth


def _shapes(sym, spec: dict) -> tuple[dict, dict]:
    shapes = {k: v for k, v in spec.items() if k not in ("ctx", "type_dict")}
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    return (dict(zip(sym.list_arguments(), arg_shapes)),
            dict(zip(sym.list_auxiliary_states(), aux_shapes)))


def _random(shape, scale, use_uniform, rand_type):
    if use_uniform:
        return np.random.uniform(-scale, scale, size=shape).astype(rand_type)
    return np.random.normal(size=shape, scale=scale).astype(rand_type)


def _consistency_run(sym, spec: dict, grad_req, arg_params: dict, aux_params: dict):
    """(outputs and gradients by name, the precision of the first output) of one entry."""
    ctx = spec.get("ctx") or default_context()
    arg_types, _, aux_types = sym.infer_type(**spec.get("type_dict", {}))
    args = {n: array(arg_params[n], ctx=ctx, dtype=t or np.float32)
            for n, t in zip(sym.list_arguments(), arg_types)}
    aux = {n: array(aux_params[n], ctx=ctx, dtype=t or np.float32)
           for n, t in zip(sym.list_auxiliary_states(), aux_types)}
    _, outputs = _run(sym, ctx, args, aux, is_train=False)
    values = dict(zip(sym.list_outputs(), outputs))
    reqs = _grad_reqs(sym.list_arguments(), grad_req)
    if any(req != "null" for req in reqs.values()):
        buffers, _ = _gradient_buffers(args, {n: ("write" if r != "null" else r)
                                              for n, r in reqs.items()})
        executor, trained = _run(sym, ctx, args, aux, True, buffers, reqs)
        executor.backward([array(o, ctx=ctx) for o in trained])
        values.update({f"{n}_grad": _host(executor.grad_dict[n]) for n in buffers})
    precision = np.finfo(outputs[0].dtype).precision if outputs[0].dtype.kind == "f" else 0
    return values, precision


def _compare_with_truth(values: dict, truth: dict, rtol, atol, equal_nan, raise_on_err):
    for name, value in values.items():
        if name not in truth:
            continue
        dtype = np.dtype(value.dtype)
        tolerance = (default_rtols().get(dtype, 1e-3) if rtol is None else rtol,
                     default_atols().get(dtype, 1e-3) if atol is None else atol)
        try:
            assert_almost_equal(truth[name], value, *tolerance,
                                names=(f"ground_truth_{name}", name), equal_nan=equal_nan)
        except AssertionError as mismatch:
            if raise_on_err:
                raise
            print(mismatch)


# -- optimizers ----------------------------------------------------------------------------

def compare_optimizer(opt1, opt2, shape, dtype, w_stype="default", g_stype="default",
                      rtol=1e-4, atol=1e-5, compare_states=True, ntensors=1):
    """Assert that two optimizers make the same states and the same update from the same
    random weights and gradients. With ``ntensors`` > 1, ``shape`` is a list of shapes:
    ``opt1`` (a reference) updates the tensors one at a time, ``opt2`` all of them in one
    multi-tensor call (a list of indices, weights, gradients and states), as MXNet's
    aggregated updates run."""
    shapes = list(shape) if ntensors > 1 else [shape]
    if len(shapes) != ntensors:
        raise InputError(f"compare_optimizer: {len(shapes)} shapes for ntensors={ntensors}")
    ctx = default_context()
    # as MXNet's: opt2 gets the arrays in their storage types (a sparse gradient of random
    # density, so that lazy updates skip rows), the reference opt1 dense copies of them
    weights2 = [rand_ndarray(s, w_stype, density=1, dtype=dtype, ctx=ctx) for s in shapes]
    grads2 = [rand_ndarray(s, g_stype, density=None if g_stype != "default" else 1,
                           dtype=dtype, ctx=ctx) for s in shapes]
    weights1 = [w.copyto(ctx).tostype("default") for w in weights2]
    grads1 = [g.copyto(ctx).tostype("default") for g in grads2]
    states1 = [opt1.create_state_multi_precision(i, w) for i, w in enumerate(weights1)]
    states2 = [opt2.create_state_multi_precision(i, w) for i, w in enumerate(weights2)]
    if compare_states:
        compare_ndarray_tuple(tuple(states1), tuple(states2))
    for i, (weight, grad, state) in enumerate(zip(weights1, grads1, states1)):
        opt1.update_multi_precision(i, weight, grad, state)
    if ntensors == 1:
        opt2.update_multi_precision(0, weights2[0], grads2[0], states2[0])
    else:
        opt2.update_multi_precision(list(range(ntensors)), weights2, grads2, states2)
    if compare_states:
        compare_ndarray_tuple(tuple(states1), tuple(states2), rtol=rtol, atol=atol)
    for w1, w2 in zip(weights1, weights2):
        assert_almost_equal(w1.asnumpy(), w2.asnumpy(), rtol=rtol, atol=atol)
