"""mixrt.gluon.loss against MXNet 1.9.1: the losses added for MXNet's API (values and
gradients MXNet gave for the same inputs), CTC (``mixrt::CTCLoss``), and every loss built
from Symbols whose shapes are unknown until they are bound."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import autograd, nd, sym
from mixrt.errors import GraphError, InputError
from mixrt.gluon import loss as gloss

A = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]
B = [[1.0, 0.5, -0.5], [-1.0, 2.0, 0.5]]
C = [[0.2, 0.1, 0.4], [0.3, 0.3, 0.3]]
SIGN = [[1, -1, 1], [-1, -1, 1]]


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got.asnumpy(), np.asarray(want, dtype=np.float32),
                               rtol=rtol, atol=atol)


def value_and_grad(loss_fn, first, *rest):
    x = nd.array(first)
    x.attach_grad()
    with autograd.record():
        loss = loss_fn(x, *[nd.array(r) for r in rest])
    loss.backward()
    return loss, x.grad


# -- values MXNet 1.9.1 gave -----------------------------------------------------------------

@pytest.mark.parametrize("loss_fn, args, want", [
    (gloss.SquaredHingeLoss(), (A, SIGN), [0.0833333358, 3.625]),
    (gloss.LogisticLoss(), (A, SIGN), [0.3047556, 1.2214079]),
    (gloss.LogisticLoss(label_format="binary"), (A, (np.array(SIGN) + 1) / 2),
     [0.3047556, 1.2214079]),
    (gloss.TripletLoss(margin=0.5), (A, B, C), [5.39, 8.83]),
    (gloss.PoissonNLLLoss(), (A, C), [2.4239562]),
    (gloss.PoissonNLLLoss(from_logits=False, compute_full=True),
     (np.array(C) + 1, np.abs(B) + 1), [1.4399360]),
    (gloss.CosineEmbeddingLoss(margin=0.1), (A, B, [1, -1]), [[1.3563483], [0.0]]),
    (gloss.SDMLLoss(), (A, B), [0.8227489, 6.739161]),
    (gloss.KLDivLoss(weight=2.0), (A, C, [[1.0], [0.5]]), [-3.437325, -1.3835756]),
    (gloss.L1Loss(batch_axis=1), (A, B), [1.5, 1.625, 1.875]),
    (gloss.SoftmaxCrossEntropyLoss(axis=0), (A, [1, 0, 1]), [1.542386]),
])
def test_values_match_mxnet(loss_fn, args, want):
    close(loss_fn(*[nd.array(a) for a in args]), want, rtol=1e-5)


def test_gradients_match_mxnet():
    _, grad = value_and_grad(gloss.SDMLLoss(), A, B)
    close(grad, [[1.1656915, -0.8742634, -0.582852], [2.7998884, -2.0999165, -1.3999442]],
          rtol=1e-4, atol=1e-5)
    _, grad = value_and_grad(gloss.CosineEmbeddingLoss(), A, B, [1, -1])
    close(grad, [[-0.390286237, -0.110298298, 0.0424224436], [0.0, 0.0, 0.0]])


def test_logistic_loss_equals_sigmoid_bce():
    pred = np.linspace(-12, 12, 10, dtype=np.float32).reshape(5, 2)
    label = np.array([[0, 1], [1, 1], [0, 0], [1, 0], [0, 1]], dtype=np.float32)
    bce = gloss.SigmoidBCELoss()(nd.array(pred), nd.array(label))
    close(gloss.LogisticLoss(label_format="binary")(nd.array(pred), nd.array(label)),
          bce.asnumpy())
    close(gloss.LogisticLoss()(nd.array(pred), nd.array(2 * label - 1)), bce.asnumpy())


def test_kl_divergence_is_summed_over_the_other_axes():
    log_pred, label = np.log(np.array(C)), np.array(B) ** 2
    want = (label * (np.log(label + 1e-12) - log_pred)).sum(axis=1)
    close(gloss.KLDivLoss()(nd.array(log_pred), nd.array(label)), want, rtol=1e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(InputError, match="label_format"):
        gloss.LogisticLoss(label_format="plus-minus")
    with pytest.raises(InputError, match="layout"):
        gloss.CTCLoss(layout="NCT")
    with pytest.raises(InputError, match="label_layout"):
        gloss.CTCLoss(label_layout="NN")
    with pytest.raises(InputError, match="smoothing_parameter"):
        gloss.SDMLLoss(smoothing_parameter=1.0)
    with pytest.raises(InputError, match="weight must be a number"):
        gloss.TripletLoss(weight=nd.ones((2,)))
    with pytest.raises(InputError, match="epsilon"):
        gloss.PoissonNLLLoss()(nd.array(A), nd.array(C), None, 1e-3)


# -- CTC ---------------------------------------------------------------------------------------

CTC_DATA = [[[-1.0, -0.5, 0.0], [0.5, 1.0, -1.0]], [[0.3, -0.2, 0.9], [1.0, -1.0, -0.5]],
            [[0.0, 0.5, 1.0], [-1.0, -0.5, 0.0]], [[0.5, 1.0, -1.0], [-0.5, 0.0, 0.5]]]

# (blank_label, label, data_lengths, label_lengths) -> MXNet's nd.ctc_loss and the
# gradient of sum(loss * [1, 0.5]) with respect to the data
CTC_CASES = [
    ("last", [[1, 0], [1, 1]], None, None, [2.0145566, 3.0294013],
     [[[0.186324, -0.233309, 0.046986], [0.174104, -0.200496, 0.026392]],
      [[0.211919, -0.214499, 0.00258], [0.368062, -0.054678, -0.313385]],
      [[-0.049753, -0.024105, 0.073859], [0.093162, -0.090174, -0.002987]],
      [[-0.582292, 0.574097, 0.008195], [0.093162, -0.194664, 0.101502]]]),
    ("first", [[2, 1], [1, 0]], None, None, [1.0344809, 2.4613054],
     [[[-0.047885, 0.307196, -0.259311], [-0.177473, 0.138625, 0.038848]],
      [[0.084981, 0.08912, -0.174101], [-0.031613, -0.050512, 0.082126]],
      [[0.014697, -0.1755, 0.160803], [-0.097482, -0.155759, 0.25324]],
      [[0.149615, -0.22731, 0.077696], [-0.128301, -0.124939, 0.25324]]]),
    ("last", [[0, 1], [1, 0]], [3, 4], [1, 2], [1.4258946, 1.594605],
     [[[-0.179066, 0.307196, -0.12813], [0.174104, -0.205801, 0.031697]],
      [[-0.290921, 0.176901, 0.11402], [-0.033341, 0.004916, 0.028425]],
      [[-0.179066, 0.307196, -0.12813], [-0.091841, 0.142644, -0.050803]],
      [[0.0, 0.0, 0.0], [-0.00456, 0.153598, -0.149038]]]),
]


@pytest.mark.parametrize("blank, label, data_lengths, label_lengths, want, want_grad",
                         CTC_CASES)
def test_ctc_op_and_gradient_match_mxnet(blank, label, data_lengths, label_lengths, want,
                                         want_grad):
    x = nd.array(CTC_DATA)
    x.attach_grad()
    lengths = [None if v is None else nd.array(v) for v in (data_lengths, label_lengths)]
    with autograd.record():
        loss = mixrt.dispatch.invoke("mixrt", "CTCLoss", [x, nd.array(label), *lengths],
                                     {"blank_label": blank})
        (loss * nd.array([1.0, 0.5])).sum().backward()
    close(loss, want)
    close(x.grad, want_grad, atol=2e-6)


EXPECTED_UNIFORM = [18.82820702, 16.50581741]  # MXNet's test_ctc_loss


@pytest.mark.parametrize("layout, label_layout, pred_shape, transpose", [
    ("NTC", "NT", (2, 20, 4), False), ("TNC", "NT", (20, 2, 4), False),
    ("TNC", "TN", (20, 2, 4), True)])
def test_ctc_layouts(layout, label_layout, pred_shape, transpose):
    label = np.array([[1, 0, -1, -1], [2, 1, 1, -1]], dtype=np.float32)
    loss = gloss.CTCLoss(layout=layout, label_layout=label_layout)
    close(loss(nd.ones(pred_shape), nd.array(label.T if transpose else label)),
          EXPECTED_UNIFORM, rtol=1e-6)


def test_ctc_lengths_imperative_and_hybridized():
    """Each pattern of given lengths is traced on its own: the same shapes in the other
    optional slot must not reuse a trace."""
    loss = gloss.CTCLoss()
    for hybrid in (False, True):
        loss.hybridize(hybrid)
        close(loss(nd.ones((2, 20, 4)), nd.array([[2, 1, 2, 2], [3, 2, 2, 2]]), None,
                   nd.array([2, 3])), EXPECTED_UNIFORM, rtol=1e-6)
        close(loss(nd.ones((2, 25, 4)), nd.array([[2, 1, -1, -1], [3, 2, 2, -1]]),
                   nd.array([20, 20])), EXPECTED_UNIFORM, rtol=1e-6)
        close(loss(nd.ones((2, 25, 4)), nd.array([[2, 1, 3, 3], [3, 2, 2, 3]]),
                   nd.array([20, 20]), nd.array([2, 3])), EXPECTED_UNIFORM, rtol=1e-6)


def test_ctc_refuses_labels_outside_the_classes():
    with pytest.raises(Exception, match="outside"):
        gloss.CTCLoss()(nd.ones((1, 5, 3)), nd.array([[1, 4]])).asnumpy()


# -- Symbols without shapes --------------------------------------------------------------------

@pytest.mark.parametrize("loss_fn, label_shape, classes", [
    (gloss.L2Loss(), (4, 5), False), (gloss.L1Loss(), (4, 5), False),
    (gloss.HuberLoss(), (4, 5), False), (gloss.HingeLoss(), (4, 5), False),
    (gloss.SquaredHingeLoss(), (4, 5), False), (gloss.SoftmaxCELoss(), (4,), True),
    (gloss.SigmoidBCELoss(), (4, 5), False), (gloss.KLDivLoss(), (4, 5), False),
    (gloss.LogisticLoss(), (4, 5), False), (gloss.PoissonNLLLoss(), (4, 5), False),
    (gloss.CosineEmbeddingLoss(), (4, 5), False),
])
def test_losses_of_unshaped_symbols_bind_and_match_imperative(loss_fn, label_shape, classes):
    rng = np.random.default_rng(3)
    data = nd.array(rng.standard_normal((4, 3)))
    label = nd.array(rng.integers(0, 5, label_shape) if classes else
                     rng.random(label_shape))
    weight, bias = nd.array(rng.standard_normal((5, 3))), nd.zeros((5,))
    output = sym.FullyConnected(sym.Variable("data"), name="fc", num_hidden=5)
    extra = [sym.Variable("sign")] if isinstance(loss_fn, gloss.CosineEmbeddingLoss) else []
    symbol = loss_fn(output, sym.Variable("label"), *extra)
    feeds = {"data": data, "label": label, "fc_weight": weight, "fc_bias": bias}
    if extra:
        feeds["sign"] = nd.array([1, -1, 1, -1])
    got = symbol.bind(mixrt.cpu(), feeds).forward()[0]
    pred = nd.FullyConnected(data, weight, bias, num_hidden=5)
    want = loss_fn(pred, label, *([feeds["sign"]] if extra else []))
    close(got, want.asnumpy())
    # a Module binds from the data's and labels' shapes alone: they must settle the rest
    given = {name: feeds[name].shape for name in ("data", "label", "sign") if name in feeds}
    arg_shapes, out_shapes, _ = symbol.infer_shape(**given)
    assert dict(zip(symbol.list_arguments(), arg_shapes))["fc_weight"] == (5, 3)
    assert out_shapes == [want.shape]


def test_sdml_hybridized_equals_imperative():
    """MXNet's SDMLLoss reads its inputs' shapes, so it runs on arrays only; hybridized,
    mixrt's traces it for the arrays' shapes."""
    loss = gloss.SDMLLoss(smoothing_parameter=0.2)
    results = []
    for hybrid in (False, True):
        loss.hybridize(hybrid)
        results.append(value_and_grad(loss, A, B))
    close(results[1][0], results[0][0].asnumpy())
    close(results[1][1], results[0][1].asnumpy())


@pytest.mark.parametrize("hybridize", [False, True])
def test_cosine_embedding_loss_matches_mxnet(hybridize):
    """MXNet's CosineEmbeddingLoss calls broadcast_maximum with axis=1, which MXNet's
    broadcast operators take and ignore (values from MXNet 1.9.1)."""
    loss_fn = gloss.CosineEmbeddingLoss(margin=-0.5)
    if hybridize:
        loss_fn.hybridize()
    close(loss_fn(nd.array(A), nd.array(B), nd.array([1, -1])), [[1.3563483], [0.1460808]])


def test_broadcast_operators_take_keywords_and_align_shapes_at_the_end():
    lhs, rhs = nd.array([0.0]), nd.array([[0.5], [-0.2], [3.0]])
    close(nd.broadcast_maximum(lhs, rhs, axis=1), [[0.5], [0.0], [3.0]])
    assert nd.broadcast_add(nd.ones((2, 1, 4)), nd.ones((3, 1))).shape == (2, 3, 4)
    assert nd.broadcast_hypot(lhs, rhs, axis=7).shape == (3, 1)
    node = sym.broadcast_maximum(sym.Variable("a"), sym.Variable("b"), axis=1)
    assert node.list_attr()["axis"] == "1"
    close(node.eval(a=lhs, b=rhs)[0], [[0.5], [0.0], [3.0]])
    with pytest.raises(InputError, match="do not broadcast"):
        nd.broadcast_add(nd.ones((2,)), nd.ones((3,)))


@pytest.mark.parametrize("function, options", [
    ("softmax", {"axis": 0}), ("log_softmax", {"temperature": 2.0}),
    ("softmin", {"axis": -1, "dtype": "float64"})])
def test_softmax_family_of_an_unshaped_symbol_binds_later(function, options):
    """MXNet code applies log_softmax to a symbol whose shape is known only at bind
    (KLDivLoss over a network's output): the result equals the imperative one."""
    head = getattr(sym, function)(sym.Variable("x"), **options)
    got = head.eval(x=nd.array(A))[0]
    want = getattr(nd, function)(nd.array(A), **options)
    assert got.dtype == want.dtype
    close(got, want.asnumpy())
    with pytest.raises(GraphError, match="temperature"):
        sym.log_softmax(sym.Variable("x"), temperature=0.0)
