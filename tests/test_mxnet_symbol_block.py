"""mixrt.gluon.SymbolBlock (MXNet 1.9.1's): a Symbol as a block, its variables as
Parameters, run through the compiled graph, composed when called on Symbols, and loaded
from a symbol file and an MXNet parameter file."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, gluon, nd, sym
from mixrt.errors import InputError
from mixrt.gluon import nn


def small_model():
    model = nn.HybridSequential()
    model.add(nn.Dense(8, activation="tanh"))
    model.add(nn.Dense(4, in_units=8))
    model.initialize()
    return model


def test_a_models_symbol_runs_and_trains_with_its_parameters():
    model, x = small_model(), nd.array(np.random.default_rng(0).random((3, 5)))
    want = model(x)
    data = sym.var("data")
    block = gluon.SymbolBlock(model(data), data, params=model.collect_params())
    assert set(block.collect_params()) == set(model.collect_params())
    np.testing.assert_allclose(block(x).asnumpy(), want.asnumpy(), rtol=1e-6)
    with autograd.record():
        loss = block(x).sum()
    loss.backward()
    weight = list(model.collect_params().values())[0]
    assert np.abs(weight.grad().asnumpy()).sum() > 0


def test_internals_give_one_output_each_and_symbols_compose():
    model, x = small_model(), nd.ones((2, 5))
    data = sym.var("data")
    internals = model(data).get_internals()
    block = gluon.SymbolBlock(internals, data, params=model.collect_params())
    outputs = block(x)
    assert len(outputs) == len(internals.list_outputs())
    composed = block(sym.var("other"))
    assert len(composed) == len(internals.list_outputs())
    assert "other" in composed[0].list_inputs() or "other" in composed[-1].list_inputs()


def test_new_parameters_take_their_shapes_from_the_first_call():
    data = sym.var("data")
    out = sym.FullyConnected(data, num_hidden=3, name="fc")
    block = gluon.SymbolBlock(out, data)
    assert sorted(block.collect_params()) == ["fc_bias", "fc_weight"]
    block.initialize()
    assert block(nd.ones((2, 7))).shape == (2, 3)
    assert block.collect_params()["fc_weight"].shape == (3, 7)


def test_imports_a_symbol_file_and_mxnet_parameters(tmp_path):
    data = sym.var("data")
    out = sym.FullyConnected(data, num_hidden=2, name="fc")
    out.save(str(tmp_path / "net-symbol.json"))
    weight, bias = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, -1], np.float32)
    nd.save(str(tmp_path / "net-0000.params"),
            {"arg:fc_weight": nd.array(weight), "arg:fc_bias": nd.array(bias)})
    block = gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), "data",
                                      str(tmp_path / "net-0000.params"))
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(block(nd.array(x)).asnumpy(), x @ weight.T + bias)
    assert str(block).splitlines()[0] == "SymbolBlock("


def test_refusals():
    data = sym.var("data")
    out = sym.FullyConnected(data, num_hidden=2, name="fc")
    with pytest.raises(InputError, match="Variable"):
        gluon.SymbolBlock(out, out)
    with pytest.raises(InputError, match="not variables"):
        gluon.SymbolBlock(out, sym.var("elsewhere"))
    block = gluon.SymbolBlock(out, data)
    with pytest.raises(InputError, match="takes 1 inputs"):
        block(nd.ones((1, 3)), nd.ones((1, 3)))


def test_sparse_parameters_are_refused():
    weight = sym.var("weight", attr={"__storage_type__": "1"})  # row_sparse
    out = sym.FullyConnected(sym.var("data"), weight, num_hidden=2, no_bias=True)
    with pytest.raises(InputError, match="storage type"):
        gluon.SymbolBlock(out, sym.var("data"))
