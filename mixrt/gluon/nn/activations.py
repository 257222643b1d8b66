"""Activation layers: ``Activation(name)`` for MXNet's named activations, and one layer per
activation with a parameter (``LeakyReLU(alpha)``, ``PReLU``, ``ELU``, ...). Each is one
or two ONNX ops, the same with ``F = nd`` and ``F = sym``."""

from __future__ import annotations

from mixrt.base.errors import InputError
from mixrt.gluon.hybrid import static_shape, HybridBlock
from mixrt.initializer import Constant
from mixrt.sym.symbol import MXNET_OP, MXNET_PARAMS, Symbol

# MXNet's activation names -> the ONNX op computing it
ACTIVATIONS = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softrelu": "Softplus",
               "softsign": "Softsign"}


def check_activation(name: str, where: str = "Activation") -> str:
    if name not in ACTIVATIONS:
        raise InputError(f"{where}: unknown activation {name!r}; valid activations are "
                         f"{sorted(ACTIVATIONS)}")
    return name


def apply_activation(F, x, name: str | None, node_name: str | None = None):
    """``x`` through the named activation (``None``: unchanged). In a traced graph the node
    is MXNet's ``Activation`` with its ``act_type``, as MXNet's block makes it (what
    list_attr and an op hook report)."""
    if name is None:
        return x
    result = getattr(F, ACTIVATIONS[name])(x, name=node_name)
    if isinstance(result, Symbol):
        node = result._outputs[0][0]
        node.info[MXNET_OP] = "Activation"
        node.info[MXNET_PARAMS] = {"act_type": name}
    return result


def activation_child(block, name: str | None):
    """MXNet's layers with ``activation=`` hold it as a child ``Activation`` block named
    after it (``dense0_relu_``), made in the layer's name scope; None without one."""
    if name is None:
        return None
    with block.name_scope():
        return Activation(check_activation(name, type(block).__name__), prefix=name + "_")


class Activation(HybridBlock):
    """One of MXNet's named activations: "relu", "sigmoid", "tanh", "softrelu" (log(1+e^x))
    or "softsign" (x / (1 + |x|))."""

    def __init__(self, activation: str, **kwargs):
        self._act_type = check_activation(activation)  # first: it names the block
        super().__init__(**kwargs)

    def _alias(self) -> str:
        return self._act_type  # MXNet names an Activation after it: relu0_

    def hybrid_forward(self, F, x):
        return apply_activation(F, x, self._act_type, "fwd")

    def __repr__(self) -> str:
        return f"Activation({self._act_type})"


class LeakyReLU(HybridBlock):
    """``x`` where positive, ``alpha * x`` elsewhere."""

    def __init__(self, alpha: float, **kwargs):
        if alpha < 0:
            raise InputError(f"LeakyReLU: alpha must be >= 0, got {alpha}")
        super().__init__(**kwargs)
        self._alpha = float(alpha)

    def hybrid_forward(self, F, x):
        return F.LeakyRelu(x, alpha=self._alpha, name="fwd")

    def __repr__(self) -> str:
        return f"LeakyReLU({self._alpha})"


class PReLU(HybridBlock):
    """LeakyReLU with a learned slope, one per channel (axis 1) or one for all
    (``in_channels=1``, the default)."""

    def __init__(self, alpha_initializer=None, in_channels: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.alpha = self.params.get("alpha", shape=(in_channels,),
                                     init=alpha_initializer or Constant(0.25))

    def hybrid_forward(self, F, x, alpha):
        channels = self.alpha.shape[0]
        if channels > 1:  # ONNX broadcasts from the last axis; the channels are axis 1
            rank = len(static_shape(x))
            alpha = alpha.reshape((channels,) + (1,) * (rank - 2))
        return F.PRelu(x, alpha, name="fwd")


class ELU(HybridBlock):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""

    def __init__(self, alpha: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self._alpha = float(alpha)

    def hybrid_forward(self, F, x):
        return F.Elu(x, alpha=self._alpha, name="fwd")


class SELU(HybridBlock):
    """Klambauer et al.'s self-normalizing ELU (the ONNX constants)."""

    def hybrid_forward(self, F, x):
        return F.Selu(x, name="fwd")


class GELU(HybridBlock):
    """``x * Phi(x)``; ``approximation="tanh"`` for the tanh formula."""

    def __init__(self, approximation: str = "none", **kwargs):
        if approximation not in ("none", "erf", "tanh"):
            raise InputError(f"GELU: approximation must be 'none' (or 'erf') or 'tanh', got "
                             f"{approximation!r}")
        super().__init__(**kwargs)
        self._approximation = "none" if approximation == "erf" else approximation

    def hybrid_forward(self, F, x):
        return F.Gelu(x, approximate=self._approximation, name="fwd")


class Swish(HybridBlock):
    """``x * sigmoid(beta * x)`` (as Mul and Sigmoid, so it exports to any opset)."""

    def __init__(self, beta: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self._beta = float(beta)

    def hybrid_forward(self, F, x):
        scaled = x if self._beta == 1.0 else x * self._beta
        return x * F.Sigmoid(scaled)
