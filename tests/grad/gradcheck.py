"""Check an op's symbolic gradient against central finite differences in float64.

``check_gradient("Mul", [a, b])`` builds a one-node graph, a loss ``sum(Y_k * R_k)`` over its
outputs with fixed random weights ``R_k`` (so every output element matters differently), the
backward graph with ``gradient_graph``, runs it in a Session, and compares each requested
input's gradient with (loss(x + eps) - loss(x - eps)) / (2 eps) computed element by element
through the forward graph alone. Then, unless told not to, it checks the gradient of that
gradient (``check_second_order``), along a few random directions: what
``autograd.grad(create_graph=True)`` relies on.
"""

from __future__ import annotations

import numpy as np

import mixrt
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

FD_EPS = 1e-6


def check_gradient(op_type: str, inputs: list, attributes: dict | None = None, *,
                   wrt: list[int] | None = None, constants: tuple[int, ...] = (),
                   domain: str = "", opset: int = 17, outputs: int = 1,
                   loss_outputs: list[int] | None = None, rtol: float = 1e-5,
                   atol: float = 1e-7, seed: int = 0,
                   second_order: bool = True) -> dict[int, np.ndarray]:
    """Compare symbolic and numeric gradients; returns input index -> symbolic gradient.

    ``inputs``: arrays (None for a missing optional input). ``constants``: indices fed as
    initializers (shapes, axes, indices: never differentiated). ``wrt``: indices to check
    (default: every float input that is not a constant). ``loss_outputs``: which outputs the
    loss reads (default all). ``second_order``: also check the gradient's gradient (with
    tolerances no tighter than 1e-4 relative, 1e-6 absolute: differences of differences)."""
    graph, names = _one_node_graph(op_type, inputs, attributes or {}, constants, domain,
                                   opset, outputs)
    weights = _add_loss(graph, range(outputs) if loss_outputs is None else loss_outputs, inputs,
                        names, seed)
    if wrt is None:
        wrt = [i for i, x in enumerate(inputs) if x is not None and i not in constants
               and np.asarray(x).dtype.kind == "f"]
    feeds = {names[i]: x for i, x in enumerate(inputs) if x is not None and i not in constants}
    feeds.update(weights)
    joint = gradient_graph(graph, "loss", [names[i] for i in wrt])
    session = mixrt.Session(joint.graph, opt_level=0)
    wanted = [joint.grads[names[i]] for i in wrt]
    symbolic = dict(zip(wrt, session.run(wanted, feeds)))
    forward = mixrt.Session(graph, opt_level=0)
    for index in wrt:
        numeric = _numeric_gradient(forward, feeds, names[index])
        got = symbolic[index]
        assert got.shape == numeric.shape, (op_type, index, got.shape, numeric.shape)
        np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"{op_type}: d loss / d input {index}")
    if second_order:
        check_second_order(op_type, inputs, attributes, wrt=wrt, constants=constants,
                           domain=domain, opset=opset, outputs=outputs,
                           loss_outputs=loss_outputs, rtol=max(rtol, 1e-4),
                           atol=max(atol, 1e-6), seed=seed)
    return symbolic


def _one_node_graph(op_type, inputs, attributes, constants, domain, opset, outputs):
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    graph = Graph(name=f"grad_{op_type}", opsets={"": opset, "mixrt": 1})
    for i, x in enumerate(inputs):
        if x is None:
            continue
        x = np.asarray(x)
        if i in constants:
            graph.initializers[names[i]] = x
        else:
            graph.inputs.append(Value(names[i], TensorType(x.dtype, x.shape)))
    outs = [f"y{k}" for k in range(outputs)]
    graph.nodes.append(Node(op_type, names, outs, name=op_type, domain=domain,
                            opset=1 if domain else opset, attributes=attributes))
    graph.outputs = [Value(name) for name in outs]
    return graph, names


def _add_loss(graph, read, inputs, names, seed) -> dict:
    """loss = sum_k sum(Y_k * R_k), with R_k fed as inputs shaped like Y_k."""
    probe = mixrt.Session(graph, opt_level=0)
    feeds = {names[i]: x for i, x in enumerate(inputs)
             if x is not None and names[i] not in graph.initializers}
    values = probe.run(None, feeds)
    rng = np.random.default_rng(seed)
    weights, terms = {}, []
    for k in read:
        y = np.asarray(values[k])
        r = f"r{k}"
        weights[r] = rng.standard_normal(y.shape).astype(y.dtype)
        graph.inputs.append(Value(r, TensorType(y.dtype, y.shape)))
        graph.nodes.append(Node("Mul", [f"y{k}", r], [f"m{k}"], name=f"weigh{k}", opset=17))
        graph.nodes.append(Node("ReduceSum", [f"m{k}"], [f"s{k}"], name=f"sum{k}", opset=17,
                                attributes={"keepdims": 0}))
        terms.append(f"s{k}")
    graph.nodes.append(Node("Sum", terms, ["loss"], name="loss", opset=17))
    graph.outputs = [Value("loss")] + graph.outputs
    return weights


def _numeric_gradient(session, feeds: dict, name: str, output: str = "loss") -> np.ndarray:
    x = np.array(feeds[name], dtype=np.float64)
    grad = np.zeros_like(x)
    flat, out = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + FD_EPS
        up = _loss(session, feeds, name, x, output)
        flat[i] = keep - FD_EPS
        down = _loss(session, feeds, name, x, output)
        flat[i] = keep
        out[i] = (up - down) / (2 * FD_EPS)
    return grad


def _loss(session, feeds, name, value, output: str = "loss") -> float:
    return float(session.run([output], {**feeds, name: value.copy()})[0])


# -- second order -----------------------------------------------------------------------------

def check_second_order(op_type: str, inputs: list, attributes: dict | None = None, *,
                       wrt: list[int] | None = None, constants: tuple[int, ...] = (),
                       domain: str = "", opset: int = 17, outputs: int = 1,
                       loss_outputs: list[int] | None = None, rtol: float = 1e-5,
                       atol: float = 1e-7, seed: int = 0) -> dict[int, np.ndarray]:
    """Compare the gradient of an op's gradient with central differences of the first.

    The loss is ``sum(R1 Y + R2 Y^2)`` over the read outputs, so the output gradient depends
    on the inputs and both of a backward kernel's paths are exercised: through dY and through
    the forward values it reads. The first-order gradients are built to be differentiated
    again (``differentiable_backward``) and must equal the plain ones; the checked quantity
    is the penalty ``sum_i <d loss / d x_i, V_i>`` for fixed random V_i, differentiated in
    every ``wrt`` input. Returns input index -> d penalty / d input."""
    graph, names = _one_node_graph(op_type, inputs, attributes or {}, constants, domain,
                                   opset, outputs)
    feeds = {names[i]: x for i, x in enumerate(inputs) if x is not None and i not in constants}
    feeds.update(_add_quadratic_loss(graph, range(outputs) if loss_outputs is None
                                     else loss_outputs, feeds, seed))
    if wrt is None:
        wrt = [i for i, x in enumerate(inputs) if x is not None and i not in constants
               and np.asarray(x).dtype.kind == "f"]
    wrt_names = [names[i] for i in wrt]
    plain = gradient_graph(graph, "loss", wrt_names)
    first = gradient_graph(graph, "loss", wrt_names, differentiable_backward=True)
    expected = mixrt.Session(plain.graph, opt_level=0).run(
        [plain.grads[w] for w in wrt_names], feeds)
    expanded = mixrt.Session(first.graph, opt_level=0).run(
        [first.grads[w] for w in wrt_names], feeds)
    for k, (got, value) in enumerate(zip(expanded, expected)):
        np.testing.assert_allclose(got, value, rtol=1e-9, atol=1e-12,  # the fused one's
                                   err_msg=f"{op_type}: first-order d / d input {wrt[k]}")
    rng = np.random.default_rng(seed + 1)
    penalty_graph = first.graph
    terms = []
    for k, (name, value) in enumerate(zip(wrt_names, expected)):
        direction = f"v{k}"
        feeds[direction] = rng.standard_normal(np.shape(value)).astype(np.asarray(value).dtype)
        penalty_graph.inputs.append(Value(direction, TensorType(feeds[direction].dtype,
                                                                feeds[direction].shape)))
        terms.append(_weighted_sum(penalty_graph, first.grads[name], direction, f"p{k}"))
    penalty_graph.nodes.append(Node("Sum", terms, ["penalty"], name="penalty", opset=17))
    penalty_graph.outputs = [Value("penalty")]
    second = gradient_graph(penalty_graph, "penalty", wrt_names)
    symbolic = dict(zip(wrt, mixrt.Session(second.graph, opt_level=0).run(
        [second.grads[w] for w in wrt_names], feeds)))
    penalty = mixrt.Session(penalty_graph, opt_level=0)
    for index in wrt:
        _check_along_directions(penalty, feeds, names[index], symbolic[index], rng,
                                rtol=rtol, atol=atol,
                                label=f"{op_type}: d penalty / d input {index}")
    return symbolic


SECOND_ORDER_DIRECTIONS = 3


def _check_along_directions(session, feeds, name, symbolic, rng, *, rtol, atol, label):
    """The second-order gradient projected on a few random directions u: <g, u> against
    (penalty(x + eps u) - penalty(x - eps u)) / (2 eps), two runs per direction where the
    element-by-element differences took two per element (PyTorch's fast gradcheck projects
    the same way). A wrong element shows in every random projection; an input of three or
    fewer elements is still checked along each element's own axis."""
    x = np.array(feeds[name], dtype=np.float64)
    if x.size <= SECOND_ORDER_DIRECTIONS:
        directions = list(np.eye(x.size).reshape(x.size, *x.shape))
    else:
        directions = [rng.standard_normal(x.shape) for _ in range(SECOND_ORDER_DIRECTIONS)]
    for k, u in enumerate(directions):
        up = _loss(session, feeds, name, x + FD_EPS * u, "penalty")
        down = _loss(session, feeds, name, x - FD_EPS * u, "penalty")
        terms = np.asarray(symbolic, dtype=np.float64) * u
        # the element-by-element tolerance, summed along u
        allowed = atol * np.abs(u).sum() + rtol * np.abs(terms).sum()
        np.testing.assert_allclose(terms.sum(), (up - down) / (2 * FD_EPS), rtol=0,
                                   atol=allowed, err_msg=f"{label}, direction {k}")


def _weighted_sum(graph, value: str, weight: str, name: str) -> str:
    """sum(value * weight) in float64 (outputs of several dtypes add up in one loss)."""
    graph.nodes.append(Node("Mul", [value, weight], [f"{name}_m"], name=f"{name}_m", opset=17))
    graph.nodes.append(Node("ReduceSum", [f"{name}_m"], [f"{name}_s"], name=f"{name}_s",
                            opset=17, attributes={"keepdims": 0}))
    graph.nodes.append(Node("Cast", [f"{name}_s"], [name], name=name, opset=17,
                            attributes={"to": 11}))
    return name


def _add_quadratic_loss(graph, read, feeds: dict, seed: int) -> dict:
    """loss = sum_k sum(R_k Y_k + Q_k Y_k^2), R_k and Q_k fed as inputs shaped like Y_k."""
    values = mixrt.Session(graph, opt_level=0).run(None, feeds)
    rng = np.random.default_rng(seed)
    weights, terms = {}, []
    for k in read:
        y = np.asarray(values[k])
        for kind in ("r", "q"):
            weights[f"{kind}{k}"] = rng.standard_normal(y.shape).astype(y.dtype)
            graph.inputs.append(Value(f"{kind}{k}", TensorType(y.dtype, y.shape)))
        graph.nodes.append(Node("Mul", [f"y{k}", f"y{k}"], [f"yy{k}"], name=f"square{k}",
                                opset=17))
        terms.append(_weighted_sum(graph, f"y{k}", f"r{k}", f"lin{k}"))
        terms.append(_weighted_sum(graph, f"yy{k}", f"q{k}", f"quad{k}"))
    graph.nodes.append(Node("Sum", terms, ["loss"], name="loss", opset=17))
    graph.outputs = [Value("loss")] + graph.outputs
    return weights


# -- low precision ----------------------------------------------------------------------------
# A spec is (op_type, inputs, attributes, opset, the input indices differentiated). The
# gradients are computed in a low-precision dtype and in float64 on the same rounded inputs
# and loss weights, and compared relative to the largest reference gradient: finite
# differences mean nothing at float16's or bfloat16's resolution.

def _as(inputs, dtype):
    return [np.asarray(x, dtype=dtype) for x in inputs]


def _spec_gradients(spec, dtype, rounded_to, differentiable_backward):
    """The joint graph, the differentiated names, the feeds and d loss / d inputs."""
    op_type, inputs, attributes, opset, wrt = spec
    inputs = _as(_as(inputs, rounded_to), dtype)  # every run sees the same rounded values
    graph, names = _one_node_graph(op_type, inputs, dict(attributes), (), "", opset, 1)
    feeds = {names[i]: x for i, x in enumerate(inputs)}
    # a quadratic loss when the result is differentiated again, so that no second
    # derivative (a bias's) is zero by construction
    weights = (_add_quadratic_loss(graph, [0], feeds, seed=5) if differentiable_backward
               else _add_loss(graph, [0], inputs, names, seed=5))
    feeds.update({k: v.astype(rounded_to).astype(dtype) for k, v in weights.items()})
    wrt_names = [names[i] for i in wrt]
    joint = gradient_graph(graph, "loss", wrt_names,
                           differentiable_backward=differentiable_backward)
    grads = mixrt.Session(joint.graph, opt_level=0).run(
        [joint.grads[w] for w in wrt_names], feeds)
    return joint, wrt_names, feeds, grads


def gradients_in(spec, dtype, *, rounded_to) -> list:
    """d sum(Y * R) / d inputs, computed in ``dtype`` on inputs rounded to ``rounded_to``."""
    return _spec_gradients(spec, dtype, rounded_to, differentiable_backward=False)[3]


def second_order_in(spec, dtype, *, rounded_to) -> list:
    """d sum_i <d loss / d x_i, V_i> / d inputs in ``dtype``, the first order built to be
    differentiated (``differentiable_backward``)."""
    joint, wrt_names, feeds, first = _spec_gradients(spec, dtype, rounded_to, True)
    directions = np.random.default_rng(6)
    terms = []
    for k, (name, value) in enumerate(zip(wrt_names, first)):
        feeds[f"v{k}"] = directions.standard_normal(value.shape).astype(rounded_to) \
            .astype(dtype)
        joint.graph.inputs.append(Value(f"v{k}", TensorType(np.dtype(dtype), value.shape)))
        terms.append(_weighted_sum(joint.graph, joint.grads[name], f"v{k}", f"p{k}"))
    joint.graph.nodes.append(Node("Sum", terms, ["penalty"], name="penalty", opset=17))
    joint.graph.outputs = [Value("penalty")]
    second = gradient_graph(joint.graph, "penalty", wrt_names)
    return mixrt.Session(second.graph, opt_level=0).run(
        [second.grads[w] for w in wrt_names], feeds)


def assert_near_reference(got, reference, label, tolerance=2e-2):
    """Every gradient finite and within ``tolerance`` of the largest reference value."""
    for k, (g, r) in enumerate(zip(got, reference)):
        g = np.asarray(g, dtype=np.float64)
        assert np.isfinite(g).all(), f"{label}: gradient {k} is not finite"
        scale = np.abs(r).max()
        assert scale > 0, f"{label}: reference gradient {k} is all zeros"
        error = np.abs(g - r).max() / scale
        assert error < tolerance, f"{label}: gradient {k} off by {error:.3g} of its largest"
