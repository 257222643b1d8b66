"""mixrt.gluon.model_zoo.vision: MXNet 1.x's image classification networks (ResNet v1/v2,
VGG, AlexNet, DenseNet, SqueezeNet, MobileNet v1/v2) by constructor or by name.

    net = get_model("resnet18_v1", classes=10)
    net.initialize()

``pretrained=True`` reads MXNet's parameter file from ``root`` (default
``$MXNET_HOME/models``) and downloads nothing.
"""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon.model_zoo.vision.alexnet import AlexNet, alexnet
from mixrt.gluon.model_zoo.vision.densenet import (DenseNet, densenet121, densenet161,
                                                   densenet169, densenet201, get_densenet)
from mixrt.gluon.model_zoo.vision.mobilenet import (
    RELU6, LinearBottleneck, MobileNet, MobileNetV2, get_mobilenet, get_mobilenet_v2,
    mobilenet0_25, mobilenet0_5, mobilenet0_75, mobilenet1_0, mobilenet_v2_0_25,
    mobilenet_v2_0_5, mobilenet_v2_0_75, mobilenet_v2_1_0)
from mixrt.gluon.model_zoo.vision.resnet import (
    BasicBlockV1, BasicBlockV2, BottleneckV1, BottleneckV2, ResNetV1, ResNetV2, get_resnet,
    resnet18_v1, resnet18_v2, resnet34_v1, resnet34_v2, resnet50_v1, resnet50_v2,
    resnet101_v1, resnet101_v2, resnet152_v1, resnet152_v2)
from mixrt.gluon.model_zoo.vision.squeezenet import (SqueezeNet, get_squeezenet,
                                                     squeezenet1_0, squeezenet1_1)
from mixrt.gluon.model_zoo.vision.vgg import (VGG, get_vgg, vgg11, vgg11_bn, vgg13, vgg13_bn,
                                              vgg16, vgg16_bn, vgg19, vgg19_bn)

# MXNet's names for get_model (squeezenet and mobilenet with a dot in the version)
MODELS = {
    "resnet18_v1": resnet18_v1, "resnet34_v1": resnet34_v1, "resnet50_v1": resnet50_v1,
    "resnet101_v1": resnet101_v1, "resnet152_v1": resnet152_v1,
    "resnet18_v2": resnet18_v2, "resnet34_v2": resnet34_v2, "resnet50_v2": resnet50_v2,
    "resnet101_v2": resnet101_v2, "resnet152_v2": resnet152_v2,
    "vgg11": vgg11, "vgg13": vgg13, "vgg16": vgg16, "vgg19": vgg19,
    "vgg11_bn": vgg11_bn, "vgg13_bn": vgg13_bn, "vgg16_bn": vgg16_bn, "vgg19_bn": vgg19_bn,
    "alexnet": alexnet,
    "densenet121": densenet121, "densenet161": densenet161, "densenet169": densenet169,
    "densenet201": densenet201,
    "squeezenet1.0": squeezenet1_0, "squeezenet1.1": squeezenet1_1,
    "mobilenet1.0": mobilenet1_0, "mobilenet0.75": mobilenet0_75,
    "mobilenet0.5": mobilenet0_5, "mobilenet0.25": mobilenet0_25,
    "mobilenetv2_1.0": mobilenet_v2_1_0, "mobilenetv2_0.75": mobilenet_v2_0_75,
    "mobilenetv2_0.5": mobilenet_v2_0_5, "mobilenetv2_0.25": mobilenet_v2_0_25,
}


def get_model(name: str, **kwargs):
    """The network MXNet names ``name`` (case-insensitive); ``kwargs`` (``pretrained``,
    ``classes``, ``ctx``, ``root``, ``prefix``, ...) go to its constructor."""
    key = str(name).lower()
    if key not in MODELS:
        raise InputError(f"get_model: model {name!r} is not supported; the available "
                         f"models are {', '.join(sorted(MODELS))}")
    return MODELS[key](**kwargs)
