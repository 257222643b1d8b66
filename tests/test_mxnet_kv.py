"""mx.kv as MXNet's users call it: NDArrays, int and str keys, lists per key summed over
devices, _set_updater, MXNet's local kinds, broadcast, row_sparse_pull, is_capable.

The cases follow MXNet 1.9.1's tests/python/unittest/test_kvstore.py; each result was also
checked against MXNet 1.9.1 running the same calls (2026-11-24).
"""

import numpy as np
import pytest

import mixrt
from mixrt import nd
from mixrt.errors import KVStoreError

SHAPE = (4, 4)
KEYS = [5, 7, 11]
STR_KEYS = ["b", "c", "d"]


def init_kv(single, many):
    kv = mixrt.kv.create()
    kv.init(single, nd.zeros(SHAPE))
    kv.init(many, [nd.zeros(SHAPE)] * len(many))  # one array for three keys: each copies
    return kv


def equals(array, value):
    np.testing.assert_array_equal(array.asnumpy(), np.full(array.shape, value, np.float32))


@pytest.mark.parametrize("single,many", [(3, KEYS), ("a", STR_KEYS)])
def test_single_and_list_push_pull(single, many):
    kv = init_kv(single, many)
    kv.push(single, nd.ones(SHAPE))
    out = nd.empty(SHAPE)
    kv.pull(single, out=out)
    equals(out, 1)
    kv.push(many, [nd.ones(SHAPE) * 4] * len(many))
    outs = [nd.empty(SHAPE)] * len(many)
    kv.pull(many, out=outs)
    for out in outs:
        equals(out, 4)


@pytest.mark.parametrize("key", [3, "a"])
def test_init_value_is_pulled(key):
    kv = mixrt.kv.create()
    kv.init(key, nd.ones(SHAPE) * 4)
    out = nd.zeros(SHAPE)
    kv.pull(key, out=out)
    equals(out, 4)


@pytest.mark.parametrize("single,many", [(3, KEYS), ("a", STR_KEYS)])
def test_values_from_several_devices_are_summed(single, many):
    kv = init_kv(single, many)
    devices = [mixrt.cpu(i) for i in range(4)]
    values = [nd.ones(SHAPE, ctx=d) for d in devices]
    kv.push(single, values)
    kv.pull(single, out=values)
    for value in values:
        equals(value, 4)
    values = [[nd.ones(SHAPE, ctx=d) * 2.0 for d in devices]] * len(many)
    kv.push(many, values)
    kv.pull(many, out=values)
    for per_key in values:
        for value in per_key:
            equals(value, 8)


@pytest.mark.parametrize("single,many", [(3, KEYS), ("a", STR_KEYS)])
def test_set_updater_sees_ndarrays_and_the_users_keys(single, many):
    seen = []

    def updater(key, received, stored):
        seen.append(key)
        stored += received

    kv = init_kv(single, many)
    kv._set_updater(updater)
    devices = [mixrt.cpu(i) for i in range(4)]
    values = [nd.ones(SHAPE, ctx=d) for d in devices]
    kv.push(single, values)
    kv.pull(single, out=values)
    for value in values:
        equals(value, 4)
    values = [[nd.ones(SHAPE, ctx=d) for d in devices]] * len(many)
    for _ in range(4):
        kv.push(many, values)
    kv.pull(many, out=values)
    for per_key in values:
        for value in per_key:
            equals(value, 16)
    assert seen[:4] == [single, *many]  # int keys come back as ints, as in MXNet


@pytest.mark.parametrize("kind", ["local", "device", "local_allreduce_cpu",
                                  "local_allreduce_device", "local_update_cpu"])
def test_mxnets_local_kinds_report_their_type(kind):
    kv = mixrt.kv.create(kind)
    assert (kv.type, kv.rank, kv.num_workers) == (kind, 0, 1)
    assert kv.is_capable(kv.OPTIMIZER)


def test_pushpull_broadcast_and_row_sparse_pull():
    kv = mixrt.kv.create("local")
    a, b = nd.ones((2, 2)) * 3, nd.zeros((2, 2))
    kv.broadcast(99, a, out=b)
    equals(b, 3)
    kv.pushpull(99, nd.ones((2, 2)) * 5, out=b)
    equals(b, 5)
    kv.init(7, nd.ones((4, 2)))
    out = nd.zeros((4, 2), stype="row_sparse")
    kv.row_sparse_pull(7, out=out, row_ids=nd.array([0, 2], dtype="int64"))
    np.testing.assert_array_equal(out.asnumpy(), [[1, 1], [0, 0], [1, 1], [0, 0]])
    assert out.indices.asnumpy().tolist() == [0, 2]


def test_mixing_ndarrays_and_host_arrays_and_errors():
    kv = mixrt.kv.create("local")
    kv.init("w", np.zeros(3, np.float32))
    kv.push("w", nd.ones((3,)))
    out = np.empty(3, np.float32)
    kv.pull("w", out=out)
    np.testing.assert_array_equal(out, np.ones(3))
    with pytest.raises(KVStoreError, match="expected NDArrays, NumPy or CuPy"):
        kv.push("w", [[1.0, 2.0, 3.0]])
    with pytest.raises(KVStoreError, match="_set_updater takes a callable"):
        kv._set_updater("not callable")
    with pytest.raises(KVStoreError, match="unknown capability"):
        kv.is_capable("telepathy")
    with pytest.raises(KVStoreError, match="gradient compression"):
        kv.set_gradient_compression({"type": "2bit"})
