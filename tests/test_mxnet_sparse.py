"""MXNet 1.x's sparse storage (``mx.nd.sparse``): CSR and row_sparse arrays, their stored
form, the storage types of operator results and sparse gradients. Expected values and
storage types are MXNet 1.9.1's."""

import numpy as np
import pytest

import mixrt
from mixrt import autograd, nd
from mixrt.base.errors import InputError, MXNetError
from mixrt.nd.ndarray import _STORAGE_TYPE_ID_TO_STR, _STORAGE_TYPE_STR_TO_ID
from mixrt.nd.sparse import CSRNDArray, RowSparseNDArray, BaseSparseNDArray

DENSE = np.array([[0, 1, 0], [2, 0, 3], [0, 0, 0], [4, 0, 0]], dtype=np.float32)


def test_storage_type_ids_are_mxnets():
    assert _STORAGE_TYPE_STR_TO_ID == {"undefined": -1, "default": 0, "row_sparse": 1,
                                       "csr": 2}
    assert _STORAGE_TYPE_ID_TO_STR[2] == "csr"


def test_tostype_csr_stores_sorted_int64_components():
    csr = nd.array(DENSE).tostype("csr")
    assert isinstance(csr, CSRNDArray) and isinstance(csr, BaseSparseNDArray)
    assert isinstance(csr, nd.NDArray) and csr.stype == "csr"
    assert csr.indptr.asnumpy().tolist() == [0, 1, 3, 3, 4]
    assert csr.indices.asnumpy().tolist() == [1, 0, 2, 0]
    assert csr.indices.dtype == np.int64 and csr.indptr.dtype == np.int64
    assert csr.data.asnumpy().tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(csr.asnumpy(), DENSE)
    np.testing.assert_array_equal(csr.asscipy().toarray(), DENSE)


def test_tostype_row_sparse_stores_the_non_zero_rows():
    rsp = nd.array(DENSE).tostype("row_sparse")
    assert isinstance(rsp, RowSparseNDArray) and rsp.stype == "row_sparse"
    assert rsp.indices.asnumpy().tolist() == [0, 1, 3]
    np.testing.assert_array_equal(rsp.data.asnumpy(), DENSE[[0, 1, 3]])
    assert rsp.tostype("default").stype == "default"


def test_csr_and_row_sparse_do_not_convert_into_each_other():
    with pytest.raises(MXNetError, match="not supported"):
        nd.array(DENSE).tostype("csr").tostype("row_sparse")
    with pytest.raises(InputError, match="stype"):
        nd.array(DENSE).tostype("sparse")


def test_csr_matrix_from_its_definition_coordinates_and_scipy():
    made = nd.sparse.csr_matrix((np.array([1., 2.]), [1, 2], [0, 1, 2]), shape=(2, 3))
    np.testing.assert_array_equal(made.asnumpy(), [[0, 1, 0], [0, 0, 2]])
    assert made.dtype == np.float64  # the data's dtype, as MXNet
    summed = nd.sparse.csr_matrix(([1, 2], ([0, 0], [1, 1])), shape=(2, 2))
    np.testing.assert_array_equal(summed.asnumpy(), [[0, 3], [0, 0]])
    assert summed.dtype == np.float32 and summed.indices.asnumpy().tolist() == [1]
    scipy_sparse = pytest.importorskip("scipy.sparse")
    from_scipy = nd.sparse.csr_matrix(scipy_sparse.csr_matrix(DENSE))
    np.testing.assert_array_equal(from_scipy.asnumpy(), DENSE)
    assert nd.sparse.array(from_scipy).stype == "csr"


def test_explicit_zeros_stay_stored():
    csr = nd.sparse.csr_matrix((np.array([0., 1.]), [0, 1], [0, 1, 2]), shape=(2, 3))
    assert csr.data.asnumpy().tolist() == [0, 1]
    rsp = nd.sparse.row_sparse_array((np.zeros((2, 3)), [0, 2]), shape=(4, 3))
    assert rsp.indices.asnumpy().tolist() == [0, 2]
    assert (rsp * 2).indices.asnumpy().tolist() == [0, 2]


def test_bad_definitions_raise_naming_what_is_wrong():
    with pytest.raises(MXNetError, match="rows"):
        nd.sparse.csr_matrix((np.array([1.]), [1], [0, 1]), shape=(2, 3))
    with pytest.raises(MXNetError, match="indices"):
        nd.sparse.row_sparse_array((np.ones((1, 2)), [5]), shape=(3, 2))
    unsorted = nd.sparse.csr_matrix((np.array([1., 2.]), [1, 0], [0, 2]), shape=(1, 3))
    with pytest.raises(MXNetError, match="sorted"):
        unsorted.check_format()


def test_zeros_and_empty_store_nothing():
    rsp = nd.zeros((3, 2), stype="row_sparse")
    assert rsp.stype == "row_sparse" and rsp.indices.shape == (0,)
    csr = nd.sparse.zeros("csr", (2, 3), dtype="float64")
    assert csr.indptr.asnumpy().tolist() == [0, 0, 0] and csr.dtype == np.float64
    assert nd.empty((2, 2), stype="csr").stype == "csr"
    with pytest.raises(InputError, match="2-D"):
        nd.zeros((2,), stype="csr")


def test_result_storage_types_follow_mxnet():
    dense = nd.array(DENSE)
    csr, rsp = dense.tostype("csr"), dense.tostype("row_sparse")
    cases = {"csr*2": (csr * 2, "csr"), "csr+1": (csr + 1, "default"),
             "csr/2": (csr / 2, "csr"), "csr+csr": (csr + csr, "csr"),
             "rsp-rsp": (rsp - rsp, "row_sparse"), "rsp+dense": (rsp + dense, "default"),
             "csr*dense": (csr * dense, "csr"), "rsp*dense": (rsp * dense, "row_sparse"),
             "-csr": (-csr, "csr"), "abs rsp": (abs(rsp), "row_sparse"),
             "sqrt csr": (nd.sparse.sqrt(csr), "csr"), "exp csr": (nd.exp(csr), "default"),
             "sum csr": (nd.sparse.sum(csr, axis=0), "default"),
             "copy": (csr.copy(), "csr"), "astype": (rsp.astype("float64"), "row_sparse")}
    for name, (result, stype) in cases.items():
        assert result.stype == stype, name
    np.testing.assert_allclose((csr * 2).asnumpy(), DENSE * 2)
    np.testing.assert_allclose(nd.sparse.sum(csr, axis=0).asnumpy(), DENSE.sum(0))


def test_row_sparse_sum_stores_the_union_of_rows():
    a = nd.sparse.row_sparse_array((np.ones((1, 2)), [0]), shape=(4, 2))
    b = nd.sparse.row_sparse_array((np.ones((2, 2)), [0, 3]), shape=(4, 2))
    total = nd.sparse.elemwise_add(a, b)
    assert total.indices.asnumpy().tolist() == [0, 3]
    np.testing.assert_array_equal(total.asnumpy()[0], [2, 2])
    assert nd.sparse.add_n(a, b, a).indices.asnumpy().tolist() == [0, 3]


def test_dot_storage_types_and_values():
    csr = nd.array(DENSE).tostype("csr")
    rhs = nd.array(np.arange(6, dtype=np.float32).reshape(3, 2))
    out = nd.sparse.dot(csr, rhs)
    assert out.stype == "default"
    np.testing.assert_allclose(out.asnumpy(), DENSE @ rhs.asnumpy())
    out_t = nd.sparse.dot(csr, nd.ones((4, 2)), transpose_a=True)
    assert out_t.stype == "row_sparse" and out_t.indices.asnumpy().tolist() == [0, 1, 2]
    np.testing.assert_allclose(out_t.asnumpy(), DENSE.T @ np.ones((4, 2)))
    assert nd.sparse.dot(nd.ones((2, 4)), csr).stype == "csr"
    assert nd.sparse.dot(nd.ones((2, 4)), csr, forward_stype="default").stype == "default"


def test_retain_keeps_the_named_stored_rows():
    rsp = nd.array(DENSE).tostype("row_sparse")
    kept = nd.sparse.retain(rsp, nd.array([0, 2, 3]))
    assert kept.indices.asnumpy().tolist() == [0, 3]
    np.testing.assert_array_equal(kept.asnumpy(), DENSE * np.array([[1], [0], [0], [1]]))
    assert rsp.retain(nd.array([1])).indices.asnumpy().tolist() == [1]


def test_csr_row_slicing_and_assignment():
    csr = nd.array(DENSE).tostype("csr")
    rows = csr[1:3]
    assert rows.stype == "csr" and rows.indptr.asnumpy().tolist() == [0, 2, 2]
    assert csr[-1].shape == (1, 3) and csr[-1].asnumpy().tolist() == [[4, 0, 0]]
    with pytest.raises(ValueError):
        csr[::2]
    target = nd.sparse.zeros("csr", (4, 3))
    target[:] = csr
    assert target.indices.asnumpy().tolist() == [1, 0, 2, 0]
    with pytest.raises(ValueError):
        target[:] = 1


def test_row_sparse_assignment_of_a_number_stores_every_row():
    rsp = nd.sparse.zeros("row_sparse", (3, 2))
    rsp[:] = 1
    assert rsp.indices.asnumpy().tolist() == [0, 1, 2]
    with pytest.raises(Exception, match=r"\[:\]"):
        rsp[1]


def test_a_dense_write_recomputes_the_structure():
    rsp = nd.sparse.zeros("row_sparse", (3, 2))
    nd.array([[0, 0], [5, 5], [0, 0]]).copyto(rsp)
    assert rsp.indices.asnumpy().tolist() == [1]


@pytest.mark.parametrize("stype", ["default", "row_sparse", "csr"])
def test_attach_grad_gives_a_gradient_of_the_arrays_or_the_asked_stype(stype):
    x = nd.zeros((2, 2), stype=stype)
    x.attach_grad()
    assert x.grad.stype == stype
    for grad_stype in ("default", "row_sparse", "csr"):
        x.attach_grad(stype=grad_stype)
        assert x.grad.stype == grad_stype
    assert x.detach().stype == stype


def test_gradient_through_sparse_dot_is_row_sparse():
    lhs = nd.array(DENSE).tostype("csr")
    weight = nd.ones((3, 2))
    weight.attach_grad(stype="row_sparse")
    with autograd.record():
        y = nd.sparse.dot(lhs, weight)
    y.backward()
    assert weight.grad.stype == "row_sparse"
    np.testing.assert_allclose(weight.grad.asnumpy(), DENSE.T @ np.ones((4, 2)))
    assert weight.grad.indices.asnumpy().tolist() == [0, 1, 2]


def test_sparse_inputs_differentiate_like_dense_ones():
    x = nd.array(DENSE + 1).tostype("csr")
    x.attach_grad()
    with autograd.record():
        y = x * x
    y.backward()
    assert x.grad.stype == "csr"
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * (DENSE + 1))


def test_copy_to_another_context_keeps_storage():
    rsp = nd.array(DENSE).tostype("row_sparse")
    moved = rsp.copyto(mixrt.cpu(0))
    assert moved.stype == "row_sparse" and moved.indices.asnumpy().tolist() == [0, 1, 3]
    with pytest.raises(MXNetError):
        rsp.copyto(nd.sparse.zeros("csr", (4, 3)))


def test_kvstore_pull_skips_sparse_outs_and_row_sparse_pull_fills_the_rows_asked():
    kv = mixrt.kv.create("local")
    kv.init(3, nd.ones((4, 2)) * 5)
    rsp = nd.array(np.full((4, 2), 2, np.float32)).tostype("row_sparse")
    kv.pull(3, out=rsp)  # ignore_sparse=True: left as it was
    np.testing.assert_array_equal(rsp.asnumpy(), np.full((4, 2), 2))
    kv.row_sparse_pull(3, out=rsp, row_ids=nd.array([3, 1, 3]))
    assert rsp.indices.asnumpy().tolist() == [1, 3]
    np.testing.assert_array_equal(rsp.asnumpy(), [[0, 0], [5, 5], [0, 0], [5, 5]])
    with pytest.raises(MXNetError, match="row_sparse"):
        kv.row_sparse_pull(3, out=nd.zeros((4, 2)), row_ids=nd.array([1]))


def test_kvstore_push_of_row_sparse_values_sums_them():
    kv = mixrt.kv.create("local")
    kv.init("w", nd.zeros((3, 2), stype="row_sparse"))
    grads = [nd.sparse.row_sparse_array((np.ones((1, 2), np.float32), [i]), shape=(3, 2))
             for i in (0, 2)]
    kv.push("w", grads)
    out = nd.zeros((3, 2))
    kv.pull("w", out=out)
    np.testing.assert_array_equal(out.asnumpy(), [[1, 1], [0, 0], [1, 1]])
    with pytest.raises(MXNetError, match="mixed key types"):
        kv.init(5, nd.zeros((3, 2)))


# -- gluon Parameters: contexts and storage types -----------------------------------------

def test_parameter_keeps_one_copy_per_context():
    from mixrt import gluon
    param = gluon.Parameter("w", shape=(2, 3), init="ones")
    param.initialize(ctx=[mixrt.cpu(0), mixrt.cpu(1)])
    assert param.list_ctx() == [mixrt.cpu(0), mixrt.cpu(1)]
    assert len(param.list_data()) == 2 and len(param.list_grad()) == 2
    assert param.data(mixrt.cpu(1)).ctx == mixrt.cpu(1)
    param.set_data(nd.zeros((2, 3)))
    assert all((copy.asnumpy() == 0).all() for copy in param.list_data())
    param.reset_ctx(mixrt.cpu(2))
    assert param.list_ctx() == [mixrt.cpu(2)]


def test_parameter_storage_types_as_mxnet():
    from mixrt import gluon
    from mixrt.gluon.parameter import ParameterStorageError
    param = gluon.Parameter("w", shape=(4, 2), stype="row_sparse", grad_stype="row_sparse")
    param.initialize(ctx=[mixrt.cpu(0), mixrt.cpu(1)])
    assert param.grad(mixrt.cpu(0)).stype == "row_sparse"
    assert param._data[0].stype == "row_sparse"
    assert param.var().attr("__storage_type__") == "1"
    with pytest.raises(RuntimeError):
        param.data()
    with pytest.raises(ParameterStorageError, match="no Trainer"):
        param.row_sparse_data(nd.arange(0, 4))
    dense = gluon.Parameter("d", shape=(4, 2))
    dense.initialize()
    with pytest.raises(RuntimeError, match="use data"):
        dense.row_sparse_data(nd.arange(0, 4))
    with pytest.raises(AssertionError):
        gluon.Parameter("bad", shape=(2,), grad_stype="dense")


def test_only_one_trainer_per_sparse_parameter():
    from mixrt import gluon
    param = gluon.Parameter("w", shape=(4,), stype="row_sparse")
    first, second = object(), object()
    param._set_trainer(first)
    param._set_trainer(None)
    param._set_trainer(first)
    with pytest.raises(RuntimeError, match="More than one"):
        param._set_trainer(second)


def test_parameter_dict_saves_and_loads_with_prefixes(tmp_path):
    from mixrt import gluon
    params = gluon.ParameterDict("net_")
    params.get("w0", shape=(2, 2), init="ones")
    params.initialize(ctx=[mixrt.cpu(0), mixrt.cpu(1)])
    assert str(params).splitlines()[0] == "net_ ("
    path = str(tmp_path / "p.params")
    params.save(path, strip_prefix="net_")
    assert list(nd.load(path)) == ["w0"]
    loaded = gluon.ParameterDict("net_")
    loaded.get("w0", shape=(2, 0))
    loaded.load(path, ctx=mixrt.cpu(0), restore_prefix="net_")
    assert loaded["net_w0"].shape == (2, 2)
    np.testing.assert_array_equal(loaded["net_w0"].data().asnumpy(), np.ones((2, 2)))
    other = gluon.ParameterDict("other_")
    other.get("x", shape=(1,))
    with pytest.raises(InputError, match="missing"):
        other.load(path, ignore_extra=True)
    with pytest.raises(InputError, match="no parameter"):
        other.load(path, allow_missing=True)


# -- optimizers: MXNet's lazy updates for row_sparse gradients -----------------------------

def _row_sparse_grad():
    return nd.sparse.row_sparse_array((np.ones((1, 2), np.float32), [1]), shape=(3, 2))


def test_sgd_update_with_a_row_sparse_grad_touches_the_stored_rows_only():
    weight = nd.ones((3, 2))
    nd.sgd_update(weight, _row_sparse_grad(), lr=0.5, wd=0.1, out=weight)
    # row 1: w - lr * (g + wd * w) = 1 - 0.5 * 1.1; rows 0 and 2 keep their weight (no decay)
    np.testing.assert_allclose(weight.asnumpy(), [[1, 1], [0.45, 0.45], [1, 1]], rtol=1e-6)
    dense = nd.ones((3, 2))
    nd.sgd_update(dense, _row_sparse_grad(), lr=0.5, wd=0.1, lazy_update=False, out=dense)
    np.testing.assert_allclose(dense.asnumpy()[0], [0.95, 0.95], rtol=1e-6)


def test_adam_update_lazily_keeps_the_moments_of_absent_rows():
    weight, mean, var = nd.ones((3, 2)), nd.ones((3, 2)), nd.ones((3, 2))
    nd.adam_update(weight, _row_sparse_grad(), mean, var, lr=0.1, out=weight)
    np.testing.assert_array_equal(mean.asnumpy()[[0, 2]], np.ones((2, 2)))
    np.testing.assert_allclose(mean.asnumpy()[1], [1.0, 1.0])  # 0.9 * 1 + 0.1 * 1
    np.testing.assert_allclose(var.asnumpy()[1], [0.999 + 0.001] * 2, rtol=1e-6)
    assert (weight.asnumpy()[1] < 1).all() and (weight.asnumpy()[[0, 2]] == 1).all()


def test_optimizer_classes_pass_lazy_update():
    from mixrt import optimizer
    for lazy, untouched in ((True, True), (False, False)):
        opt = optimizer.Adam(learning_rate=0.1, wd=0.1, lazy_update=lazy)
        weight = nd.ones((3, 2)).tostype("row_sparse")
        state = opt.create_state(0, weight)
        opt.update(0, weight, _row_sparse_grad(), state)
        assert bool((weight.asnumpy()[0] == 1).all()) is untouched


def test_symbol_variables_record_their_storage_type():
    weight = mixrt.sym.Variable("weight", stype="row_sparse")
    assert weight.attr("__storage_type__") == str(_STORAGE_TYPE_STR_TO_ID["row_sparse"])
    assert mixrt.sym.Variable("data").attr("__storage_type__") is None
    with pytest.raises(MXNetError, match="stype"):
        mixrt.sym.Variable("x", stype="sparse")
    assert mixrt.sym.sparse.dot is mixrt.sym.dot
    assert mixrt.sym.sparse.cast_storage(weight, "csr") is weight


def test_trainer_keeps_row_sparse_weights_in_its_store_and_serves_rows():
    from mixrt import gluon
    x = gluon.Parameter("x", shape=(4, 1), stype="row_sparse", grad_stype="row_sparse")
    x.initialize(ctx=[mixrt.cpu(0), mixrt.cpu(1)], init="zeros")
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 0.1}, kvstore="local")
    assert x._trainer is trainer
    rows = nd.array([0, 2], ctx=mixrt.cpu(0))
    with autograd.record():
        for w in x.list_row_sparse_data(rows):
            (w + 1).backward()
    trainer.step(1)
    assert trainer._update_on_kvstore is True
    # both contexts' gradients (ones) summed in the store: -0.2 on every row
    updated = x.row_sparse_data(nd.arange(0, 4, ctx=mixrt.cpu(1)))
    assert updated.ctx == mixrt.cpu(1) and updated.stype == "row_sparse"
    np.testing.assert_allclose(updated.asnumpy().ravel(), [-0.2] * 4, rtol=1e-6)
    assert x.row_sparse_data(rows).indices.asnumpy().tolist() == [0, 2]


def test_trainer_refuses_local_updates_of_row_sparse_weights():
    from mixrt import gluon
    x = gluon.Parameter("x", shape=(4, 1), stype="row_sparse")
    x.initialize(init="zeros")
    trainer = gluon.Trainer([x], "sgd", kvstore="local", update_on_kvstore=False)
    with pytest.raises(ValueError, match="sparse weights"):
        x.row_sparse_data(nd.arange(0, 4))
    assert trainer._kvstore is not None


def test_parameter_dict_load_checks_or_casts_dtypes(tmp_path):
    from mixrt import gluon
    saved = gluon.ParameterDict("")
    saved.get("w", shape=(2,), dtype="int8", init="ones")
    saved.initialize(ctx=[mixrt.cpu(0), mixrt.cpu(3)])
    assert saved.list_ctx() == [mixrt.cpu(0), mixrt.cpu(3)]
    path = str(tmp_path / "w.params")
    saved.save(path)
    loading = gluon.ParameterDict("")
    loading.get("w", shape=(2,), dtype="float64")
    with pytest.raises(InputError, match="cast_dtype"):
        loading.load(path)
    loading.load(path, cast_dtype=True, dtype_source="current")
    assert loading["w"].data().dtype == np.float64
    loading.load(path, cast_dtype=True, dtype_source="saved")
    assert loading["w"].data().dtype == np.int8


def test_new_values_after_the_store_took_them_make_the_trainer_start_a_new_store():
    from mixrt import gluon
    x = gluon.Parameter("x", shape=(3,), init="zeros")
    x.initialize(ctx=[mixrt.cpu(0), mixrt.cpu(1)])
    trainer = gluon.Trainer([x], "sgd", {"learning_rate": 0.1}, kvstore="local")
    for _ in range(2):  # the second step starts from the value set, not the store's copy
        with autograd.record():
            for w in x.list_data():
                (w + 1).backward()
        trainer.step(1)
        x.set_data(nd.zeros((3,)))
        assert trainer._kvstore is None and not trainer._kv_initialized
    with autograd.record():
        for w in x.list_data():
            (w + 1).backward()
    trainer.step(1)
    assert trainer._kvstore.type == "local"
    np.testing.assert_allclose(x.data(mixrt.cpu(1)).asnumpy(), [-0.2] * 3, rtol=1e-6)


def test_deep_copies_keep_storage_and_stored_rows():
    import copy
    rsp = nd.sparse.row_sparse_array((np.zeros((1, 2), np.float32), [2]), shape=(3, 2))
    copied = copy.deepcopy(rsp)
    assert type(copied) is RowSparseNDArray and copied.indices.asnumpy().tolist() == [2]
    csr = copy.deepcopy(nd.array(DENSE).tostype("csr"))
    assert csr.indptr.asnumpy().tolist() == [0, 1, 3, 3, 4]


def test_a_stores_updater_shows_the_mxnet_updaters_optimizer():
    from mixrt import optimizer
    kv = mixrt.kv.create("local")
    opt = optimizer.SGD(learning_rate=0.5)
    kv.set_optimizer(opt)
    assert kv._updater.optimizer is opt and kv._updater.states == {}
    kv.init(0, nd.ones((2,)))
    kv.push(0, nd.ones((2,)))
    out = nd.zeros((2,))
    kv.pull(0, out=out)
    np.testing.assert_allclose(out.asnumpy(), [0.5, 0.5])


def test_storage_casts_are_differentiable():
    x = nd.array(DENSE).tostype("csr")
    x.attach_grad()
    with autograd.record():
        y = (x.tostype("default") * 3).tostype("row_sparse").copy()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(DENSE.shape, 3))
    assert y.stype == "row_sparse" and x.grad.stype == "csr"
