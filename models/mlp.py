"""Multi-layer perceptron, written with mixrt.sym."""

from __future__ import annotations

from mixrt import sym
from mixrt.models.layers import dense


def mlp(in_units: int = 784, hidden: tuple[int, ...] = (1024, 1024), classes: int = 10,
        data: str = "data"):
    """data (N, in_units) -> dense + ReLU per hidden width -> dense(classes) logits."""
    x = sym.Variable(data, shape=(None, in_units))
    width = in_units
    for i, units in enumerate(hidden):
        x = sym.Relu(dense(x, width, units, f"fc{i + 1}"), name=f"relu{i + 1}")
        width = units
    return dense(x, width, classes, f"fc{len(hidden) + 1}")
