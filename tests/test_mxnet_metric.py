"""mx.metric against MXNet 1.9.1: every metric on the same batches, local and global tallies
across reset_local, average='macro'|'micro', axis, 2-D labels, update_dict, composites,
custom metrics, names, aliases and configs.

EXPECTED was made with MXNet 1.9.1 (numpy 1.23.5) by running ``scenario`` below with ``mx``
being ``mxnet`` and printing what it returned (2026-11-24); ``numpy.random.RandomState``
draws the same inputs in both numpy versions.
"""

import math

import numpy as np
import pytest

import mixrt
from mixrt import metric, nd
from mixrt.errors import InputError

EXPECTED = {
    'acc{}': [['accuracy', 0.3333333333333333], ['accuracy', 0.4], ['accuracy', 0.36363636363636365], [['accuracy', 0.4]], '5', 'accuracy'],
    "top_k_accuracy{'top_k': 2}": [['top_k_accuracy_2', 0.8333333333333334], ['top_k_accuracy_2', 1.0], ['top_k_accuracy_2', 0.9090909090909091], [['top_k_accuracy_2', 1.0]], '5', 'top_k_accuracy_2'],
    'f1{}': [['f1', 0.5714285714285715], ['f1', 0.3333333333333333], ['f1', 0.45238095238095244], [['f1', 0.3333333333333333]], '1', 'f1'],
    "f1{'average': 'micro'}": [['f1', 0.5714285714285715], ['f1', 0.3333333333333333], ['f1', 0.4615384615384615], [['f1', 0.3333333333333333]], '6', 'f1'],
    'mcc{}': [['mcc', 0.2581988897471611], ['mcc', -0.3333333333333333], ['mcc', -0.03756722179308611], [['mcc', -0.3333333333333333]], '1.0', 'mcc'],
    "mcc{'average': 'micro'}": [['mcc', 0.2581988897471611], ['mcc', -0.3333333333333333], ['mcc', 0.0], [['mcc', -0.3333333333333333]], '6', 'mcc'],
    'pcc{}': [['pcc', 0.0], ['pcc', 0.125], ['pcc', 0.0375], [['pcc', 0.125]], '1.0', 'pcc'],
    'ce{}': [['cross-entropy', 1.3052020072937012], ['cross-entropy', 0.9133131980895997], ['cross-entropy', 1.1270707303827459], [['cross-entropy', 0.9133131980895997]], '5', 'cross-entropy'],
    'nll_loss{}': [['nll-loss', 1.3052020072937012], ['nll-loss', 0.9133131980895997], ['nll-loss', 1.1270707303827459], [['nll-loss', 0.9133131980895997]], '5', 'nll-loss'],
    "perplexity{'ignore_label': 1}": [['perplexity', 2.425675560803901], ['perplexity', 2.3664427745245176], ['perplexity', 2.4001106678421085], [['perplexity', 2.3664427745245176]], '3.0', 'perplexity'],
    "perplexity{'ignore_label': None}": [['perplexity', 3.6884338159151855], ['perplexity', 2.4925674743916955], ['perplexity', 3.0866017559615346], [['perplexity', 2.4925674743916955]], '5', 'perplexity'],
    'mae{}': [['mae', 1.868819236755371], ['mae', 0.831622302532196], ['mae', 1.3502207696437836], [['mae', 0.831622302532196]], '1', 'mae'],
    'mse{}': [['mse', 4.870404243469238], ['mse', 0.917610764503479], ['mse', 2.8940075039863586], [['mse', 0.917610764503479]], '1', 'mse'],
    'rmse{}': [['rmse', 2.2068991661071777], ['rmse', 0.9579200148582458], ['rmse', 1.5824095904827118], [['rmse', 0.9579200148582458]], '1', 'rmse'],
    'pearsonr{}': [['pearsonr', -0.5936188499350032], ['pearsonr', 0.3233981187705294], ['pearsonr', -0.13511036558223694], [['pearsonr', 0.3233981187705294]], '1', 'pearsonr'],
    "pearsonr{'average': 'micro'}": [['pearsonr', -0.5936188499350031], ['pearsonr', -0.30027744504310233], ['pearsonr', 0.0], [['pearsonr', -0.30027744504310233]], '1', 'pearsonr'],
    'loss{}': [['loss', -0.2974528471628825], ['loss', 0.08544743061065674], ['loss', -0.07865268843514579], [['loss', 0.08544743061065674]], '8', 'loss'],
    'acc_axis0': ['accuracy', 0.3333333333333333],
    'acc_2d': ['accuracy', 0.75],
    'acc_2d_label_3d_pred': ['accuracy', 0.25],
    'composite': [[['accuracy', 'cross-entropy'], [0.3333333333333333, 1.3052020072937012]], [['accuracy', 0.3333333333333333], ['cross-entropy', 1.3052020072937012]]],
    'custom': ['my', 2.0],
    'np': [['custom(<lambda>)', 2.0], 'custom(<lambda>)'],
    'update_dict': ['accuracy', 1.0],
    'single_ndarray': ['rmse', 2.2068991661071777],
}


def _inputs():
    rng = np.random.RandomState(3)
    probs = rng.dirichlet([1, 1, 1], size=6).astype("float32")
    probs2 = rng.dirichlet([1, 1, 1], size=5).astype("float32")
    lab = np.array([0, 2, 1, 1, 0, 2], "float32")
    lab2 = np.array([1, 1, 0, 2, 2], "float32")
    bin_p = rng.dirichlet([1, 1], size=8).astype("float32")
    bin_l = np.array([0, 1, 1, 0, 1, 1, 0, 0], "float32")
    bin_p2 = rng.dirichlet([1, 1], size=6).astype("float32")
    bin_l2 = np.array([1, 1, 0, 0, 1, 0], "float32")
    reg_p, reg_l = rng.randn(6).astype("float32"), rng.randn(6).astype("float32")
    reg_p2, reg_l2 = rng.randn(4, 2).astype("float32"), rng.randn(4, 2).astype("float32")
    classes = ((probs, lab), (probs2, lab2))
    binary = ((bin_p, bin_l), (bin_p2, bin_l2))
    values = ((reg_p, reg_l), (reg_p2, reg_l2))
    return rng, classes, binary, values


CASES = [("acc", {}, "classes"), ("top_k_accuracy", {"top_k": 2}, "classes"),
         ("f1", {}, "binary"), ("f1", {"average": "micro"}, "binary"),
         ("mcc", {}, "binary"), ("mcc", {"average": "micro"}, "binary"),
         ("pcc", {}, "classes"), ("ce", {}, "classes"), ("nll_loss", {}, "classes"),
         ("perplexity", {"ignore_label": 1}, "classes"),
         ("perplexity", {"ignore_label": None}, "classes"),
         ("mae", {}, "values"), ("mse", {}, "values"), ("rmse", {}, "values"),
         ("pearsonr", {}, "values"), ("pearsonr", {"average": "micro"}, "values"),
         ("loss", {}, "values")]


def _same(found, expected):
    if isinstance(expected, float):
        return (math.isnan(found) and math.isnan(expected)) or \
            found == pytest.approx(expected, rel=1e-5, abs=1e-7)
    if isinstance(expected, list):
        return len(found) == len(expected) and all(map(_same, found, expected))
    return found == expected


@pytest.mark.parametrize("name,kwargs,data", CASES, ids=[f"{n}{k}" for n, k, _ in CASES])
def test_values_and_tallies_match_mxnet(name, kwargs, data):
    _, classes, binary, values = _inputs()
    first, second = {"classes": classes, "binary": binary, "values": values}[data]
    m = metric.create(name, **kwargs)
    m.update([nd.array(first[1])], [nd.array(first[0])])
    middle = m.get()
    m.reset_local()
    m.update([nd.array(second[1])], [nd.array(second[0])])
    found = [list(middle), list(m.get()), list(m.get_global()),
             [list(p) for p in m.get_name_value()], str(m.num_inst), m.name]
    expected = EXPECTED[f"{name}{kwargs}"]
    assert _same(found, expected), (found, expected)


def test_axis_two_d_labels_composites_custom_and_update_dict_match_mxnet():
    rng, classes, _, values = _inputs()
    (probs, lab), _ = classes
    m = metric.Accuracy(axis=0)
    m.update([nd.array([0, 1, 1])], [nd.array([[0.3, 0.7, 0.2], [0.7, 0.3, 0.8]])])
    assert _same(list(m.get()), EXPECTED["acc_axis0"])
    m = metric.Accuracy()
    m.update([nd.array([[0, 1], [1, 0]])], [nd.array([[0, 1], [1, 1]])])
    assert _same(list(m.get()), EXPECTED["acc_2d"])
    m = metric.Accuracy()
    m.update([nd.array([[0, 1], [2, 0]])], [nd.array(rng.rand(2, 3, 2).astype("float32"))])
    assert _same(list(m.get()), EXPECTED["acc_2d_label_3d_pred"])
    m = metric.create(["acc", "ce"])
    m.update([nd.array(lab)], [nd.array(probs)])
    assert _same([list(m.get()), [list(p) for p in m.get_name_value()]],
                 EXPECTED["composite"])
    m = metric.create(lambda l, p: float((l == p.argmax(1)).sum()), name="my")
    m.update([nd.array(lab)], [nd.array(probs)])
    assert _same(list(m.get()), EXPECTED["custom"])
    m = metric.np(lambda l, p: (float(np.abs(l - p.argmax(1)).sum()), 3))
    m.update([nd.array(lab)], [nd.array(probs)])
    assert _same([list(m.get()), m.name], EXPECTED["np"])
    m = metric.create("acc", output_names=["o2"], label_names=["l1"])
    m.update_dict({"l0": nd.array([0, 0]), "l1": nd.array([1, 0])},
                  {"o1": nd.array([[1, 0], [1, 0]]), "o2": nd.array([[0, 1], [1, 0]])})
    assert _same(list(m.get()), EXPECTED["update_dict"])
    (reg_p, reg_l), _ = values
    m = metric.create("rmse")
    m.update(nd.array(reg_l), nd.array(reg_p))  # single arrays, not lists
    assert _same(list(m.get()), EXPECTED["single_ndarray"])


# names and aliases MXNet 1.9.1's mx.metric.create resolves, and the class it gives
NAMES = {"accuracy": "Accuracy", "acc": "Accuracy", "crossentropy": "CrossEntropy",
         "ce": "CrossEntropy", "negativeloglikelihood": "NegativeLogLikelihood",
         "nll_loss": "NegativeLogLikelihood", "pearsoncorrelation": "PearsonCorrelation",
         "pearsonr": "PearsonCorrelation", "compositeevalmetric": "CompositeEvalMetric",
         "composite": "CompositeEvalMetric", "torch": "Torch", "caffe": "Caffe",
         "mae": "MAE", "mse": "MSE", "rmse": "RMSE", "f1": "F1", "mcc": "MCC", "pcc": "PCC",
         "loss": "Loss", "Accuracy": "Accuracy", "RMSE": "RMSE"}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_create_knows_mxnets_names(name):
    assert type(metric.create(name)).__name__ == NAMES[name]


def test_top_k_names_config_and_errors():
    assert metric.create("top_k_acc", top_k=3).name == "top_k_accuracy_3"
    assert metric.create("perplexity", ignore_label=None).name == "perplexity"
    config = metric.Accuracy().get_config()
    assert config == {"axis": 1, "metric": "Accuracy", "name": "accuracy",
                      "output_names": None, "label_names": None}  # MXNet 1.9.1's
    again = metric.create(config)
    assert isinstance(again, metric.Accuracy) and again.axis == 1
    composite = metric.create(["acc", "mse"])
    assert [type(m).__name__ for m in metric.create(composite.get_config()["metrics"])
            .metrics] == ["Accuracy", "MSE"]
    with pytest.raises(InputError, match="unknown metric 'nope'"):
        metric.create("nope")
    with pytest.raises(ValueError, match="does not match"):
        metric.create("acc").update([nd.array([0])], [nd.array([[1, 0]]), nd.array([[1, 0]])])
    with pytest.raises(NotImplementedError):
        metric.create(lambda l, p: 0.0).get_config()
    with pytest.raises(InputError, match="top_k"):
        metric.TopKAccuracy(top_k=1)


def test_host_arrays_work_as_ndarrays_do():
    m = mixrt.metric.create("acc")
    m.update(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]]))
    assert m.get() == ("accuracy", pytest.approx(2 / 3))
    assert m.get_global() == m.get()
    m.reset()
    assert math.isnan(m.get()[1]) and math.isnan(m.get_global()[1])
