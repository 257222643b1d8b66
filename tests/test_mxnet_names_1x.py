"""MXNet 1.9.1 names code written for MXNet 1.x reaches for: the older contrib autograd API,
``import *`` of mx.autograd, the current AttrScope and NameManager as class properties,
Context's device-type tables, NDArray fluent methods' ``name=``/``out=``, the multi-tensor
AdamW updates, HybridBlock.register_op_hook, the fused ``sym.RNN`` and symbol attributes.
Each expectation is MXNet 1.9.1's behaviour."""

import numpy as np
import pytest

import mixrt as mx
from mixrt import autograd, nd
from mixrt.attribute import AttrScope
from mixrt.context import Context
from mixrt.contrib import autograd as contrib_autograd
from mixrt.name import NameManager, Prefix


# -- mx.contrib.autograd ---------------------------------------------------------------------

def test_contrib_autograd_is_an_attribute_of_contrib():
    assert mx.contrib.autograd is contrib_autograd
    assert mx.contrib.nd.adamw_update is nd.contrib.adamw_update


def test_grad_and_loss_gives_gradients_and_the_loss():
    x = nd.array([[1.0, 2.0], [3.0, 4.0]])
    grads, loss = contrib_autograd.grad_and_loss(lambda a: (a * a).sum())(x)
    np.testing.assert_allclose(grads[0].asnumpy(), 2 * x.asnumpy())
    assert float(loss.asscalar()) == 30.0


def test_grad_and_loss_argnum_picks_the_differentiated_arguments():
    a, b = nd.array([1.0, 2.0]), nd.array([3.0, 5.0])
    grads = contrib_autograd.grad(lambda x, y: (x * y).sum(), argnum=[1])(a, b)
    assert len(grads) == 1
    np.testing.assert_allclose(grads[0].asnumpy(), a.asnumpy())


def test_mark_variables_and_backward_write_the_given_gradient_arrays():
    x = nd.array([1.0, -2.0, 3.0])
    dx = nd.zeros_like(x)
    contrib_autograd.mark_variables([x], [dx])
    with contrib_autograd.train_section():
        assert autograd.is_recording() and autograd.is_training()
        y = x * x * 3
    contrib_autograd.backward([y])
    np.testing.assert_allclose(dx.asnumpy(), 6 * x.asnumpy())
    contrib_autograd.mark_variables([x], [dx], grad_reqs="add")
    with contrib_autograd.train_section():
        y = x * 2
    contrib_autograd.compute_gradient([y])
    np.testing.assert_allclose(dx.asnumpy(), 6 * x.asnumpy() + 2)  # "add" adds to dx
    with contrib_autograd.train_section():
        y = x * 2
    contrib_autograd.backward([y], [nd.ones_like(y) * 3])
    np.testing.assert_allclose(dx.asnumpy(), 6 * x.asnumpy() + 8)


def test_set_is_training_switches_both_and_returns_the_previous_recording():
    assert not autograd.is_recording()
    previous_training = autograd.set_training(True)  # training on, recording off
    try:
        assert contrib_autograd.set_is_training(True) is False  # recording was off
        assert autograd.is_recording() and autograd.is_training()
        assert contrib_autograd.set_is_training(False) is True
        assert not autograd.is_recording() and not autograd.is_training()
    finally:
        autograd.set_training(previous_training)


def test_test_section_inside_train_section():
    with contrib_autograd.train_section():
        with contrib_autograd.test_section():
            assert not autograd.is_recording() and not autograd.is_training()
        assert autograd.is_recording() and autograd.is_training()
    assert not autograd.is_recording()


# -- import * ---------------------------------------------------------------------------------

def test_star_import_of_autograd_gives_mxnet_module_names():
    names = {}
    exec("from mixrt.autograd import *", names)
    for name in ("NDArray", "Symbol", "Function", "record", "pause", "train_mode",
                 "predict_mode", "is_recording", "is_training", "set_recording",
                 "set_training", "mark_variables", "backward", "grad", "get_symbol",
                 "Lock", "traceback", "ctypes"):
        assert name in names, name
    assert names["NDArray"] is nd.NDArray
    assert names["Symbol"] is mx.sym.Symbol


def test_star_import_of_contrib_autograd():
    names = {}
    exec("from mixrt.contrib.autograd import *", names)
    for name in ("NDArray", "zeros_like", "set_is_training", "TrainingStateScope",
                 "train_section", "test_section", "mark_variables", "backward",
                 "compute_gradient", "grad_and_loss", "grad"):
        assert name in names, name


def test_star_import_of_ndarray_gives_its_operators_and_subpackages():
    names = {}
    exec("from mixrt.nd import *", names)
    for name in ("NDArray", "array", "zeros", "concat", "relu", "exp", "reshape", "maximum",
                 "random_normal", "sample_uniform", "shuffle", "Custom", "cast_storage",
                 "contrib", "linalg", "random", "sparse", "waitall", "save", "load"):
        assert name in names, name


# -- AttrScope, NameManager -----------------------------------------------------------------

def test_attr_scope_current_is_a_class_property_and_scopes_merge():
    assert isinstance(AttrScope.current, AttrScope)
    with AttrScope(group="4", data="great") as outer:
        assert AttrScope.current is outer
        with AttrScope(group="5") as inner:
            assert AttrScope.current is inner
            assert inner.get(None) == {"group": "5", "data": "great"}
            assert inner.get({"own": "x"}) == {"group": "5", "data": "great", "own": "x"}
            variable = mx.sym.Variable("v", attr={"data": "mine"})
        assert AttrScope.current is outer
    assert variable.list_attr() == {"group": "5", "data": "mine"}


def test_attr_scope_current_can_be_assigned():
    previous = AttrScope.current
    scope = AttrScope(ctx_group="dev1")
    AttrScope.current = scope
    try:
        assert AttrScope.current is scope
        assert mx.sym.Variable("w").attr("ctx_group") == "dev1"
    finally:
        AttrScope.current = previous
    assert isinstance(AttrScope.__dict__["current"], object)
    assert AttrScope.current is previous


def test_name_manager_counts_per_hint_and_is_current_inside_with():
    manager = NameManager()
    assert [manager.get(None, "fc"), manager.get(None, "fc"), manager.get(None, "conv"),
            manager.get("mine", "fc"), manager.get(None, "fc")] == \
        ["fc0", "fc1", "conv0", "mine", "fc2"]
    with NameManager() as fresh:
        assert NameManager.current is fresh
        data = mx.sym.Variable("data")
        assert mx.sym.FullyConnected(data, num_hidden=2).name == "fullyconnected0"
        assert mx.sym.FullyConnected(data, num_hidden=2).name == "fullyconnected1"
    assert NameManager.current is not fresh


def test_prefix_prefixes_given_and_automatic_names():
    with Prefix("net_") as prefix:
        assert NameManager.current is prefix
        data = mx.sym.Variable("data")
        assert mx.sym.FullyConnected(data, num_hidden=2, name="fc").name == "net_fc"
        assert prefix.get(None, "act") == "net_act0"


def test_name_manager_current_assignment():
    previous = NameManager.current
    manager = NameManager()
    NameManager.current = manager
    try:
        assert NameManager.current is manager and manager.current is manager
    finally:
        NameManager.current = previous


# -- Context ---------------------------------------------------------------------------------

def test_context_device_type_tables():
    assert Context.devtype2str == {1: "cpu", 2: "gpu", 3: "cpu_pinned", 5: "cpu_shared"}
    assert Context.devstr2type == {"cpu": 1, "gpu": 2, "cpu_pinned": 3, "cpu_shared": 5}
    assert mx.cpu().devtype2str[mx.cpu().device_typeid] == "cpu"
    assert Context.devstr2type[mx.context.cpu_pinned().device_type] == 3


# -- NDArray fluent methods: name= and out= --------------------------------------------------

# the arguments each method needs beside the array (the others need none)
FLUENT_ARGUMENTS = {
    "reshape_like": ([nd.zeros((3, 2))], {}), "broadcast_axes": ([], {"axis": 0, "size": 2}),
    "repeat": ([], {"repeats": 2}), "pad": None, "swapaxes": ([], {"dim1": 0, "dim2": 1}),
    "split": ([], {"num_outputs": 3, "axis": 1}), "slice": ([(0, 0), (1, 2)], {}),
    "slice_axis": ([], {"axis": 1, "begin": 0, "end": 2}),
    "slice_like": ([nd.zeros((1, 2))], {}), "take": ([nd.array([0, 1])], {}),
    "one_hot": None, "pick": ([nd.array([0, 2])], {}), "topk": ([], {"k": 2}),
    "clip": ([0.0, 2.0], {}), "tile": ([], {"reps": (2, 1)}), "flip": ([], {"axis": 1}),
    "depth_to_space": None, "space_to_depth": None, "softmin": ([], {}),
    "sum": ([], {"axis": 1}), "norm": ([], {}),
}
FLUENT_POSITIVE = {"log", "log10", "log2", "log1p", "sqrt", "rsqrt", "rcbrt", "arccosh"}
FLUENT_UNIT = {"arcsin", "arccos", "arctanh"}


def _fluent_cases():
    from mixrt.nd.fluent import FORWARDING
    return [m for m in FORWARDING if FLUENT_ARGUMENTS.get(m, ()) is not None]


def _fluent_data(method):
    values = np.array([[0.5, -0.25, 0.75], [0.125, 0.5, -0.5]], np.float32)
    if method in FLUENT_POSITIVE:
        values = np.abs(values) + 1.5
    elif method in FLUENT_UNIT:
        values = values * 0.5
    elif method == "broadcast_axes":
        values = values[:1]  # an axis of length 1 to broadcast
    return nd.array(values)


@pytest.mark.parametrize("method", _fluent_cases())
def test_fluent_method_takes_name_and_out(method):
    x = _fluent_data(method)
    args, kwargs = FLUENT_ARGUMENTS.get(method, ([], {}))
    expected = getattr(x, method)(*args, **kwargs)
    named = getattr(x, method)(*args, name=f"{method}0", **kwargs)
    results = expected if isinstance(expected, list) else [expected]
    named = named if isinstance(named, list) else [named]
    outs = [nd.zeros(r.shape, dtype=r.dtype) for r in results]
    written = getattr(x, method)(*args, out=outs if len(outs) > 1 else outs[0],
                                 name="ignored", **kwargs)
    if len(outs) == 1:
        assert written is outs[0]
    for want, got, out in zip(results, named, outs):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(out.asnumpy(), want.asnumpy(), rtol=1e-6)


def test_fluent_methods_of_their_own_take_name():
    x = nd.ones((2, 1, 3))
    assert x.flatten(name="f").shape == (2, 3)
    assert x.expand_dims(axis=0, name="e").shape == (1, 2, 1, 3)
    assert x.squeeze(name="s").shape == (2, 3)
    assert x.flatten(inplace=True, name="f").shape == (2, 3)


def test_flatten_with_name_in_a_hybridized_block_that_exports(tmp_path):
    class Net(mx.gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.conv = mx.gluon.nn.Conv2D(2, 3)
                self.dense = mx.gluon.nn.Dense(3)

        def hybrid_forward(self, F, x):
            return self.dense(self.conv(x).flatten(name="f").relu(name="r"))

    net = Net()
    net.initialize()
    x = nd.ones((1, 1, 5, 5))
    imperative = net(x).asnumpy()
    net.hybridize()
    np.testing.assert_allclose(net(x).asnumpy(), imperative, rtol=1e-5, atol=1e-6)
    paths = net.export(str(tmp_path / "cnn"))
    assert (tmp_path / "cnn-symbol.json").exists() and paths["params"]


# -- multi-tensor AdamW and LAMB (nd.contrib, nd._internal) -----------------------------------

def _adamw_reference(w, g, m, v, lr, wd, eta, rescale=1.0, beta1=0.9, beta2=0.999, eps=1e-8,
                     clip=-1.0):
    g = g * rescale
    if clip >= 0:
        g = np.clip(g, -clip, clip)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    return w - eta * (lr * m / (np.sqrt(v) + eps) + wd * w), m, v


def _adamw_state(seed):
    rng = np.random.default_rng(seed)
    shapes = [(3,), (2, 4)]
    return [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4)]


def test_multi_adamw_update_updates_each_weight_with_its_own_rates():
    weights, grads, means, variances = _adamw_state(0)
    variances = [np.abs(v) for v in variances]
    lrs, wds, etas = [0.1, 0.05], [0.01, 0.0], [1.0, 0.5]
    w_nd, m_nd, v_nd = ([nd.array(a) for a in arrays] for arrays in
                        (weights, means, variances))
    result = nd.contrib.multi_adamw_update(w_nd, [nd.array(g) for g in grads], m_nd, v_nd,
                                           rescale_grad=0.5, lrs=lrs, wds=wds, etas=etas,
                                           out=w_nd, clip_gradient=0.3, beta1=0.8)
    assert result is w_nd
    for i in range(2):
        want_w, want_m, want_v = _adamw_reference(weights[i], grads[i], means[i],
                                                  variances[i], lrs[i], wds[i], etas[i],
                                                  rescale=0.5, clip=0.3, beta1=0.8)
        np.testing.assert_allclose(w_nd[i].asnumpy(), want_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m_nd[i].asnumpy(), want_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v_nd[i].asnumpy(), want_v, rtol=1e-5, atol=1e-6)


def test_multi_adamw_operator_takes_flat_arrays_with_rescale_grad_last():
    weights, grads, means, variances = _adamw_state(1)
    variances = [np.abs(v) for v in variances]
    data = [nd.array(a) for group in zip(weights, grads, means, variances) for a in group]
    new = nd._internal._multi_adamw_update(*data, nd.array([1.0]), lrs=(0.1, 0.2),
                                           wds=(0.0, 0.1), etas=(1.0, 1.0), num_weights=2)
    assert isinstance(new, list) and len(new) == 2
    want, _, _ = _adamw_reference(weights[1], grads[1], means[1], variances[1], 0.2, 0.1, 1.0)
    np.testing.assert_allclose(new[1].asnumpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(data[4].asnumpy(), weights[1])  # the weight stays


def test_multi_adamw_update_skips_the_step_for_a_rescale_of_zero_or_nan():
    weights, grads, means, variances = _adamw_state(2)
    w_nd, m_nd = [nd.array(w) for w in weights], [nd.array(m) for m in means]
    for rescale in (0.0, float("nan")):
        nd.contrib.multi_adamw_update(w_nd, [nd.array(g) for g in grads], m_nd,
                                      [nd.array(np.abs(v)) for v in variances], rescale,
                                      lrs=[0.1, 0.1], wds=[0, 0], etas=[1, 1], out=w_nd)
        for i in range(2):
            np.testing.assert_array_equal(w_nd[i].asnumpy(), weights[i])
            np.testing.assert_array_equal(m_nd[i].asnumpy(), means[i])


def test_multi_mp_adamw_update_steps_the_master_copies():
    weights, grads, means, variances = _adamw_state(3)
    variances = [np.abs(v) for v in variances]
    w16 = [nd.array(w, dtype="float16") for w in weights]
    w32 = [nd.array(w) for w in weights]
    nd.contrib.multi_mp_adamw_update(w16, [nd.array(g, dtype="float16") for g in grads],
                                     [nd.array(m) for m in means],
                                     [nd.array(v) for v in variances], w32, 1.0,
                                     lrs=[0.1, 0.1], wds=[0.0, 0.0], etas=[1.0, 1.0],
                                     out=w16)
    for i in range(2):
        g16 = grads[i].astype(np.float16).astype(np.float32)
        want, _, _ = _adamw_reference(weights[i], g16, means[i], variances[i], 0.1, 0.0, 1.0)
        np.testing.assert_allclose(w32[i].asnumpy(), want, rtol=1e-5, atol=1e-6)
        assert w16[i].dtype == np.float16
        np.testing.assert_allclose(w16[i].asnumpy(), want.astype(np.float16), rtol=1e-3)


def test_multi_adamw_update_checks_its_lists():
    w = [nd.ones((2,))]
    with pytest.raises(mx.errors.InputError, match="lrs"):
        nd.contrib.multi_adamw_update(w, [nd.ones((2,))], [nd.zeros((2,))],
                                      [nd.zeros((2,))], 1.0, lrs=[0.1, 0.2], wds=[0],
                                      etas=[1])
    with pytest.raises(mx.errors.ShapeError, match="grad"):
        nd.contrib.multi_adamw_update(w, [nd.ones((3,))], [nd.zeros((2,))],
                                      [nd.zeros((2,))], 1.0, lrs=[0.1], wds=[0], etas=[1])


def _lamb_reference(w, g, m, v, t, lr, wd, beta1=0.9, beta2=0.999, eps=1e-6):
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    direction = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps) + wd * w
    r1, r2 = np.linalg.norm(w), np.linalg.norm(direction)
    ratio = 1.0 if r1 == 0 or r2 == 0 else r1 / r2
    return w - lr * ratio * direction, m, v


def test_multi_lamb_update_matches_lamb_per_weight():
    weights, grads, means, variances = _adamw_state(4)
    variances = [np.abs(v) for v in variances]
    m_nd, v_nd = [nd.array(m) for m in means], [nd.array(v) for v in variances]
    new = nd.contrib.multi_lamb_update([nd.array(w) for w in weights],
                                       [nd.array(g) for g in grads], m_nd, v_nd,
                                       step_count=[1, 3], lrs=[0.1, 0.01], wds=[0.0, 0.1])
    for i, (t, lr, wd) in enumerate([(1, 0.1, 0.0), (3, 0.01, 0.1)]):
        want_w, want_m, want_v = _lamb_reference(weights[i], grads[i], means[i],
                                                 variances[i], t, lr, wd)
        np.testing.assert_allclose(new[i].asnumpy(), want_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(m_nd[i].asnumpy(), want_m, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v_nd[i].asnumpy(), want_v, rtol=1e-5, atol=1e-6)
    assert nd.contrib.multi_mp_lamb_update is not None
    assert nd._internal._multi_lamb_update is not None


# -- HybridBlock.register_op_hook ---------------------------------------------------------------

def _hooked(block, x, monitor_all=False):
    seen = []

    def callback(node_name, op_name, array):
        seen.append((mx.base.py_str(node_name), mx.base.py_str(op_name), array))
    block.register_op_hook(callback, monitor_all)
    block(x)
    return seen


def test_op_hook_reports_each_operator_output_of_a_hybridized_block():
    model = mx.gluon.nn.HybridSequential(prefix="dense_")
    with model.name_scope():
        model.add(mx.gluon.nn.Dense(2))
        model.add(mx.gluon.nn.Activation("relu"))
    model.initialize()
    model.hybridize()
    x = nd.ones((2, 3, 4))
    seen = _hooked(model, x)
    assert [(name, op) for name, op, _ in seen] == [
        ("dense_dense0_fwd_output", "FullyConnected"), ("dense_relu0_fwd_output", "Activation")]
    np.testing.assert_allclose(seen[-1][2].asnumpy(), model(x).asnumpy(), rtol=1e-6)
    assert isinstance(seen[0][2], nd.NDArray)


def test_op_hook_with_monitor_all_reports_inputs_first():
    model = mx.gluon.nn.HybridSequential("pool_")
    with model.name_scope():
        model.add(mx.gluon.nn.AvgPool1D())
    model.initialize()
    model.hybridize()
    seen = _hooked(model, nd.ones((2, 3, 4)), monitor_all=True)
    assert [(name, op) for name, op, _ in seen] == [("pool_pool0_fwd_data", "Pooling"),
                                                    ("pool_pool0_fwd_output", "Pooling")]
    assert seen[1][2].shape == (2, 3, 2)


def test_op_hook_names_a_layers_parameters_and_is_silent_imperatively():
    model = mx.gluon.nn.HybridSequential(prefix="net_")
    with model.name_scope():
        model.add(mx.gluon.nn.Dense(3, in_units=4))
    model.initialize()
    assert _hooked(model, nd.ones((2, 4)), monitor_all=True) == []  # not hybridized
    model.hybridize()
    names = [name for name, _, _ in _hooked(model, nd.ones((2, 4)), monitor_all=True)]
    assert names == ["net_dense0_fwd_data", "net_dense0_fwd_weight", "net_dense0_fwd_bias",
                     "net_dense0_fwd_output"]


# -- the fused sym.RNN -----------------------------------------------------------------------

def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_sym_rnn_lstm_takes_mxnet_arguments_and_computes_mxnets_lstm():
    T, N, C, H = 4, 2, 3, 5
    rng = np.random.default_rng(7)
    x = rng.standard_normal((T, N, C)).astype(np.float32)
    w = (rng.standard_normal((4 * H, C)) * 0.4).astype(np.float32)  # gates i, f, c, o
    r = (rng.standard_normal((4 * H, H)) * 0.4).astype(np.float32)
    bw, br = rng.standard_normal(4 * H).astype(np.float32), rng.standard_normal(4 * H).astype(
        np.float32)
    h0, c0 = (rng.standard_normal((1, N, H)).astype(np.float32) for _ in range(2))
    data = mx.sym.Variable("data")
    net = mx.sym.RNN(data=data, state_size=H, num_layers=1, mode="lstm", state_outputs=True,
                     name="lstm")
    assert net.list_arguments() == ["data", "lstm_parameters", "lstm_state", "lstm_state_cell"]
    assert net.list_outputs() == ["lstm_output", "lstm_state_output", "lstm_statecell_output"]
    params = np.concatenate([w.ravel(), r.ravel(), bw, br])
    exe = net.bind(mx.cpu(), {"data": nd.array(x), "lstm_parameters": nd.array(params),
                              "lstm_state": nd.array(h0), "lstm_state_cell": nd.array(c0)})
    out, h_n, c_n = (o.asnumpy() for o in exe.forward())
    h, c, ys = h0[0], c0[0], []
    for t in range(T):
        gates = x[t] @ w.T + bw + h @ r.T + br
        i, f, g, o = (gates[:, k * H:(k + 1) * H] for k in range(4))
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        ys.append(h)
    np.testing.assert_allclose(out, np.stack(ys), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h_n[0], h, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(c_n[0], c, rtol=1e-5, atol=1e-5)


def test_sym_rnn_makes_mxnets_variables_and_infers_the_states():
    data = mx.sym.Variable("data")
    with NameManager():
        net = mx.sym.RNN(data, state_size=4, num_layers=2, mode="gru", bidirectional=True)
    assert net.name == "rnn0"
    assert net.list_arguments() == ["data", "rnn0_parameters", "rnn0_state"]
    shapes, outputs, _ = net.infer_shape(data=(3, 2, 5))
    # per layer and direction the input and recurrent weights (3 gates of 4), then biases
    weights = 2 * (12 * 5 + 12 * 4) + 2 * (12 * 8 + 12 * 4)
    assert shapes[1:] == [(weights + 4 * 2 * 12,), (4, 2, 4)] and outputs == [(3, 2, 8)]


def test_sym_rnn_given_bare_variables_learn_their_shapes_for_simple_bind():
    x, params, h, c = (mx.sym.Variable(n) for n in ("x", "params", "h", "c"))
    net = mx.sym.RNN(data=x, parameters=params, state=h, state_cell=c, state_size=6,
                     num_layers=1, mode="lstm")
    exe = net.simple_bind(mx.cpu(), x=(7, 3, 5))
    assert exe.arg_dict["params"].shape == (4 * 6 * 5 + 4 * 6 * 6 + 2 * 4 * 6,)
    assert exe.arg_dict["c"].shape == (1, 3, 6)
    assert exe.forward()[0].shape == (7, 3, 6)


def test_sym_rnn_refuses_unknown_arguments_and_keeps_onnx_rnn():
    with pytest.raises(mx.errors.GraphError, match="hidden"):
        mx.sym.RNN(mx.sym.Variable("data"), state_size=2, mode="lstm", hidden=3)
    x, w, r = (mx.sym.Variable(n) for n in ("X", "W", "R"))
    onnx_rnn = mx.sym.RNN(x, w, r, hidden_size=3)  # ONNX's operator, by its own arguments
    assert len(onnx_rnn.list_outputs()) >= 1


# -- symbol attributes ---------------------------------------------------------------------------

def test_variable_lr_mult_is_stored_as_mxnet_does():
    weight = mx.sym.Variable("w", lr_mult=2.0, wd_mult=0.5, attr={"mood": "angry"})
    assert weight.attr("__lr_mult__") == "2.0"
    assert weight.attr("lr_mult") == "2.0"  # MXNet looks a hidden key up as __key__ too
    assert weight.list_attr() == {"__lr_mult__": "2.0", "lr_mult": "2.0",
                                  "__wd_mult__": "0.5", "wd_mult": "0.5", "mood": "angry"}
    assert weight.attr("missing") is None
    assert weight.attr("name") == "w"


def test_set_attr_stores_hidden_keys_under_underscores_and_renames():
    data = mx.sym.Variable("data")
    data._set_attr(lr_mult="3", ctx_group="dev1", mood="calm")
    assert data.list_attr() == {"__lr_mult__": "3", "lr_mult": "3", "__ctx_group__": "dev1",
                                "ctx_group": "dev1", "mood": "calm"}
    data._set_attr(name="renamed")
    assert data.name == "renamed"
    with pytest.raises(ValueError):
        data._set_attr(mood=1)
    with pytest.raises(mx.errors.GraphError, match="fc_lr_mult"):
        data._set_attr(fc_lr_mult="2")


def test_layer_attributes_are_its_mxnet_parameters_copied_to_its_variables():
    data = mx.sym.Variable("data")
    fc = mx.sym.FullyConnected(data, num_hidden=10, name="fc", lr_mult=2)
    assert fc.list_attr() == {"num_hidden": "10", "__lr_mult__": "2", "lr_mult": "2"}
    assert fc.attr("num_hidden") == "10"
    attrs = fc.attr_dict()
    assert set(attrs) == {"fc_weight", "fc_bias", "fc"}  # data has none; the layer is one node
    assert attrs["fc_weight"]["num_hidden"] == "10"
    assert attrs["fc_weight"]["__lr_mult__"] == "2"
    conv = mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv")
    assert conv.attr("kernel") == "(3, 3)" and conv.attr("num_filter") == "4"


def test_attr_dict_maps_each_node_to_its_attributes_and_groups_answer_none():
    a = mx.sym.Variable("a", attr={"a1": "a2"})
    b = mx.sym.Variable("b", attr={"b1": "b2"})
    c = a + b
    assert c.attr_dict() == {"a": {"a1": "a2"}, "b": {"b1": "b2"}}
    group = mx.sym.Group([a, b])
    assert group.attr("a1") is None  # outputs of two nodes: no single node to ask
    assert group.list_attr() == {"a1": "a2"}  # the first output's node, as MXNet's
    with AttrScope(group="4"):
        d = mx.sym.Variable("d")
    assert d.attr_dict() == {"d": {"group": "4"}}


def test_nd_rnn_computes_the_symbols_values_and_records_for_autograd():
    T, N, C, H = 3, 2, 4, 3
    rng = np.random.default_rng(11)
    x = nd.array(rng.standard_normal((T, N, C)))
    params = nd.array(rng.standard_normal(3 * H * C + 3 * H * H + 6 * H) * 0.3)
    h0 = nd.array(rng.standard_normal((1, N, H)))
    net = mx.sym.RNN(mx.sym.Variable("data"), state_size=H, num_layers=1, mode="gru",
                     name="gru")
    want = net.bind(mx.cpu(), {"data": x, "gru_parameters": params,
                               "gru_state": h0}).forward()[0].asnumpy()
    got = nd.RNN(x, params, h0, state_size=H, num_layers=1, mode="gru")
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6)
    out, h_n = nd.RNN(data=x, parameters=params, state=h0, state_size=H, num_layers=1,
                      mode="gru", state_outputs=True)
    np.testing.assert_allclose(h_n.asnumpy()[0], want[-1], rtol=1e-5, atol=1e-6)
    params.attach_grad()
    with autograd.record():
        loss = nd.RNN(x, params, h0, state_size=H, num_layers=1, mode="gru").sum()
    loss.backward()
    assert float(params.grad.abs().sum().asscalar()) > 0
    with pytest.raises(mx.errors.InputError, match="state"):
        nd.RNN(x, params, state_size=H, num_layers=1, mode="gru")


def test_symbol_astype_takes_name_as_mxnets_fluent_method_does():
    cast = mx.sym.Variable("x").astype("float16", name="half")
    assert cast.name == "half" and cast.list_outputs() == ["half_output"]


def test_attr_scope_refuses_values_that_are_not_strings_with_a_value_error():
    with pytest.raises(ValueError, match="must be a string"):
        AttrScope(group=4)


def test_op_hook_warns_with_static_alloc_as_mxnet_does():
    model = mx.gluon.nn.Dense(2, in_units=3)
    model.initialize()
    model.hybridize(static_alloc=True)
    with pytest.warns(UserWarning, match="experimental"):
        assert len(_hooked(model, nd.ones((1, 3)))) == 1


def test_mxnet_functions_on_symbols_keep_their_parameters_as_attributes():
    x = mx.sym.Variable("x", shape=(2, 3))
    sliced = mx.sym.slice_axis(x, axis=1, begin=0, end=2, name="s")
    assert sliced.list_attr() == {"axis": "1", "begin": "0", "end": "2"}
    assert x.topk(k=2, axis=1).attr("k") == "2"


def test_gluon_activation_traces_as_mxnets_activation_node():
    block = mx.gluon.nn.Activation("tanh")
    traced = block(mx.sym.Variable("data"))
    assert traced.list_attr() == {"act_type": "tanh"}


def test_variable_declarations_are_attributes_as_mxnet_writes_them():
    weight = mx.sym.Variable("w", shape=(2, 3), dtype="float16", init=mx.init.Zero(),
                             lr_mult=2)
    assert weight.list_attr() == {"__shape__": "(2, 3)", "__dtype__": "2",
                                  "__init__": '["zero", {}]', "__lr_mult__": "2",
                                  "lr_mult": "2"}


def test_hidden_keys_given_as_attributes_are_listed_under_both_names():
    with AttrScope(group="4", data="great"):
        data = mx.sym.Variable("data", attr={"dtype": "data", "group": "1",
                                             "force_mirroring": "True"}, lr_mult=1)
    assert data.attr("group") == "1"
    assert data.attr("lr_mult") == "1" and data.attr("__lr_mult__") == "1"
    assert data.attr("force_mirroring") == "True"
    assert data.attr("__force_mirroring__") == "True"


def test_base_as_list_is_mxnets():
    """``mxnet.base._as_list``, which MXNet's own test_operator.py imports."""
    pair, single = (1, 2), [3]
    assert mx.base._as_list(pair) is pair and mx.base._as_list(single) is single
    assert mx.base._as_list(4) == [4] and mx.base._as_list(None) == [None]
