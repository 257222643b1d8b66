import pytest

from mixrt.errors import GraphError
from mixrt.runtime.graph import Graph, Node, Value


def _graph(nodes, inputs=("x",), outputs=("y",)):
    return Graph(inputs=[Value(n) for n in inputs], outputs=[Value(n) for n in outputs],
                 nodes=nodes)


def test_toposort_orders_producers_first():
    late = Node("Relu", ["a"], ["y"], name="late")
    early = Node("Neg", ["x"], ["a"], name="early")
    graph = _graph([late, early])
    graph.validate()
    assert [n.name for n in graph.nodes] == ["early", "late"]


def test_dangling_input_names_node_and_value():
    graph = _graph([Node("Relu", ["ghost"], ["y"], name="r")])
    with pytest.raises(GraphError, match=r"node 'r' reads 'ghost'"):
        graph.validate()


def test_duplicate_output_names_both():
    graph = _graph([Node("Neg", ["x"], ["y"], name="a"), Node("Abs", ["x"], ["y"], name="b")])
    with pytest.raises(GraphError, match=r"output 'y' of node '(a|b)' is already defined"):
        graph.validate()


def test_cycle_is_reported_with_its_nodes():
    graph = _graph([Node("Neg", ["b"], ["a"], name="n1"), Node("Neg", ["a"], ["b"], name="n2"),
                    Node("Abs", ["x"], ["y"], name="n3")])
    with pytest.raises(GraphError, match=r"cycle: .*n1.*n2|cycle: .*n2.*n1"):
        graph.validate()


def test_missing_graph_output():
    graph = _graph([Node("Neg", ["x"], ["a"], name="n")], outputs=("nowhere",))
    with pytest.raises(GraphError, match="'nowhere' is never produced"):
        graph.validate()


def test_subgraph_may_read_outer_scope():
    body = Graph(name="then", outputs=[Value("t")], nodes=[Node("Neg", ["x"], ["t"])])
    node = Node("If", ["c"], ["y"], attributes={"then_branch": body, "else_branch": body})
    graph = _graph([node], inputs=("x", "c"))
    graph.validate()
    assert body.nodes[0].op_type == "Neg"
