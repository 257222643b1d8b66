"""mixrt.autograd as MXNet users know it: gradients of nd ops against PyTorch (float64),
backward/grad options, modes, custom Functions, the errors that explain a missing gradient,
and a long training loop that neither leaks memory nor keeps its tape."""

import gc
import inspect
import threading
import tracemalloc
import weakref

from mixrt import autograd, nd
from mixrt.errors import GradientError
from mixrt.ops.ir.registry import REGISTRY

import numpy as np
import pytest


def _nd(value, **kwargs):
    """``nd.array`` keeping a NumPy array's dtype (these checks compute in float64);
    ``nd.array``'s own default is float32, as MXNet's."""
    return nd.array(value, dtype=getattr(value, "dtype", None), **kwargs)

RNG = np.random.default_rng(7)


def _normal(*shape):
    return RNG.standard_normal(shape)


def _positive(*shape):
    return RNG.uniform(0.5, 2.0, shape)


def _variables(arrays):
    variables = []
    for a in arrays:
        v = _nd(a)
        if v.dtype.kind == "f":
            v.attach_grad()
        variables.append(v)
    return variables


# -- gradients against PyTorch -------------------------------------------------------------

def _gemm(a, b, c):
    return nd.Gemm(a, b, c, alpha=0.5, beta=2.0, transB=1)


def _batch_norm(x, scale, bias):
    mean, var = nd.zeros(x.shape[1], dtype=x.dtype), nd.ones(x.shape[1], dtype=x.dtype)
    outputs = nd.BatchNormalization(x, scale, bias, mean, var, epsilon=1e-5,
                                    training_mode=1, num_outputs=3)
    return outputs[0]


def _conv(x, w, b):
    return nd.Conv(x, w, b, pads=[1, 1, 1, 1], strides=[2, 2])


def _cross_entropy(scores, labels):
    return nd.SoftmaxCrossEntropyLoss(scores, labels)


LABELS = np.array([0, 3, 1, 4, 3, 2], dtype=np.int64)
CLASS_WEIGHTS = np.array([1.0, 0.5, 2.0, 1.5, 0.25])
EMBED_IDS = np.array([[1, 4, 1], [4, 1, 0]], dtype=np.int64)

# name: (mixrt function, torch function (given torch and F), inputs)
CASES = {
    "Gemm_transB": (_gemm, lambda t, F, a, b, c: 0.5 * a @ b.T + 2.0 * c,
                    [_normal(3, 4), _normal(5, 4), _normal(5)]),
    "MatMul_batched": (lambda a, b: a @ b, lambda t, F, a, b: a @ b,
                       [_normal(2, 3, 4), _normal(4, 5)]),
    "Add_broadcast": (lambda a, b: a + b, lambda t, F, a, b: a + b,
                      [_normal(3, 1, 4), _normal(2, 4)]),
    "Sub_broadcast": (lambda a, b: a - b, lambda t, F, a, b: a - b,
                      [_normal(3, 4), _normal(4)]),
    "Mul_broadcast": (lambda a, b: a * b, lambda t, F, a, b: a * b,
                      [_normal(2, 3), _normal(1, 3)]),
    "Div_broadcast": (lambda a, b: a / b, lambda t, F, a, b: a / b,
                      [_normal(3, 4), _positive(3, 1)]),
    "Pow": (lambda a, b: a ** b, lambda t, F, a, b: a ** b, [_positive(3, 4), _normal(4)]),
    "scalar_operators": (lambda a: (2.0 - a) * 3.0 / (1.5 + a * a) ** 2,
                         lambda t, F, a: (2.0 - a) * 3.0 / (1.5 + a * a) ** 2,
                         [_normal(3, 4)]),
    "Relu": (nd.Relu, lambda t, F, a: F.relu(a), [_normal(4, 5)]),
    "Sigmoid": (nd.Sigmoid, lambda t, F, a: t.sigmoid(a), [_normal(4, 5)]),
    "Tanh": (nd.Tanh, lambda t, F, a: t.tanh(a), [_normal(4, 5)]),
    "Exp": (nd.Exp, lambda t, F, a: t.exp(a), [_normal(4, 5)]),
    "Log": (nd.Log, lambda t, F, a: t.log(a), [_positive(4, 5)]),
    "Softmax": (lambda a: nd.Softmax(a, axis=1), lambda t, F, a: F.softmax(a, dim=1),
                [_normal(2, 5, 3)]),
    "LogSoftmax": (lambda a: nd.LogSoftmax(a), lambda t, F, a: F.log_softmax(a, dim=-1),
                   [_normal(4, 6)]),
    "ReduceSum_axes": (lambda a: a.sum(axis=(0, 2)), lambda t, F, a: a.sum(dim=(0, 2)),
                       [_normal(2, 3, 4)]),
    "ReduceMean_keepdims": (lambda a: a.mean(axis=1, keepdims=True),
                            lambda t, F, a: a.mean(dim=1, keepdim=True), [_normal(2, 3, 4)]),
    "Reshape": (lambda a: a.reshape(4, -1) * _nd(np.arange(6.0, dtype=np.float64)),
                lambda t, F, a: a.reshape(4, -1) * t.arange(6.0, dtype=t.float64),
                [_normal(2, 3, 4)]),
    "Transpose": (lambda a: a.transpose(2, 0, 1), lambda t, F, a: a.permute(2, 0, 1),
                  [_normal(2, 3, 4)]),
    "Concat": (lambda a, b, c: nd.concat(a, b, c, dim=1),
               lambda t, F, a, b, c: t.cat([a, b, c], dim=1),
               [_normal(2, 1, 3), _normal(2, 4, 3), _normal(2, 2, 3)]),
    "Slice_indexing": (lambda a: a[1:3, ::2] * a[:, -1:][1:3],
                       lambda t, F, a: a[1:3, ::2] * a[:, -1:][1:3], [_normal(4, 5)]),
    "int_array_indexing": (lambda a: a[nd.array(np.array([2, 0, 2]), dtype=np.int64)],
                           lambda t, F, a: a[t.tensor([2, 0, 2])], [_normal(3, 4)]),
    "Conv_pad_stride": (_conv, lambda t, F, x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
                        [_normal(2, 3, 7, 7), _normal(4, 3, 3, 3), _normal(4)]),
    "MaxPool": (lambda x: nd.MaxPool(x, kernel_shape=[2, 2], strides=[2, 2]),
                lambda t, F, x: F.max_pool2d(x, 2, 2), [_normal(2, 3, 6, 6)]),
    "AveragePool_pad": (lambda x: nd.AveragePool(x, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                        lambda t, F, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False),
                        [_normal(2, 3, 5, 5)]),
    "BatchNormalization_training": (
        _batch_norm,
        lambda t, F, x, s, b: F.batch_norm(x, None, None, s, b, training=True, eps=1e-5),
        [_normal(4, 3, 2, 2), _positive(3), _normal(3)]),
    "LayerNormalization": (
        lambda x, s, b: nd.LayerNormalization(x, s, b, axis=-1, epsilon=1e-5, stash_type=11),
        lambda t, F, x, s, b: F.layer_norm(x, (6,), s, b, eps=1e-5),
        [_normal(2, 3, 6), _positive(6), _normal(6)]),
    "SoftmaxCrossEntropyLoss": (_cross_entropy,
                                lambda t, F, x, y: F.cross_entropy(x, y),
                                [_normal(6, 5), LABELS]),
    "SoftmaxCrossEntropyLoss_weights_ignore_index": (
        lambda x, y: nd.SoftmaxCrossEntropyLoss(x, y, _nd(CLASS_WEIGHTS), ignore_index=3),
        lambda t, F, x, y: F.cross_entropy(x, y, weight=t.tensor(CLASS_WEIGHTS), ignore_index=3),
        [_normal(6, 5), LABELS]),
    "Split_one_output_used": (lambda a: nd.Split(a, axis=1, num_outputs=2)[1] * 3,
                              lambda t, F, a: a[:, 2:] * 3, [_normal(3, 4)]),
    "Where_broadcast": (lambda a, b: nd.where(a > 0, a, b),
                        lambda t, F, a, b: t.where(a > 0, a, b), [_normal(3, 4), _normal(4)]),
    "Max_Clip": (lambda a, b: nd.maximum(a, b).clip(-0.5, 0.8),
                 lambda t, F, a, b: t.maximum(a, b).clamp(-0.5, 0.8),
                 [_normal(3, 4), _normal(3, 4)]),
    "Expand_Pad": (lambda a: nd.Pad(nd.Expand(a, nd.array(np.array([2, 3, 4]), dtype=np.int64)),
                                    nd.array(np.array([0, 1, 0, 0, 2, 1]), dtype=np.int64)),
                   lambda t, F, a: F.pad(a.expand(2, 3, 4), (0, 1, 1, 2)), [_normal(3, 1)]),
    "ConvTranspose_stride": (lambda x, w: nd.ConvTranspose(x, w, strides=[2, 2]),
                             lambda t, F, x, w: F.conv_transpose2d(x, w, stride=2),
                             [_normal(1, 2, 3, 3), _normal(2, 3, 3, 3)]),
    "Conv_groups": (lambda x, w: nd.Conv(x, w, group=2),
                    lambda t, F, x, w: F.conv2d(x, w, groups=2),
                    [_normal(1, 4, 5, 5), _normal(4, 2, 3, 3)]),
    "MaxPool_pad_stride": (lambda x: nd.MaxPool(x, kernel_shape=[3, 3], strides=[2, 2],
                                                pads=[1, 1, 1, 1]),
                           lambda t, F, x: F.max_pool2d(x, 3, 2, 1), [_normal(1, 2, 7, 7)]),
    "Gelu_Erf": (lambda a: nd.Gelu(a) + nd.Erf(a), lambda t, F, a: F.gelu(a) + t.erf(a),
                 [_normal(3, 4)]),
    "Sum_variadic_broadcast": (lambda a, b, c: nd.Sum(a, b, c), lambda t, F, a, b, c: a + b + c,
                               [_normal(3, 4), _normal(4), _normal(3, 1)]),
    "two_index_arrays": (lambda a: a[nd.array(np.array([0, 2, 0]), dtype=np.int64),
                                     nd.array(np.array([1, 1, 1]), dtype=np.int64)],
                         lambda t, F, a: a[[0, 2, 0], [1, 1, 1]], [_normal(3, 4)]),
    "Gather_embedding_repeats": (lambda w, i: nd.Gather(w, i, axis=0),
                                 lambda t, F, w, i: F.embedding(i, w),
                                 [_normal(6, 4), EMBED_IDS]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_matches_torch(case):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    ours, theirs, arrays = CASES[case]
    xs = _variables(arrays)
    with autograd.record():
        y = ours(*xs)
    head = _normal(*y.shape)
    y.backward(_nd(head))
    ts = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    expected = theirs(torch, functional, *ts)
    expected.backward(torch.tensor(head))
    np.testing.assert_allclose(y.asnumpy(), expected.detach().numpy(), rtol=1e-7, atol=1e-9)
    for index, (x, t) in enumerate(zip(xs, ts)):
        if t.requires_grad:
            np.testing.assert_allclose(x.grad.asnumpy(), t.grad.numpy(), rtol=1e-6, atol=1e-9,
                                       err_msg=f"{case}: gradient of input {index}")


def test_dropout_gradient_is_the_forward_mask():
    x = _nd(_positive(40, 50))
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, 0.25, True)
    y.backward()
    kept = y.asnumpy() != 0
    assert 0.6 < kept.mean() < 0.9  # about 1 - ratio kept
    np.testing.assert_allclose(y.asnumpy()[kept], x.asnumpy()[kept] / 0.75)
    np.testing.assert_allclose(x.grad.asnumpy(), kept / 0.75)


def test_dropout_outside_training_mode_is_identity_with_unit_gradient():
    x = _nd(_positive(3, 4))
    x.attach_grad()
    with autograd.record():
        y = nd.Dropout(x, 0.5)
    y.backward()
    np.testing.assert_array_equal(y.asnumpy(), x.asnumpy())
    np.testing.assert_array_equal(x.grad.asnumpy(), np.ones((3, 4)))


def test_custom_function_against_the_analytic_gradient():
    class Sigmoid(autograd.Function):
        def forward(self, x):
            y = 1 / (1 + nd.exp(-x))
            self.save_for_backward(y)
            return y

        def backward(self, dy):
            y, = self.saved_tensors
            return dy * y * (1 - y)

    values = _normal(3, 4)
    x = _nd(values)
    x.attach_grad()
    with autograd.record():
        y = (Sigmoid()(x) * 2).sum()
    y.backward()
    s = 1 / (1 + np.exp(-values))
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * s * (1 - s), rtol=1e-12)


def test_custom_function_with_two_inputs_and_two_outputs():
    class SumAndProduct(autograd.Function):
        def forward(self, a, b):
            self.save_for_backward(a, b)
            return a + b, a * b

        def backward(self, d_sum, d_product):
            a, b = self.saved_tensors
            return d_sum + d_product * b, d_sum + d_product * a

    a, b = _variables([_normal(3), _normal(3)])
    with autograd.record():
        total, product = SumAndProduct()(a, b)
        loss = (total * 3 + product).sum()
    loss.backward()
    np.testing.assert_allclose(a.grad.asnumpy(), 3 + b.asnumpy())
    np.testing.assert_allclose(b.grad.asnumpy(), 3 + a.asnumpy())


def test_custom_function_returning_its_input_leaves_the_variable_a_leaf():
    class Passthrough(autograd.Function):
        def forward(self, x):
            return x

        def backward(self, dy):
            return dy * 2

    x, = _variables([_normal(3)])
    with autograd.record():
        y = (Passthrough()(x) * 3).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(3, 6.0))
    assert x._entry is None
    _square_sum(x).backward()  # x is still a variable of its own
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy())


def test_custom_function_may_return_none_for_an_input():
    class ScaleFirst(autograd.Function):
        def forward(self, a, b):
            return a * b

        def backward(self, dy):
            return dy * 2, None

    a, b = _variables([_normal(2), _normal(2)])
    with autograd.record():
        y = ScaleFirst()(a, b).sum()
    y.backward()
    np.testing.assert_allclose(a.grad.asnumpy(), [2.0, 2.0])
    np.testing.assert_array_equal(b.grad.asnumpy(), [0.0, 0.0])


# -- backward and grad options -------------------------------------------------------------

def _square_sum(x):
    with autograd.record():
        return (x * x).sum()


def test_backward_with_head_grads():
    x, = _variables([_normal(2, 3)])
    with autograd.record():
        y = x * x
    head = _normal(2, 3)
    y.backward(_nd(head))
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy() * head)
    with autograd.record():
        y = x * 3
    autograd.backward([y], [_nd(head)])
    np.testing.assert_allclose(x.grad.asnumpy(), 3 * head)


def test_backward_of_several_heads_adds_their_gradients():
    x, = _variables([_normal(3)])
    with autograd.record():
        a, b = (x * 2).sum(), (x * x).sum()
    autograd.backward([a, b])
    np.testing.assert_allclose(x.grad.asnumpy(), 2 + 2 * x.asnumpy())


def test_grad_req_write_overwrites_and_add_accumulates():
    x, = _variables([_normal(4)])
    for _ in range(2):
        _square_sum(x).backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 2 * x.asnumpy())
    x.attach_grad(grad_req="add")
    for _ in range(2):
        _square_sum(x).backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 4 * x.asnumpy())


def test_grad_returns_gradients_and_leaves_dot_grad_alone():
    x, w = _variables([_normal(3), _normal(3)])
    with autograd.record():
        y = (x * w).sum()
    gx, gw = autograd.grad(y, [x, w])
    np.testing.assert_allclose(gx.asnumpy(), w.asnumpy())
    np.testing.assert_allclose(gw.asnumpy(), x.asnumpy())
    np.testing.assert_array_equal(x.grad.asnumpy(), np.zeros(3))
    np.testing.assert_array_equal(w.grad.asnumpy(), np.zeros(3))


def test_retain_graph_allows_a_second_backward():
    x, = _variables([_normal(3)])
    x.attach_grad(grad_req="add")
    y = _square_sum(x)
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 4 * x.asnumpy())


def test_second_backward_without_retain_graph_is_refused():
    x, = _variables([_normal(3)])
    y = _square_sum(x)
    y.backward()
    with pytest.raises(GradientError, match="retain_graph"):
        y.backward()


def test_pause_inside_record_stops_taping():
    x, = _variables([_normal(3)])
    with autograd.record():
        y = x * 2
        with autograd.pause():
            assert not autograd.is_recording()
            untaped = x * 5
        z = (y + untaped).sum()
    assert untaped._entry is None
    z.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(3, 2.0))


def test_training_and_recording_modes():
    assert not autograd.is_recording() and not autograd.is_training()
    with autograd.record():
        assert autograd.is_recording() and autograd.is_training()
        with autograd.pause():
            assert not autograd.is_recording() and not autograd.is_training()
        with autograd.predict_mode():
            assert autograd.is_recording() and not autograd.is_training()
    with autograd.record(train_mode=False):
        assert autograd.is_recording() and not autograd.is_training()
    with autograd.train_mode():
        assert autograd.is_training() and not autograd.is_recording()
    assert not autograd.is_recording() and not autograd.is_training()
    previous = autograd.set_training(True)
    try:
        assert not previous and autograd.is_training()
    finally:
        autograd.set_training(previous)
    assert autograd.set_recording(False) is False


def test_recording_is_per_thread():
    seen = []
    with autograd.record():
        worker = threading.Thread(target=lambda: seen.append(
            (autograd.is_recording(), autograd.is_training())))
        worker.start()
        worker.join()
    assert seen == [(False, False)]


def test_mark_variables():
    x = _nd(_normal(2, 2))
    gradient = nd.zeros((2, 2), dtype=np.float64)
    autograd.mark_variables([x], [gradient])
    with autograd.record():
        y = (x * x * x).sum()
    y.backward()
    assert x.grad is gradient
    np.testing.assert_allclose(gradient.asnumpy(), 3 * x.asnumpy() ** 2)


def test_detach_cuts_the_graph():
    x, = _variables([_normal(3)])
    with autograd.record():
        y = (x * x.detach()).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), x.asnumpy())


def test_gradient_flows_through_copy_and_astype():
    x = nd.array(_normal(3), dtype=np.float32)
    x.attach_grad()
    with autograd.record():
        y = (x.copy() * x.astype(np.float64).astype(np.float32) * 2).sum()
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 4 * x.asnumpy(), rtol=1e-6)


# -- errors that say what to do ------------------------------------------------------------

def test_inplace_update_of_a_taped_array_is_refused():
    x, = _variables([_normal(3)])
    with autograd.record():
        y = x * 2
        with pytest.raises(GradientError, match="in-place"):
            x += 1
        with pytest.raises(GradientError, match="in-place"):
            y += 1
        with pytest.raises(GradientError, match="in-place"):
            x[0] = 1.0
    with autograd.pause():
        x += 1  # the SGD way
    np.testing.assert_allclose(y.asnumpy(), 2 * (x.asnumpy() - 1))


def test_inplace_change_of_a_saved_input_after_recording_fails_at_backward():
    x, = _variables([_normal(3)])
    with autograd.record():
        y = (x * x).sum()
    x += 1  # not recording: allowed, but Mul saved x
    with pytest.raises(GradientError, match="modified in place") as info:
        y.backward()
    assert info.value.op_type == "Mul"


def test_inplace_change_of_an_output_its_gradient_reads_fails_at_backward():
    x, = _variables([_normal(3)])
    with autograd.record():
        y = x.exp()  # Exp's gradient reads y
    y += 1
    with pytest.raises(GradientError, match="output 0 of Exp was modified in place"):
        y.backward()
    with autograd.record():
        y = x * 2  # Mul's gradient does not read y: changing it afterwards is harmless
    y += 1
    y.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), np.full(3, 2.0))


def test_backward_on_an_untaped_head_says_attach_grad_and_record():
    x = _nd(_normal(3))
    y = (x * 2).sum()
    with pytest.raises(GradientError, match="attach_grad") as info:
        y.backward()
    assert "record" in str(info.value)
    x.attach_grad()
    y = (x * 2).sum()  # attached but not under record
    with pytest.raises(GradientError, match="record"):
        y.backward()


def test_grad_for_a_variable_off_the_path_names_it():
    x, w, unused = _variables([_normal(3), _normal(3), _normal(2)])
    with autograd.record():
        y = (x * w).sum()
    with pytest.raises(GradientError, match=r"variable 2 \(shape \(2,\)\)"):
        autograd.grad(y, [x, w, unused])


def test_create_graph_gives_a_differentiable_gradient():
    # it used to be refused; tests/test_create_graph.py has the rest
    x, = _variables([_normal(3)])
    with autograd.record():
        g = autograd.grad(_square_sum(x), [x], create_graph=True)[0]
        total = (g * g).sum()
    total.backward()
    np.testing.assert_allclose(x.grad.asnumpy(), 8 * x.asnumpy(), rtol=1e-6)


def test_op_without_gradient_names_the_op_and_the_call_line(monkeypatch):
    # every float op of one input has a gradient now: take Hardmax's away for the test
    op_type = "Hardmax"
    for kernel in REGISTRY.all_kernels():
        if kernel.domain == "" and kernel.op_type == op_type:
            monkeypatch.setattr(kernel, "grad_fn", None)
            monkeypatch.setattr(kernel, "expand_fn", None)
    x, = _variables([_positive(2, 3, 2, 2)])
    with autograd.record():
        line = inspect.currentframe().f_lineno + 1
        y = getattr(nd, op_type)(x * 2)
        z = (y * x).sum()
    with pytest.raises(GradientError) as info:
        z.backward()
    message = str(info.value)
    assert op_type in message and info.value.op_type == op_type
    assert f"{__file__}:{line}" in message, message


# -- memory --------------------------------------------------------------------------------

def _mlp_parameters(rng):
    shapes = [(32, 64), (32,), (10, 32), (10,)]
    parameters = [nd.array(rng.standard_normal(s) * 0.1, dtype=np.float32) for s in shapes]
    for p in parameters:
        p.attach_grad()
    return parameters


def _mlp_loss(parameters, x, labels):
    w1, b1, w2, b2 = parameters
    hidden = nd.Gemm(x, w1, b1, transB=1).relu()
    return nd.SoftmaxCrossEntropyLoss(nd.Gemm(hidden, w2, b2, transB=1), labels)


def _sgd_step(parameters, x, labels, lr=0.1) -> float:
    with autograd.record():
        loss = _mlp_loss(parameters, x, labels)
    loss.backward()
    with autograd.pause():
        for p in parameters:
            p -= lr * p.grad
    return float(loss)


def test_thousand_step_training_loop_memory_is_flat():
    rng = np.random.default_rng(0)
    x = nd.array(rng.standard_normal((16, 64)), dtype=np.float32)
    labels = nd.array(rng.integers(0, 10, 16), dtype=np.int64)
    parameters = _mlp_parameters(rng)
    losses = []
    tracemalloc.start()
    try:
        for step in range(1, 1001):
            losses.append(_sgd_step(parameters, x, labels))
            if step == 100:
                gc.collect()
                after_warmup = tracemalloc.get_traced_memory()[0]
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - after_warmup
    finally:
        tracemalloc.stop()
    assert growth < 2 * 2**20, f"memory grew {growth / 2**20:.2f} MiB over 900 steps"
    assert losses[-1] < 0.5 * losses[0]  # it learned: the loop did real work


def test_the_tape_dies_with_its_outputs():
    rng = np.random.default_rng(1)
    x = nd.array(rng.standard_normal((4, 64)), dtype=np.float32)
    w1, b1 = _mlp_parameters(rng)[:2]
    with autograd.record():
        hidden = nd.Gemm(x, w1, b1, transB=1)
        loss = nd.Relu(hidden).sum()
    hidden_ref = weakref.ref(hidden)
    del hidden
    gc.collect()
    assert hidden_ref() is not None  # the tape keeps what the backward needs
    loss.backward()
    del loss
    gc.collect()
    assert hidden_ref() is None

    with autograd.record():  # never differentiated: dropping the head frees it all
        hidden = nd.Gemm(x, w1, b1, transB=1)
        loss = nd.Relu(hidden).sum()
    hidden_ref = weakref.ref(hidden)
    del hidden, loss
    gc.collect()
    assert hidden_ref() is None


def test_backward_frees_the_walked_graph_even_while_the_head_lives():
    x, = _variables([_normal(3)])
    with autograd.record():
        hidden = x * x
        y = hidden.sum()
    hidden_ref = weakref.ref(hidden)
    del hidden
    y.backward()
    gc.collect()
    assert hidden_ref() is None  # y still holds its node, but the node let go of its inputs


# -- mixed float dtypes ------------------------------------------------------------------------

def test_mixed_float_inputs_promote_and_each_gradient_keeps_its_arrays_dtype():
    w = nd.array(np.array([1.0, 2.0, 3.0]), dtype="float32")
    c = nd.array(np.array([2.0, 0.5, -1.0]), dtype="float64")
    w.attach_grad()
    c.attach_grad()
    with autograd.record():
        product = w * c  # Mul's inputs share ONNX type T: w is cast, recorded
        total = nd.Sum(product, w, c).sum()
    assert product.dtype == np.float64
    total.backward()
    assert w.grad.dtype == np.float32 and c.grad.dtype == np.float64
    np.testing.assert_allclose(w.grad.asnumpy(), c.asnumpy() + 1)
    np.testing.assert_allclose(c.grad.asnumpy(), w.asnumpy() + 1)


def test_ops_whose_inputs_have_different_onnx_types_are_not_promoted():
    data = nd.array(np.array([1.0, 2.0, 3.0]), dtype="float32")
    picked = nd.Gather(data, nd.array(np.array([2, 0]), dtype="int64"))
    assert picked.dtype == np.float32
    chosen = nd.Where(_nd(np.array([True, False])), nd.array(np.ones(2), dtype="float16"),
                      nd.array(np.zeros(2), dtype="float32"))
    assert chosen.dtype == np.float32  # X and Y share T: the float16 one is promoted


def test_a_float64_gradient_arriving_at_a_float32_output_is_cast_to_it():
    w = nd.array(np.ones((2, 3)), dtype="float32")
    w.attach_grad()
    label = nd.array(np.full((2, 3), 0.5), dtype="float64")
    with autograd.record():
        hidden = nd.Tanh(w)  # float32, its backward plan made for float32 head grads
        loss = ((hidden - label) ** 2).sum()  # float64 from here on
    loss.backward()
    expected = 2 * (np.tanh(1.0) - 0.5) * (1 - np.tanh(1.0) ** 2)
    assert w.grad.dtype == np.float32
    np.testing.assert_allclose(w.grad.asnumpy(), np.full((2, 3), expected), rtol=1e-6)
