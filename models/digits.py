"""The main job's built-in data and model: the 8x8 handwritten digits (1,797 images, the UCI
"Optical Recognition of Handwritten Digits" test set, pixel counts 0..16) and a small CNN.

The data ships as ``data/digits.npz`` (uint8 images and labels, loaded without pickle).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mixrt import random as mixrt_random
from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Node, Value

DATA = Path(__file__).with_name("data") / "digits.npz"
OPSET = 17
NUM_CLASSES = 10


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 (N, 1, 8, 8) scaled to [0, 1], labels as int64 (N,)."""
    with np.load(DATA, allow_pickle=False) as stored:
        images, labels = stored["images"], stored["labels"]
    return (images.astype(np.float32) / 16.0)[:, None], labels.astype(np.int64)


def split(images, labels, *, test_share: float = 0.2, seed: int = 0):
    """A fixed stratified-enough split: a seeded permutation, the first share for test."""
    order = np.random.default_rng(seed).permutation(len(images))
    cut = int(len(images) * test_share)
    test, train = order[:cut], order[cut:]
    return (images[train], labels[train]), (images[test], labels[test])


def digits_cnn(channels: tuple[int, int] = (16, 32), hidden: int = 64,
               num_classes: int = NUM_CLASSES) -> Graph:
    """conv3x3(16) - relu - conv3x3(32) - relu - maxpool2 - dense(64) - relu - dense(10), He
    initialized from mixrt.random (so ``mixrt.random.seed`` fixes it). The input batch
    dimension is symbolic; the features before the classifier are named ``features``."""
    rng = mixrt_random.generator()
    graph = Graph(name="digits_cnn", opsets={"": OPSET})
    graph.inputs = [Value("image", TensorType(np.dtype(np.float32), ("N", 1, 8, 8)))]
    c1, c2 = channels

    def param(name, shape, fan_in):
        graph.initializers[name] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
                                    ).astype(np.float32)

    def zeros(name, size):
        graph.initializers[name] = np.zeros(size, np.float32)

    def node(op_type, inputs, output, **attributes):
        graph.nodes.append(Node(op_type, inputs, [output], name=output, opset=OPSET,
                                attributes=attributes))

    param("conv1.weight", (c1, 1, 3, 3), 9)
    zeros("conv1.bias", c1)
    param("conv2.weight", (c2, c1, 3, 3), 9 * c1)
    zeros("conv2.bias", c2)
    param("fc1.weight", (hidden, c2 * 16), c2 * 16)
    zeros("fc1.bias", hidden)
    param("fc2.weight", (num_classes, hidden), hidden)
    zeros("fc2.bias", num_classes)
    node("Conv", ["image", "conv1.weight", "conv1.bias"], "conv1", pads=[1, 1, 1, 1])
    node("Relu", ["conv1"], "relu1")
    node("Conv", ["relu1", "conv2.weight", "conv2.bias"], "conv2", pads=[1, 1, 1, 1])
    node("Relu", ["conv2"], "relu2")
    node("MaxPool", ["relu2"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    node("Flatten", ["pool"], "flat")
    node("Gemm", ["flat", "fc1.weight", "fc1.bias"], "fc1", transB=1)
    node("Relu", ["fc1"], "features")
    node("Gemm", ["features", "fc2.weight", "fc2.bias"], "logits", transB=1)
    graph.outputs = [Value("logits", TensorType(np.dtype(np.float32), ("N", num_classes)))]
    return graph
