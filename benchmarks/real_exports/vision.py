"""torchvision classification, segmentation and detection models, random weights.

Classifiers and segmenters take one 224x224 image, the detectors one 320x320 image (their
own transform resizes and normalises inside the graph). Weights are torchvision's
initialisation under a fixed seed; nothing is downloaded (``weights=None``, and no backbone
weights either). Most go through the TorchScript exporter at opset 17 as torchvision's
export tests do; two classifiers also go through the ``torch.export`` exporter. A detector
with random weights scores every anchor alike, so its NonMaxSuppression sees the full
candidate list (SSDlite: ~27,000 boxes over 90 classes), which is the worst case a trained
model meets on a cluttered image.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .common import Recipe, rng, torch_seeded, version

CLASSIFIERS = ("mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf", "convnext_tiny",
               "swin_t", "resnet18")
DYNAMO_CLASSIFIERS = ("mobilenet_v3_large", "resnet18")
SEGMENTERS = ("deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")
DETECTORS = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn")


def _image(size: int) -> np.ndarray:
    return rng(5).random((1, 3, size, size), dtype=np.float32)


def _export(torch, module, image: np.ndarray, path: Path, outputs, dynamo: bool,
            opset: int = 17):
    args = (torch.from_numpy(image),)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, args, str(path), dynamo=True, external_data=False,
                              input_names=["image"], output_names=list(outputs))
        else:
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                              input_names=["image"], output_names=list(outputs))


def _classifier(name: str, dynamo: bool):
    def build(path: Path) -> dict[str, np.ndarray]:
        torch = torch_seeded()
        import torchvision  # noqa: PLC0415
        model = torchvision.models.get_model(name, weights=None).eval()
        image = _image(224)
        _export(torch, model, image, path, ["logits"], dynamo)
        return {"image": image}
    return build


def _segmenter(name: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        torch = torch_seeded()
        import torchvision  # noqa: PLC0415
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None,
                                             num_classes=21).eval()

        class Masks(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, image):
                return self.model(image)["out"]

        image = _image(224)
        _export(torch, Masks().eval(), image, path, ["masks"], dynamo=False)
        return {"image": image}
    return build


def _detector(name: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        torch = torch_seeded()
        import torchvision  # noqa: PLC0415
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None).eval()

        class Detections(torch.nn.Module):
            """One image in, its boxes, scores and labels out (torchvision's detectors take a
            list of images and return a list of dicts)."""

            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, image):
                found = self.model([image[0]])[0]
                return found["boxes"], found["scores"], found["labels"]

        image = _image(320)
        _export(torch, Detections().eval(), image, path, ["boxes", "scores", "labels"],
                dynamo=False)
        return {"image": image}
    return build


def _recipes() -> dict[str, Recipe]:
    ts = f"torch.onnx TorchScript (torch {version('torch')}, torchvision {version('torchvision')})"
    dyn = f"torch.onnx dynamo (torch {version('torch')}, torchvision {version('torchvision')})"
    recipes = {f"tv_{name}": Recipe("vision", ts, _classifier(name, False))
               for name in CLASSIFIERS}
    recipes.update({f"tv_{name}_dynamo": Recipe("vision", dyn, _classifier(name, True))
                    for name in DYNAMO_CLASSIFIERS})
    recipes.update({f"tv_{name}": Recipe("vision", ts, _segmenter(name)) for name in SEGMENTERS})
    recipes.update({f"tv_{name}": Recipe("vision", ts, _detector(name)) for name in DETECTORS})
    return recipes


BUILDERS = _recipes()
