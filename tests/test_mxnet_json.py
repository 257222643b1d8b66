"""MXNet 1.x's own symbol files (``-symbol.json``) and parameters, read by mixrt.

The models in tests/data/mxnet_json/ were saved by MXNet 1.9.1 with
tools/mxnet_json_fixtures.py, beside MXNet's outputs for a fixed input; mixrt must load them
through each of MXNet's entry points and compute the same outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mixrt as mx
from mixrt import gluon, nd, sym
from mixrt.errors import ModelLoadError

DATA = Path(__file__).parent / "data" / "mxnet_json"
SYMBOL_MODELS = ["mlp", "lenet", "resnet_thumb", "ops_mix", "layers_mix", "norms"]
ALL_MODELS = SYMBOL_MODELS + ["gluon_net"]


def _expected(name: str) -> dict:
    with np.load(DATA / f"{name}-expected.npz") as arrays:
        return dict(arrays)


def _split_params(name: str) -> tuple[dict, dict]:
    params = nd.load(str(DATA / f"{name}-0000.params"))
    args = {key[4:]: value for key, value in params.items() if key.startswith("arg:")}
    aux = {key[4:]: value for key, value in params.items() if key.startswith("aux:")}
    return args, aux


def _assert_outputs(outputs, expected: dict) -> None:
    assert len(outputs) == len([k for k in expected if k.startswith("output")])
    for i, output in enumerate(outputs):
        np.testing.assert_allclose(output.asnumpy(), expected[f"output{i}"], rtol=1e-4,
                                   atol=1e-5)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_sym_load_and_executor_match_mxnet(name):
    symbol = sym.load(str(DATA / f"{name}-symbol.json"))
    args, aux = _split_params(name)
    expected = _expected(name)
    assert set(args) <= set(symbol.list_arguments())
    assert set(aux) == set(symbol.list_auxiliary_states())
    executor = symbol.simple_bind("cpu", grad_req="null", data=expected["data"].shape)
    executor.copy_params_from(args, aux)
    _assert_outputs(executor.forward(is_train=False, data=nd.array(expected["data"])),
                    expected)


def test_load_json_reads_the_same_text():
    text = (DATA / "lenet-symbol.json").read_text()
    symbol = sym.load_json(text)
    assert symbol.list_outputs() == ["prob_output"]
    assert symbol.list_arguments() == [
        "data", "conv1_weight", "conv1_bias", "conv2_weight", "conv2_bias", "fc1_weight",
        "fc1_bias", "fc2_weight", "fc2_bias"]


@pytest.mark.parametrize("name", ["mlp", "resnet_thumb"])
def test_load_checkpoint_and_module_match_mxnet(name):
    symbol, args, aux = mx.model.load_checkpoint(str(DATA / name), 0)
    expected = _expected(name)
    module = mx.mod.Module(symbol, data_names=["data"], label_names=["softmax_label"])
    module.bind(data_shapes=[("data", expected["data"].shape)], for_training=False)
    module.set_params(args, aux)
    module.forward(mx.io.DataBatch([nd.array(expected["data"])]), is_train=False)
    _assert_outputs(module.get_outputs(), expected)


def test_module_load_matches_mxnet():
    module = mx.mod.Module.load(str(DATA / "resnet_thumb"), 0, data_names=["data"],
                                label_names=["softmax_label"])
    expected = _expected("resnet_thumb")
    module.bind(data_shapes=[("data", expected["data"].shape)], for_training=False)
    module.forward(mx.io.DataBatch([nd.array(expected["data"])]), is_train=False)
    _assert_outputs(module.get_outputs(), expected)


def test_normalization_parameters_get_mxnet_shapes():
    symbol = sym.load(str(DATA / "norms-symbol.json"))
    arg_shapes, _, _ = symbol.infer_shape(data=(2, 4, 3, 5))
    assert dict(zip(symbol.list_arguments(), arg_shapes)) == {
        "data": (2, 4, 3, 5), "inorm_gamma": (4,), "inorm_beta": (4,),
        "gnorm_gamma": (2,), "gnorm_beta": (2,), "lnorm_gamma": (5,), "lnorm_beta": (5,)}


def test_symbol_block_imports_a_gluon_export():
    block = gluon.SymbolBlock.imports(str(DATA / "gluon_net-symbol.json"), ["data"],
                                      str(DATA / "gluon_net-0000.params"))
    expected = _expected("gluon_net")
    _assert_outputs([block(nd.array(expected["data"]))], expected)
    assert "net_batchnorm0_running_mean" in block.collect_params()


def _without_prefix(params: dict) -> dict:
    return {key.split(":", 1)[-1]: value for key, value in params.items()}


def test_gluon_lstm_export_matches_mxnet():
    """Gluon's LSTM exports MXNet's fused RNN op over the _rnn_param_concat of its weights;
    here 2 layers, bidirectional, begin states given, the final states output too."""
    symbol = sym.load(str(DATA / "gluon_lstm-symbol.json"))
    expected = _expected("gluon_lstm")
    inputs = {key: nd.array(expected[key]) for key in ("data0", "data1", "data2")}
    params = _without_prefix(nd.load(str(DATA / "gluon_lstm-0000.params")))
    _assert_outputs(symbol.bind("cpu", {**params, **inputs}).forward(), expected)
    block = gluon.SymbolBlock.imports(str(DATA / "gluon_lstm-symbol.json"),
                                      ["data0", "data1", "data2"],
                                      str(DATA / "gluon_lstm-0000.params"))
    _assert_outputs(block(*inputs.values()), expected)


def test_gluon_gru_export_in_ntc_layout_matches_mxnet():
    """A GRU with layout NTC: MXNet's export swaps the axes around the RNN op (SwapAxis)
    and takes the begin state as an input (zeros here, as the layer's default)."""
    symbol = sym.load(str(DATA / "gluon_gru-symbol.json"))
    expected = _expected("gluon_gru")
    params = _without_prefix(nd.load(str(DATA / "gluon_gru-0000.params")))
    inputs = {"data0": nd.array(expected["data0"]), "data1": nd.zeros((1, 2, 4))}
    _assert_outputs(symbol.bind("cpu", {**params, **inputs}).forward(), expected)


def test_sym_rnn_over_one_flat_parameter_vector_matches_mxnet():
    """sym.RNN's flat vector is cut where the data's width puts each weight."""
    symbol = sym.load(str(DATA / "flat_rnn-symbol.json"))
    args, _ = _split_params("flat_rnn")
    expected = _expected("flat_rnn")
    assert args["rnn_parameters"].shape == (184,)
    outputs = symbol.bind("cpu", {**args, "data": nd.array(expected["data"])}).forward()
    _assert_outputs(outputs, expected)


def test_rnn_mode_and_projection_are_checked():
    document = json.loads((DATA / "flat_rnn-symbol.json").read_text())
    rnn = document["nodes"][_node_index(document, "rnn")]
    rnn["attrs"]["mode"] = "transformer"
    with pytest.raises(ModelLoadError, match=r"'rnn'.*mode must be one of"):
        _load(document)
    rnn["attrs"].update(mode="lstm", state_size="inf")
    with pytest.raises(ModelLoadError, match=r"'rnn'.*state_size must be a whole number in"):
        _load(document)
    rnn["attrs"].update(state_size="4", projection_size="3")
    with pytest.raises(ModelLoadError, match=r"'rnn'.*projection_size is not supported"):
        _load(document)


def test_variable_declarations_are_kept():
    symbol = sym.load(str(DATA / "gluon_net-symbol.json"))
    attributes = symbol.attr_dict()
    assert attributes["net_conv0_weight"]["__lr_mult__"] == "1.0"
    assert attributes["net_conv0_weight"]["__storage_type__"] == "0"
    saved = {node["name"]: node for node in json.loads(symbol.tojson())["nodes"]}
    assert saved["net_conv0_bias"]["info"]["init"] == {"type": "Zero"}
    assert saved["net_conv0_bias"]["info"]["dtype"] == "float32"
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, 12, 12))
    shapes = dict(zip(symbol.list_arguments(), arg_shapes))
    assert shapes["net_conv0_weight"] == (6, 3, 3, 3)
    assert aux_shapes == [(6,), (6,)]


def test_prelu_gamma_keeps_its_initializer():
    symbol = sym.load(str(DATA / "ops_mix-symbol.json"))
    saved = {node["name"]: node for node in json.loads(symbol.tojson())["nodes"]}
    assert saved["prelu_gamma"]["info"]["init"] == {"type": "Constant", "value": 0.25}


def test_files_of_mxnet_before_0_9_are_read():
    """Old files keep the op's parameters in "param", the user's in "attr", and refer to
    inputs as [node, output]."""
    document = json.loads((DATA / "mlp-symbol.json").read_text())
    for node in document["nodes"]:
        attrs = node.pop("attrs", {})
        node["param"] = {k: v for k, v in attrs.items() if not k.startswith("__")}
        node["attr"] = {k: v for k, v in attrs.items() if k.startswith("__")}
        node["inputs"] = [ref[:2] for ref in node["inputs"]]
    document["heads"] = [ref[:2] for ref in document["heads"]]
    symbol = sym.load_json(json.dumps(document))
    args, aux = _split_params("mlp")
    expected = _expected("mlp")
    outputs = symbol.bind("cpu", {**args, "data": nd.array(expected["data"]),
                                  "softmax_label": nd.zeros((2,))}).forward()
    _assert_outputs(outputs, expected)


# -- malformed and hostile files ---------------------------------------------------------------

def _document() -> dict:
    return json.loads((DATA / "mlp-symbol.json").read_text())


def _load(document) -> None:
    sym.load_json(json.dumps(document))


def _node_index(document: dict, name: str) -> int:
    return next(i for i, node in enumerate(document["nodes"]) if node["name"] == name)


def test_unknown_operator_names_the_node_and_op():
    document = _document()
    document["nodes"][_node_index(document, "relu1")]["op"] = "NoSuchOp"
    with pytest.raises(ModelLoadError, match=r"relu1.*'NoSuchOp'"):
        _load(document)


@pytest.mark.parametrize("reference", [[99, 0, 0], [-1, 0, 0], [0, 5, 0], "x", [0],
                                       [True, 0, 0], [0.5, 0, 0]])
def test_bad_input_reference_names_the_node(reference):
    document = _document()
    document["nodes"][_node_index(document, "fc2")]["inputs"][0] = reference
    with pytest.raises(ModelLoadError, match="fc2"):
        _load(document)


def test_a_later_node_cannot_be_an_input():
    document = _document()
    fc1 = _node_index(document, "fc1")
    document["nodes"][fc1]["inputs"][0] = [fc1 + 1, 0, 0]
    with pytest.raises(ModelLoadError, match="only nodes 0"):
        _load(document)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["nodes"][1].update(attrs={"__shape__": 7}), "strings"),
    (lambda d: d["nodes"][1].update(attrs={"__shape__": "(a, b)"}), "__shape__"),
    (lambda d: d["nodes"][1].update(attrs={"__dtype__": "99"}), "__dtype__"),
    (lambda d: d["nodes"][1].update(attrs={"__lr_mult__": "-1"}), "__lr_mult__"),
    (lambda d: d["nodes"][1].update(attrs={"__init__": "no_such_init"}), "fc1_weight"),
    (lambda d: d["nodes"][1].update(name=""), "name"),
    (lambda d: d["nodes"][1].update(op=3), "op"),
    (lambda d: d["nodes"][1].update(inputs=[[0, 0, 0]]), "no inputs"),
    (lambda d: d["nodes"][3].update(attrs={"num_hidden": "sixteen"}), "fc1"),
    (lambda d: d["nodes"][3].update(attrs={"num_hidden": "16", "bogus": "1"}), "bogus"),
    (lambda d: d["nodes"][3].update(attrs={"num_hidden": "((1, 2), 3)"}), "nested"),
    (lambda d: d["nodes"][3].update(attrs={"num_hidden": "9" * 5000}), "characters"),
    (lambda d: d["nodes"][3].update(inputs=[]), "fc1"),
    (lambda d: d.update(heads=[]), "no outputs"),
    (lambda d: d.update(heads=[[500, 0, 0]]), "heads"),
    (lambda d: d.update(nodes={}), "'nodes' must be a list"),
    (lambda d: d["nodes"].append(5), "node 14: expected an object"),
])
def test_malformed_documents_raise_model_load_error(change, message):
    document = _document()
    change(document)
    with pytest.raises(ModelLoadError, match=message):
        _load(document)


@pytest.mark.parametrize("value", ["inf", "(1,, 2)", "", "-7", "(None,)", "1e999", "[["])
def test_any_bad_parameter_value_is_a_model_load_error(value):
    """Each op of the op-mix file with one parameter spoiled: it loads (the value happens
    to be valid) or raises ModelLoadError, never another exception."""
    clean = json.loads((DATA / "ops_mix-symbol.json").read_text())
    for index, node in enumerate(clean["nodes"]):
        for key in node.get("attrs") or {}:
            document = json.loads(json.dumps(clean))
            document["nodes"][index]["attrs"][key] = value
            try:
                _load(document)
            except ModelLoadError as error:
                assert node["name"] in str(error)


def test_missing_required_parameter_is_named():
    document = _document()
    relu = document["nodes"][_node_index(document, "relu1")]
    relu.update(op="slice_axis", attrs={"axis": "1"})
    with pytest.raises(ModelLoadError, match=r"relu1.*'begin' is missing"):
        _load(document)


def test_layer_norm_on_an_inner_axis_is_refused_by_name():
    document = json.loads((DATA / "norms-symbol.json").read_text())
    layer_norm = document["nodes"][_node_index(document, "lnorm")]
    layer_norm["attrs"] = {"axis": "1"}
    with pytest.raises(ModelLoadError, match=r"lnorm.*axis=1"):
        _load(document)


def test_neither_format_is_refused():
    with pytest.raises(ModelLoadError, match="nor an MXNet one"):
        sym.load_json(json.dumps({"nodes": [], "heads": []}))


# -- single ops, against values MXNet 1.9.1 gives ----------------------------------------------

def _one_op(op: str, attrs: dict, *arrays):
    nodes = [{"op": "null", "name": f"in{i}", "inputs": []} for i in range(len(arrays))]
    nodes.append({"op": op, "name": "out", "attrs": attrs,
                  "inputs": [[i, 0, 0] for i in range(len(arrays))]})
    document = {"nodes": nodes, "arg_nodes": list(range(len(arrays))),
                "heads": [[len(arrays), 0, 0]], "attrs": {"mxnet_version": ["int", 10901]}}
    symbol = sym.load_json(json.dumps(document))
    inputs = {f"in{i}": nd.array(a) for i, a in enumerate(arrays)}
    return symbol.eval("cpu", **inputs)[0].asnumpy()


def test_scalar_ops_follow_mxnet():
    x = np.array([[1.0, -2.0], [4.0, 0.5]], dtype=np.float32)
    np.testing.assert_allclose(_one_op("_rminus_scalar", {"scalar": "3"}, x), 3 - x)
    np.testing.assert_allclose(_one_op("_rdiv_scalar", {"scalar": "2.0"}, x), 2 / x)
    np.testing.assert_allclose(_one_op("_power_scalar", {"scalar": "2"}, x), x ** 2)
    # MXNet's comparisons give 1.0 / 0.0 in the operand's dtype
    greater = _one_op("_greater_scalar", {"scalar": "0.75"}, x)
    assert greater.dtype == np.float32
    np.testing.assert_array_equal(greater, [[1, 0], [1, 0]])
    np.testing.assert_array_equal(_one_op("broadcast_not_equal", {}, x, x[:1]),
                                  [[0, 0], [1, 1]])


def test_shape_ops_follow_mxnet():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert _one_op("Reshape", {"shape": "(0, -1)"}, x).shape == (2, 12)
    assert _one_op("Reshape", {"shape": "(-3, 0)"}, x).shape == (6, 4)
    np.testing.assert_array_equal(_one_op("slice_axis", {"axis": "2", "begin": "1",
                                                         "end": "None"}, x), x[:, :, 1:])
    np.testing.assert_array_equal(
        _one_op("slice", {"begin": "(None, 2)", "end": "(None, 0)", "step": "(1, -1)"}, x),
        x[:, 2:0:-1])
    np.testing.assert_array_equal(_one_op("sum", {"axis": "(0, 2)", "keepdims": "True"}, x),
                                  x.sum(axis=(0, 2), keepdims=True))
    assert _one_op("UpSampling", {"scale": "2", "sample_type": "nearest", "num_args": "1"},
                   x[None]).shape == (1, 2, 6, 8)


def test_swap_axis_follows_mxnet_for_any_rank():
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(_one_op("SwapAxis", {"dim1": "3", "dim2": "1"}, x),
                                  np.swapaxes(x, 1, 3))
    np.testing.assert_array_equal(_one_op("SwapAxis", {"dim1": "0", "dim2": "1"}, x[0]),
                                  np.swapaxes(x[0], 0, 1))
    np.testing.assert_array_equal(_one_op("SwapAxis", {"dim1": "2", "dim2": "2"}, x), x)


def test_softmax_with_temperature():
    x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    scaled = np.exp(x / 2) / np.exp(x / 2).sum()
    np.testing.assert_allclose(_one_op("softmax", {"axis": "-1", "temperature": "2.0"}, x),
                               scaled, rtol=1e-6)
