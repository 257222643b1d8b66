"""One arithmetic for each optimizer wherever it runs, bit for bit in float32 and float64:

* MXNet's optimizers (``mixrt.optimizer``) in this process: through their Updater on NDArrays
  and through a gluon Trainer;
* on a parameter server: what ``kvstore/dist/server.py`` runs, the engine optimizer rebuilt
  from the spec the worker sends (``mxnet_sgd`` and ``mxnet_adam`` for MXNet's kinds);
  tests/kvstore/test_dist.py runs one with real processes;
* on a GPU: the kernels' CUDA C (each optimizer's, in ``runtime/training/optimizers/``: the
  multi-tensor RawKernels and the one-weight ElementwiseKernels' bodies), compiled here for
  the host by the C++ compiler with every product and sum rounded alone (as NVRTC's ``--fmad=false``
  has them) and run on host memory, against the CPU's steps. The engine's own kinds
  (PyTorch's rules) are checked the same way. A real GPU's run of the same comparison
  waits for a machine with one (tests/test_optimizer.py compares CuPy with NumPy there).

MXNet's operators take their hyper-parameters as C floats, so in float64 momentum 0.9 is
0.899999976158..., and the issue's case (two steps of gradients 3 and 7, lr 0.5, momentum
0.9, from 0) ends at -6.349999964237213 under MXNet 1.9.1, not -6.35."""

import ctypes
import hashlib
import itertools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import kernel_source, nvrtc

import mixrt
from mixrt import autograd, gluon, lr_scheduler, nd
from mixrt.base.errors import OptimizerError
from mixrt.runtime.training import optimizer as engine
from mixrt.runtime.training import optimizer_kernels, update_rules
from mixrt.runtime.training.optimizers import (adagrad, ftrl, lamb, rmsprop, signum,
                                                torch_adam, torch_sgd)

DTYPES = [np.float32, np.float64]
STEPS = 6
SHAPES = [(3, 5), (7,)]

# (MXNet's optimizer, its options): wd, clip_gradient and rescale_grad set; one without
# clipping (MXNet multiplies lr and rescale_grad first then) and one with a schedule
MXNET_CASES = [
    ("sgd", dict(learning_rate=0.1, wd=0.01, clip_gradient=0.75, rescale_grad=0.25)),
    ("sgd", dict(learning_rate=0.5, momentum=0.9, wd=0.01, clip_gradient=0.75,
                 rescale_grad=0.25)),
    ("sgd", dict(learning_rate=0.3, momentum=0.9, wd=0.02, rescale_grad=0.25)),
    ("sgd", dict(momentum=0.9, wd=0.01, clip_gradient=0.75,
                 lr_scheduler=lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.5))),
    ("nag", dict(learning_rate=0.1, momentum=0.9, wd=0.01, clip_gradient=0.75,
                 rescale_grad=0.25)),
    ("nag", dict(learning_rate=0.1, momentum=0.8, wd=0.03, rescale_grad=0.5)),
    ("nag", dict(learning_rate=0.1, wd=0.03, clip_gradient=0.75)),  # sgd_update's rounding
    ("adam", dict(learning_rate=0.01, wd=0.01, clip_gradient=0.75, rescale_grad=0.25)),
    ("adam", dict(learning_rate=0.02, beta1=0.8, beta2=0.99, epsilon=1e-6, wd=0.05)),
    ("rmsprop", dict(learning_rate=0.01, wd=0.01, clip_gradient=0.75, rescale_grad=0.25,
                     clip_weights=1.2)),
    ("rmsprop", dict(learning_rate=0.02, gamma1=0.95, epsilon=1e-6, wd=0.05)),
    ("rmsprop", dict(learning_rate=0.01, centered=True, wd=0.01, clip_gradient=0.75,
                     rescale_grad=0.25, clip_weights=1.2)),
    ("rmsprop", dict(learning_rate=0.02, centered=True, gamma1=0.95, gamma2=0.8,
                     epsilon=1e-6, wd=0.05)),
    ("adagrad", dict(learning_rate=0.1, wd=0.01, clip_gradient=0.75, rescale_grad=0.25)),
    ("adagrad", dict(learning_rate=0.05, eps=1e-6, wd=0.02, rescale_grad=0.5)),
    ("ftrl", dict(learning_rate=0.1, lamda1=0.01, beta=1.0, wd=0.01, clip_gradient=0.75,
                  rescale_grad=0.25)),
    ("ftrl", dict(learning_rate=0.2, lamda1=0.3, beta=0.5, wd=0.02, rescale_grad=0.5)),
    ("signum", dict(learning_rate=0.01, momentum=0.9, wd=0.01, wd_lh=0.02, clip_gradient=0.75,
                    rescale_grad=0.25)),
    ("signum", dict(learning_rate=0.03, momentum=0.8, wd=0.03, rescale_grad=0.5)),
    ("signum", dict(learning_rate=0.1, momentum=0.0, wd=0.03)),  # signSGD
    ("lamb", dict(learning_rate=0.01, wd=0.01, clip_gradient=0.75, rescale_grad=0.25)),
    ("lamb", dict(learning_rate=0.02, beta1=0.8, beta2=0.99, epsilon=1e-5, wd=0.05,
                  lower_bound=0.5, upper_bound=2.0)),
    ("lamb", dict(learning_rate=0.02, wd=0.02, bias_correction=False, rescale_grad=0.5)),
]
CASE_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(MXNET_CASES)]


def problem(dtype, seed=0):
    """Start weights and STEPS steps of gradients, large enough that clipping acts."""
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(shape).astype(dtype) for shape in SHAPES]
    grads = [[(3 * rng.standard_normal(shape)).astype(dtype) for shape in SHAPES]
             for _ in range(STEPS)]
    return weights, grads


def bits(array) -> np.ndarray:
    array = np.asarray(array)
    return array.view({4: np.int32, 8: np.int64}[array.dtype.itemsize])


def assert_same_bits(got, expected):
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        assert np.array_equal(bits(a), bits(b)), f"{a!r} != {b!r}"


# -- the three paths of an MXNet optimizer ---------------------------------------------

def mxnet_optimizer(name, options):
    return mixrt.optimizer.create(name, **dict(options))


def through_the_updater(name, options, weights, grads):
    """MXNet's optimizer in this process, through its Updater on NDArrays."""
    updater = mixrt.optimizer.get_updater(mxnet_optimizer(name, options))
    arrays = [nd.array(w, dtype=w.dtype) for w in weights]
    for step in grads:
        for key, (weight, grad) in enumerate(zip(arrays, step)):
            updater(key, nd.array(grad, dtype=grad.dtype), weight)
    return [a.asnumpy() for a in arrays]


def through_a_trainer(name, options, weights, grads):
    """gluon.Trainer: the gradients come from a backward pass (d(sum(w * g))/dw = g
    exactly) and ``step(batch)`` sets rescale_grad to 1 / batch, as MXNet's does."""
    options = dict(options)
    batch = 1 / options.pop("rescale_grad", 1.0)
    params = []
    for index, weight in enumerate(weights):
        param = gluon.Parameter(f"p{index}_weight", shape=weight.shape, dtype=weight.dtype)
        param.initialize(init="zeros")
        param.set_data(nd.array(weight, dtype=weight.dtype))
        params.append(param)
    trainer = gluon.Trainer(params, name, options)
    for step in grads:
        with autograd.record():
            losses = [(p.data() * nd.array(g, dtype=g.dtype)).sum()
                      for p, g in zip(params, step)]
        autograd.backward(losses)
        trainer.step(batch)
    return [p.data().asnumpy() for p in params]


def on_a_server(spec, weights, grads):
    """What a parameter server runs: the engine optimizer rebuilt from the spec the worker
    sends (through JSON, as the wire carries it), stepped on the host arrays
    (``server.py``: ``optimizer.step(shard.key, shard.value, shard.merged)``)."""
    optimizer = engine.from_spec(json.loads(json.dumps(spec)))
    weights = [w.copy() for w in weights]
    for step in grads:
        for key, (weight, grad) in enumerate(zip(weights, step)):
            optimizer.step(str(key), weight, grad)
    return weights


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_issues_case_is_mxnets_number_on_every_path(dtype):
    options = dict(learning_rate=0.5, momentum=0.9)
    weights, grads = [np.zeros(1, dtype)], [[np.full(1, 3, dtype)], [np.full(1, 7, dtype)]]
    # MXNet's SGDMomKernel: mom = momentum * mom - lr * wd * w - lr * rescale_grad * g,
    # w += mom, with momentum the C float 0.9 cast to the weight's dtype
    momentum = dtype(np.float32(0.9))
    mom = dtype(0) - dtype(0.5) * dtype(1) * dtype(3)
    weight = dtype(0) + mom
    mom = momentum * mom - dtype(0.5) * dtype(0) * weight - dtype(0.5) * dtype(1) * dtype(7)
    expected = [np.array([weight + mom], dtype)]
    if dtype is np.float64:
        assert expected[0][0] == -6.349999964237213  # what MXNet 1.9.1 gives
    else:
        assert expected[0][0] == np.float32(-6.35)
    assert_same_bits(through_the_updater("sgd", options, weights, grads), expected)
    assert_same_bits(through_a_trainer("sgd", options, weights, grads), expected)
    spec = mxnet_optimizer("sgd", options).spec()
    assert_same_bits(on_a_server(spec, weights, grads), expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, options", MXNET_CASES, ids=CASE_IDS)
def test_an_mxnet_optimizer_takes_the_same_steps_locally_and_on_a_server(name, options,
                                                                          dtype):
    weights, grads = problem(dtype)
    local = through_the_updater(name, options, weights, grads)
    assert not any(np.array_equal(a, b) for a, b in zip(local, weights))
    assert_same_bits(through_a_trainer(name, options, weights, grads), local)
    assert_same_bits(on_a_server(mxnet_optimizer(name, options).spec(), weights, grads),
                     local)


@pytest.mark.parametrize("name, options", MXNET_CASES[:4], ids=CASE_IDS[:4])
def test_a_dist_trainer_sends_mxnets_rule_with_the_parameters_multipliers(name, options):
    params = [gluon.Parameter("a_weight", shape=(2,)), gluon.Parameter("b_weight", shape=(2,))]
    params[1].lr_mult, params[1].wd_mult = 0.5, 0.0
    spec = gluon.Trainer(params, name, dict(options))._engine_spec()
    assert spec["name"] == "mxnet_sgd"
    assert spec["params"]["lr_mult"] == {"b_weight": 0.5}
    assert spec["params"]["wd_mult"] == {"b_weight": 0.0}


@pytest.mark.parametrize("name, options, twin", [
    ("adagrad", {}, "mxnet_adagrad"), ("ftrl", {}, "mxnet_ftrl"),
    ("signum", {}, "mxnet_signum"), ("signum", {"momentum": 0.0}, "mxnet_signum"),
    ("lamb", {}, "mxnet_lamb"), ("rmsprop", {"centered": True}, "mxnet_rmsprop")])
def test_a_dist_trainer_sends_their_twins_without_a_warning(name, options, twin, recwarn):
    trainer = gluon.Trainer([gluon.Parameter("a_weight", shape=(2,))], name, options)
    assert trainer._engine_spec()["name"] == twin
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_an_optimizer_whose_steps_a_server_cannot_take_has_no_twin():
    """A dist Trainer then warns and sends the engine's kind of the name (its own rule)."""
    optimizer = mixrt.optimizer.create("lamb", param_idx2name={0: "a_weight"})
    with pytest.raises(OptimizerError, match="no engine twin"):
        optimizer.spec()


@pytest.mark.parametrize("dtype", DTYPES)
def test_mxnets_sgd_without_momentum_rounds_as_its_multi_tensor_operator(dtype):
    """MXNet's SGD updates dense weights with multi_sgd_update, even one alone, whose kernel
    computes w + (0 * 0 - lr * wd * w - lr * g), not sgd_update's (1 - lr * wd) * w - lr * g:
    the two differ in the last bit for some weights."""
    options = dict(learning_rate=0.1, wd=0.03, rescale_grad=0.25)
    weights, grads = problem(dtype, seed=4)
    local = through_the_updater("sgd", options, weights, grads[:1])
    multi, single = (nd.array(w, dtype=w.dtype) for w in (weights[0], weights[0]))
    grad = nd.array(grads[0][0], dtype=dtype)
    nd.multi_sgd_update(multi, grad, out=multi, lrs=[0.1], wds=[0.03], rescale_grad=0.25)
    nd.sgd_update(single, grad, out=single, lr=0.1, wd=0.03, rescale_grad=0.25)
    assert_same_bits([local[0]], [multi.asnumpy()])
    assert not np.array_equal(bits(multi.asnumpy()), bits(single.asnumpy()))


# -- the rules' text runs as written ----------------------------------------------------

def test_a_float_literal_is_refused_in_a_rule():
    """A C ``1.0`` is a double: in a float kernel it would promote the statement."""
    with pytest.raises(ValueError, match="integer literals"):
        update_rules.Rule("bad", ("weight",), (), ("lr",), ("weight = 1.0 - lr * weight",))
    update_rules.Rule("good", ("weight",), (), ("beta1",), ("weight = beta1 * weight",))


# -- the GPU's kernels, compiled for the host ------------------------------------------------

HOST_PRELUDE = """
#include <cmath>
using std::sqrt;
#define __global__
#define __device__
#define __forceinline__ inline
struct mixrt_dim3 { long long x; };
static const mixrt_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""
COMPILER = shutil.which("g++") or shutil.which("c++")
needs_compiler = pytest.mark.skipif(COMPILER is None, reason="no C++ compiler to build "
                                                               "the kernels for the host")
_BUILT = Path(tempfile.mkdtemp(prefix="mixrt-host-kernels-"))


class HostArray:
    """A NumPy array seen as the kernels' callers see a CuPy one: ``data.ptr`` is its
    address (here host memory, which the host-compiled kernel reads)."""

    def __init__(self, array: np.ndarray):
        self.array = array
        self.dtype, self.size, self.flags = array.dtype, array.size, array.flags

    @property
    def data(self):
        return type("Memory", (), {"ptr": self.array.ctypes.data})()


class HostKernel:
    """A kernel's CUDA C built as C++ for the host, without contracting a product and a sum
    into a fused multiply-add (``-ffp-contract=off``, as NVRTC's ``--fmad=false``), and
    launched as one thread that walks the grid-stride loop over every element."""

    def __init__(self, code: str, name: str, options=()):
        assert update_rules.FMAD in options, "every kernel is compiled without FMA"
        self.function = getattr(_host_library(HOST_PRELUDE + code), name)

    def __call__(self, grid, block, args):
        self.function(*(_c_argument(a) for a in args))


class HostElementwiseKernel:
    """A one-weight ElementwiseKernel's body in a host loop, each parameter bound by
    reference to its element (an array) or passed by value (a scalar), as CuPy binds them."""

    def __init__(self, in_params: str, out_params: str, body: str, name: str, options=()):
        assert update_rules.FMAD in options, "every kernel is compiled without FMA"
        self.names = [p.split()[-1] for p in f"{in_params}, {out_params}".split(",")]
        self.body = body

    def __call__(self, *args):
        dtype = next(a.dtype for a in args if isinstance(a, np.ndarray))
        arrays = [isinstance(a, np.ndarray) for a in args]
        parameters = ", ".join(f"T* {n}_" if is_array else f"T {n}"
                               for n, is_array in zip(self.names, arrays))
        bound = " ".join(f"T& {n} = {n}_[i];" for n, is_array in zip(self.names, arrays)
                         if is_array)
        code = (f"#define T {optimizer_kernels.MANY_DTYPES[dtype]}\n{HOST_PRELUDE}"
                f'extern "C" void run(long long n, {parameters}) {{\n'
                f"for (long long i = 0; i < n; ++i) {{ {bound}\n{self.body}\n}}\n}}\n")
        size = next(a.size for a in args if isinstance(a, np.ndarray))
        _host_library(code).run(ctypes.c_longlong(size), *(
            _c_argument(a if is_array else dtype.type(a)) for a, is_array in zip(args, arrays)))


def _host_library(source: str):
    """``source`` built as a shared library (once per text) and loaded."""
    library = _BUILT / f"{hashlib.sha256(source.encode()).hexdigest()[:16]}.so"
    if not library.exists():
        path = library.with_suffix(".cpp")
        path.write_text(source)
        subprocess.run([COMPILER, "-O2", "-ffp-contract=off", "-fno-fast-math", "-shared",
                        "-fPIC", "-o", str(library), str(path)], check=True)
    return ctypes.CDLL(str(library))


def _c_argument(value):
    if isinstance(value, np.ndarray):
        return ctypes.c_void_p(value.ctypes.data)
    return {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
            np.dtype(np.int32): ctypes.c_int32,
            np.dtype(np.int64): ctypes.c_int64}[np.asarray(value).dtype](value)


class HostModule:
    """The few names of CuPy's the multi-tensor launchers use, on host memory."""

    RawKernel = HostKernel
    ElementwiseKernel = HostElementwiseKernel

    @staticmethod
    def asarray(values):
        return np.ascontiguousarray(values)


HOST = HostModule()


def through_the_kernel(optimizer, weights, grads):
    """``optimizer``'s multi-tensor update (``_apply_many``, what ``step_many`` launches on
    a GPU) with each step's lr, wd and counts as ``step_many`` advances them."""
    weights = [w.copy() for w in weights]
    keys = [str(k) for k in range(len(weights))]
    states = [{slot: HostArray(a) for slot, a in optimizer.create_state(k, w).items()}
              for k, w in zip(keys, weights)]
    for step in grads:
        lrs, wds, counts = zip(*(optimizer._advance(key) for key in keys))
        assert optimizer._apply_many(HOST, [HostArray(w) for w in weights],
                                     [HostArray(g) for g in step], states, list(lrs),
                                     list(wds), list(counts))
    return weights


@needs_compiler
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, options", [c for c in MXNET_CASES if c[0] == "sgd"],
                         ids=[i for i, c in zip(CASE_IDS, MXNET_CASES) if c[0] == "sgd"])
def test_mxnets_sgd_kernel_takes_the_cpus_steps(name, options, dtype):
    weights, grads = problem(dtype)
    local = through_the_updater(name, options, weights, grads)
    twin = engine.from_spec(mxnet_optimizer(name, options).spec())
    assert_same_bits(through_the_kernel(twin, weights, grads), local)


ENGINE_CASES = [
    ("sgd", dict(learning_rate=0.1, wd=0.01, clip_gradient=0.75, rescale_grad=0.25)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, wd=0.01, clip_gradient=0.75,
                 rescale_grad=0.25)),
    ("sgd", dict(learning_rate=0.1, momentum=0.9, nesterov=True, wd=0.01, rescale_grad=0.5)),
    ("adam", dict(learning_rate=0.01, wd=0.01, clip_gradient=0.75, rescale_grad=0.25)),
    ("adamw", dict(learning_rate=0.01, wd=0.1, clip_gradient=0.75, rescale_grad=0.25)),
    ("adamw", dict(learning_rate=0.01, beta1=0.8, epsilon=1e-6, wd=0.0)),
]


@needs_compiler
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, options", ENGINE_CASES,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(ENGINE_CASES)])
def test_the_engines_kernels_take_the_cpus_steps(name, options, dtype):
    weights, grads = problem(dtype)
    on_the_cpu = on_a_server(engine.create(name, **options).spec(), weights, grads)
    kernel = through_the_kernel(engine.create(name, **options), weights, grads)
    assert_same_bits(kernel, on_the_cpu)


@needs_compiler
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, options", ENGINE_CASES,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(ENGINE_CASES)])
def test_the_engines_one_weight_kernels_take_the_cpus_steps(name, options, dtype):
    """``_apply`` given a GPU's module launches one ElementwiseKernel (its body compiled
    here for the host) where the CPU runs its array expressions."""
    weights, grads = problem(dtype)
    on_the_cpu = on_a_server(engine.create(name, **options).spec(), weights, grads)
    optimizer = engine.create(name, **options)
    weights = [w.copy() for w in weights]
    states = [optimizer.create_state(str(k), w) for k, w in enumerate(weights)]
    for step in grads:
        for key, (weight, grad, state) in enumerate(zip(weights, step, states)):
            lr, wd, t = optimizer._advance(str(key))
            optimizer._apply(HOST, weight, optimizer._rescaled_clipped(grad), state, lr, wd,
                             t)
    assert_same_bits(weights, on_the_cpu)


def test_every_kernel_is_built_without_fused_multiply_adds(monkeypatch):
    """The one-weight ElementwiseKernels as well as the multi-tensor RawKernels."""
    made = []
    record = staticmethod(lambda *args, options=(): made.append(options))
    monkeypatch.setattr(HostModule, "RawKernel", record, raising=False)
    monkeypatch.setattr(HostModule, "ElementwiseKernel", record, raising=False)
    optimizer_kernels.raw_kernel.__wrapped__(HOST, "code", "name")
    optimizer_kernels.compiled_elementwise.__wrapped__(HOST, "T g", "T w", "w = g;", "name")
    assert made == [(update_rules.FMAD,)] * 2


# MXNet's rules that no kernel runs yet, each compiled as written into a host loop: the C
# reading of the text (the CUDA helpers included) takes the same steps as its Python one
RULES_AS_C = [
    adagrad.adagrad(True), adagrad.adagrad(False), ftrl.ftrl(True), ftrl.ftrl(False),
    signum.signsgd(), signum.signum(True), signum.signum(False),
    rmsprop.rmsprop_centered(True, True), rmsprop.rmsprop_centered(False, False),
    lamb.direction(True, True), lamb.direction(False, False), lamb.STEP]


def _rule_as_host_loop(rule, dtype, outputs):
    """``rule``'s C statements in a loop over host arrays, ``outputs`` (locals) stored too."""
    arrays = rule.arrays + rule.inputs + tuple(outputs)
    body = update_rules.cuda_statements(rule, lambda n: f"{n}_[i]", lambda n: f"{n}_[i]")
    body += "".join(f"        {n}_[i] = {n};\n" for n in outputs)
    parameters = ", ".join([f"T* {n}_" for n in arrays] + [f"T {n}" for n in rule.scalars])
    code = (f"#define T {optimizer_kernels.MANY_DTYPES[np.dtype(dtype)]}\n{HOST_PRELUDE}"
            f"{update_rules.CUDA_HELPERS}"
            f'extern "C" void run(long long n, {parameters}) {{\n'
            f"    for (long long i = 0; i < n; ++i) {{\n{body}    }}\n}}\n")
    return _host_library(code).run


@needs_compiler
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULES_AS_C,
                         ids=[f"{rule.name}-{i}" for i, rule in enumerate(RULES_AS_C)])
def test_mxnets_rules_read_as_c_take_the_same_steps(rule, dtype):
    rng = np.random.default_rng(7)
    values = {n: rng.standard_normal(64).astype(dtype) for n in rule.arrays + rule.inputs}
    values["grad" if "grad" in values else "direction"][:8] = 0  # sign and greater at zero
    for name in ("var", "n", "history"):  # what a square root reads stays positive (the
        if name in values:                   # centered one's n - g * g too, as n >= g * g)
            values[name] = np.abs(values[name]) + 4
    if "delta" in values:
        values["g"] *= dtype(0.1)
    scalars = {n: float(dtype(v)) for n, v in zip(rule.scalars, rng.uniform(0.05, 0.9, 16))}
    outputs = tuple(t for t, _, _ in rule.statements if t == "direction")  # LAMB's phase 1
    arrays = {n: values[n].copy() for n in rule.arrays}
    got = {n: values[n].copy() for n in rule.arrays + rule.inputs}
    got.update({n: np.zeros(64, dtype) for n in outputs})
    names = update_rules.run(rule, np, dtype, arrays,
                             {n: values[n] for n in rule.inputs}, scalars)
    _rule_as_host_loop(rule, dtype, outputs)(
        ctypes.c_longlong(64), *(_c_argument(got[n]) for n in rule.arrays + rule.inputs
                                 + outputs), *(_c_argument(dtype(v)) for v in scalars.values()))
    assert_same_bits([got[n] for n in rule.arrays + outputs],
                     [arrays[n] for n in rule.arrays] + [names[n] for n in outputs])


# -- what NVRTC makes of them: no fused multiply-add, every operation rounded alone ---------

def _ptx(source: str, *options: bytes) -> str:
    library, program = nvrtc(), ctypes.c_void_p()
    assert library.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"mixrt.cu", 0,
                                      None, None) == 0
    given = (b"--gpu-architecture=compute_90",) + options
    assert library.nvrtcCompileProgram(program, len(given),
                                       (ctypes.c_char_p * len(given))(*given)) == 0
    size = ctypes.c_size_t()
    library.nvrtcGetPTXSize(program, ctypes.byref(size))
    text = ctypes.create_string_buffer(size.value)
    library.nvrtcGetPTX(program, text)
    library.nvrtcDestroyProgram(ctypes.byref(program))
    return text.value.decode()


def _multi_tensor_sources():
    flags = {"sgd": ("MOMENTUM", "NESTEROV", "CLIP"), "mxnet_sgd": ("MOMENTUM", "CLIP"),
             "adam": ("DECOUPLED", "CLIP")}
    for kernel, names in flags.items():
        for values in itertools.product((0, 1), repeat=len(names)):
            for dtype in DTYPES:
                yield kernel_source(kernel, dtype, **dict(zip(names, values)))


def _one_weight_sources():
    """The one-weight kernels' bodies (each flag's), in a __global__ function over CuPy's
    element references, as CuPy wraps them."""
    bodies = []
    record = staticmethod(lambda i, o, body, name, options=(): bodies.append((i, o, body))
                          or (lambda *args: None))
    recorder = type("Recorder", (), {"ElementwiseKernel": record})()
    w = np.zeros(1)
    for momentum, nesterov, wd in itertools.product((0.0, 0.9), (False, True), (0.0, 0.1)):
        if nesterov and not momentum:
            continue
        torch_sgd.one_launch(recorder, w, w, w if momentum else None, 0.1, wd, momentum,
                              nesterov)
    for wd, decay in ((0.0, None), (0.1, None), (0.0, 0.99)):
        torch_adam.one_launch(recorder, w, w, w, w, step_size=0.1, correction=0.9,
                               beta1=0.9, beta2=0.99, epsilon=1e-8, wd=wd, decay=decay)
    for (inputs, outputs, body), dtype in itertools.product(bodies, DTYPES):
        names = [p.split()[-1] for p in f"{inputs}, {outputs}".split(",")]
        yield (f"#define T {optimizer_kernels.MANY_DTYPES[np.dtype(dtype)]}\n"
               f"extern \"C\" __global__ void run(long long n, "
               + ", ".join(f"T* {n}_" for n in names) + ") {\n"
               "const long long i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;\n"
               + " ".join(f"T& {n} = {n}_[i];" for n in names) + f"\n{body}\n}}\n")


def _float_operations(ptx: str) -> list[str]:
    return re.findall(r"\t((?:fma|mul|add|sub)(?:\.\w+)*\.f(?:32|64))\s", ptx)


@pytest.mark.skipif(nvrtc() is None, reason="NVRTC is not installed")
def test_nvrtc_rounds_every_product_and_sum_of_the_kernels_alone():
    """With ``--fmad=false`` NVRTC writes each operation as ``.rn`` (rounded to nearest,
    which ptxas may not fuse either) and no ``fma``; without it, Adam's kernel has fused
    ones. So a GPU computes the statements as the host and NumPy do."""
    sources = list(_multi_tensor_sources()) + list(_one_weight_sources())
    assert len(sources) == 2 * (8 + 4 + 4) + 2 * 9
    for source in sources:
        operations = _float_operations(_ptx(source, update_rules.FMAD.encode()))
        assert operations, source
        assert all(".rn." in op and not op.startswith("fma") for op in operations), (
            sorted(set(operations)), source)
    adam = torch_adam.source(np.float32, DECOUPLED=0, CLIP=0)
    assert any(op.startswith("fma") for op in _float_operations(_ptx(adam)))
