"""Check an op's symbolic gradient against central finite differences in float64.

``check_gradient("Mul", [a, b])`` builds a one-node graph, a loss ``sum(Y_k * R_k)`` over its
outputs with fixed random weights ``R_k`` (so every output element matters differently), the
backward graph with ``gradient_graph``, runs it in a Session, and compares each requested
input's gradient with (loss(x + eps) - loss(x - eps)) / (2 eps) computed element by element
through the forward graph alone.
"""

from __future__ import annotations

import numpy as np

import mixrt
from mixrt.ops.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

FD_EPS = 1e-6


def check_gradient(op_type: str, inputs: list, attributes: dict | None = None, *,
                   wrt: list[int] | None = None, constants: tuple[int, ...] = (),
                   domain: str = "", opset: int = 17, outputs: int = 1,
                   loss_outputs: list[int] | None = None, rtol: float = 1e-5,
                   atol: float = 1e-7, seed: int = 0) -> dict[int, np.ndarray]:
    """Compare symbolic and numeric gradients; returns input index -> symbolic gradient.

    ``inputs``: arrays (None for a missing optional input). ``constants``: indices fed as
    initializers (shapes, axes, indices: never differentiated). ``wrt``: indices to check
    (default: every float input that is not a constant). ``loss_outputs``: which outputs the
    loss reads (default all)."""
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


def _numeric_gradient(session, feeds: dict, name: str) -> np.ndarray:
    x = np.array(feeds[name], dtype=np.float64)
    grad = np.zeros_like(x)
    flat, out = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + FD_EPS
        up = _loss(session, feeds, name, x)
        flat[i] = keep - FD_EPS
        down = _loss(session, feeds, name, x)
        flat[i] = keep
        out[i] = (up - down) / (2 * FD_EPS)
    return grad


def _loss(session, feeds, name, value) -> float:
    return float(session.run(["loss"], {**feeds, name: value.copy()})[0])
