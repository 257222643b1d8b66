"""Optimizers: against PyTorch (when installed), against step-by-step NumPy references and
LAMB's paper, then specs, checkpoints, errors, dtypes and gradient clipping."""

import json

import numpy as np
import pytest
from helpers import counted_optimizer_launches, kernel_source, nvrtc, nvrtc_compile

from mixrt import lr_scheduler
# the engine's optimizers (PyTorch's rules); mixrt.optimizer is MXNet's (test_mxnet_optimizer)
from mixrt.runtime.training import optimizer
from mixrt.errors import DeviceMismatchError, OptimizerError, ShapeError

SHAPES = [(5, 3), (7,)]


def random_problem(seed, steps, dtype=np.float64, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    grads = [[rng.standard_normal(shape).astype(dtype) for shape in shapes]
             for _ in range(steps)]
    return weights, grads


def run(opt, weights, grads):
    """Copies of ``weights`` after ``opt.step`` on each step's gradients (keys 0, 1, ...)."""
    weights = [w.copy() for w in weights]
    for step_grads in grads:
        for key, (weight, grad) in enumerate(zip(weights, step_grads)):
            opt.step(key, weight, grad)
    return weights


# -- against PyTorch ------------------------------------------------------------------------

TORCH_CASES = [
    ("sgd", dict(learning_rate=0.1), "SGD", dict(lr=0.1)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01),
     "SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("sgd", dict(learning_rate=0.05, momentum=0.8, nesterov=True, wd=0.02),
     "SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    ("adam", dict(learning_rate=0.01), "Adam", dict(lr=0.01)),
    ("adam", dict(learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-6, wd=0.1),
     "Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", dict(learning_rate=0.01), "AdamW", dict(lr=0.01)),  # both default wd 0.01
    ("adamw", dict(learning_rate=0.01, beta1=0.85, wd=0.1),
     "AdamW", dict(lr=0.01, betas=(0.85, 0.999), weight_decay=0.1)),
    ("rmsprop", dict(learning_rate=0.01), "RMSprop", dict(lr=0.01)),
    ("rmsprop", dict(learning_rate=0.01, rho=0.9, momentum=0.9, wd=0.05),
     "RMSprop", dict(lr=0.01, alpha=0.9, momentum=0.9, weight_decay=0.05)),
    ("rmsprop", dict(learning_rate=0.01, centered=True, momentum=0.5, wd=0.05, epsilon=1e-6),
     "RMSprop", dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.05, eps=1e-6)),
    ("rmsprop", dict(learning_rate=0.01, centered=True),
     "RMSprop", dict(lr=0.01, centered=True)),
    ("adagrad", dict(learning_rate=0.1), "Adagrad", dict(lr=0.1)),
    ("adagrad", dict(learning_rate=0.1, wd=0.05, lr_decay=0.01, initial_accumulator_value=0.1,
                     epsilon=1e-8),
     "Adagrad", dict(lr=0.1, weight_decay=0.05, lr_decay=0.01, initial_accumulator_value=0.1,
                     eps=1e-8)),
]


def run_torch(torch, class_name, kwargs, weights, grads):
    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in weights]
    opt = getattr(torch.optim, class_name)(params, **kwargs)
    for step_grads in grads:
        for param, grad in zip(params, step_grads):
            param.grad = torch.from_numpy(grad.copy())
        opt.step()
    return [param.detach().numpy() for param in params]


@pytest.mark.parametrize("name,params,torch_class,torch_kwargs", TORCH_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TORCH_CASES)])
def test_matches_pytorch_over_20_steps(name, params, torch_class, torch_kwargs):
    torch = pytest.importorskip("torch")
    weights, grads = random_problem(seed=len(name), steps=20)
    ours = run(optimizer.create(name, **params), weights, grads)
    theirs = run_torch(torch, torch_class, torch_kwargs, weights, grads)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine, reference, rtol=1e-12, atol=1e-14)


# -- against step-by-step NumPy references (no PyTorch needed) ------------------------------

def sgd_reference(w, grads, lr, momentum=0.0, nesterov=False, wd=0.0):
    buf = None
    for g in grads:
        g = g + wd * w
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        w = w - lr * g
    return w


def adam_reference(w, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0, decoupled=False):
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            w = w - lr * wd * w
        else:
            g = g + wd * w
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g ** 2
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return w


def rmsprop_reference(w, grads, lr, rho=0.99, eps=1e-8, momentum=0.0, centered=False, wd=0.0):
    square_avg, grad_avg, buf = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for g in grads:
        g = g + wd * w
        square_avg = rho * square_avg + (1 - rho) * g ** 2
        grad_avg = rho * grad_avg + (1 - rho) * g
        variance = square_avg - grad_avg ** 2 if centered else square_avg
        scaled = g / (np.sqrt(variance) + eps)
        buf = momentum * buf + scaled
        w = w - lr * (buf if momentum else scaled)
    return w


def adagrad_reference(w, grads, lr, eps=1e-10, lr_decay=0.0, initial=0.0, wd=0.0):
    total = np.full_like(w, initial)
    for t, g in enumerate(grads, start=1):
        g = g + wd * w
        total = total + g ** 2
        w = w - lr / (1 + (t - 1) * lr_decay) * g / (np.sqrt(total) + eps)
    return w


REFERENCE_CASES = [
    ("sgd", dict(learning_rate=0.1), sgd_reference, dict(lr=0.1)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01),
     sgd_reference, dict(lr=0.1, momentum=0.9, wd=0.01)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, nesterov=True, wd=0.01),
     sgd_reference, dict(lr=0.1, momentum=0.9, nesterov=True, wd=0.01)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5, clip_gradient=0.3),
     sgd_reference, dict(lr=0.1, momentum=0.9, wd=0.01)),
    ("adam", dict(learning_rate=0.01, beta1=0.8, beta2=0.99, wd=0.1),
     adam_reference, dict(lr=0.01, beta1=0.8, beta2=0.99, wd=0.1)),
    ("adam", dict(learning_rate=0.01, clip_gradient=0.5), adam_reference, dict(lr=0.01)),
    ("adamw", dict(learning_rate=0.01, wd=0.1),
     adam_reference, dict(lr=0.01, wd=0.1, decoupled=True)),
    ("rmsprop", dict(learning_rate=0.01, rho=0.9, wd=0.05),
     rmsprop_reference, dict(lr=0.01, rho=0.9, wd=0.05)),
    ("rmsprop", dict(learning_rate=0.01, momentum=0.9, centered=True, rescale_grad=2.0),
     rmsprop_reference, dict(lr=0.01, momentum=0.9, centered=True)),
    ("adagrad", dict(learning_rate=0.1, wd=0.05, lr_decay=0.1, initial_accumulator_value=0.2),
     adagrad_reference, dict(lr=0.1, wd=0.05, lr_decay=0.1, initial=0.2)),
]


def rescaled_clipped(grads, params):
    """The gradients the rules see: rescaled, then clipped element-wise (MXNet's order)."""
    clip = params.get("clip_gradient", np.inf)
    return [np.clip(g * params.get("rescale_grad", 1.0), -clip, clip) for g in grads]


@pytest.mark.parametrize("name,params,reference,reference_kwargs", REFERENCE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(REFERENCE_CASES)])
def test_matches_a_numpy_reference_over_3_steps(name, params, reference, reference_kwargs):
    (weight,), grads = random_problem(seed=3, steps=3, shapes=[(4, 3)])
    (ours,) = run(optimizer.create(name, **params), [weight], grads)
    step_grads = rescaled_clipped([g for (g,) in grads], params)
    expected = reference(weight, step_grads, **reference_kwargs)
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-15)
    assert not np.allclose(ours, weight)


# -- LAMB against the paper (You et al. 2019, Algorithm 2) ----------------------------------

def lamb_reference(x, grads, lr, beta1, beta2, eps, wd, bias_correction=True, lower=0.0,
                   upper=np.inf):
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        if bias_correction:
            m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        else:
            m_hat, v_hat = m, v
        r = m_hat / (np.sqrt(v_hat) + eps)
        phi = min(max(np.linalg.norm(x), lower), upper)
        update_norm = np.linalg.norm(r + wd * x)
        ratio = phi / update_norm if phi > 0 and update_norm > 0 else 1.0
        x = x - lr * ratio * (r + wd * x)
    return x


LAMB_CASES = [
    (dict(learning_rate=0.01, wd=0.01), {}),
    (dict(learning_rate=0.02, beta1=0.8, beta2=0.95, epsilon=1e-8, bias_correction=False),
     dict(bias_correction=False)),
    (dict(learning_rate=0.01, wd=0.1, lower_bound=5.0), dict(lower=5.0)),
    (dict(learning_rate=0.01, upper_bound=0.5), dict(upper=0.5)),
]


@pytest.mark.parametrize("params,extra", LAMB_CASES)
def test_lamb_matches_the_paper(params, extra):
    (weight,), grads = random_problem(seed=11, steps=4, shapes=[(6, 4)])
    (ours,) = run(optimizer.create("lamb", **params), [weight], grads)
    expected = lamb_reference(
        weight, [g for (g,) in grads], lr=params["learning_rate"],
        beta1=params.get("beta1", 0.9), beta2=params.get("beta2", 0.999),
        eps=params.get("epsilon", 1e-6), wd=params.get("wd", 0.0), **extra)
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-15)


def test_lamb_trust_ratio_is_one_for_a_zero_weight():
    weight, grad = np.zeros(4), np.array([1.0, -2.0, 3.0, -4.0])
    optimizer.create("lamb", learning_rate=0.1).step("w", weight, grad)
    # first step, bias-corrected: m^ = g, v^ = g^2, so r = g / (|g| + eps) ~ sign(g)
    np.testing.assert_allclose(weight, -0.1 * np.sign(grad), rtol=1e-5)


# -- counts, schedules, per-key multipliers -------------------------------------------------

def test_schedule_follows_num_update_and_bias_correction_each_keys_count():
    schedule = lr_scheduler.FactorScheduler(step=1, factor=0.5, base_lr=1.0)
    opt = optimizer.create("sgd", lr_scheduler=schedule)
    a, b, grad = np.zeros(2), np.zeros(2), np.ones(2)
    for _ in range(3):
        opt.step("a", a, grad)            # rates 1, 0.5, 0.25
    opt.step("b", b, grad)                # num_update is still 3: rate 0.25
    np.testing.assert_array_equal(a, [-1.75, -1.75])
    np.testing.assert_array_equal(b, [-0.25, -0.25])
    assert opt.counts == {"a": 3, "b": 1} and opt.num_update == 3

    adam = optimizer.create("adam", learning_rate=0.1)
    for _ in range(5):
        adam.step("a", np.zeros(2), grad)
    fresh = np.zeros(2)
    adam.step("b", fresh, grad)           # t=1 for "b": the full bias correction
    np.testing.assert_allclose(fresh, -0.1 / (1 + 1e-8), rtol=1e-14)


def test_lr_mult_and_wd_mult_apply_per_key_and_int_keys_are_strings():
    opt = optimizer.create("sgd", learning_rate=0.1, wd=0.1, lr_mult={"w": 2.0},
                           wd_mult={1: 0.0})
    w, b, grad = np.ones(3), np.ones(3), np.full(3, 0.5)
    opt.step("w", w, grad)
    opt.step(1, b, grad)
    np.testing.assert_allclose(w, 1 - 0.2 * (0.5 + 0.1))
    np.testing.assert_allclose(b, 1 - 0.1 * 0.5)
    opt.step("1", b, grad)
    assert opt.counts == {"w": 1, "1": 2}


# -- specs and checkpoints ------------------------------------------------------------------

ALL_CASES = [
    ("sgd", dict(learning_rate=0.1)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01)),
    ("sgd", dict(learning_rate=0.05, momentum=0.8, nesterov=True, wd=0.02, clip_gradient=1.0)),
    ("adam", dict(learning_rate=0.01, wd=0.1, rescale_grad=0.5)),
    ("adam", dict(lr_scheduler=lr_scheduler.FactorScheduler(step=3, factor=0.5, base_lr=0.02),
                  lr_mult={0: 2.0}, wd_mult={1: 0.5}, wd=0.1)),
    ("adamw", dict(learning_rate=0.01, wd=0.1)),
    ("rmsprop", dict(learning_rate=0.01, momentum=0.9, wd=0.05)),
    ("rmsprop", dict(learning_rate=0.01, centered=True, momentum=0.5, clip_gradient=0.8)),
    ("adagrad", dict(learning_rate=0.1, wd=0.05, lr_decay=0.01, initial_accumulator_value=0.1)),
    ("lamb", dict(learning_rate=0.01, wd=0.01)),
    ("lamb", dict(bias_correction=False, lower_bound=0.5, upper_bound=3.0,
                  lr_scheduler=lr_scheduler.CosineScheduler(max_update=8, base_lr=0.01,
                                                            warmup_steps=2))),
]
ALL_IDS = [f"{c[0]}-{i}" for i, c in enumerate(ALL_CASES)]


@pytest.mark.parametrize("name,params", ALL_CASES, ids=ALL_IDS)
def test_spec_through_json_rebuilds_an_identical_optimizer(name, params):
    opt = optimizer.create(name, **params)
    text = json.dumps(opt.spec(), allow_nan=False)
    rebuilt = optimizer.from_spec(json.loads(text))
    assert type(rebuilt) is type(opt) and rebuilt.spec() == opt.spec()
    weights, grads = random_problem(seed=5, steps=6)
    for mine, theirs in zip(run(opt, weights, grads), run(rebuilt, weights, grads)):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("name,params", ALL_CASES, ids=ALL_IDS)
def test_checkpoint_through_savez_continues_bit_for_bit(name, params, tmp_path):
    weights, grads = random_problem(seed=7, steps=10)
    uninterrupted = optimizer.create(name, **params)
    expected = run(uninterrupted, weights, grads)

    first = optimizer.create(name, **params)
    halfway = run(first, weights, grads[:4])
    np.savez(tmp_path / "optimizer.npz", **first.state_dict())
    with np.load(tmp_path / "optimizer.npz", allow_pickle=False) as saved:
        resumed = optimizer.from_state_dict(saved)
    result = run(resumed, halfway, grads[4:])

    for mine, theirs in zip(result, expected):
        np.testing.assert_array_equal(mine, theirs)
    assert resumed.counts == uninterrupted.counts
    assert resumed.num_update == uninterrupted.num_update == 10
    for key, state in uninterrupted.states.items():
        for slot, value in state.items():
            np.testing.assert_array_equal(resumed.states[key][slot], value)


def test_state_dict_is_a_snapshot_and_loads_into_a_fresh_optimizer():
    weights, grads = random_problem(seed=8, steps=3)
    opt = optimizer.create("adam", learning_rate=0.01)
    run(opt, weights, grads)
    saved = opt.state_dict()
    frozen = {name: value.copy() for name, value in saved.items()}
    run(opt, weights, grads)
    for name, value in saved.items():
        np.testing.assert_array_equal(value, frozen[name])
    fresh = optimizer.create("adam", learning_rate=0.005)  # hyper-parameters may change
    fresh.load_state_dict(frozen)
    assert fresh.counts == {"0": 3, "1": 3}
    assert set(optimizer.read_meta(frozen)) >= {"optimizer", "keys", "counts"}


@pytest.mark.parametrize("name,params", ALL_CASES, ids=ALL_IDS)
def test_the_gradient_is_never_changed(name, params):
    weights, grads = random_problem(seed=9, steps=2)
    before = [[g.copy() for g in step] for step in grads]
    run(optimizer.create(name, **params), weights, grads)
    for step, step_before in zip(grads, before):
        for grad, grad_before in zip(step, step_before):
            np.testing.assert_array_equal(grad, grad_before)


# -- dtypes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name,params", ALL_CASES, ids=ALL_IDS)
def test_float32_stays_float32(name, params):
    weights32, grads32 = random_problem(seed=10, steps=5, dtype=np.float32)
    opt = optimizer.create(name, **params)
    result = run(opt, weights32, grads32)
    assert all(w.dtype == np.float32 for w in result)
    assert all(v.dtype == np.float32 for s in opt.states.values() for v in s.values())
    weights64, grads64 = random_problem(seed=10, steps=5, dtype=np.float32)
    as64 = [w.astype(np.float64) for w in weights64]
    grads64 = [[g.astype(np.float64) for g in step] for step in grads64]
    for w32, w64 in zip(result, run(optimizer.create(name, **params), as64, grads64)):
        np.testing.assert_allclose(w32, w64, rtol=1e-4, atol=1e-5)


def test_numpy_scalar_hyper_parameters_do_not_promote_float32():
    opt = optimizer.create("adam", learning_rate=np.float64(0.01), beta1=np.float64(0.9),
                           wd=np.float64(0.1))
    weight = np.ones(3, np.float32)
    opt.step("w", weight, np.ones(3, np.float32))
    assert weight.dtype == np.float32 and type(opt.spec()["params"]["beta1"]) is float


def test_a_float64_checkpoint_continues_a_float32_run_in_float32():
    opt = optimizer.create("sgd", momentum=0.9)
    opt.step("w", np.ones(3), np.ones(3))
    resumed = optimizer.from_state_dict(opt.state_dict())
    weight = np.ones(3, np.float32)
    resumed.step("w", weight, np.ones(3, np.float32))
    assert weight.dtype == resumed.states["w"]["momentum"].dtype == np.float32


# -- gradient clipping ----------------------------------------------------------------------

def test_clip_global_norm_scales_to_max_norm_and_returns_the_norm():
    grads = [np.array([3.0, 0.0]), np.array([[0.0], [4.0]])]
    total = optimizer.clip_global_norm(grads, max_norm=1.0)
    assert float(total) == 5.0
    scale = 1.0 / (5.0 + 1e-6)
    np.testing.assert_array_equal(grads[0], np.array([3.0, 0.0]) * scale)
    np.testing.assert_array_equal(grads[1], np.array([[0.0], [4.0]]) * scale)


def test_clip_global_norm_leaves_small_gradients_alone_and_keeps_float32():
    grads = [np.array([0.3, -0.4], np.float32), np.array([0.1], np.float32)]
    before = [g.copy() for g in grads]
    total = optimizer.clip_global_norm(grads, max_norm=10.0)
    assert total.dtype == np.float32 and grads[0].dtype == np.float32
    for grad, original in zip(grads, before):
        np.testing.assert_array_equal(grad, original)


def test_clip_global_norm_infinity_norm():
    grads = [np.array([1.0, -6.0]), np.array([2.0])]
    assert float(optimizer.clip_global_norm(grads, max_norm=3.0, norm_type=float("inf"))) == 6.0
    np.testing.assert_allclose(grads[0], [0.5, -3.0], rtol=1e-6)


def test_clip_global_norm_matches_pytorch():
    torch = pytest.importorskip("torch")
    _, (grads,) = random_problem(seed=12, steps=1)
    tensors = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads]
    for tensor, grad in zip(tensors, grads):
        tensor.grad = torch.from_numpy(grad.copy())
    expected_total = torch.nn.utils.clip_grad_norm_(tensors, max_norm=0.7)
    total = optimizer.clip_global_norm(grads, max_norm=0.7)
    assert float(total) == pytest.approx(float(expected_total), rel=1e-14)
    for grad, tensor in zip(grads, tensors):
        np.testing.assert_allclose(grad, tensor.grad.numpy(), rtol=1e-14)


# -- errors ---------------------------------------------------------------------------------

def cosine(base_lr):
    return lr_scheduler.CosineScheduler(max_update=10, base_lr=base_lr)


@pytest.mark.parametrize("call,fragments", [
    (lambda: optimizer.create("adamax"), ["'adamax'", "'adam'", "'lamb'", "'sgd'"]),
    (lambda: optimizer.create("sgd", momentun=0.9), ["'momentun'", "'momentum'"]),
    (lambda: optimizer.create("adam", beta1=1.0), ["beta1=1.0", "[0.0, 1.0)"]),
    (lambda: optimizer.create("sgd", learning_rate=-1), ["learning_rate=-1.0"]),
    (lambda: optimizer.create("sgd", nesterov=True), ["nesterov"]),
    (lambda: optimizer.create("sgd", nesterov="yes"), ["nesterov", "'yes'"]),
    (lambda: optimizer.create("sgd", clip_gradient=0), ["clip_gradient"]),
    (lambda: optimizer.create("sgd", wd="0.1"), ["wd", "'0.1'"]),
    (lambda: optimizer.create("sgd", lr_mult={"w": -1}), ["lr_mult['w']"]),
    (lambda: optimizer.create("lamb", lower_bound=2, upper_bound=1), ["lower_bound=2"]),
    (lambda: optimizer.create("sgd", learning_rate=0.1, lr_scheduler=cosine(0.2)),
     ["learning_rate=0.1", "base_lr=0.2"]),
    (lambda: optimizer.create("sgd", lr_scheduler="cosine"), ["lr_scheduler"]),
    (lambda: optimizer.from_spec({"name": "sgd"}), ["spec"]),
    (lambda: optimizer.from_spec({"name": "sgd", "params": {
        "lr_scheduler": {"name": "cosin", "params": {}}}}), ["'cosin'", "'cosine'"]),
    (lambda: optimizer.create("sgd", lr_scheduler=cosine(0.1)).set_learning_rate(0.5),
     ["lr_scheduler"]),
    (lambda: optimizer.clip_global_norm([np.ones(2)], 1.0, norm_type=1), ["norm_type=1"]),
    (lambda: optimizer.clip_global_norm([np.ones(2)], 0.0), ["max_norm"]),
])
def test_bad_requests_raise_a_typed_error_naming_the_value(call, fragments):
    with pytest.raises(OptimizerError) as caught:
        call()
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_bad_updates_raise_typed_errors():
    opt = optimizer.create("sgd", momentum=0.9)
    weight = np.ones((2, 3))
    with pytest.raises(ShapeError, match="'w'"):
        opt.step("w", weight, np.ones(3))
    with pytest.raises(OptimizerError, match="float32"):
        opt.step("w", weight, np.ones((2, 3), np.float32))
    with pytest.raises(OptimizerError, match="'momentum'"):
        opt.update("w", weight, np.ones((2, 3)), {})
    with pytest.raises(OptimizerError, match="key"):
        opt.step(("w", 1), weight, np.ones((2, 3)))
    with pytest.raises(OptimizerError, match="int64"):
        opt.step("i", np.ones(3, np.int64), np.ones(3, np.int64))


def test_checkpoints_that_do_not_fit_are_refused():
    adam = optimizer.create("adam")
    adam.step("w", np.ones(2), np.ones(2))
    with pytest.raises(OptimizerError, match="'adam'"):
        optimizer.create("sgd").load_state_dict(adam.state_dict())
    with_momentum = optimizer.create("sgd", momentum=0.9)
    with_momentum.step("w", np.ones(2), np.ones(2))
    with pytest.raises(OptimizerError, match="unexpected.*state0.momentum"):
        optimizer.create("sgd").load_state_dict(with_momentum.state_dict())
    with pytest.raises(OptimizerError, match="meta"):
        adam.load_state_dict({"state0.mean": np.ones(2)})
    for meta, message in [('{"format": 99}', "format"), ("[1, 2", "JSON"),
                          ('{"format": 1, "optimizer": {"name": "adam"}, "keys": [0]}', "meta")]:
        with pytest.raises(OptimizerError, match=message):
            adam.load_state_dict(dict(adam.state_dict(), meta=np.array(meta)))
    with pytest.raises(OptimizerError, match="floating"):
        adam.load_state_dict(dict(adam.state_dict(), **{"state0.mean": np.array(["a", "b"])}))
    resumed = optimizer.from_state_dict(adam.state_dict())
    with pytest.raises(ShapeError, match="'mean'"):
        resumed.step("w", np.ones(3), np.ones(3))


# -- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("name,params", ALL_CASES, ids=ALL_IDS)
def test_cupy_matches_numpy_and_checkpoints_move_between_devices(name, params):
    cupy = pytest.importorskip("cupy")
    from mixrt.ops.device import gpu_available
    if not gpu_available():
        pytest.skip("no CUDA GPU")
    weights, grads = random_problem(seed=13, steps=6, dtype=np.float32)
    expected = run(optimizer.create(name, **params), weights, grads)
    on_gpu = optimizer.create(name, **params)
    gpu_weights = [cupy.asarray(w) for w in weights]
    gpu_grads = [[cupy.asarray(g) for g in step] for step in grads]
    halfway = run(on_gpu, gpu_weights, gpu_grads[:3])
    resumed = optimizer.from_state_dict(on_gpu.state_dict())   # host arrays
    result = run(resumed, halfway, gpu_grads[3:])              # moved back to the GPU
    for mine, reference in zip(result, expected):
        assert isinstance(mine, cupy.ndarray) and mine.dtype == np.float32
        np.testing.assert_allclose(cupy.asnumpy(mine), reference, rtol=2e-5, atol=2e-6)
    with pytest.raises(DeviceMismatchError):
        on_gpu.step(0, gpu_weights[0], grads[0][0])


@pytest.mark.gpu
@pytest.mark.parametrize("name,params", [
    ("sgd", dict(learning_rate=0.1)), ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, nesterov=True)),
    ("adam", dict(learning_rate=0.01, wd=0.1)), ("adamw", dict(learning_rate=0.01, wd=0.1))])
def test_a_gpu_update_is_one_launch_per_parameter(name, params, monkeypatch):
    """SGD, Adam and AdamW update each weight and its state in one kernel on a GPU
    (each one's ``one_launch``), where their array expressions launched 6-12."""
    cupy = pytest.importorskip("cupy")
    from mixrt.ops.device import gpu_available
    from mixrt.runtime.training import optimizer_kernels
    if not gpu_available():
        pytest.skip("no CUDA GPU")
    launches = []
    compiled = optimizer_kernels.compiled_elementwise

    def counted(*args):
        kernel = compiled(*args)
        return lambda *arrays: (launches.append(args[-1]), kernel(*arrays))[1]
    monkeypatch.setattr(optimizer_kernels, "compiled_elementwise", counted)
    weights, grads = random_problem(seed=3, steps=2, dtype=np.float32)
    expected = run(optimizer.create(name, **params), weights, grads)
    result = run(optimizer.create(name, **params), [cupy.asarray(w) for w in weights],
                 [[cupy.asarray(g) for g in step] for step in grads])
    assert len(launches) == 2 * len(weights)
    for mine, reference in zip(result, expected):  # --fmad=false: the CPU's very bits
        np.testing.assert_array_equal(cupy.asnumpy(mine), reference)


MANY_CASES = [
    ("sgd", dict(learning_rate=0.1)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.5)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, nesterov=True, clip_gradient=0.8)),
    ("adam", dict(learning_rate=0.01, wd=0.1, clip_gradient=1.5)),
    ("adamw", dict(learning_rate=0.01, wd=0.1, rescale_grad=2.0))]


def run_many(opt, weights, grads):
    """``run`` with each step's weights updated together (``step_many``)."""
    weights = [w.copy() for w in weights]
    for step_grads in grads:
        opt.step_many([(key, w, g) for key, (w, g) in enumerate(zip(weights, step_grads))])
    return weights


def _multiplied(opt):
    """Key 0 learns at twice the rate, key 2 without weight decay (lr_mult, wd_mult)."""
    opt.lr_mult, opt.wd_mult = {"0": 2.0}, {"2": 0.0}
    return opt


@pytest.mark.parametrize("name,params", MANY_CASES, ids=[c[0] for c in MANY_CASES])
def test_stepping_many_weights_on_the_cpu_is_stepping_each(name, params):
    weights, grads = random_problem(seed=8, steps=3)
    expected = run(_multiplied(optimizer.create(name, **params)), weights, grads)
    result = run_many(_multiplied(optimizer.create(name, **params)), weights, grads)
    for mine, reference in zip(result, expected):
        np.testing.assert_array_equal(mine, reference)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,params", MANY_CASES, ids=[c[0] for c in MANY_CASES])
def test_a_gpu_step_of_every_weight_is_one_launch(name, params, dtype, monkeypatch):
    """step_many on a GPU: one multi-tensor launch a step for all the weights, each with its
    own lr_mult and wd_mult, the gradients rescaled and clipped, as stepping each weight on
    the CPU gives."""
    cupy = pytest.importorskip("cupy")
    from mixrt.ops.device import gpu_available
    if not gpu_available():
        pytest.skip("no CUDA GPU")
    launches = counted_optimizer_launches(monkeypatch)
    weights, grads = random_problem(seed=9, steps=3, dtype=dtype)
    expected = run(_multiplied(optimizer.create(name, **params)), weights, grads)
    result = run_many(_multiplied(optimizer.create(name, **params)),
                      [cupy.asarray(w) for w in weights],
                      [[cupy.asarray(g) for g in step] for step in grads])
    assert len(launches) == 3
    for mine, reference in zip(result, expected):  # --fmad=false: the CPU's very bits
        np.testing.assert_array_equal(cupy.asnumpy(mine), reference)


@pytest.mark.skipif(nvrtc() is None, reason="NVRTC is not installed")
@pytest.mark.parametrize("kernel,flags", [
    ("sgd", dict(MOMENTUM=0, NESTEROV=0, CLIP=0)), ("sgd", dict(MOMENTUM=1, NESTEROV=1, CLIP=1)),
    ("sgd", dict(MOMENTUM=1, NESTEROV=0, CLIP=0)), ("adam", dict(DECOUPLED=0, CLIP=1)),
    ("adam", dict(DECOUPLED=1, CLIP=0)), ("mxnet_sgd", dict(MOMENTUM=1, CLIP=1)),
    ("mxnet_sgd", dict(MOMENTUM=0, CLIP=0))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_multi_tensor_kernels_compile(kernel, flags, dtype):
    """The CUDA C of the multi-tensor updates, compiled by NVRTC for Hopper (no GPU needed
    to compile; a GPU run checks what they compute)."""
    status, log = nvrtc_compile(kernel_source(kernel, dtype, **flags))
    assert status == 0, log


@pytest.mark.gpu
def test_a_kind_without_a_multi_tensor_form_counts_each_gpu_step_once(monkeypatch):
    """MXNet's NAG on a server (``mxnet_sgd`` with nesterov) has no multi-tensor form: on a
    GPU its step_many steps weight by weight, each update counted once (it was counted twice,
    the counts advanced for the multi-tensor launch it then declined), so a schedule reads
    the right ``num_update``."""
    cupy = pytest.importorskip("cupy")
    from mixrt.ops.device import gpu_available
    if not gpu_available():
        pytest.skip("no CUDA GPU")
    launches = counted_optimizer_launches(monkeypatch)
    weights, grads = random_problem(seed=4, steps=3)
    params = {"momentum": 0.9, "nesterov": True, "learning_rate": 0.1}
    expected = optimizer.create("mxnet_sgd", **params)
    on_the_cpu = run(expected, weights, grads)
    nag = optimizer.create("mxnet_sgd", **params)
    result = run_many(nag, [cupy.asarray(w) for w in weights],
                      [[cupy.asarray(g) for g in step] for step in grads])
    assert not launches
    assert nag.counts == expected.counts == {str(k): 3 for k in range(len(weights))}
    assert nag.num_update == 3
    for mine, reference in zip(result, on_the_cpu):
        np.testing.assert_allclose(cupy.asnumpy(mine), reference, rtol=1e-6)
