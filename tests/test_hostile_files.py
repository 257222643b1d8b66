"""Every loader of a user-supplied saved file (other than .mxr: test_mxr_fuzz.py) against
damaged and hostile files: each ends in a typed mixrt error whose message names the file,
key or node, or in a correct load; nothing else escapes, hangs or loads garbage."""

import io
import json
import os
import random
import zipfile

import numpy as np
import pytest
from helpers import add_model, mlp_graph, save, weighted_model

import mixrt
from mixrt import nd, sym
from mixrt.cli import main as cli_main
from mixrt.errors import (GraphError, InputError, KVStoreError, MixrtError, ModelLoadError,
                          OptimizerError)
from mixrt.gluon import Trainer, nn
from mixrt.importers.onnx import import_model
from mixrt.io import NDArrayIter
from mixrt.module import Module
from mixrt.runtime import npz
from mixrt.runtime.training import optimizer as optim
from mixrt.runtime.training.mixed_precision import LossScaler

WEIGHT = np.arange(6, dtype=np.float32).reshape(2, 3)


# -- hostile .npz files ------------------------------------------------------------------------

def _npy_bytes(array, header_shape=None) -> bytes:
    """An .npy file of ``array``, its header optionally lying about the shape."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    data = buffer.getvalue()
    if header_shape is not None:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {
            "descr": np.lib.format.dtype_to_descr(array.dtype), "fortran_order": False,
            "shape": header_shape})
        data = header.getvalue() + data[len(header.getvalue()):]
    return data


def _zip(members: dict, compression=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _damaged_member(key: str, array: np.ndarray, compression) -> bytes:
    """A zip whose directory is intact but whose one member's data has a flipped byte."""
    data = bytearray(_zip({f"{key}.npy": _npy_bytes(array)}, compression))
    start = 30 + len(f"{key}.npy")  # the local header, then the (compressed) data
    data[start + 12] ^= 0xFF
    return bytes(data)


def _twice(key: str, array: np.ndarray) -> bytes:
    """A zip holding ``key``.npy twice (np.load keeps the last one silently)."""
    other = key[:-1] + ("x" if key[-1] != "x" else "y")  # same length: offsets stay right
    data = _zip({f"{key}.npy": _npy_bytes(array), f"{other}.npy": _npy_bytes(array)})
    return data.replace(f"{other}.npy".encode(), f"{key}.npy".encode())


def _structural_npz_cases(key: str, array: np.ndarray) -> dict:
    """Files that are no valid .npz of ``key``: {what is wrong: (bytes, message part)}."""
    zeros = np.zeros(array.shape, np.float32)
    unreadable = "cannot be read as an .npz archive"
    return {
        "empty": (b"", unreadable),
        "random bytes": (random.Random(1).randbytes(700), unreadable),
        "plain .npy": (_npy_bytes(array), unreadable),
        "text": (b"weight,bias\n1,2\n", unreadable),
        "member not .npy": (_zip({f"{key}.txt": _npy_bytes(array)}),
                            f"member '{key}.txt' is not an array"),
        "member without suffix": (_zip({key: _npy_bytes(array)}),
                                  f"member '{key}' is not an array"),
        "member twice": (_twice(key, array), f"array '{key}' is stored twice"),
        "member is raw bytes": (_zip({f"{key}.npy": b"hello, world"}),
                                f"array '{key}' is damaged"),
        "object array": (_zip({f"{key}.npy": _npy_bytes(np.array([{"a": 1}], dtype=object))}),
                         f"array '{key}': dtype object holds Python objects"),
        "header claims 400 GiB": (_zip({f"{key}.npy": _npy_bytes(
            zeros, header_shape=(100_000_000_000,))}), "needs 400000000000 bytes"),
        "header shorter than data": (_zip({f"{key}.npy": _npy_bytes(
            np.zeros(12, np.float32), header_shape=(1,))}), "needs 4 bytes of data"),
        "negative dimensions": (_zip({f"{key}.npy": _npy_bytes(
            np.zeros(4, np.float32), header_shape=(-2, -2))}), "cannot exist"),
        "stored data damaged": (_damaged_member(key, array, zipfile.ZIP_STORED),
                                f"array '{key}' is damaged"),
        "deflated data damaged": (_damaged_member(key, array, zipfile.ZIP_DEFLATED),
                                  f"array '{key}' is damaged"),
        "deflated and cut short": (_zip({f"{key}.npy": _npy_bytes(array)},
                                        zipfile.ZIP_DEFLATED)[:-60], unreadable),
    }


def _cuts(data: bytes, step: int = 1):
    """Prefixes of ``data``: every ``step`` bytes, and every one of the first and last 40."""
    points = set(range(0, len(data), step)) | set(range(min(40, len(data))))
    points |= set(range(max(0, len(data) - 40), len(data)))
    return [data[:cut] for cut in sorted(points)]


def _flips(data: bytes, count: int = 80, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(count):
        damaged = bytearray(data)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        yield bytes(damaged)


def _every_hostile_npz(good: bytes, key: str, array: np.ndarray, step: int = 1):
    for label, (data, _message) in _structural_npz_cases(key, array).items():
        yield label, data
    for index, data in enumerate(_cuts(good, step)):
        yield f"cut {index}", data
    for index, data in enumerate(_flips(good)):
        yield f"flip {index}", data


# -- gluon: Block.load_parameters --------------------------------------------------------------

def _dense():
    net = nn.Dense(3, in_units=4)
    net.initialize()
    return net


def _values(block) -> list:
    """The parameter values in order (blocks made apart have different name prefixes)."""
    return [p.data().asnumpy().copy() for p in block.collect_params().values()]


def _same(block, values) -> bool:
    now = _values(block)
    return len(now) == len(values) and all(np.array_equal(a, b) for a, b in zip(now, values))


def test_parameters_round_trip_at_exactly_the_given_path(tmp_path):
    net = _dense()
    net.save_parameters(tmp_path / "model.params")  # no .npz appended
    other = _dense()
    other.load_parameters(tmp_path / "model.params")
    assert _same(other, _values(net))
    assert sorted(os.listdir(tmp_path)) == ["model.params"]


def test_damaged_parameter_files_raise_model_load_error_and_change_nothing(tmp_path):
    source = _dense()
    source.save_parameters(tmp_path / "good.params")
    good = (tmp_path / "good.params").read_bytes()
    target = _dense()
    before = _values(target)
    path = tmp_path / "bad.params"
    for label, data in _every_hostile_npz(good, "weight", source.weight.data().asnumpy()):
        path.write_bytes(data)
        try:
            target.load_parameters(path)
        except ModelLoadError as exc:
            assert "bad.params" in str(exc), label
            assert _same(target, before), label
        except InputError as exc:  # a flip renamed a member: a missing or extra parameter
            assert label.startswith("flip") and "bad.params" in str(exc), label
        else:
            # save_parameters writes MXNet's .params format, which has no checksum (MXNet
            # reads the files mixrt writes, and mixrt MXNet's): a flipped value byte loads as
            # the value the file now holds, exactly what nd.load reads from it, no other
            assert label.startswith("flip"), label
            stored = nd.load(str(path))
            assert _same(target, [stored[name].asnumpy() for name in ("weight", "bias")]), label
            target = _dense()
            before = _values(target)


@pytest.mark.parametrize("case", sorted(_structural_npz_cases("weight", WEIGHT)))
def test_broken_parameter_files_say_what_is_wrong_where(tmp_path, case):
    data, message = _structural_npz_cases("weight", np.zeros((3, 4), np.float32))[case]
    (tmp_path / "w.params").write_bytes(data)
    with pytest.raises(ModelLoadError, match=rf"parameter file '.*w\.params'.*{message}"):
        _dense().load_parameters(tmp_path / "w.params")


def test_parameter_folders_missing_files_and_fifos(tmp_path):
    net = _dense()
    with pytest.raises(ModelLoadError, match="nope.params"):
        net.load_parameters(tmp_path / "nope.params")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        net.load_parameters(tmp_path)
    os.mkfifo(tmp_path / "fifo")  # opening it to read would block forever
    with pytest.raises(ModelLoadError, match="not a regular file"):
        net.load_parameters(tmp_path / "fifo")


def _params_file(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("arrays, message", [
    ({"weight": np.zeros((4, 3), np.float32), "bias": np.zeros(3, np.float32)},
     r"parameter 'weight' has shape \(4, 3\); the parameter's is \(3, 4\)"),
    ({"weight": np.zeros((3, 4, 1), np.float32), "bias": np.zeros(3, np.float32)},
     r"'weight' has shape \(3, 4, 1\)"),
    ({"weight": np.zeros((3, 4), np.float32), "bias": np.float32(0)}, r"'bias' has shape \(\)"),
    ({"weight": np.zeros((3, 4), np.float64), "bias": np.zeros(3, np.float32)},
     "'weight' is float64; the parameter is float32"),
    ({"weight": np.zeros((3, 4), np.int64), "bias": np.zeros(3, np.float32)},
     "'weight' is int64"),
    ({"weight": np.full((3, 4), "a"), "bias": np.zeros(3, np.float32)}, "'weight' is <U1"),
    ({"weight": np.zeros((3, 4), "V4"), "bias": np.zeros(3, np.float32)}, "'weight' is |V4"),
    ({"weight": np.zeros((3, 4), np.float32)}, r"no values for parameters \['bias'\]"),
    ({"weight": np.zeros((3, 4), np.float32), "bias": np.zeros(3, np.float32),
      "gamma": np.zeros(3, np.float32)}, r"the block does not have: \['gamma'\]"),
])
def test_parameters_of_the_wrong_shape_dtype_or_name_are_refused(tmp_path, arrays, message):
    net = _dense()
    before = _values(net)
    path = _params_file(tmp_path / "p.npz", **arrays)
    with pytest.raises(InputError, match=message) as info:
        net.load_parameters(path)
    assert "p.npz" in str(info.value)
    assert _same(net, before)  # nothing loaded, not even the parameters that fitted


def test_cast_dtype_allow_missing_and_ignore_extra(tmp_path):
    net = _dense()
    path = _params_file(tmp_path / "p.npz", weight=np.ones((3, 4)), gamma=np.ones(2))
    with pytest.raises(InputError, match="cast_dtype=True"):
        net.load_parameters(path, allow_missing=True, ignore_extra=True)
    net.load_parameters(path, allow_missing=True, ignore_extra=True, cast_dtype=True)
    assert net.weight.data().asnumpy().dtype == np.float32
    assert (net.weight.data().asnumpy() == 1).all()
    strings = _params_file(tmp_path / "s.npz", weight=np.full((3, 4), "1"),
                           bias=np.zeros(3, np.float32))
    with pytest.raises(InputError, match="'weight' is <U1"):
        net.load_parameters(strings, cast_dtype=True)  # only numbers convert


def test_deferred_parameters_take_the_saved_shape_only_where_unknown(tmp_path):
    source = nn.Dense(3, in_units=4)
    source.initialize()
    source.save_parameters(tmp_path / "p.params")
    later = nn.Dense(3)  # in_units unknown until the first forward
    later.initialize()
    later.load_parameters(tmp_path / "p.params")
    assert later.weight.shape == (3, 4)
    wrong = nn.Dense(5)
    wrong.initialize()
    with pytest.raises(InputError, match=r"'weight' has shape \(3, 4\); the parameter's is "
                                         r"\(5, 0\)"):
        wrong.load_parameters(tmp_path / "p.params")


def test_save_parameters_refuses_what_npy_cannot_record(tmp_path):
    net = _dense()
    net.cast("bfloat16")  # .npy would record it as raw 2-byte voids, unloadable
    with pytest.raises(InputError, match="'weight' has dtype bfloat16"):
        net.save_parameters(tmp_path / "bf.params")
    assert os.listdir(tmp_path) == []  # no half-written file left behind


def test_parameters_named_like_savez_arguments_save_and_load(tmp_path):
    class Odd(mixrt.gluon.Block):
        def __init__(self):
            super().__init__()
            self.file = self.params.get("file", shape=(2,))
            self.pickle = self.params.get("allow_pickle", shape=(2,))

    net = Odd()
    net.initialize()
    net.save_parameters(tmp_path / "odd.params")  # np.savez(path, file=...) is a TypeError
    again = Odd()
    again.initialize()
    again.load_parameters(tmp_path / "odd.params")
    assert _same(again, _values(net))


# -- optimizer states: Trainer.load_states and KVStore.load_optimizer_states -------------------

def _trained(optimizer="adam"):
    net = _dense()
    trainer = Trainer(net.collect_params(), optimizer, {"learning_rate": 0.1})
    with mixrt.autograd.record():
        loss = net(mixrt.nd.array(np.ones((2, 4), np.float32))).sum()
    loss.backward()
    trainer.step(2)
    return net, trainer


def _state_arrays(trainer) -> dict:
    return {k: np.array(v) for k, v in trainer.optimizer_state_dict().items()}


def test_states_round_trip_at_exactly_the_given_path(tmp_path):
    net, trainer = _trained()
    trainer.save_states(tmp_path / "run.states")
    fresh = Trainer(net.collect_params(), "adam", {"learning_rate": 0.1})
    fresh.load_states(tmp_path / "run.states")  # np.savez would have written run.states.npz
    assert fresh.optimizer.counts == trainer.optimizer.counts
    assert os.listdir(tmp_path) == ["run.states"]


def test_damaged_state_files_raise_typed_errors_naming_the_file(tmp_path):
    net, trainer = _trained()
    trainer.save_states(tmp_path / "good.states")
    good = (tmp_path / "good.states").read_bytes()
    path = tmp_path / "bad.states"
    for label, data in _every_hostile_npz(good, "meta", np.array("{}"), step=3):
        path.write_bytes(data)
        fresh = Trainer(net.collect_params(), "adam", {"learning_rate": 0.1})
        try:
            fresh.load_states(path)
        except (ModelLoadError, OptimizerError) as exc:
            assert "bad.states" in str(exc), label
            assert fresh.optimizer.states == {}, label
        else:
            assert label.startswith("flip"), label
            assert fresh.optimizer.counts == trainer.optimizer.counts, label


def _with_meta(arrays: dict, meta) -> dict:
    text = meta if isinstance(meta, str) else json.dumps(meta)
    return dict(arrays, meta=np.array(text))


def _edited_meta(arrays: dict, **changes) -> dict:
    meta = json.loads(str(arrays["meta"]))
    meta.update(changes)
    return _with_meta(arrays, meta)


DEEP = "[" * 100_000 + "]" * 100_000


def _bad_states(arrays: dict) -> dict:
    """Optimizer-state contents that must be refused, by what is wrong with them."""
    keys = json.loads(str(arrays["meta"]))["keys"]
    first = next(k for k in arrays if k.startswith("state0."))
    return {
        "no meta": {k: v for k, v in arrays.items() if k != "meta"},
        "meta not JSON": _with_meta(arrays, "{not json"),
        "meta nested 100000 deep": _with_meta(arrays, DEEP),
        "meta a number": dict(arrays, meta=np.array(3.5)),
        "meta a list": _with_meta(arrays, [1, 2]),
        "format 99": _edited_meta(arrays, format=99),
        "keys not a list": _edited_meta(arrays, keys="dense0_weight"),
        "a key twice": _edited_meta(arrays, keys=[keys[0], keys[0]]),
        "count negative": _edited_meta(arrays, counts={keys[0]: -1}),
        "count a float": _edited_meta(arrays, counts={keys[0]: 1.5}),
        "count a bool": _edited_meta(arrays, counts={keys[0]: True}),
        "other optimizer": _edited_meta(arrays, optimizer={"name": "sgd", "params": {}}),
        "name a list": _edited_meta(arrays, optimizer={"name": ["adam"], "params": {}}),
        "unknown key": _edited_meta(arrays, keys=["nope"] + keys[1:]),
        "missing slot": {k: v for k, v in arrays.items() if k != first},
        "extra array": dict(arrays, **{"state9.mean": np.zeros(3, np.float32)}),
        "integer state": dict(arrays, **{first: arrays[first].astype(np.int32)}),
        "wrong state shape": dict(arrays, **{first: np.zeros((7, 7), np.float32)}),
    }


@pytest.mark.parametrize("case", sorted(_bad_states(_state_arrays(_trained()[1]))))
def test_bad_optimizer_states_are_refused_naming_the_file(tmp_path, case):
    net, trainer = _trained()
    arrays = _bad_states(_state_arrays(trainer))[case]
    np.savez(tmp_path / "bad.npz", **arrays)
    fresh = Trainer(net.collect_params(), "adam", {"learning_rate": 0.1})
    with pytest.raises(OptimizerError, match="bad.npz") as info:
        fresh.load_states(tmp_path / "bad.npz")
    assert len(str(info.value)) < 2000  # a 200 KB meta is not pasted into the message
    assert fresh.optimizer.states == {} and fresh.optimizer.counts == {}
    store = mixrt.kv.create("local")  # holding the keys the good state is for
    for param in net.collect_params().values():
        store.init(param.name, param.data().asnumpy())
    store.set_optimizer(optim.create("adam"))
    with pytest.raises(OptimizerError, match="bad.npz"):
        store.load_optimizer_states(tmp_path / "bad.npz")
    assert store.optimizer.states == {}


def test_a_store_loads_only_states_that_fit_its_values(tmp_path):
    """A state saved for another model fails at load, naming the key, not at a later step
    (or, for a state that broadcasts, never)."""
    saved = mixrt.kv.create("local")
    saved.init("w", np.zeros(4, np.float32))
    saved.set_optimizer(optim.create("adam", learning_rate=0.1))
    saved.push("w", np.ones(4, np.float32))
    saved.save_optimizer_states(tmp_path / "w4.npz")
    for shape in [(1,), (2, 2), (5,)]:
        other = mixrt.kv.create("local")
        other.init("w", np.zeros(shape, np.float32))
        other.set_optimizer(optim.create("adam", learning_rate=0.1))
        with pytest.raises(OptimizerError, match=r"w4.npz.*'state0\.\w+' of key 'w' has "
                                                 r"shape \(4,\); the key's value has"):
            other.load_optimizer_states(tmp_path / "w4.npz")
        assert other.optimizer.states == {}
    stranger = mixrt.kv.create("local")
    stranger.init("v", np.zeros(4, np.float32))
    stranger.set_optimizer(optim.create("adam", learning_rate=0.1))
    with pytest.raises(OptimizerError, match="for key 'w', which this store does not hold"):
        stranger.load_optimizer_states(tmp_path / "w4.npz")


@pytest.mark.parametrize("spec", [
    {"name": "sgd", "params": {"lr_scheduler": {"name": ["factor"], "params": {}}}},
    {"name": "sgd", "params": {"lr_scheduler": 5}},
    {"name": "sgd", "params": {"learning_rate": "0.1"}},
    {"name": "sgd", "params": {"nope": 1}},
    {"name": {"sgd": 1}, "params": {}},
    {"name": "sgd"},
])
def test_the_optimizer_a_checkpoint_names_is_checked(spec):
    """What a parameter-server store rebuilds its optimizer from (from_state_dict)."""
    arrays = _edited_meta(optim.create("sgd").state_dict(), optimizer=spec)
    with pytest.raises(OptimizerError):
        optim.from_state_dict(arrays)


def test_kvstore_states_round_trip_and_refuse_damage(tmp_path):
    store = mixrt.kv.create("local")
    store.init("w", np.zeros(4, np.float32))
    store.set_optimizer(optim.create("adam", learning_rate=0.1))
    store.push("w", np.ones(4, np.float32))
    store.save_optimizer_states(tmp_path / "kv.states")
    good = (tmp_path / "kv.states").read_bytes()
    again = mixrt.kv.create("local")
    again.init("w", np.zeros(4, np.float32))  # a state loads onto keys the store holds
    again.set_optimizer(optim.create("adam", learning_rate=0.1))
    again.load_optimizer_states(tmp_path / "kv.states")
    assert again.optimizer.counts == {"w": 1}
    for index, data in enumerate(_cuts(good, 5)):
        (tmp_path / "cut.states").write_bytes(data)
        with pytest.raises(ModelLoadError, match="cut.states"):
            again.load_optimizer_states(tmp_path / "cut.states")
    with pytest.raises(KVStoreError, match="no optimizer"):
        mixrt.kv.create("local").load_optimizer_states(tmp_path / "kv.states")


# -- Module.load_checkpoint --------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint of a small MLP after one epoch of Adam on random data, and its data."""
    folder = tmp_path_factory.mktemp("checkpoint")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 8)).astype(np.float32), rng.integers(0, 3, 40)
    model = Module(mlp_graph(8, 6, 3))
    trainer = Trainer(model.params.trainable(), "adam", {"learning_rate": 0.01})
    model.fit(NDArrayIter(x, y, 20, shuffle=True, seed=1), epochs=1, trainer=trainer,
              checkpoint=folder / "run", progress=False)
    return folder / "run.npz", (x, y)


def _fresh_module():
    model = Module(mlp_graph(8, 6, 3, seed=7))
    trainer = Trainer(model.params.trainable(), "adam", {"learning_rate": 0.01})
    return model, trainer


def _module_values(model) -> dict:
    return {name: np.array(p.raw()) for name, p in model.params.items()}


def test_checkpoint_loads_and_damaged_ones_change_nothing(checkpoint, tmp_path):
    path, (x, y) = checkpoint
    model, trainer = _fresh_module()
    epochs, history = model.load_checkpoint(path, trainer, NDArrayIter(x, y, 20))
    assert epochs == 1 and len(history) == 1 and "loss" in history[0]
    good = path.read_bytes()
    bad = tmp_path / "bad.npz"
    for label, data in _every_hostile_npz(good, "meta", np.array("{}"), step=41):
        bad.write_bytes(data)
        model, trainer = _fresh_module()
        before = _module_values(model)
        try:
            model.load_checkpoint(bad, trainer)
        except (ModelLoadError, OptimizerError) as exc:
            assert "bad.npz" in str(exc), label
            assert all(np.array_equal(v, before[k]) for k, v in _module_values(model).items())
            assert trainer.optimizer.states == {}, label
        else:
            assert label.startswith("flip"), label


def _checkpoint_arrays(path) -> dict:
    with np.load(path, allow_pickle=False) as stored:
        return {key: stored[key] for key in stored.files}


def _record_edit(**changes):
    def edit(arrays):
        record = json.loads(str(arrays["meta"]))
        record.update(changes)
        arrays["meta"] = np.array(json.dumps(record))
    return edit


def _record_drop(key):
    def edit(arrays):
        record = json.loads(str(arrays["meta"]))
        del record[key]
        arrays["meta"] = np.array(json.dumps(record))
    return edit


def _set(key, value):
    def edit(arrays):
        arrays[key] = value
    return edit


def _drop(key):
    def edit(arrays):
        del arrays[key]
    return edit


BAD_CHECKPOINTS = {
    "no meta": (_drop("meta"), ModelLoadError, "no 'meta' entry"),
    "meta not JSON": (_set("meta", np.array("{oops")), ModelLoadError, "not a JSON record"),
    "meta nested deep": (_set("meta", np.array(DEEP)), ModelLoadError, "not a JSON record"),
    "meta an array of numbers": (_set("meta", np.arange(3)), ModelLoadError, "'meta'"),
    "record a list": (_set("meta", np.array("[1]")), ModelLoadError, "format None"),
    "wrong format": (_record_edit(format="other/1"), ModelLoadError, "format 'other/1'"),
    "epoch missing": (_record_drop("epoch"), ModelLoadError, "'epoch'"),
    "epoch a string": (_record_edit(epoch="1"), ModelLoadError, "'epoch'"),
    "epoch negative": (_record_edit(epoch=-1), ModelLoadError, "'epoch'"),
    "epoch a bool": (_record_edit(epoch=True), ModelLoadError, "'epoch'"),
    "epoch a float": (_record_edit(epoch=1.5), ModelLoadError, "'epoch'"),
    "history a string": (_record_edit(history="abc"), ModelLoadError, "'history'"),
    "history of numbers": (_record_edit(history=[1, 2]), ModelLoadError, "'history'"),
    "data a list": (_record_edit(data=[1]), ModelLoadError, "'data'"),
    "data state empty": (_record_edit(data={}), ModelLoadError, "data iterator"),
    "data rng garbage": (_record_edit(data={"rng": "x", "order": [], "position": 0}),
                         ModelLoadError, "data iterator"),
    "data order short": (_record_edit(data={"rng": None, "order": [0], "position": 0}),
                         ModelLoadError, "'order' must be a list of 40 sample indices"),
    "data order repeats": (_record_edit(data={"rng": None, "order": [0] * 40, "position": 0}),
                           ModelLoadError, "'order' must hold distinct indices"),
    "data order out of range": (_record_edit(data={"rng": None, "order": list(range(1, 41)),
                                                   "position": 0}),
                                ModelLoadError, r"distinct indices in \[0, 40\)"),
    "data position past the end": (_record_edit(data={"rng": None, "order": list(range(40)),
                                                      "position": 3}),
                                   ModelLoadError, r"'position' must be an int in \[0, 2\]"),
    "scaler a string": (_record_edit(loss_scaler="big"), ModelLoadError, "'loss_scaler'"),
    "scaler scale zero": (_record_edit(loss_scaler={"scale": 0, "clean_steps": 0}),
                          ModelLoadError, "'loss_scaler'"),
    "scaler count inf": (_record_edit(loss_scaler={"scale": 2.0, "clean_steps": 1e999}),
                         ModelLoadError, "clean_steps"),
    "parameter missing": (_drop("param/w1"), ModelLoadError, "no parameter 'w1'"),
    "parameter extra": (_set("param/w9", np.zeros(2, np.float32)), ModelLoadError,
                        r"does not have: \['param/w9'\]"),
    "unknown entry": (_set("weights", np.zeros(2, np.float32)), ModelLoadError,
                      r"does not have: \['weights'\]"),
    "parameter shape": (_set("param/w1", np.zeros((6, 8), np.float32)), ModelLoadError,
                        r"'w1' is float32 \[6, 8\]; the model's is float32 \[8, 6\]"),
    "parameter dtype": (_set("param/w1", np.zeros((8, 6), np.float64)), ModelLoadError,
                        "'w1' is float64"),
    "parameter strings": (_set("param/b1", np.full(6, "x")), ModelLoadError, "'b1' is <U1"),
    "optimizer state missing": (_drop("optimizer/meta"), OptimizerError, "no 'meta' entry"),
    "optimizer state shape": (_set("optimizer/state0.mean", np.zeros(5, np.float32)),
                              OptimizerError, "has shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_bad_checkpoint_contents_are_refused_and_change_nothing(checkpoint, tmp_path, case):
    path, (x, y) = checkpoint
    edit, error, message = BAD_CHECKPOINTS[case]
    arrays = _checkpoint_arrays(path)
    edit(arrays)
    np.savez(tmp_path / "edited.npz", **arrays)
    model, trainer = _fresh_module()
    before, data = _module_values(model), NDArrayIter(x, y, 20, shuffle=True, seed=9)
    data_before = json.dumps(data.state())
    with pytest.raises(error, match=message) as info:
        model.load_checkpoint(tmp_path / "edited.npz", trainer, data)
    assert "edited.npz" in str(info.value)
    assert all(np.array_equal(v, before[k]) for k, v in _module_values(model).items())
    assert trainer.optimizer.states == {} and model.loss_scaler is None
    assert json.dumps(data.state()) == data_before  # the iterator was put back


# -- LossScaler.load_state_dict ----------------------------------------------------------------

@pytest.mark.parametrize("state", [
    None, [], "scale", {}, {"scale": 2.0}, {"clean_steps": 0},
    {"scale": 2.0, "clean_steps": 0, "extra": 1},
    {"scale": "65536", "clean_steps": 0}, {"scale": True, "clean_steps": 0},
    {"scale": float("inf"), "clean_steps": 0}, {"scale": float("nan"), "clean_steps": 0},
    {"scale": -1.0, "clean_steps": 0}, {"scale": [2.0], "clean_steps": 0},
    {"scale": 2.0, "clean_steps": float("inf")}, {"scale": 2.0, "clean_steps": 2.7},
    {"scale": 2.0, "clean_steps": -1}, {"scale": 2.0, "clean_steps": "3"},
    {"scale": 2.0, "clean_steps": True}, {"scale": 2.0, "clean_steps": 0, "skipped_steps": -2},
    {"scale": 2.0, "clean_steps": 0, "skipped_steps": None},
])
def test_loss_scaler_refuses_bad_states_and_keeps_its_own(state):
    scaler = LossScaler(init_scale=8.0)
    scaler.clean_steps, scaler.skipped_steps = 3, 1
    with pytest.raises(InputError, match="LossScaler") as info:
        scaler.load_state_dict(state)
    assert len(str(info.value)) < 400
    assert (scaler.scale, scaler.clean_steps, scaler.skipped_steps) == (8.0, 3, 1)


def test_loss_scaler_state_round_trips_through_json():
    scaler = LossScaler(init_scale=8.0)
    scaler.update(False)
    again = LossScaler()
    again.load_state_dict(json.loads(json.dumps(scaler.state_dict())))
    assert again.state_dict() == scaler.state_dict()
    again.load_state_dict({"scale": 4, "clean_steps": 2})  # saved before skipped_steps
    assert (again.scale, again.clean_steps, again.skipped_steps) == (4.0, 2, 0)


# -- symbol JSON: sym.load and sym.load_json ---------------------------------------------------

def _symbol():
    data = sym.Variable("data", shape=(None, 3), dtype="float32", lr_mult=2.0)
    out = sym.Gemm(data, sym.Variable("w", shape=(4, 3)), sym.constant(np.ones(4, np.float32),
                                                                         name="b"),
                   transB=1, name="fc")
    return sym.Relu(out, name="relu")


def test_truncated_and_damaged_symbol_json_is_refused(tmp_path):
    text = _symbol().tojson()
    sym.load_json(text)
    for cut in range(0, len(text), 7):
        with pytest.raises(ModelLoadError, match="<string>"):
            sym.load_json(text[:cut])
    rng = random.Random(3)
    for _ in range(300):
        damaged = list(text)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.choice('[]{}",:0123456789-.enultrufas ')
        try:
            sym.load_json("".join(damaged))
        except ModelLoadError:
            pass


def _document():
    return json.loads(_symbol().tojson())


def _node(document, name):
    return next(n for n in document["nodes"] if n["name"] == name)


def _tensor_of(document):
    return _node(document, "b")["info"]["value"]["__tensor__"]


def _edit(path_fn, value):
    def edit(document):
        target, key = path_fn(document)
        target[key] = value
    return edit


def _empty_tensor(shape):
    def edit(document):
        _tensor_of(document).update(shape=shape, data="")
    return edit


SYMBOL_EDITS = {
    "nodes an object": (_edit(lambda d: (d, "nodes"), {}), "'nodes' must be a list"),
    "node a string": (_edit(lambda d: (d["nodes"], 0), "data"), "expected an object"),
    "name a number": (_edit(lambda d: (_node(d, "fc"), "name"), 5), "empty \"name\""),
    "op a number": (_edit(lambda d: (_node(d, "fc"), "op"), 5), "\"op\" is an operator"),
    "op a list": (_edit(lambda d: (_node(d, "fc"), "op"), ["Gemm"]), "\"op\" is an operator"),
    "opset a string": (_edit(lambda d: (_node(d, "fc"), "opset"), "21"), "bad domain"),
    "opset a bool": (_edit(lambda d: (_node(d, "fc"), "opset"), True), "bad domain"),
    "inputs a number": (_edit(lambda d: (_node(d, "fc"), "inputs"), 3), "bad domain"),
    "inputs a string": (_edit(lambda d: (_node(d, "fc"), "inputs"), "ab"), "bad domain"),
    "num_outputs 10**12": (_edit(lambda d: (_node(d, "fc"), "num_outputs"), 10**12),
                           "num_outputs"),
    "variable with inputs": (_edit(lambda d: (_node(d, "w"), "inputs"), [[0, 0]]),
                             "no inputs and 1 output"),
    "attrs a list": (_edit(lambda d: (_node(d, "fc"), "attrs"), [1]), "'attrs' must be"),
    "reference a bool": (_edit(lambda d: (_node(d, "fc")["inputs"], 0), [True, 0]),
                         "a reference is"),
    "reference a float": (_edit(lambda d: (_node(d, "fc")["inputs"], 0), [0.0, 0]),
                          "a reference is"),
    "heads a dict": (_edit(lambda d: (d, "heads"), {"a": 1}), "'heads' must be a list"),
    "tensor dtype a field list": (_edit(lambda d: (_tensor_of(d), "dtype"), [["a", "<f4"]]),
                                  "tensor dtype"),
    "tensor dtype void": (_edit(lambda d: (_tensor_of(d), "dtype"), "V16"), "tensor dtype"),
    "tensor dtype object": (_edit(lambda d: (_tensor_of(d), "dtype"), "object"),
                            "tensor dtype"),
    "tensor dtype datetime": (_edit(lambda d: (_tensor_of(d), "dtype"), "M8[s]"),
                              "tensor dtype"),
    "tensor shape a string": (_edit(lambda d: (_tensor_of(d), "shape"), "4"), "shape must"),
    "tensor shape floats": (_edit(lambda d: (_tensor_of(d), "shape"), [4.0]), "shape must"),
    "tensor shape negative": (_edit(lambda d: (_tensor_of(d), "shape"), [-4]), "shape must"),
    "empty tensor of 2**96 rows": (_empty_tensor([2**32, 2**32, 2**32, 0]), "not possible"),
    "empty tensor of 65 axes": (_empty_tensor([0] * 65), "not possible"),
    "tensor shape 2**64 elements": (_edit(lambda d: (_tensor_of(d), "shape"), [2**32, 2**32]),
                                    "needs 73786976294838206464 bytes"),
    "tensor data not base64": (_edit(lambda d: (_tensor_of(d), "data"), "@@@"), "base64"),
    "tensor data a number": (_edit(lambda d: (_tensor_of(d), "data"), 5), "base64"),
    "tensor field missing": (_edit(lambda d: (_node(d, "b")["info"]["value"], "__tensor__"),
                                   {"dtype": "float32"}), "a tensor is"),
    "constant without value": (_edit(lambda d: (_node(d, "b"), "info"), {}),
                               "needs a tensor"),
    "variable shape a string": (_edit(lambda d: (_node(d, "w")["info"], "shape"), "4,3"),
                                "\"shape\" must"),
    "variable shape negative": (_edit(lambda d: (_node(d, "w")["info"], "shape"), [-1, 3]),
                                "\"shape\" must"),
    "variable dtype unknown": (_edit(lambda d: (_node(d, "w")["info"], "dtype"), "float99"),
                               "\"dtype\" 'float99'"),
    "variable dtype a dict": (_edit(lambda d: (_node(d, "w")["info"], "dtype"), {"a": 1}),
                              "\"dtype\""),
    "lr_mult a string": (_edit(lambda d: (_node(d, "data")["info"], "lr_mult"), "2"),
                         "\"lr_mult\""),
    "wd_mult infinite": (_edit(lambda d: (_node(d, "data")["info"], "wd_mult"), 1e999),
                         "\"wd_mult\""),
    "attr nested 100000 deep": (_edit(lambda d: (_node(d, "fc"), "attrs"), "DEEP"),
                                "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(SYMBOL_EDITS))
def test_symbol_json_with_wrong_types_is_refused_naming_the_node(tmp_path, case):
    edit, message = SYMBOL_EDITS[case]
    document = _document()
    edit(document)
    text = json.dumps(document)
    text = text.replace('"DEEP"', DEEP)  # json.dumps itself cannot nest that deep
    path = tmp_path / "net.json"
    path.write_text(text)
    with pytest.raises(ModelLoadError, match=message) as info:
        sym.load(path)
    assert "net.json" in str(info.value) and len(str(info.value)) < 2000


def test_symbol_files_that_are_not_symbol_json(tmp_path):
    cases = {"empty.json": b"", "binary.json": b"\xff\xfe\x00garbage", "list.json": b"[]",
             "deep.json": DEEP.encode(), "string.json": b'"mixrt.symbol"'}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelLoadError, match=name):
            sym.load(tmp_path / name)
    with pytest.raises(ModelLoadError, match="nope.json"):
        sym.load(tmp_path / "nope.json")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        sym.load(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        sym.load(tmp_path / "fifo")
    with pytest.raises(ModelLoadError, match="is text"):
        sym.load_json(None)


def test_symbol_variable_declarations_survive_the_round_trip():
    loaded = sym.load_json(_symbol().tojson())
    assert loaded.tojson() == _symbol().tojson()
    args, _, _ = loaded.infer_shape(data=(2, 3))
    assert args == [(2, 3), (4, 3)]


def test_saving_a_string_tensor_as_symbol_json_is_refused():
    words = sym.constant(np.array(["a", "b"], dtype=object), name="words")
    with pytest.raises(GraphError, match="words"):
        words.tojson()


# -- ONNX files --------------------------------------------------------------------------------

def _external_model(tmp_path, entries, weights=WEIGHT.tobytes()):
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "weights.bin").write_bytes(weights)
    return save(weighted_model(WEIGHT, entries), folder / "m.onnx")


@pytest.mark.parametrize("entries, message", [
    ({"location": "missing.bin"}, "not found"),
    ({"location": "../../etc/passwd"}, "climbs out"),
    ({"location": "/etc/passwd"}, "is absolute"),
    ({"location": os.path.abspath("/tmp/weights.bin")}, "is absolute"),
    ({"location": "weights.bin", "offset": 30}, "runs past the end"),
    ({"location": "weights.bin", "offset": 20}, "holds 4 bytes for it"),
    ({"location": "weights.bin", "offset": 8, "length": 24}, "runs past the end"),
    ({"location": "weights.bin", "length": 10**30}, "runs past the end"),
    ({"location": "."}, "not a regular file"),
])
def test_hostile_external_data(tmp_path, entries, message):
    path = _external_model(tmp_path, entries)
    with pytest.raises(ModelLoadError, match=rf"tensor 'w'.*{message}"):
        mixrt.Session(path)


def test_external_data_shorter_than_the_tensor(tmp_path):
    path = _external_model(tmp_path, {"location": "weights.bin"}, WEIGHT.tobytes()[:10])
    with pytest.raises(ModelLoadError, match="holds 10 bytes for it, but .* need 24"):
        mixrt.Session(path)


def test_onnx_files_that_are_damaged_or_not_models(tmp_path):
    good = add_model().SerializeToString()
    path = tmp_path / "m.onnx"
    for cut in range(len(good)):  # a prefix may parse: then it is an incomplete graph
        path.write_bytes(good[:cut])
        with pytest.raises(MixrtError):
            mixrt.Session(str(path))
    for name, data in {"empty.onnx": b"", "text.onnx": b"hello, not a model",
                       "npz.onnx": _zip({"x.npy": _npy_bytes(WEIGHT)})}.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelLoadError, match=name):
            mixrt.Session(str(tmp_path / name))
    with pytest.raises(ModelLoadError, match="not a regular file"):
        mixrt.Session(str(tmp_path))
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        mixrt.Session(str(tmp_path / "nope.onnx"))


def test_onnx_import_does_not_read_fifos_or_devices(tmp_path):
    os.mkfifo(tmp_path / "fifo.onnx")  # reading would block for a writer that never comes
    with pytest.raises(ModelLoadError, match="not a regular file"):
        import_model(tmp_path / "fifo.onnx")
    with pytest.raises(ModelLoadError, match="not a regular file"):
        import_model("/dev/zero")  # st_size 0, then read_bytes() never ends
    # a Session first asks whether the path is an .mxr file: that check must not read it
    with pytest.raises(ModelLoadError, match="not a regular file"):
        mixrt.Session(str(tmp_path / "fifo.onnx"))


# -- mixrt run --input NAME=FILE.npy -----------------------------------------------------------

def _run_cli(capsys, model, x_path) -> tuple[int, str]:
    code = cli_main(["run", model, "--input", f"x={x_path}", "--input", f"y={x_path}"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("object", "holds Python objects"), ("truncated", "needs 24 bytes of data, the file holds"),
    ("truncated header", "EOF"), ("empty", "EOF"), ("huge header", "needs 400000000000 bytes"),
    ("npz", "magic string"), ("random", "magic string"), ("folder", "not a regular file"),
    ("missing", "No such file"), ("wrong shape", "expects dimension 0 to be 2"),
    ("wrong dtype", "expects dtype float, got double"), ("strings", "expects dtype float"),
    ("structured", "expects dtype float"),
])
def test_cli_npy_inputs(tmp_path, capsys, case, message):
    model = save(add_model(), tmp_path / "m.onnx")
    good = _npy_bytes(np.ones((2, 3), np.float32))
    files = {
        "object": _npy_bytes(np.array([{"a": 1}], dtype=object)), "truncated": good[:-3],
        "truncated header": good[:50], "empty": b"",
        "huge header": _npy_bytes(np.zeros(4, np.float32), header_shape=(100_000_000_000,)),
        "npz": _zip({"x.npy": good}), "random": random.Random(2).randbytes(300),
        "wrong shape": _npy_bytes(np.ones((3, 3), np.float32)),
        "wrong dtype": _npy_bytes(np.ones((2, 3), np.float64)),
        "strings": _npy_bytes(np.full((2, 3), "a")),
        "structured": _npy_bytes(np.zeros((2, 3), [("a", "<f4")])),
    }
    x_path = tmp_path / "x.npy"
    if case == "folder":
        x_path = tmp_path
    elif case != "missing":
        x_path.write_bytes(files[case])
    code, err = _run_cli(capsys, model, x_path)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert err.startswith("mixrt: error: ") and err.count("\n") == 1


def test_cli_npy_truncated_at_every_byte(tmp_path, capsys):
    model = save(add_model(), tmp_path / "m.onnx")
    good = _npy_bytes(np.ones((2, 3), np.float32))
    for cut in range(len(good)):
        (tmp_path / "x.npy").write_bytes(good[:cut])
        code, err = _run_cli(capsys, model, tmp_path / "x.npy")
        assert code == 2 and "--input x: not a plain .npy array" in err, (cut, err)
    (tmp_path / "x.npy").write_bytes(good)
    assert _run_cli(capsys, model, tmp_path / "x.npy")[0] == 0


# -- the readers themselves --------------------------------------------------------------------

def test_npz_reader_refuses_a_zip_bomb_header_before_allocating(tmp_path):
    bomb = _zip({"w.npy": _npy_bytes(np.zeros(4, np.float32), header_shape=(2**40, 2**20))})
    (tmp_path / "bomb.npz").write_bytes(bomb)
    with pytest.raises(ModelLoadError, match=r"checkpoint '.*bomb.npz': array 'w'.*needs"):
        npz.read_npz(tmp_path / "bomb.npz", "checkpoint")


def test_npz_writer_round_trips_every_key_and_file_objects(tmp_path):
    arrays = {"file": np.arange(3), "allow_pickle": np.ones(2, np.float16),
              "meta": np.array("{}"), "a/b": np.zeros((2, 0))}
    npz.write_npz(tmp_path / "x", arrays, "test")
    loaded = npz.read_npz(tmp_path / "x", "test")
    assert loaded.keys() == arrays.keys()
    for key, value in arrays.items():
        assert loaded[key].dtype == value.dtype and np.array_equal(loaded[key], value)
    buffer = io.BytesIO()
    npz.write_npz(buffer, arrays, "test")
    buffer.seek(0)
    assert npz.read_npz(buffer, "test").keys() == arrays.keys()
    with pytest.raises(InputError, match="'o' has dtype object"):
        npz.write_npz(tmp_path / "o", {"o": np.array([None])}, "test")
