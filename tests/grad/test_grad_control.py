"""The gradient of If (runtime/passes/control_gradients.py): through either branch, values the
branches read from the enclosing graph, nested Ifs, branch outputs that are captured values or
constants, second order, a model onnxruntime runs, training, and the GPU; all against float64
central differences."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mixrt
from mixrt.importers.onnx import import_model
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import gpu_available
from mixrt.runtime.graph import Graph, Node, Value
from mixrt.runtime.passes.autodiff import gradient_graph

from grad.gradcheck import _numeric_gradient

rng = np.random.default_rng(41)
F64 = np.dtype(np.float64)


def randn(*shape):
    return rng.standard_normal(shape)


def node(op_type, inputs, outputs, **attributes):
    return Node(op_type, inputs, outputs, name=outputs[0], opset=17, attributes=attributes)


def branch(name, nodes, outputs, initializers=None):
    return Graph(name=name, nodes=nodes, outputs=[Value(o) for o in outputs],
                 initializers=initializers or {}, opsets={"": 17})


def if_graph(then_branch, else_branch, outputs=1, extra_nodes=()):
    """Inputs c (bool), x [3, 4], w [4]; y_k = If(c); loss = sum_k sum(y_k * r_k)."""
    ys = [f"y{k}" for k in range(outputs)]
    graph = Graph(name="if_grad", opsets={"": 17}, inputs=[
        Value("c", TensorType(np.dtype(bool), (1,))), Value("x", TensorType(F64, (3, 4))),
        Value("w", TensorType(F64, (4,)))])
    graph.nodes = [*extra_nodes, Node("If", ["c"], ys, name="if", opset=17, attributes={
        "then_branch": then_branch, "else_branch": else_branch})]
    return add_weighted_loss(graph, dict(enumerate(ys)))


def add_weighted_loss(graph, read: dict):
    """loss = sum_k sum(read[k] * r_k), the weights r_k fed as inputs."""
    terms = []
    for k, name in read.items():
        graph.inputs.append(Value(f"r{k}", TensorType(F64, None)))
        graph.nodes += [node("Mul", [name, f"r{k}"], [f"m{k}"]),
                        node("ReduceSum", [f"m{k}"], [f"s{k}"], keepdims=0)]
        terms.append(f"s{k}")
    graph.nodes.append(node("Sum", terms, ["loss"]))
    graph.outputs = [Value("loss")]
    return graph


def feeds_for(cond, shapes):
    feeds = {"c": np.array([cond]), "x": randn(3, 4), "w": randn(4)}
    feeds.update({f"r{k}": randn(*shape) for k, shape in enumerate(shapes)})
    return feeds


def check_if_gradient(graph, feeds, wrt=("x", "w"), *, second_order=True):
    """Symbolic gradients of the loss against central differences, then (second_order) the
    gradient of <d loss / d x, V> the same way."""
    gradient = gradient_graph(graph, "loss", list(wrt))
    got = mixrt.Session(gradient.graph, opt_level=0).run(
        [gradient.grads[w] for w in wrt], feeds)
    forward = mixrt.Session(graph, opt_level=0)
    for name, value in zip(wrt, got):
        np.testing.assert_allclose(value, _numeric_gradient(forward, feeds, name),
                                   rtol=1e-6, atol=1e-8, err_msg=f"d loss / d {name}")
    if second_order:
        check_second_order(graph, feeds, wrt)
    return dict(zip(wrt, got))


def check_second_order(graph, feeds, wrt):
    first = gradient_graph(graph, "loss", list(wrt), differentiable_backward=True)
    penalty = first.graph
    feeds = dict(feeds)
    terms = []
    for k, name in enumerate(wrt):
        feeds[f"v{k}"] = randn(*feeds[name].shape)
        penalty.inputs.append(Value(f"v{k}", TensorType(F64, feeds[name].shape)))
        penalty.nodes += [node("Mul", [first.grads[name], f"v{k}"], [f"pv{k}"]),
                          node("ReduceSum", [f"pv{k}"], [f"ps{k}"], keepdims=0)]
        terms.append(f"ps{k}")
    penalty.nodes.append(node("Sum", terms, ["penalty"]))
    penalty.outputs = [Value("penalty")]
    second = gradient_graph(penalty, "penalty", list(wrt))
    got = mixrt.Session(second.graph, opt_level=0).run([second.grads[w] for w in wrt], feeds)
    at = mixrt.Session(penalty, opt_level=0)
    for name, value in zip(wrt, got):
        np.testing.assert_allclose(value, _numeric_gradient(at, feeds, name, "penalty"),
                                   rtol=1e-5, atol=1e-7, err_msg=f"d penalty / d {name}")


# -- the branches -----------------------------------------------------------------------------

def tanh_branch():
    """tanh(x * w): reads x and w from outside."""
    return branch("then", [node("Mul", ["x", "w"], ["t1"]), node("Tanh", ["t1"], ["t2"])],
                  ["t2"])


def sin_branch():
    """sin(x) + 0.5 with its own initializer: reads x only, so w's gradient is zero here."""
    half = np.array(0.5)
    return branch("else", [node("Sin", ["x"], ["e1"]), node("Add", ["e1", "half"], ["e2"])],
                  ["e2"], initializers={"half": half})


@pytest.mark.parametrize("cond", [True, False])
def test_either_branch_against_central_differences(cond):
    graph = if_graph(tanh_branch(), sin_branch())
    grads = check_if_gradient(graph, feeds_for(cond, [(3, 4)]))
    if not cond:
        np.testing.assert_array_equal(grads["w"], 0.0)


@pytest.mark.parametrize("cond", [True, False])
def test_outputs_that_are_captured_values_constants_or_the_same_twice(cond):
    """then: (x, x * x, t) with t = x * w; else: (a constant, w broadcast by an Expand, t)
    with t = sin(x): one output is a captured name, one branch output has no gradient, and
    the third output is shared by the other two of no branch."""
    then_branch = branch("then", [node("Mul", ["x", "x"], ["sq"]), node("Mul", ["x", "w"],
                                                                         ["t"])],
                         ["x", "sq", "t"])
    shape = np.array([3, 4], np.int64)
    else_branch = branch("else", [node("Expand", ["w", "shape"], ["we"]),
                                  node("Sin", ["x"], ["t"])],
                         ["ones", "we", "t"], initializers={"ones": np.ones((3, 4)),
                                                            "shape": shape})
    graph = if_graph(then_branch, else_branch, outputs=3)
    check_if_gradient(graph, feeds_for(cond, [(3, 4)] * 3))


def nested_if_graph():
    inner_then = branch("inner_then", [node("Mul", ["u", "w"], ["p"])], ["p"])
    inner_else = branch("inner_else", [node("Exp", ["u"], ["q"])], ["q"])
    outer_then = branch("outer_then", [
        node("Tanh", ["x"], ["u"]),
        Node("If", ["c2"], ["v"], name="inner", opset=17,
             attributes={"then_branch": inner_then, "else_branch": inner_else}),
        node("Mul", ["v", "x"], ["o"])], ["o"])
    graph = if_graph(outer_then, sin_branch())
    graph.inputs.append(Value("c2", TensorType(np.dtype(bool), (1,))))
    return graph


@pytest.mark.parametrize("outer, inner", [(True, True), (True, False), (False, True)])
def test_nested_if_reads_through_two_scopes(outer, inner):
    """The then branch holds an If on a second condition whose branches read x and w from
    the top graph, and an intermediate of the outer branch."""
    graph = nested_if_graph()
    feeds = feeds_for(outer, [(3, 4)])
    feeds["c2"] = np.array([inner])
    check_if_gradient(graph, feeds)


def test_values_computed_before_the_if_get_their_gradient_through_it():
    """The branches read h = x @ W from the enclosing graph, not a graph input: the gradient
    flows through the If into h, then on into x and W."""
    then_branch = branch("then", [node("Relu", ["h"], ["a"])], ["a"])
    else_branch = branch("else", [node("Mul", ["h", "h"], ["b"])], ["b"])
    graph = if_graph(then_branch, else_branch,
                     extra_nodes=[node("Mul", ["x", "w"], ["h"])])
    for cond in (True, False):
        check_if_gradient(graph, feeds_for(cond, [(3, 4)]))


def test_an_integer_value_the_branches_read_gets_no_gradient():
    """Shapes and indices from outside are read, not differentiated."""
    then_branch = branch("then", [node("Reshape", ["x", "shape"], ["flat"]),
                                  node("Tanh", ["flat"], ["t"])], ["t"])
    else_branch = branch("else", [node("Reshape", ["x", "shape"], ["flat"])], ["flat"])
    graph = if_graph(then_branch, else_branch)
    graph.initializers["shape"] = np.array([2, 6], np.int64)
    for cond in (True, False):
        check_if_gradient(graph, feeds_for(cond, [(2, 6)]))


def test_nothing_differentiable_inside_means_no_backward_if():
    then_branch = branch("then", [], ["k"], initializers={"k": np.ones((3, 4))})
    else_branch = branch("else", [], ["k"], initializers={"k": np.zeros((3, 4))})
    graph = if_graph(then_branch, else_branch)
    gradient = gradient_graph(graph, "loss", ["x"])
    assert [n.op_type for n in gradient.graph.nodes].count("If") == 1
    got = mixrt.Session(gradient.graph).run([gradient.grads["x"]], feeds_for(True, [(3, 4)]))
    np.testing.assert_array_equal(got[0], 0.0)


def test_no_subgraph_redefines_a_name_of_its_scope():
    """ONNX's SSA rule: a subgraph may not define a name its enclosing graphs define. The
    backward branches are named by their own builder, so they are renamed into the joint
    graph's name space; checked down every scope chain, second order (Ifs in Ifs) too."""
    graph = nested_if_graph()
    first = gradient_graph(graph, "loss", ["x", "w"], differentiable_backward=True)
    penalty = first.graph
    penalty.nodes += [node("Mul", [first.grads["x"], first.grads["x"]], ["gg"]),
                      node("ReduceSum", ["gg"], ["penalty"], keepdims=0)]
    penalty.outputs = [Value("penalty")]
    second = gradient_graph(penalty, "penalty", ["x", "w"])
    assert _count_ifs(second.graph) >= 7  # 2 forward; backward Ifs hold copies and their own
    _assert_ssa(second.graph, frozenset())


def _defined(graph):
    return ([v.name for v in graph.inputs] + list(graph.initializers)
            + [o for n in graph.nodes for o in n.outputs if o])


def _assert_ssa(graph, scope):
    names = _defined(graph)
    assert len(names) == len(set(names)), graph.name
    assert not set(names) & scope, (graph.name, sorted(set(names) & scope))
    for n in graph.nodes:
        for sub in n.subgraphs():
            _assert_ssa(sub, scope | set(names))


def _count_ifs(graph):
    return sum(1 + sum(_count_ifs(sub) for sub in n.subgraphs())
               for n in graph.nodes if n.op_type == "If")


def test_an_exported_if_model_trains_and_matches_onnxruntime():
    """An ONNX model with an If (helper-built, as exporters write them) imported, run in
    onnxruntime and mixrt alike, then fine-tuned: the loss falls on either branch."""
    ort = pytest.importorskip("onnxruntime")
    # its own generator: drawn from the module's, the weights depended on which tests ran
    # before on the same worker, and 3 draws in 40 left the Relu branch's units dead
    local = np.random.default_rng(20261124)
    model = _if_classifier_model(local)
    x = local.standard_normal((16, 4)).astype(np.float32)
    for use_relu in (True, False):
        feeds = {"x": x, "use_relu": np.array([use_relu])}
        want = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        got = mixrt.Session(model).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    graph = import_model(model)
    teacher = local.standard_normal((4, 3)).astype(np.float32)
    for use_relu in (True, False):
        activation = (lambda h: np.maximum(h, 0)) if use_relu else np.tanh
        losses = _fine_tune(graph, x, use_relu, activation(x @ teacher))
        assert losses[-1] < 0.01 * losses[0], losses


def _if_classifier_model(generator):
    weight = helper.make_tensor("W", TensorProto.FLOAT, (4, 3),
                                generator.standard_normal(12).astype(np.float32) * 0.5)
    then_graph = helper.make_graph([helper.make_node("Relu", ["h"], ["a"])], "relu", [],
                                   [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Tanh", ["h"], ["b"])], "tanh", [],
                                   [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    graph = helper.make_graph([
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("If", ["use_relu"], ["y"], then_branch=then_graph,
                         else_branch=else_graph)], "if_classifier", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
        helper.make_tensor_value_info("use_relu", TensorProto.BOOL, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)


def _fine_tune(graph, x, use_relu, target, steps=200, rate=0.5):
    """Plain gradient descent on mean((y - target)^2) through the If, by gradient_graph;
    the target is a teacher's output, so the loss can reach zero."""
    trained = Graph(name=graph.name, inputs=list(graph.inputs), nodes=list(graph.nodes),
                    outputs=list(graph.outputs), initializers=dict(graph.initializers),
                    opsets=dict(graph.opsets))
    trained.inputs.append(Value("target", TensorType(np.dtype(np.float32), target.shape)))
    trained.nodes = trained.nodes + [node("Sub", ["y", "target"], ["err"]),
                                     node("Mul", ["err", "err"], ["sq"]),
                                     node("ReduceMean", ["sq"], ["mse"], keepdims=0)]
    gradient = gradient_graph(trained, "mse", ["W"])
    session = mixrt.Session(gradient.graph)
    weight = graph.initializers["W"].copy()
    losses = []
    for _ in range(steps):
        loss, grad = session.run(["mse", gradient.grads["W"]],
                                 {"x": x, "use_relu": np.array([use_relu]), "W": weight,
                                  "target": target})
        losses.append(float(loss))
        weight = weight - rate * grad
    return losses


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
@pytest.mark.parametrize("cond", [True, False])
def test_the_gpu_gives_the_cpus_gradients(cond):
    graph = if_graph(tanh_branch(), sin_branch())
    gradient = gradient_graph(graph, "loss", ["x", "w"])
    feeds = feeds_for(cond, [(3, 4)])
    wanted = [gradient.grads["x"], gradient.grads["w"]]
    want = mixrt.Session(gradient.graph).run(wanted, feeds)
    got = mixrt.Session(gradient.graph, device="gpu:0").run(wanted, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
def test_a_scan_gradient_on_the_gpu_gives_the_cpus():
    graph, xs_shape = scan_graph(input_direction=1, output_axis=1)
    feeds = scan_feeds(graph, xs_shape)
    gradient = gradient_graph(graph, "loss", ["h0", "xs", "w", "v"])
    wanted = [gradient.grads[n] for n in ("h0", "xs", "w", "v")]
    want = mixrt.Session(gradient.graph).run(wanted, feeds)
    got = mixrt.Session(gradient.graph, device="gpu:0").run(wanted, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


# -- Scan ---------------------------------------------------------------------------------------

def scan_graph(*, input_direction=0, input_axis=0, output_direction=0, output_axis=0,
               read=("final", "stacked"), counter=False):
    """h_{t+1} = tanh(h_t * w + x_t), y_t = h_{t+1} * v + x_t over xs [4, 2, 3] (the scan axis
    moved to ``input_axis``); w and v are read from the enclosing graph. ``counter`` adds an
    int64 state the body increments: it is recorded but carries no gradient."""
    state_type = TensorType(F64, (2, 3))
    body_inputs = [Value("h", state_type)] + (
        [Value("n", TensorType(np.dtype(np.int64), ()))] if counter else []) + [
        Value("x_t", state_type)]
    body_nodes = [node("Mul", ["h", "w"], ["hw"]), node("Add", ["hw", "x_t"], ["pre"]),
                  node("Tanh", ["pre"], ["h_next"]), node("Mul", ["h_next", "v"], ["hv"]),
                  node("Add", ["hv", "x_t"], ["y_t"])]
    body_outputs = ["h_next"] + (["n_next"] if counter else []) + ["y_t"]
    initializers = {}
    if counter:
        body_nodes.append(node("Add", ["n", "one"], ["n_next"]))
        initializers["one"] = np.array(1, np.int64)
    body = Graph(name="body", inputs=body_inputs, nodes=body_nodes,
                 outputs=[Value(o) for o in body_outputs], initializers=initializers,
                 opsets={"": 17})
    xs_shape = [4, 2, 3]
    xs_shape.insert(input_axis, xs_shape.pop(0))
    graph = Graph(name="scan_grad", opsets={"": 17}, inputs=[
        Value("h0", state_type), Value("xs", TensorType(F64, tuple(xs_shape))),
        Value("w", TensorType(F64, (3,))), Value("v", TensorType(F64, (2, 3)))])
    state_inputs = ["h0"] + (["n0"] if counter else [])
    if counter:
        graph.initializers["n0"] = np.array(0, np.int64)
    outputs = ["h_final"] + (["n_final"] if counter else []) + ["ys"]
    graph.nodes = [Node("Scan", [*state_inputs, "xs"], outputs, name="scan", opset=17,
                        attributes={"body": body, "num_scan_inputs": 1,
                                    "scan_input_directions": [input_direction],
                                    "scan_input_axes": [input_axis],
                                    "scan_output_directions": [output_direction],
                                    "scan_output_axes": [output_axis]})]
    return add_weighted_loss(graph, read_outputs(read)), xs_shape


def scan_feeds(graph, xs_shape):
    feeds = {"h0": randn(2, 3), "xs": randn(*xs_shape), "w": randn(3), "v": randn(2, 3)}
    probe = Graph(name="probe", inputs=[v for v in graph.inputs if v.name[0] != "r"],
                  nodes=[n for n in graph.nodes if n.op_type == "Scan"],
                  outputs=[Value(o) for o in graph.nodes[0].outputs if o],
                  initializers=dict(graph.initializers), opsets={"": 17})
    values = dict(zip(probe.output_names, mixrt.Session(probe, opt_level=0).run(None, feeds)))
    feeds["r0"] = randn(*values["h_final"].shape)
    feeds["r1"] = randn(*values["ys"].shape)
    return {k: v for k, v in feeds.items() if k in graph.input_names}


@pytest.mark.parametrize("layout", [
    {}, {"input_direction": 1}, {"output_direction": 1}, {"input_axis": 1},
    {"output_axis": 2}, {"input_direction": 1, "input_axis": 2, "output_direction": 1,
                         "output_axis": 1}])
def test_scan_against_central_differences(layout):
    graph, xs_shape = scan_graph(**layout)
    check_if_gradient(graph, scan_feeds(graph, xs_shape), wrt=("h0", "xs", "w", "v"))


@pytest.mark.parametrize("read", [("final",), ("stacked",)])
def test_scan_with_one_output_in_the_loss(read):
    graph, xs_shape = scan_graph(read=read)
    check_if_gradient(graph, scan_feeds(graph, xs_shape), wrt=("h0", "xs", "w", "v"))


def test_scan_with_an_integer_state_records_it_and_passes_no_gradient_to_it():
    graph, xs_shape = scan_graph(counter=True)
    check_if_gradient(graph, scan_feeds(graph, xs_shape), wrt=("h0", "xs", "w", "v"))


def test_scan_matches_pytorchs_loop():
    """The same recurrence written as a Python loop in PyTorch: gradients to 1e-12."""
    torch = pytest.importorskip("torch")
    graph, xs_shape = scan_graph(input_direction=1)
    feeds = scan_feeds(graph, xs_shape)
    gradient = gradient_graph(graph, "loss", ["h0", "xs", "w", "v"])
    got = mixrt.Session(gradient.graph).run(
        [gradient.grads[n] for n in ("h0", "xs", "w", "v")], feeds)
    t = {k: torch.tensor(v, requires_grad=k in ("h0", "xs", "w", "v")) for k, v in feeds.items()}
    h, ys = t["h0"], []
    for step in reversed(range(4)):
        h = torch.tanh(h * t["w"] + t["xs"][step])
        ys.append(h * t["v"] + t["xs"][step])
    loss = (h * t["r0"]).sum() + (torch.stack(ys) * t["r1"]).sum()
    loss.backward()
    for name, value in zip(("h0", "xs", "w", "v"), got):
        np.testing.assert_allclose(value, t[name].grad.numpy(), rtol=1e-12, atol=1e-14)


def test_a_scan_of_zero_iterations_passes_the_final_states_gradient_to_the_initial_ones():
    graph, _ = scan_graph(read=("final",))
    graph.inputs[1].type = TensorType(F64, (0, 2, 3))
    feeds = {"h0": randn(2, 3), "xs": np.zeros((0, 2, 3)), "w": randn(3), "v": randn(2, 3),
             "r0": randn(2, 3)}
    gradient = gradient_graph(graph, "loss", ["h0", "xs", "w", "v"])
    dh0, dxs, dw, dv = mixrt.Session(gradient.graph).run(
        [gradient.grads[n] for n in ("h0", "xs", "w", "v")], feeds)
    np.testing.assert_array_equal(dh0, feeds["r0"])
    assert dxs.shape == (0, 2, 3) and dxs.dtype == F64
    np.testing.assert_array_equal(dw, 0.0)
    np.testing.assert_array_equal(dv, 0.0)


# -- Loop ---------------------------------------------------------------------------------------

def loop_graph(trips=4, *, stop_below=None, read=("final", "stacked")):
    """h_{i+1} = tanh(h_i * w + x * (1 + i / 2)), y_i = h_{i+1} * v for i < trips; x, w and v
    are read from the enclosing graph, i (the iteration number) scales the input. With
    ``stop_below`` the loop also has a condition: it goes on while sum(h) >= stop_below."""
    scalar_int, scalar_bool = TensorType(np.dtype(np.int64), ()), TensorType(np.dtype(bool), ())
    state_type = TensorType(F64, (2, 3))
    nodes = [node("Cast", ["i"], ["i_float"], to=11), node("Mul", ["i_float", "half"], ["ih"]),
             node("Add", ["ih", "one"], ["scale"]), node("Mul", ["x", "scale"], ["xs"]),
             node("Mul", ["h", "w"], ["hw"]), node("Add", ["hw", "xs"], ["pre"]),
             node("Tanh", ["pre"], ["h_next"]), node("Mul", ["h_next", "v"], ["y_i"])]
    if stop_below is None:
        nodes.append(node("Identity", ["cond_in"], ["cond_out"]))
    else:
        nodes += [node("ReduceSum", ["h_next"], ["total"], keepdims=0),
                  node("GreaterOrEqual", ["total", "limit"], ["cond_out"])]
    body = Graph(name="loop_body", inputs=[Value("i", scalar_int), Value("cond_in", scalar_bool),
                                           Value("h", state_type)],
                 nodes=nodes, outputs=[Value("cond_out", scalar_bool), Value("h_next", state_type),
                                       Value("y_i", state_type)],
                 initializers={"half": np.array(0.5), "one": np.array(1.0),
                               "limit": np.array(stop_below or 0.0)}, opsets={"": 17})
    graph = Graph(name="loop_grad", opsets={"": 17}, inputs=[
        Value("h0", state_type), Value("x", state_type), Value("w", TensorType(F64, (3,))),
        Value("v", state_type)],
        initializers={"trips": np.array(trips, np.int64), "go": np.array(True)})
    graph.nodes = [Node("Loop", ["trips", "go" if stop_below is not None else "", "h0"],
                        ["h_final", "ys"], name="loop", opset=17, attributes={"body": body})]
    return add_weighted_loss(graph, read_outputs(read))


def read_outputs(read) -> dict:
    """{0: the final state, 1: the stacked outputs}, as far as ``read`` names them."""
    return {k: name for k, (kind, name) in enumerate([("final", "h_final"), ("stacked", "ys")])
            if kind in read}


def loop_feeds(graph, steps):
    feeds = {"h0": randn(2, 3), "x": randn(2, 3), "w": randn(3), "v": randn(2, 3),
             "r0": randn(2, 3), "r1": randn(steps, 2, 3)}
    return {k: v for k, v in feeds.items() if k in graph.input_names}


@pytest.mark.parametrize("read", [("final", "stacked"), ("final",), ("stacked",)])
def test_loop_against_central_differences(read):
    graph = loop_graph(read=read)
    check_if_gradient(graph, loop_feeds(graph, 4), wrt=("h0", "x", "w", "v"))


def test_a_while_loop_differentiates_the_iterations_it_ran():
    """The condition stops the loop after a data-dependent number of iterations (here 2 of
    at most 6: sum(h) is -1.59, then -2.62, far enough from -2 that small steps do not
    change the count)."""
    graph = loop_graph(trips=6, stop_below=-2.0)
    feeds = loop_feeds(graph, 2)
    feeds["h0"] = np.full((2, 3), 0.2)
    feeds["x"] = np.full((2, 3), -0.3)
    feeds["w"] = np.array([0.5, -0.2, 0.1])
    probe = mixrt.Session(_without_loss(graph), opt_level=0).run(
        None, {k: v for k, v in feeds.items() if k[0] != "r"})
    assert probe[1].shape[0] == 2, probe[1].shape
    check_if_gradient(graph, feeds, wrt=("h0", "x", "w", "v"))


def _without_loss(graph):
    return Graph(name="probe", inputs=[v for v in graph.inputs if v.name[0] != "r"],
                 nodes=graph.nodes[:1], outputs=[Value("h_final"), Value("ys")],
                 initializers=dict(graph.initializers), opsets={"": 17})


def test_a_loop_of_zero_iterations_passes_the_final_gradient_to_the_initial_state():
    graph = loop_graph(trips=0, read=("final",))
    feeds = loop_feeds(graph, 0)
    gradient = gradient_graph(graph, "loss", ["h0", "x", "w", "v"])
    dh0, dx, dw, dv = mixrt.Session(gradient.graph).run(
        [gradient.grads[n] for n in ("h0", "x", "w", "v")], feeds)
    np.testing.assert_array_equal(dh0, feeds["r0"])
    for grad in (dx, dw, dv):
        np.testing.assert_array_equal(grad, 0.0)


def test_loop_matches_pytorchs_loop():
    torch = pytest.importorskip("torch")
    graph = loop_graph(trips=5)
    feeds = loop_feeds(graph, 5)
    names = ("h0", "x", "w", "v")
    gradient = gradient_graph(graph, "loss", list(names))
    got = mixrt.Session(gradient.graph).run([gradient.grads[n] for n in names], feeds)
    t = {k: torch.tensor(v, requires_grad=k in names) for k, v in feeds.items()}
    h, ys = t["h0"], []
    for i in range(5):
        h = torch.tanh(h * t["w"] + t["x"] * (1 + i / 2))
        ys.append(h * t["v"])
    ((h * t["r0"]).sum() + (torch.stack(ys) * t["r1"]).sum()).backward()
    for name, value in zip(names, got):
        np.testing.assert_allclose(value, t[name].grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(not gpu_available(), reason="no CUDA GPU (or no CuPy) here")
def test_a_loop_gradient_on_the_gpu_gives_the_cpus():
    graph = loop_graph(trips=3)
    feeds = loop_feeds(graph, 3)
    names = ("h0", "x", "w", "v")
    gradient = gradient_graph(graph, "loss", list(names))
    wanted = [gradient.grads[n] for n in names]
    want = mixrt.Session(gradient.graph).run(wanted, feeds)
    got = mixrt.Session(gradient.graph, device="gpu:0").run(wanted, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
