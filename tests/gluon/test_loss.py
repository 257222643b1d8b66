"""mixrt.gluon.loss: MXNet's losses (one value per sample, the mean over the other axes)
against PyTorch, with their gradients, imperatively and hybridized."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, nd
from mixrt.errors import InputError
from mixrt.gluon import loss as gloss

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(1)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(loss_fn, pred, label, *extra):
    """(loss per sample, d sum(loss) / d pred), imperatively and hybridized (asserted equal)."""
    results = []
    for hybrid in (False, True):
        loss_fn.hybridize(hybrid)
        x = nd.array(pred)
        x.attach_grad()
        with autograd.record():
            value = loss_fn(x, nd.array(label), *[nd.array(e) for e in extra])
        value.backward()
        results.append((value.asnumpy(), x.grad.asnumpy().copy()))
    assert loss_fn._cached
    for got, want in zip(results[1], results[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return results[0]


def reference(function, pred):
    """(values, d sum(values) / d pred) of a torch expression of ``pred``."""
    x = torch.tensor(pred, requires_grad=True)
    value = function(x)
    value.sum().backward()
    return value.detach().numpy(), x.grad.numpy()


def check(loss_fn, pred, label, expected_fn, *extra):
    value, grad = run(loss_fn, pred, label, *extra)
    want, want_grad = reference(expected_fn, pred)
    assert value.shape == want.shape
    np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


def per_sample(x):
    return x.reshape(x.shape[0], -1).mean(dim=1)


def test_l2_and_l1():
    pred, label = rand(4, 3, 2), rand(4, 3, 2)
    target = torch.tensor(label)
    check(gloss.L2Loss(), pred, label, lambda x: per_sample((x - target) ** 2 / 2))
    check(gloss.L2Loss(weight=3.0), pred, label,
          lambda x: per_sample(1.5 * (x - target) ** 2))
    check(gloss.L1Loss(), pred, label, lambda x: per_sample((x - target).abs()))


def test_label_reshaped_like_pred_and_sample_weight():
    pred, label, weight = rand(5, 1), rand(5), rand(5, 1)
    target, w = torch.tensor(label)[:, None], torch.tensor(weight)
    check(gloss.L1Loss(weight=2.0), pred, label,
          lambda x: per_sample(2 * w * (x - target).abs()), weight)


def test_batch_axis():
    pred, label = rand(3, 4, 2), rand(3, 4, 2)
    target = torch.tensor(label)
    check(gloss.L2Loss(batch_axis=1), pred, label,
          lambda x: ((x - target) ** 2 / 2).mean(dim=(0, 2)))


def test_softmax_cross_entropy_sparse_and_dense():
    pred = rand(6, 5)
    classes = RNG.integers(0, 5, 6)
    check(gloss.SoftmaxCrossEntropyLoss(), pred, classes.astype(np.float32),
          lambda x: F.cross_entropy(x, torch.tensor(classes), reduction="none"))
    check(gloss.SoftmaxCrossEntropyLoss(), pred, classes[:, None].astype(np.float32),
          lambda x: F.cross_entropy(x, torch.tensor(classes), reduction="none"))
    soft = np.exp(rand(6, 5))
    soft /= soft.sum(axis=1, keepdims=True)
    check(gloss.SoftmaxCrossEntropyLoss(sparse_label=False), pred, soft,
          lambda x: -(torch.log_softmax(x, 1) * torch.tensor(soft)).sum(1))
    check(gloss.SoftmaxCrossEntropyLoss(from_logits=True), pred, classes.astype(np.float32),
          lambda x: -x[torch.arange(6), torch.tensor(classes)])


def test_softmax_cross_entropy_over_a_middle_axis():
    pred = rand(2, 4, 3)  # classes on axis 1, a sequence of 3
    classes = RNG.integers(0, 4, (2, 3))
    check(gloss.SoftmaxCrossEntropyLoss(axis=1), pred, classes.astype(np.float32),
          lambda x: F.cross_entropy(x, torch.tensor(classes), reduction="none").mean(1))


def test_sigmoid_binary_cross_entropy():
    pred = rand(4, 3) * 4
    label = (RNG.random((4, 3)) > 0.5).astype(np.float32)
    target = torch.tensor(label)
    check(gloss.SigmoidBinaryCrossEntropyLoss(), pred, label,
          lambda x: per_sample(F.binary_cross_entropy_with_logits(x, target,
                                                                   reduction="none")))
    pos = np.array([2.0, 0.5, 1.0], dtype=np.float32)
    check(gloss.SigmoidBCELoss(), pred, label,
          lambda x: per_sample(F.binary_cross_entropy_with_logits(
              x, target, reduction="none", pos_weight=torch.tensor(pos))),
          np.ones((4, 1), np.float32), pos)
    probs = 1 / (1 + np.exp(-pred))
    check(gloss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=True), probs, label,
          lambda p: per_sample(F.binary_cross_entropy(p, target, reduction="none")))


def test_sigmoid_binary_cross_entropy_is_stable_for_large_logits():
    pred = np.array([[1000.0, -1000.0, 80.0, -80.0]], dtype=np.float32)
    label = np.array([[0.0, 1.0, 1.0, 0.0]], dtype=np.float32)
    value, grad = run(gloss.SigmoidBinaryCrossEntropyLoss(), pred, label)
    np.testing.assert_allclose(value, [(1000 + 1000 + 0 + 0) / 4], rtol=1e-5)
    np.testing.assert_allclose(grad, [[0.25, -0.25, 0.0, 0.0]], atol=1e-6)
    value, _ = run(gloss.SigmoidBinaryCrossEntropyLoss(), pred, label,
                   np.ones((1, 1), np.float32), np.full((4,), 3.0, np.float32))
    assert np.isfinite(value).all()


def test_pos_weight_without_sample_weight():
    loss_fn = gloss.SigmoidBCELoss()
    pred, label = rand(3, 2), np.ones((3, 2), np.float32)
    pos = nd.array(np.array([2.0, 2.0], np.float32))
    with_pos = loss_fn(nd.array(pred), nd.array(label), None, pos).asnumpy()
    np.testing.assert_allclose(with_pos, 2 * loss_fn(nd.array(pred), nd.array(label))
                               .asnumpy(), rtol=1e-5)


def test_kl_divergence():
    """Summed over the non-batch axes, not averaged: MXNet 1.9.1's KLDivLoss."""
    pred = rand(3, 5)
    label = np.exp(rand(3, 5))
    label /= label.sum(axis=1, keepdims=True)
    target = torch.tensor(label)
    check(gloss.KLDivLoss(), np.log(label + 0.1).astype(np.float32), label,
          lambda x: F.kl_div(x, target, reduction="none").sum(dim=1))
    check(gloss.KLDivLoss(from_logits=False), pred, label,
          lambda x: F.kl_div(torch.log_softmax(x, 1), target, reduction="none").sum(dim=1))


def test_huber_and_hinge():
    pred, label = rand(5, 4) * 2, rand(5, 4)
    target = torch.tensor(label)
    check(gloss.HuberLoss(rho=0.7), pred, label,
          lambda x: per_sample(F.smooth_l1_loss(x, target, reduction="none", beta=0.7)))
    signs = np.sign(rand(5, 4)).astype(np.float32)
    check(gloss.HingeLoss(margin=1.5), pred, signs,
          lambda x: per_sample(torch.relu(1.5 - x * torch.tensor(signs))))


def test_weight_must_be_a_number():
    with pytest.raises(InputError, match="sample_weight"):
        gloss.L1Loss(weight=np.ones(3))
    with pytest.raises(InputError, match="rho"):
        gloss.HuberLoss(rho=0)
