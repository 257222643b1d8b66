"""mx.gluon.model_zoo.vision: MXNet 1.9.1's networks with its parameter names, counts and
shapes (the reference numbers are MXNet's for a 224x224 input and 1000 classes), the same
outputs imperatively and hybridized, get_model's names, and pretrained weights read from a
local file only."""

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import nd
from mixrt.errors import InputError, ModelLoadError
from mixrt.gluon.model_zoo import vision
from mixrt.gluon.model_zoo.vision import get_model

# name -> (parameters, their values, the trainable ones), as MXNet 1.9.1 counts them
REFERENCE = {
    "resnet18_v1": (102, 11699112, 11689512),
    "squeezenet1.1": (52, 1235496, 1235496),
    "mobilenetv2_1.0": (266, 3539136, 3504960),
    "mobilenet1.0": (137, 4253864, 4231976),
}


def _counts(net):
    params = net.collect_params()
    sizes = {name: int(np.prod(p.shape)) for name, p in params.items()}
    trainable = sum(sizes[name] for name, p in params.items() if p.grad_req != "null")
    return len(sizes), sum(sizes.values()), trainable


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_parameter_counts_are_mxnets(name):
    net = get_model(name)
    net.initialize()
    assert net(nd.zeros((1, 3, 224, 224))).shape == (1, 1000)
    assert _counts(net) == REFERENCE[name]


def test_parameter_names_follow_mxnets_prefixes():
    names = list(vision.resnet18_v1(prefix="r_").collect_params().keys())
    assert names[:6] == ["r_conv0_weight", "r_batchnorm0_gamma", "r_batchnorm0_beta",
                         "r_batchnorm0_running_mean", "r_batchnorm0_running_var",
                         "r_stage1_conv0_weight"]
    assert "r_stage2_conv2_weight" in names  # stage 2's projection shortcut
    assert names[-2:] == ["r_dense0_weight", "r_dense0_bias"]
    v2 = vision.mobilenet_v2_0_25(prefix="m_").collect_params()
    assert v2["m_output_pred_weight"].shape == (1000, 0, 1, 1)  # known at the first call
    assert "m_features_linearbottleneck16_conv2_weight" in v2.keys()


def test_thumbnail_resnets_give_the_same_outputs_hybridized():
    x = nd.array(np.random.default_rng(0).uniform(-1, 1, (2, 3, 32, 32)))
    for build in (vision.resnet18_v1, vision.resnet18_v2):
        net = build(classes=10, thumbnail=True)
        net.initialize(mixrt.initializer.Uniform(0.1))
        eager = net(x).asnumpy()
        net.hybridize()
        np.testing.assert_allclose(net(x).asnumpy(), eager, rtol=1e-4, atol=1e-4)
        assert eager.shape == (2, 10)


def test_mobilenet_v2_clips_at_six_hybridized():
    relu6 = vision.RELU6()
    relu6.hybridize()
    assert relu6(nd.array([-1.0, 3.0, 9.0])).asnumpy().tolist() == [0.0, 3.0, 6.0]


def test_get_model_names_the_available_models():
    assert isinstance(get_model("SqueezeNet1.0"), vision.SqueezeNet)
    assert isinstance(get_model("vgg11_bn").features[1], mixrt.gluon.nn.BatchNorm)
    with pytest.raises(InputError, match="resnet18_v1"):
        get_model("resnet19_v1")
    with pytest.raises(InputError, match="num_layers"):
        vision.get_resnet(1, 19)
    with pytest.raises(InputError, match="version"):
        vision.get_resnet(3, 18)


def test_pretrained_reads_a_local_file_and_downloads_nothing(tmp_path):
    with pytest.raises(ModelLoadError, match="downloads nothing"):
        vision.squeezenet1_1(pretrained=True, root=str(tmp_path))
    trained = vision.squeezenet1_1()
    trained.initialize(mixrt.initializer.Uniform(0.5))
    trained(nd.zeros((1, 3, 224, 224)))
    trained.save_parameters(str(tmp_path / "squeezenet1.1-0123abcd.params"))
    loaded = vision.squeezenet1_1(pretrained=True, root=str(tmp_path))
    first = loaded.features[0].weight.data().asnumpy()
    np.testing.assert_array_equal(first, trained.features[0].weight.data().asnumpy())
