"""mx.optimizer against MXNet 1.9.1: every registered optimizer, four steps on two weights,
with weight decay, rescale_grad, clip_gradient, multipliers, schedulers and float16 with
multi_precision; MXNet's update operators; Updater states (no pickle); the engine protocol.

The expected weights were made with MXNet 1.9.1 (numpy 1.23.5) by running ``run`` below
(identical code, ``mx`` being ``mxnet``) on each case and printing the weights to 8
significant digits (2026-11-24). ``numpy.random.RandomState`` draws the same numbers in
both numpy versions.
"""

import warnings

import numpy as np
import pytest

import mixrt
from mixrt import lr_scheduler, nd, optimizer, optimizer_ops
from mixrt.errors import OptimizerError

CASES = [
    ("sgd", dict(learning_rate=0.1)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, multi_precision=True), "float16"),
    ("sgd", dict(learning_rate=0.1, multi_precision=True), "float16"),
    ("nag", dict(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("nag", dict(learning_rate=0.1, momentum=0.9, multi_precision=True), "float16"),
    ("signum", dict(learning_rate=0.1, momentum=0.9, wd_lh=0.01, wd=0.02)),
    ("signum", dict(learning_rate=0.1, momentum=0.0, wd=0.02)),
    ("adam", dict(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("adam", dict(learning_rate=0.01, multi_precision=True), "float16"),
    ("adamax", dict(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("nadam", dict(learning_rate=0.01, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("adagrad", dict(learning_rate=0.1, eps=1e-5, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("adadelta", dict(rho=0.8, epsilon=1e-4, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("rmsprop", dict(learning_rate=0.01, gamma1=0.8, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("rmsprop", dict(learning_rate=0.01, centered=True, clip_weights=0.9, wd=0.01)),
    ("ftrl", dict(learning_rate=0.1, lamda1=0.05, beta=1.5, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("ftml", dict(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("lamb", dict(learning_rate=0.01, wd=0.01, lower_bound=0.1, upper_bound=5.0, rescale_grad=0.5, clip_gradient=0.3)),
    ("lamb", dict(learning_rate=0.01, bias_correction=False)),
    ("lars", dict(learning_rate=0.1, momentum=0.9, eta=0.01, wd=0.01, param_idx2name={0: "fc_weight", 1: "fc_bias"})),
    ("dcasgd", dict(learning_rate=0.1, lamda=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.3)),
    ("lbsgd", dict(learning_rate=0.1, momentum=0.9, batch_scale=2, warmup_epochs=1, updates_per_epoch=2)),
    ("test", dict(rescale_grad=0.5)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.1, param_idx2name={0: "fc_weight", 1: "fc_bias"})),
    ("nag", dict(learning_rate=0.1, momentum=0.9, wd=0.05, multi_precision=True), "float16"),
    ("adam", dict(learning_rate=0.1, begin_num_update=3)),
    ("sgd", dict(momentum=0.5, lr_scheduler="factor")),
    ("lamb", dict(learning_rate=0.01, wd=0.01, multi_precision=True), "float16"),
    ("signum", dict(learning_rate=0.1, momentum=0.9, rescale_grad=0.5, clip_gradient=0.3)),
]

EXPECTED = {
    0: [1.9522833, -0.50187922, -0.25006366, 0.44874951, -0.91539371, 0.0065394547, 0.038623232, -1.3833891, 1.2828425],
    1: [1.622185, -0.36461225, -0.0096978471, 0.3697336, -0.7715587, 0.028461371, 0.028916003, -1.6658239, 1.1290193],
    2: [1.9648438, -0.18273926, -0.45288086, 0.3659668, -0.88183594, -0.13256836, 0.35253906, -1.0849609, 1.3818359],
    3: [1.9521484, -0.50195312, -0.25, 0.44873047, -0.91552734, 0.0065460205, 0.038604736, -1.3837891, 1.2832031],
    4: [1.6391529, -0.37362948, -0.036106721, 0.38579819, -0.79805374, 0.046914831, 0.0025763996, -1.6054168, 1.1876872],
    5: [2.1992188, -0.24707031, -0.6875, 0.41137695, -0.99902344, -0.11468506, 0.35668945, -0.78076172, 1.6103516],
    6: [1.6841733, -0.26467606, -0.16731071, 0.40628827, -0.78617167, 0.20185752, 0.39851359, -1.547716, 1.2135934],
    7: [1.6778405, -0.46301949, 0.032159217, 0.40506434, -0.78342897, 0.2016499, -0.001681678, -1.5407294, 1.2095405],
    8: [1.6724398, -0.44436705, 0.034062292, 0.39156991, -0.77273464, 0.012188339, 0.012878085, -1.7526189, 1.0278698],
    9: [1.6806641, -0.4453125, 0.026473999, 0.39331055, -0.77734375, 0.0059661865, 0.019012451, -1.7460938, 1.0283203],
    10: [1.6742706, -0.4443672, 0.036146827, 0.39306971, -0.77344543, 0.012289061, 0.011390265, -1.7530942, 1.0227768],
    11: [1.688009, -0.45939013, 0.032631747, 0.40531617, -0.78528094, 0.013745259, -0.0055244067, -1.7428663, 1.0353649],
    12: [1.6655961, -0.40148982, 0.029369883, 0.39011395, -0.74416262, 0.097108394, -0.017706349, -1.6640583, 1.1543105],
    13: [1.6381234, -0.45204538, 0.015791912, 0.40298966, -0.7768749, 0.036066968, -0.022730771, -1.6326793, 1.0564911],
    14: [1.6876744, -0.45423946, 0.031380247, 0.40556508, -0.78088689, 0.024870859, -0.0080807256, -1.7312895, 1.0510809],
    15: [0.85276979, -0.31799123, 0.048644617, 0.32611632, -0.6706301, 0.069298081, 0.081297532, -0.83543795, 0.89999998],
    16: [0.28479522, -0.071723081, -0.011262211, 0.061383918, -0.072009042, 0.0085017066, -0.0083005261, -0.24139051, 0.076243028],
    17: [1.6600082, -0.40041387, 0.039387703, 0.38108325, -0.74113828, 0.098417766, -0.0063686846, -1.687151, 1.1316575],
    18: [1.6739932, -0.43619707, 0.02636957, 0.40030921, -0.78323519, 0.023668949, 0.020893205, -1.7415885, 1.0502502],
    19: [1.6962796, -0.44452342, 0.01324122, 0.40094379, -0.78931922, 0.004877694, 0.030840946, -1.7295853, 1.045656],
    20: [1.6896107, -0.46162462, 0.030243108, 0.40516645, -0.78836852, 0.0020407129, 0.3526412, -1.0847881, 1.3815163],
    21: [1.7001324, -0.46422437, 0.0020902473, 0.41943952, -0.81339204, 0.023201354, -0.023839893, -1.6854856, 1.0875684],
    22: [1.8735371, -0.30820346, -0.38318726, 0.38938233, -0.85702908, -0.15422964, 0.1734997, -1.3027403, 1.3081638],
    23: [0.38173735, -0.28622806, 1.4472392, 0.20135008, -0.15656951, -0.020303808, -0.19845852, -3.6113997, -0.30826479],
    24: [1.7528163, -0.30601501, -0.2104926, 0.36953121, -0.80071127, -0.064408228, 0.3526412, -1.0847881, 1.3815163],
    25: [2.1015625, -0.23522949, -0.68115234, 0.39282227, -0.95556641, -0.10821533, 0.33886719, -0.68408203, 1.546875],
    26: [1.648571, -0.33134556, -0.040281914, 0.32399917, -0.72676867, 0.016112214, 0.13246238, -1.6566912, 1.1273682],
    27: [1.832947, -0.00072496384, -0.59473914, 0.30833596, -0.80035925, -0.35141882, 0.42283973, -1.0700084, 1.3831903],
    28: [1.6953125, -0.4440918, 0.012870789, 0.40087891, -0.78955078, 0.0048904419, 0.030792236, -1.7285156, 1.0449219],
    29: [1.4905256, -0.26593739, 0.032820158, 0.40751627, -0.78892303, 0.20206559, -0.00089038908, -1.5547242, 1.217658],
}

STEPS = 4


def problem(dtype="float32"):
    rng = np.random.RandomState(7)
    weights = [rng.randn(2, 3).astype(dtype), rng.randn(3).astype(dtype)]
    grads = [[rng.randn(2, 3).astype(dtype), rng.randn(3).astype(dtype)]
             for _ in range(STEPS)]
    return weights, grads


def run(name, kwargs, dtype="float32", lists=False):
    """Four updates through get_updater, one index at a time or both at once."""
    weights, grads = problem(dtype)
    kwargs = dict(kwargs)
    if kwargs.get("lr_scheduler") == "factor":
        kwargs["lr_scheduler"] = lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.2)
    opt = optimizer.create(name, **kwargs)
    if name == "sgd" and "param_idx2name" in kwargs:
        opt.set_lr_mult({0: 0.5})
    updater = optimizer.get_updater(opt)
    ws = [nd.array(w, dtype=dtype) for w in weights]
    for step in grads:
        gs = [nd.array(g, dtype=dtype) for g in step]
        if lists:
            updater([0, 1], gs, ws)
        else:
            for i in range(2):
                updater(i, gs[i], ws[i])
    return np.concatenate([w.asnumpy().astype(np.float64).ravel() for w in ws])


@pytest.mark.parametrize("lists", [False, True], ids=["one-by-one", "aggregated"])
@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_updates_match_mxnet(index, lists):
    case = CASES[index]
    dtype = case[2] if len(case) > 2 else "float32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float16 without multi_precision warns, as in MXNet
        found = run(case[0], case[1], dtype, lists)
    rtol = 2e-3 if dtype == "float16" else 3e-5
    np.testing.assert_allclose(found, EXPECTED[index], rtol=rtol, atol=rtol * 1e-2)


# -- the update operators ---------------------------------------------------------------------
# Made with MXNet 1.9.1 from W, G and the states below (script: call mx.nd.<op> with the
# arguments each lambda passes and print the result and every state to 8 digits).

W, G = [1.0, -2.0, 0.5], [0.5, 1.5, -3.0]
S1, S2, S3 = [0.1, -0.2, 0.3], [0.2, 0.1, 0.4], [0.0, 0.3, -0.1]
COMMON = dict(wd=0.01, rescale_grad=0.5, clip_gradient=1.0)
OPERATORS = {
    "sgd_update": [[0.97400004, -2.073, 0.5995]],
    "sgd_mom_update": [[1.064, -2.253, 0.86950004], [0.063999996, -0.25299999, 0.36950001]],
    "nag_mom_update": [[1.0316, -2.3006999, 0.93204999], [0.063999996, -0.25299999, 0.36950001]],
    "nag_mom_update_in_place": [[1.0316, -2.3006999, 0.93204999], [0.06396839, -0.25269929, 0.36906797]],
    "signsgd_update": [[0.89899999, -2.098, 0.5995]],
    "signum_update": [[1.095, -2.0899999, 0.59750003], [0.063999988, -0.25300002, 0.36950004]],
    "adam_update": [[0.96952611, -1.9963113, 0.494111], [0.132, -0.014000013, 0.040000021], [0.18675999, 0.14329001, 0.46000001]],
    "rmsprop_update": [[0.93776274, -1.5, 0.63854194], [0.17352001, 0.18658, 0.51999998]],
    "rmspropalex_update": [[0.93440199, -1.9586384, 0.56875515], [0.17352001, 0.18658, 0.51999998], [0.132, -0.014000013, 0.040000021], [-0.065598018, 0.041361541, 0.068755127]],
    "ftrl_update": [[0.012483652, -0.45159966, 0.12680806], [-0.3013393, 10.504266, -3.4538023], [0.26249999, 0.66250002, 1.4]],
    "ftml_update": [[0.9647333, -2.0632603, 0.53412074], [6.3515954, 5.5643039, 9.9646273], [0.18675999, 0.14329001, 0.46000001], [-6.1275954, 11.480608, -5.3223138]],
    "lamb_update": [[0.8058002, -1.9732194, 0.46038631], [0.37436041, -0.051625151, 0.076363593], [0.13, -0.01000002, 0.040000021], [0.18625, 0.14625001, 0.46000001]],
    "mp_sgd_mom_update": [[1.0644531, -2.2539062, 0.86962891], [0.063999996, -0.25299999, 0.36950001], [1.064, -2.253, 0.86950004]],
    "mp_sgd_update": [[0.97412109, -2.0722656, 0.59960938], [0.97400004, -2.073, 0.5995]],
    "mp_nag_mom_update": [[1.03125, -2.3007812, 0.93212891], [0.06396839, -0.25269929, 0.36906797], [1.0316, -2.3006999, 0.93204999]],
}


def _a(values, dtype="float32"):
    return nd.array(values, dtype=dtype)


def _lamb(w, g, m, v):
    direction = optimizer_ops.lamb_update_phase1(w, g, m, v, t=2, wd=0.01, beta1=0.8,
                                                 beta2=0.9, epsilon=1e-3, rescale_grad=0.5,
                                                 clip_gradient=1.0)
    norms = [_a([np.linalg.norm(x.asnumpy())]) for x in (w, direction)]
    return optimizer_ops.lamb_update_phase2(w, direction, *norms, lr=0.1, lower_bound=0.5,
                                            upper_bound=2.0), direction


def _mixed(op, **options):
    """A float16 weight updated through its float32 copy (the result is the weight)."""
    def call(w, g, *states):
        w16, g16 = _a(W, "float16"), _a(G, "float16")
        op(w16, g16, *states, out=w16, lr=0.1, **options, **COMMON)
        return w16
    return call


CALLS = {
    "sgd_update": (lambda w, g: optimizer_ops.sgd_update(w, g, lr=0.1, **COMMON), []),
    "sgd_mom_update": (lambda w, g, m: optimizer_ops.sgd_mom_update(
        w, g, m, lr=0.1, momentum=0.9, **COMMON), [S1]),
    "nag_mom_update": (lambda w, g, m: optimizer_ops.nag_mom_update(
        w, g, m, lr=0.1, momentum=0.9, **COMMON), [S1]),
    "nag_mom_update_in_place": (lambda w, g, m: optimizer_ops.nag_mom_update(
        w, g, m, out=w, lr=0.1, momentum=0.9, **COMMON), [S1]),
    "signsgd_update": (lambda w, g: optimizer_ops.signsgd_update(w, g, lr=0.1, **COMMON), []),
    "signum_update": (lambda w, g, m: optimizer_ops.signum_update(
        w, g, m, lr=0.1, momentum=0.9, wd_lh=0.05, **COMMON), [S1]),
    "adam_update": (lambda w, g, m, v: optimizer_ops.adam_update(
        w, g, m, v, lr=0.1, beta1=0.8, beta2=0.9, epsilon=1e-3, **COMMON), [S1, S2]),
    "rmsprop_update": (lambda w, g, n: optimizer_ops.rmsprop_update(
        w, g, n, lr=0.1, gamma1=0.8, epsilon=1e-3, clip_weights=1.5, **COMMON), [S2]),
    "rmspropalex_update": (lambda w, g, n, m, d: optimizer_ops.rmspropalex_update(
        w, g, n, m, d, lr=0.1, gamma1=0.8, gamma2=0.7, epsilon=1e-3, **COMMON), [S2, S1, S3]),
    "ftrl_update": (lambda w, g, z, n: optimizer_ops.ftrl_update(
        w, g, z, n, lr=0.1, lamda1=0.05, beta=1.5, **COMMON), [S1, S2]),
    "ftml_update": (lambda w, g, d, v, z: optimizer_ops.ftml_update(
        w, g, d, v, z, lr=0.1, t=2, beta1=0.6, beta2=0.9, epsilon=1e-3, wd=0.01,
        rescale_grad=0.5, clip_grad=1.0), [S2, S2, S3]),
    "lamb_update": (_lamb, [S1, S2]),
    "mp_sgd_mom_update": (_mixed(optimizer_ops.mp_sgd_mom_update, momentum=0.9), [S1, W]),
    "mp_sgd_update": (_mixed(optimizer_ops.mp_sgd_update), [W]),
    "mp_nag_mom_update": (_mixed(optimizer_ops.mp_nag_mom_update, momentum=0.9), [S1, W]),
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_update_operators_match_mxnet(name):
    call, state_values = CALLS[name]
    states = [_a(values) for values in state_values]
    result = call(_a(W), _a(G), *states)
    found = list(result) if isinstance(result, tuple) else [result]
    found = [x.asnumpy() for x in found] + [s.asnumpy() for s in states]
    rtol = 1e-3 if name.startswith("mp_") else 1e-5
    for got, expected in zip(found, OPERATORS[name]):
        np.testing.assert_allclose(got.astype(np.float64), expected, rtol=rtol, atol=1e-6)


def test_operators_without_out_leave_the_weight_and_with_out_write_it():
    w = _a(W)
    result = optimizer_ops.sgd_update(w, _a(G), lr=0.1)
    np.testing.assert_array_equal(w.asnumpy(), np.float32(W))
    assert result is not w
    assert optimizer_ops.sgd_update(w, _a(G), lr=0.1, out=w) is w
    np.testing.assert_allclose(w.asnumpy(), result.asnumpy())


# -- the Optimizer API ----------------------------------------------------------------------

MXNET_NAMES = ["adadelta", "adagrad", "adam", "adamax", "ccsgd", "dcasgd", "ftml", "ftrl",
               "groupadagrad", "lamb", "lars", "lbsgd", "nadam", "nag", "rmsprop", "sgd",
               "sgld", "signum", "test"]  # sorted(mx.optimizer.Optimizer.opt_registry)


def test_registry_holds_mxnets_names_and_create_is_case_insensitive():
    assert set(MXNET_NAMES) <= set(optimizer.Optimizer.opt_registry)
    assert isinstance(optimizer.create("SGD"), optimizer.SGD)
    assert isinstance(mixrt.optimizer.Optimizer.create_optimizer("Adam"), optimizer.Adam)
    with pytest.raises(ValueError, match="Cannot find optimizer 'nope'"):
        optimizer.create("nope")
    with pytest.raises(OptimizerError):
        optimizer.create("nope")


def test_register_a_new_optimizer():
    @optimizer.register
    class HalfStep(optimizer.Optimizer):
        def update(self, index, weight, grad, state):
            weight[:] = weight - 0.5 * grad
    w = nd.ones((2,))
    optimizer.get_updater(optimizer.create("halfstep"))(0, nd.ones((2,)), w)
    np.testing.assert_array_equal(w.asnumpy(), [0.5, 0.5])
    del optimizer.Optimizer.opt_registry["halfstep"]


# (name, attribute, MXNet 1.9.1's default)
DEFAULTS = [("sgd", "lr", 0.01), ("sgd", "momentum", 0.0), ("sgd", "aggregate_num", 4),
            ("adam", "lr", 0.001), ("adam", "epsilon", 1e-8), ("adamax", "lr", 0.002),
            ("ftrl", "lr", 0.1), ("ftrl", "lamda1", 0.01), ("signum", "momentum", 0.9),
            ("rmsprop", "gamma1", 0.9), ("rmsprop", "lr", 0.001), ("adagrad",
            "float_stable_eps", 1e-7), ("adadelta", "rho", 0.9), ("adadelta", "epsilon", 1e-5),
            ("lamb", "epsilon", 1e-6), ("lamb", "aggregate_num", 45), ("ftml", "beta1", 0.6),
            ("nadam", "schedule_decay", 0.004), ("dcasgd", "lamda", 0.04),
            ("lars", "eta", 0.001), ("sgd", "rescale_grad", 1.0),
            ("sgd", "clip_gradient", None), ("sgd", "wd", 0.0),
            ("sgd", "multi_precision", False), ("sgd", "begin_num_update", 0)]


@pytest.mark.parametrize("name,attribute,default", DEFAULTS)
def test_defaults_are_mxnets(name, attribute, default):
    assert getattr(optimizer.create(name), attribute) == default


def test_multipliers_counts_and_schedules_behave_as_mxnets():
    opt = optimizer.SGD(learning_rate=0.1, wd=0.5, param_idx2name={0: "fc_weight",
                                                                   1: "fc_bias",
                                                                   2: "bn_gamma"})
    assert opt.wd_mult == {"fc_bias": 0.0}  # MXNet: no decay for non-weight, non-gamma
    assert [opt._get_wd(i) for i in range(3)] == [0.5, 0.0, 0.5]
    opt.set_lr_mult({"fc_bias": 2.0, 0: 3.0})
    assert [opt._get_lr(i) for i in range(3)] == [pytest.approx(0.3), 0.2, 0.1]
    opt._update_count([0, 1])
    opt._update_count(0)
    assert opt._index_update_count == {0: 2, 1: 1} and opt.num_update == 2
    scheduled = optimizer.SGD(lr_scheduler=lr_scheduler.FactorScheduler(step=1, factor=0.5))
    scheduled.num_update = 3
    assert scheduled.learning_rate == pytest.approx(0.01 * 0.5 ** 2)
    with pytest.raises(UserWarning, match="LRScheduler of the optimizer"):
        scheduled.set_learning_rate(0.3)
    opt.set_learning_rate(0.7)
    assert opt.learning_rate == 0.7
    with pytest.warns(UserWarning, match="overwritten"):
        overridden = optimizer.SGD(learning_rate=0.5,
                                   lr_scheduler=lr_scheduler.FactorScheduler(step=1))
    assert overridden.lr_scheduler.base_lr == 0.5


def test_multi_precision_states_have_mxnets_layout():
    w16 = nd.ones((2, 2), dtype="float16")
    sgd = optimizer.SGD(momentum=0.9, multi_precision=True)
    mom, master = sgd.create_state_multi_precision(0, w16)
    assert mom.dtype == np.float32 and master.dtype == np.float32
    adam = optimizer.Adam(multi_precision=True)
    master, (mean, var) = adam.create_state_multi_precision(0, w16)
    assert master.dtype == mean.dtype == np.float32
    with pytest.warns(UserWarning, match="multi_precision=True"):
        optimizer.Adam().create_state_multi_precision(0, w16)


# -- Updater states: bytes, never pickle ------------------------------------------------------

def _trained_updater(name="adam", **kwargs):
    updater = optimizer.get_updater(optimizer.create(name, **kwargs))
    weights = {0: nd.ones((2, 3)), "fc_bias": nd.ones((3,))}
    for _ in range(2):
        for key, weight in weights.items():
            updater(key, nd.ones(weight.shape) * 0.5, weight)
    return updater, weights


def test_states_round_trip_as_npz_bytes_and_continue_identically():
    updater, weights = _trained_updater("adam", learning_rate=0.1)
    blob = updater.get_states()
    assert blob[:2] == b"PK"  # a zip (.npz), not a pickle
    again = optimizer.get_updater(optimizer.create("adam", learning_rate=0.1))
    again.optimizer._index_update_count.update(updater.optimizer._index_update_count)
    again.set_states(blob)
    assert set(again.states) == {0, "fc_bias"}  # int and str keys kept apart
    copies = {k: w.copy() for k, w in weights.items()}
    for key in weights:
        updater(key, nd.ones(weights[key].shape), weights[key])
        again(key, nd.ones(copies[key].shape), copies[key])
        np.testing.assert_array_equal(weights[key].asnumpy(), copies[key].asnumpy())


def test_dumped_optimizer_comes_back_with_its_settings_and_counts():
    updater, _ = _trained_updater("sgd", learning_rate=0.3, momentum=0.8, wd=0.1)
    fresh = optimizer.get_updater(optimizer.create("adam"))
    fresh.set_states(updater.get_states(dump_optimizer=True))
    restored = fresh.optimizer
    assert isinstance(restored, optimizer.SGD)
    assert (restored.lr, restored.momentum, restored.wd) == (0.3, 0.8, 0.1)
    assert restored._index_update_count == {0: 2, "fc_bias": 2}
    assert restored.num_update == 2


def test_set_states_refuses_pickles_and_strangers():
    updater = optimizer.get_updater(optimizer.create("sgd"))
    with pytest.raises(OptimizerError, match="pickle"):
        updater.set_states(b"\x80\x04K\x01.")
    with pytest.raises(OptimizerError):
        updater.set_states(b"not a zip file")
    adam, _ = _trained_updater("adam")
    with pytest.raises(OptimizerError, match="'adam'"):
        updater.set_states(adam.get_states())


# -- the engine protocol (KVStore, Trainer) ---------------------------------------------------

def test_step_on_host_arrays_equals_the_updater():
    opt, twin = optimizer.create("nag", momentum=0.9), optimizer.create("nag", momentum=0.9)
    updater = optimizer.get_updater(twin)
    w, w_nd = np.ones(3, np.float32), nd.ones((3,))
    for _ in range(3):
        opt.step("w", w, np.full(3, 0.5, np.float32))
        updater("w", nd.full((3,), 0.5), w_nd)
    np.testing.assert_array_equal(w, w_nd.asnumpy())
    saved = opt.state_dict()
    assert "meta" in saved and "state0.value" in saved
    again = optimizer.create("nag", momentum=0.9)
    again.load_state_dict(saved)
    assert again.counts == {"w": 3} and again.num_update == 3


def test_spec_is_the_engine_twin_for_the_kinds_a_server_can_run_only():
    sgd = optimizer.create("sgd", learning_rate=0.2, momentum=0.5).spec()
    assert sgd["name"] == "mxnet_sgd" and sgd["params"]["momentum"] == 0.5
    assert optimizer.create("nag", momentum=0.5).spec()["params"]["nesterov"] is True
    assert optimizer.create("adam", beta1=0.8).spec()["params"]["beta1"] == 0.8
    assert optimizer.create("rmsprop").spec()["name"] == "mxnet_rmsprop"
    assert optimizer.create("rmsprop", centered=True).spec()["params"]["centered"] is True
    assert optimizer.create("adagrad").spec()["name"] == "mxnet_adagrad"
    with pytest.raises(OptimizerError, match="in this process only"):
        optimizer.create("adadelta").spec()


def test_a_kvstore_runs_an_mxnet_optimizer_through_its_updater(tmp_path):
    kv = mixrt.kv.create("local")
    kv.init(9, nd.ones((2, 3)))
    kv.set_optimizer(optimizer.create("sgd", learning_rate=0.1, momentum=0.9, wd=0.01))
    w = nd.zeros((2, 3))
    for _ in range(3):
        kv.push(9, [nd.ones((2, 3)) * 0.5, nd.ones((2, 3))])
        kv.pull(9, out=w)
    # MXNet 1.9.1, the same calls: 0.15361461 (2026-11-24)
    np.testing.assert_allclose(w.asnumpy(), np.full((2, 3), 0.15361461), rtol=1e-6)
    kv.save_optimizer_states(tmp_path / "states")
    kv.load_optimizer_states(tmp_path / "states")
    kv.push(9, nd.ones((2, 3)))
    kv.pull(9, out=w)
    np.testing.assert_allclose(w.asnumpy(), np.full((2, 3), -0.3143117), rtol=1e-6)
