"""mx.mod (mixrt.module) against MXNet 1.9.1: Module's bind/init_params/init_optimizer/
forward/backward/update, fit, score, predict, iter_predict, checkpoints, fixed parameters
and BatchNorm's running statistics; BucketingModule sharing parameters across buckets;
parameters MXNet wrote (tests/data/mxnet_checkpoint: MXNet 1.9.1's save_checkpoint of a
Xavier-initialized fc-bn-softmax net).

The expected values were printed by MXNet 1.9.1 running the same calls (2026-11-24).
"""

import warnings

import numpy as np
import pytest

import mixrt
from mixrt import io, model, nd, sym
from mixrt.errors import GradientError, InputError
from mixrt.module import BucketingModule, Module

DATA = "tests/data/mxnet_checkpoint/mxck"
EXPECTED = {"names": [["data"], ["softmax_label"], ["softmax_output"], [["softmax_output", [8, 3]]]], "forward": [[0.28454500436782837, 0.43759098649024963, 0.277864009141922], [0.3466309905052185, 0.30560600757598877, 0.3477630019187927]], "after_one": [[0.18129600584506989, 0.3018369972705841, -0.21719099581241608, -0.23770399391651154, 0.6404799818992615, -0.34084200859069824, -0.12347999960184097, 0.258419007062912], [0.032281000167131424, 0.1457590013742447, -0.1513810008764267, 0.19920599460601807, -0.32581400871276855, 0.5144619941711426, 0.07718899846076965, -0.0904809981584549], [0.2204200029373169, -0.02250700071454048, -0.33642399311065674, -0.3966220021247864, 0.19014699757099152, -0.042716000229120255, -0.06947200000286102, 0.2900969982147217]], "after_fit": [[-0.7274199724197388, -0.2158699929714203, -0.4111100137233734, -0.7244700193405151, -0.2723099887371063, -0.4572800099849701], [0.7042700052261353, 1.7979300022125244, 0.05420000106096268, 1.0855499505996704, 0.5393400192260742, -1.0102800130844116]], "score": [["accuracy", 0.875], ["cross-entropy", 0.487998]], "predict": [[10, 3], [0.08715999871492386, 0.8377599716186523, 0.07507000118494034]], "iter_predict": [[[4, 3], 0], [[4, 3], 1], [[2, 3], 2]], "ckpt": [["fc1_bias", "fc1_weight", "fc2_bias", "fc2_weight"], [], ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "softmax_label"], 0.0], "loaded_predict": [5.999999848427251e-05, 0.05875999853014946, 0.9411699771881104], "fixed": [24.0, ["bn_moving_mean", "bn_moving_var"], [0.13179999589920044, 0.13179999589920044, 0.13179999589920044, 0.13179999589920044]]}
BUCKETS = {"outs": [[0.14195799827575684, 0.38381099700927734, 0.4742310047149658], [0.16904599964618683, 0.21407799422740936, 0.6168749928474426], [0.4571619927883148, 0.31696799397468567, 0.22586999833583832], [0.16211600601673126, 0.5618950128555298, 0.27598899602890015], [0.2739099860191345, 0.33667999505996704, 0.38940998911857605], [0.43211400508880615, 0.3641720116138458, 0.20371399819850922]], "w": [[0.32515600323677063, 0.18142199516296387, -0.4190860092639923, 0.3059979975223541, -0.39802899956703186], [-0.34658700227737427, 0.3020409941673279, 0.03140399977564812, -0.012996000237762928, -0.424778014421463], [-0.1906840056180954, 0.33818501234054565, -0.6143019795417786, -0.4536829888820648, 0.1737920045852661]], "buckets": [1, 2]}


def mlp():
    data = sym.Variable("data")
    fc1 = sym.FullyConnected(data, num_hidden=8, name="fc1")
    act = sym.Activation(fc1, act_type="relu", name="relu1")
    fc2 = sym.FullyConnected(act, num_hidden=3, name="fc2")
    return sym.SoftmaxOutput(fc2, name="softmax")


def problem():
    rng = np.random.RandomState(0)
    x = rng.randn(40, 6).astype("float32")
    y = (x[:, 0] > 0).astype("float32") + (x[:, 1] > 0)
    weights = {"fc1_weight": rng.randn(8, 6).astype("float32") * 0.3,
               "fc1_bias": np.zeros(8, "float32"),
               "fc2_weight": rng.randn(3, 8).astype("float32") * 0.3,
               "fc2_bias": np.zeros(3, "float32")}
    return x, y, {k: nd.array(v) for k, v in weights.items()}


def close(found, expected, rtol=1e-4):
    np.testing.assert_allclose(np.asarray(found, dtype=float), np.asarray(expected, dtype=float),
                               rtol=rtol, atol=1e-5)


def test_module_steps_fit_score_predict_and_checkpoints_match_mxnet(tmp_path):
    x, y, args = problem()
    it = io.NDArrayIter(x, y, batch_size=8)
    m = Module(mlp(), data_names=["data"], label_names=["softmax_label"])
    m.bind(data_shapes=it.provide_data, label_shapes=it.provide_label)
    m.init_params(arg_params=args)
    m.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.5, "momentum": 0.9,
                                                        "wd": 0.01})
    assert [m.data_names, m.label_names, m.output_names,
            [[name, list(shape)] for name, shape in m.output_shapes]] == EXPECTED["names"]
    batch = next(it)
    m.forward(batch, is_train=True)
    close(m.get_outputs()[0].asnumpy()[:2], EXPECTED["forward"])
    m.backward()
    m.update()
    close(m.get_params()[0]["fc2_weight"].asnumpy(), EXPECTED["after_one"])
    it.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # init_params again: ignored, as in MXNet
        m.fit(it, num_epoch=3, eval_metric="acc", optimizer="sgd",
              optimizer_params={"learning_rate": 0.5})
    arg, _ = m.get_params()
    close(arg["fc1_weight"].asnumpy()[:2], EXPECTED["after_fit"])
    scores = m.score(io.NDArrayIter(x, y, batch_size=8), ["acc", "ce"])
    close([v for _, v in scores], [v for _, v in EXPECTED["score"]])
    assert [n for n, _ in scores] == [n for n, _ in EXPECTED["score"]]
    predicted = m.predict(io.NDArrayIter(x[:10], y[:10], batch_size=4))
    assert list(predicted.shape) == EXPECTED["predict"][0]
    close(predicted.asnumpy()[-1], EXPECTED["predict"][1])
    shapes = [[list(o[0].shape), i] for o, i, _ in
              m.iter_predict(io.NDArrayIter(x[:10], batch_size=4))]
    assert shapes == EXPECTED["iter_predict"]
    prefix = str(tmp_path / "ck")
    m.save_checkpoint(prefix, 3)
    symbol, arg_params, aux_params = model.load_checkpoint(prefix, 3)
    assert [sorted(arg_params), sorted(aux_params), symbol.list_arguments()] == \
        EXPECTED["ckpt"][:3]
    loaded = Module.load(prefix, 3)
    loaded.bind(data_shapes=[("data", (5, 6))], for_training=False)
    close(loaded.predict(nd.array(x[:5])).asnumpy()[0], EXPECTED["loaded_predict"])


def test_fixed_parameters_and_running_statistics_match_mxnet():
    x, _, _ = problem()
    data = sym.Variable("data")
    bn = sym.BatchNorm(sym.FullyConnected(data, num_hidden=4, name="fc"), name="bn")
    net = sym.LinearRegressionOutput(sym.FullyConnected(bn, num_hidden=1, name="out"),
                                     name="lro")
    m = Module(net, label_names=["lro_label"], fixed_param_names=["fc_weight"])
    it = io.NDArrayIter(x, x[:, 0], batch_size=10, label_name="lro_label")
    m.fit(it, num_epoch=2, eval_metric="mse", initializer=mixrt.init.One(),
          optimizer_params={"learning_rate": 0.01})
    arg, aux = m.get_params()
    found = [float(arg["fc_weight"].asnumpy().sum()), sorted(aux),
             aux["bn_moving_mean"].asnumpy().tolist()]
    assert found[:2] == EXPECTED["fixed"][:2]
    close(found[2], EXPECTED["fixed"][2])


def test_bucketing_module_shares_parameters_as_mxnet():
    def sym_gen(key):
        data = sym.Variable("data")
        x = data if key == 1 else sym.Activation(data, act_type="relu")
        fc = sym.FullyConnected(x, num_hidden=3, name="fc")
        return sym.SoftmaxOutput(fc, name="softmax"), ("data",), ("softmax_label",)
    rng = np.random.RandomState(2)
    m = BucketingModule(sym_gen, default_bucket_key=1)
    m.bind(data_shapes=[("data", (4, 5))], label_shapes=[("softmax_label", (4,))])
    w = rng.randn(3, 5).astype("float32") * 0.3
    m.init_params(arg_params={"fc_weight": nd.array(w), "fc_bias": nd.zeros((3,))})
    m.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.3, "momentum": 0.5})
    outputs = []
    for step in range(6):
        key = 1 + step % 2
        x = rng.randn(4, 5).astype("float32")
        y = rng.randint(0, 3, size=4).astype("float32")
        batch = io.DataBatch([nd.array(x)], [nd.array(y)], bucket_key=key,
                             provide_data=[io.DataDesc("data", (4, 5))],
                             provide_label=[io.DataDesc("softmax_label", (4,))])
        m.forward(batch, is_train=True)
        m.backward()
        m.update()
        outputs.append(m.get_outputs()[0].asnumpy()[0])
    close(outputs, BUCKETS["outs"])
    close(m.get_params()[0]["fc_weight"].asnumpy(), BUCKETS["w"])
    assert sorted(m._buckets) == BUCKETS["buckets"]


def test_parameters_mxnet_wrote_load_and_predict_as_in_mxnet():
    arg_params, aux_params = model.load_params(DATA, 7)
    assert sorted(arg_params) == ["bn_beta", "bn_gamma", "fc_bias", "fc_weight"]
    assert sorted(aux_params) == ["bn_moving_mean", "bn_moving_var"]
    data = sym.Variable("data")
    net = sym.SoftmaxOutput(sym.BatchNorm(sym.FullyConnected(data, num_hidden=3, name="fc"),
                                          name="bn"), name="softmax")
    m = Module(net)
    m.bind([("data", (2, 4))], for_training=False)
    m.set_params(arg_params, aux_params)
    found = m.predict(nd.array(np.arange(8).reshape(2, 4))).asnumpy()
    # MXNet 1.9.1's Module.load(...).predict on the same input
    close(found, [[0.5133867263793945, 0.4538913071155548, 0.03272198885679245],
                  [0.2688823640346527, 0.7309482097625732, 0.000169437364093028]])


def test_callbacks_and_errors():
    x, y, args = problem()
    seen = []
    m = Module(mlp())
    m.fit(io.NDArrayIter(x, y, batch_size=20), num_epoch=2, arg_params=args,
          batch_end_callback=lambda p: seen.append(("batch", p.epoch, p.nbatch)),
          epoch_end_callback=[lambda epoch, s, a, aux: seen.append(("epoch", epoch))],
          optimizer_params={"learning_rate": 0.1})
    assert seen == [("batch", 0, 0), ("batch", 0, 1), ("epoch", 0),
                    ("batch", 1, 0), ("batch", 1, 1), ("epoch", 1)]
    fresh = Module(mlp())
    with pytest.raises(InputError, match="call bind"):
        fresh.init_params()
    with pytest.raises(InputError, match="num_epoch"):
        fresh.fit(io.NDArrayIter(x, y, batch_size=20))
    fresh.bind([("data", (4, 6))], [("softmax_label", (4,))])
    with pytest.raises(InputError, match="not presented"):
        fresh.init_params(arg_params={"fc1_weight": args["fc1_weight"]})
    fresh.init_params()
    with pytest.raises(GradientError, match="forward first"):
        fresh.backward(out_grads=[nd.ones((4, 3))])


def _regression_module(contexts=None, batch=1):
    net = sym.FullyConnected(sym.Variable("data"), num_hidden=2, name="fc_0")
    net = sym.LinearRegressionOutput(net, name="softmax")
    mod = Module(net, context=contexts or [mixrt.cpu()])
    mod.bind([("data", (batch, 2))], label_shapes=[("softmax_label", (batch, 2))])
    mod.init_params(arg_params={"fc_0_weight": nd.array([[.15, .20], [.25, .30]]),
                                "fc_0_bias": nd.array([.35, .35])})
    return mod


def _batch():
    return io.DataBatch(data=[nd.array([[0.05, .10]])], label=[nd.array([[.01, 0.99]])])


def test_monitor_reports_matching_arrays_on_every_interval_th_batch():
    mod = _regression_module()
    mon = mixrt.mon.Monitor(2, stat_func=lambda x: nd.sum(nd.abs(x)) / x.size,
                            pattern="fc_0.*|data", sort=True)
    mod.install_monitor(mon)
    mon.tic()
    mod.forward_backward(_batch())
    res = mon.toc()
    names = [name for _, name, _ in res]
    assert names == sorted(names) and {"data", "fc_0_bias", "fc_0_weight"} <= set(names)
    assert "softmax_label" not in names
    # MXNet's text: a one-element statistic as its scalar (float32 digits), then a tab
    assert dict((name, text) for _, name, text in res)["fc_0_weight"] == "0.22500001\t"
    assert {step for step, _, _ in res} == {1}
    mon.tic()  # batch 2 of interval 2: not collected
    mod.forward(_batch())
    assert mon.toc() == []


def test_monitor_rejects_an_interval_below_one():
    with pytest.raises(InputError, match="interval"):
        mixrt.mon.Monitor(0)


def test_multi_context_module_updates_inside_the_store(tmp_path):
    mod = _regression_module([mixrt.cpu(0), mixrt.cpu(1)], batch=2)
    mod.init_optimizer(optimizer_params={"learning_rate": 0.1, "momentum": 0.9})
    assert mod._update_on_kvstore and mod._updater is None
    before = mod.get_params()[0]["fc_0_bias"].asnumpy()
    mod.forward_backward(io.DataBatch(data=[nd.ones((2, 2))], label=[nd.zeros((2, 2))]))
    mod.update()
    after = mod.get_params()[0]["fc_0_bias"].asnumpy()
    assert not np.allclose(before, after)
    path = str(tmp_path / "states")
    mod.save_optimizer_states(path)
    mod.load_optimizer_states(path)


def test_ctx_group_places_arrays_and_input_gradients_on_the_group_context():
    with mixrt.AttrScope(ctx_group="dev1"):
        a = sym.Variable("a") * 2
    with mixrt.AttrScope(ctx_group="dev2"):
        c = a + sym.Variable("b")
    mod = Module(c, context=[mixrt.cpu(0)], data_names=["a", "b"], label_names=None,
                 group2ctxs={"dev1": mixrt.cpu(1), "dev2": mixrt.cpu(2)})
    mod.bind(data_shapes=[["a", (2, 5)], ["b", (2, 5)]], inputs_need_grad=True)
    mod.init_params()
    mod.forward(io.DataBatch(data=[nd.ones((2, 5)), nd.ones((2, 5))]), is_train=True)
    mod.backward([nd.ones((2, 5))])
    grad_a, grad_b = mod.get_input_grads()
    assert (grad_a.context, grad_b.context) == (mixrt.cpu(1), mixrt.cpu(2))
    np.testing.assert_array_equal(grad_a.asnumpy(), np.full((2, 5), 2.0))
    np.testing.assert_array_equal(grad_b.asnumpy(), np.ones((2, 5)))


def l2_head(**make_loss_options):
    """A linear regression whose loss is a Gluon L2Loss behind make_loss, labels an input."""
    data, label = sym.Variable("data"), sym.Variable("label")
    fc = sym.FullyConnected(data, num_hidden=1, name="fc")
    return sym.make_loss(mixrt.gluon.loss.L2Loss()(fc, label), **make_loss_options)


def test_make_loss_module_scores_every_batch_with_its_own_labels():
    """Labels are loaded for inference forwards too (MXNet 1.9.1 gives these values)."""
    x = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    y = np.array([[1.0], [0.0], [2.0], [-1.0], [0.5], [3.0]], np.float32)
    batches = io.NDArrayIter(x, y, batch_size=3, label_name="label")
    mod = Module(l2_head(name="l2"), data_names=("data",), label_names=("label",))
    assert mod.output_names == ["l2_loss"]
    mod.bind(batches.provide_data, batches.provide_label)
    mod.init_params(arg_params={"fc_weight": nd.array([[0.5, -0.25]]),
                                "fc_bias": nd.array([0.1])})
    assert mod.score(batches, mixrt.metric.Loss())[0][1] == pytest.approx(1.0757291714, 1e-6)
    np.testing.assert_allclose(mod.predict(batches).asnumpy().ravel(),
                               [0.4278125, 0.0078125, 1.6653125, 0.7503125, 0.0253125,
                                3.5778124], rtol=1e-5)


@pytest.mark.parametrize("options", [{}, {"grad_scale": 2.0, "normalization": "batch"}])
def test_make_loss_backward_seeds_ones_and_ignores_makeloss_keywords(options):
    """MXNet's make_loss has no parameters: MakeLoss's keywords change nothing."""
    batches = io.NDArrayIter(np.arange(6, dtype=np.float32).reshape(3, 2) / 10,
                             np.array([[1.0], [0.0], [2.0]], np.float32), batch_size=3,
                             label_name="label")
    mod = Module(l2_head(**options), data_names=("data",), label_names=("label",))
    mod.bind(batches.provide_data, batches.provide_label)
    mod.init_params(arg_params={"fc_weight": nd.array([[0.5, -0.25]]),
                                "fc_bias": nd.array([0.1])})
    mod.forward(next(iter(batches)), is_train=True)
    mod.backward()
    grads = mod._exec_group.execs[0].grad_dict
    np.testing.assert_allclose(grads["fc_weight"].asnumpy(), [[-0.705, -0.9675]], rtol=1e-5)
    np.testing.assert_allclose(grads["fc_bias"].asnumpy(), [-2.625], rtol=1e-5)


def test_a_variables_own_init_fills_any_name_in_its_declared_storage():
    """MXNet's global initializer hands a Variable's init its array whatever the name
    (``v`` has no weight/bias suffix); the module's copy keeps the declared stype."""
    data = sym.Variable("data")
    v = sym.Variable("v", shape=(5, 1), init=mixrt.init.Constant(0.5), stype="row_sparse")
    net = sym.LinearRegressionOutput(sym.dot(data, v), sym.Variable("label"), name="out")
    mod = Module(net, data_names=["data"], label_names=["label"])
    mod.bind(data_shapes=[("data", (4, 5))], label_shapes=[("label", (4, 1))])
    mod.init_params()
    params = mod.get_params()[0]
    assert params["v"].stype == "row_sparse"
    np.testing.assert_array_equal(params["v"].asnumpy(), np.full((5, 1), 0.5))


def test_symbols_take_mxnets_operand_names_and_scalar_shapes():
    x = sym.Variable("x")
    value = nd.array([[1.0, -2.0, 3.0]])
    np.testing.assert_array_equal(sym.square(data=x).eval(x=value)[0].asnumpy(),
                                  [[1.0, 4.0, 9.0]])
    np.testing.assert_array_equal(
        sym.sum(data=x, axis=1, keepdims=True).eval(x=value)[0].asnumpy(), [[2.0]])
    assert sym.flatten(data=x).infer_shape(x=(2, 3, 4))[1] == [(2, 12)]
    squares = sym._internal._square_sum(data=x, axis=1, keepdims=True)
    np.testing.assert_array_equal(squares.eval(x=value)[0].asnumpy(), [[14.0]])
    assert sym.Variable("b", shape=1).infer_shape()[0] == [(1,)]  # MXNet reads 1 as (1,)


@pytest.mark.parametrize("make", [sym.Embedding, sym.contrib.SparseEmbedding])
def test_an_embedding_weight_given_as_a_bare_variable_gets_the_layers_shape(make):
    weight = sym.Variable("embed_weight", stype="row_sparse")
    embed = make(data=sym.Variable("data"), weight=weight, input_dim=10, output_dim=4,
                 name="embed")
    arg_shapes, out_shapes, _ = embed.infer_shape(data=(2, 3))
    assert dict(zip(embed.list_arguments(), arg_shapes))["embed_weight"] == (10, 4)
    assert out_shapes == [(2, 3, 4)]
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    rows = embed.eval(data=nd.array([[1, 0, 9], [2, 2, 3]]), embed_weight=nd.array(table))
    np.testing.assert_array_equal(rows[0].asnumpy()[1, 2], table[3])


def test_layers_list_their_data_before_their_parameters_as_mxnet():
    data = sym.Variable("data")
    assert sym.Embedding(data, input_dim=10, output_dim=4, name="e").list_arguments() == \
        ["data", "e_weight"]
    assert sym.BatchNorm(data, name="bn").list_arguments() == ["data", "bn_gamma", "bn_beta"]
    embed = sym.Embedding(data, input_dim=10, output_dim=4, name="e")
    assert sym.load_json(embed.tojson()).list_arguments() == ["data", "e_weight"]
