"""mixrt.viz: the Graphviz drawing of a Symbol (nodes, edges, hidden parameters, shape
labels, escaping), rendering with and without the `dot` program, and the layer summary."""

from __future__ import annotations

import math
import re
import shutil

import mixrt  # noqa: F401  (before NumPy: mixrt's BLAS policy)
import graphviz
import pytest

from mixrt import sym, viz
from mixrt.errors import InputError
from mixrt.models.layers import batch_norm, conv2d
from mixrt.models.lenet import lenet
from mixrt.models.mlp import mlp

HAS_DOT = shutil.which("dot") is not None


def labels(dot: graphviz.Digraph) -> dict[str, str]:
    """node id -> label, from the dot text."""
    return dict(re.findall(r'^\t(node\d+) \[label=("(?:[^"\\]|\\.)*"|\S+)', dot.source,
                           re.MULTILINE))


def edges(dot: graphviz.Digraph) -> list[tuple[str, str, str]]:
    """(from, to, label or "") per edge, from the dot text."""
    return [(a, b, label.strip('"')) for a, b, label in
            re.findall(r'^\t(node\d+) -> (node\d+)(?: \[label=("[^"]*"|[^\s\]]+))?',
                       dot.source, re.MULTILINE)]


def test_lenet_nodes_edges_and_hidden_weights():
    dot = viz.plot_network(lenet(), title="lenet")
    assert isinstance(dot, graphviz.Digraph) and dot.format == "pdf"
    found = labels(dot)
    names = [label.strip('"').split("\\n")[-1] for label in found.values()]
    assert names == ["data", "conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten",
                     "fc1", "relu3", "fc2", "relu4", "fc3"]
    assert found["node1"] == '"Conv\\nkernel_shape=5x5, strides=1x1, pads=0,0,0,0\\nconv1"'
    assert found["node8"] == '"Gemm\\ntransB=1\\nfc1"'
    # a chain: each node fed by the one before, no parameter among them
    assert [(a, b) for a, b, _ in edges(dot)] == [(f"node{i}", f"node{i + 1}")
                                                  for i in range(12)]
    assert "_weight" not in dot.source and "_bias" not in dot.source
    assert 'node0 [label=data fillcolor="#8dd3c7" shape=oval]' in dot.source
    assert 'fillcolor="#fb8072"' in dot.source  # conv/dense family
    assert not any(label for *_, label in edges(dot))  # no shapes asked for


def test_weights_and_batchnorm_statistics_shown_on_request():
    x = conv2d(sym.Variable("data", shape=(None, 3, 8, 8)), 3, 4, 3, "conv1")
    net = sym.Relu(batch_norm(x, 4, "bn1"), name="relu1")
    hidden = viz.plot_network(net).source
    assert "conv1_weight" not in hidden and "bn1_moving_mean" not in hidden
    shown = viz.plot_network(net, hide_weights=False)
    names = {label.strip('"') for label in labels(shown).values()}
    assert {"conv1_weight", "bn1_gamma", "bn1_beta", "bn1_moving_mean",
            "bn1_moving_var"} <= names
    assert len(edges(shown)) == 2 + 5 + 1  # data+weight -> conv, 5 inputs -> bn, bn -> relu


def test_shapes_and_dtypes_label_the_edges():
    dot = viz.plot_network(lenet(), shape={"data": (1, 1, 28, 28)},
                           dtype={"data": "float32"})
    assert [label for *_, label in edges(dot)] == [
        "1x1x28x28 float32", "1x6x24x24 float32", "1x6x24x24 float32", "1x6x12x12 float32",
        "1x16x8x8 float32", "1x16x8x8 float32", "1x16x4x4 float32", "1x256 float32",
        "1x120 float32", "1x120 float32", "1x84 float32", "1x84 float32"]
    weights_shown = viz.plot_network(mlp(in_units=5, hidden=(8,)), shape={"data": (2, 5)},
                                     hide_weights=False)
    assert {label for *_, label in edges(weights_shown)} >= {"8x5", "8", "2x5", "2x8"}


def test_odd_names_are_escaped_and_ids_are_ours(tmp_path):
    name = 'in "put" a:b\\c <x>'
    net = sym.Relu(sym.Variable(name, shape=(1, 2)), name="my relu:1")
    dot = viz.plot_network(net, node_attrs={"fontsize": "12"})
    assert dot.source.splitlines()[3] == \
        '\tnode0 [label="in \\"put\\" a:b\\\\c <x>" fillcolor="#8dd3c7" shape=oval]'
    assert '\tnode1 [label="Relu\\nmy relu:1"' in dot.source
    assert "\tnode0 -> node1" in dot.source
    assert "fontsize=12" in dot.source.splitlines()[1]
    if HAS_DOT:  # dot itself parses it and keeps the name whole
        svg = (tmp_path / "odd.svg")
        viz.render(dot, svg)
        assert "in &quot;put&quot; a:b\\c &lt;x&gt;" in svg.read_text()


@pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot program is not installed")
def test_render_png_and_svg(tmp_path):
    dot = viz.plot_network(lenet(), shape={"data": (1, 1, 28, 28)})
    png = viz.render(dot, tmp_path / "lenet.png")
    assert png == str(tmp_path / "lenet.png")
    assert (tmp_path / "lenet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    viz.render(dot, tmp_path / "lenet", format="svg")
    assert "conv1" in (tmp_path / "lenet").read_text()


def test_render_without_dot_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    with pytest.raises(InputError, match=r"needs Graphviz's `dot` program.*\.source"):
        viz.render(viz.plot_network(lenet()), tmp_path / "lenet.png")
    assert not (tmp_path / "lenet.png").exists()


def test_bad_arguments_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="save_format 'jpeg2000'.*'svg'"):
        viz.plot_network(lenet(), save_format="jpeg2000")
    with pytest.raises(InputError, match="takes a mixrt.sym.Symbol, got str"):
        viz.plot_network("lenet")
    with pytest.raises(InputError, match="'docx' is not a Graphviz format"):
        viz.render(viz.plot_network(lenet()), tmp_path / "lenet.docx")


def test_summary_of_the_mlp_counts_every_parameter(capsys):
    net = mlp()
    arg_shapes, _, _ = net.infer_shape(data=(1, 784))
    expected = sum(math.prod(shape) for name, shape in zip(net.list_arguments(), arg_shapes)
                   if name != "data")
    text = viz.print_summary(net, shape={"data": (1, 784)})
    assert capsys.readouterr().out == text + "\n"
    assert f"Total params: {expected:,}" in text  # 1,863,690
    assert f"Trainable params: {expected:,}" in text and "Non-trainable params: 0" in text
    rows = [line.split() for line in text.splitlines() if "(Gemm)" in line]
    assert [(row[0], row[2], row[3], row[4]) for row in rows] == [
        ("fc1", "1x1024", "803,840", "data"), ("fc2", "1x1024", "1,049,600", "relu1"),
        ("fc3", "1x10", "10,250", "relu2")]
    assert all(len(line) <= 120 for line in text.splitlines())


def test_summary_counts_statistics_as_non_trainable_and_lists_both_inputs(capsys):
    data = sym.Variable("data", shape=(None, 3, 8, 8))
    x = batch_norm(conv2d(data, 3, 4, 3, "conv1", pad=1), 4, "bn1")
    net = sym.Add(x, conv2d(data, 3, 4, 1, "skip"), name="add")
    text = viz.print_summary(net, line_length=80)
    capsys.readouterr()
    assert "Total params: 136" in text  # conv1 108, bn1 8 + 8 running stats, skip 12
    assert "Trainable params: 128" in text and "Non-trainable params: 8" in text
    add = text.splitlines().index(next(l for l in text.splitlines() if l.startswith("add")))
    assert text.splitlines()[add].split()[-1] == "bn1"
    assert text.splitlines()[add + 1].split() == ["skip"]
    assert all(len(line) <= 80 for line in text.splitlines())


def test_summary_names_parameters_whose_shape_is_unknown(capsys):
    net = sym.Gemm(sym.Variable("data"), sym.Variable("fc_weight"), transB=1, name="fc")
    text = viz.print_summary(net)
    capsys.readouterr()
    assert "Not counted (shape unknown; pass shape=): fc_weight" in text
