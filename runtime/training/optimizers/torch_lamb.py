"""The engine's ``lamb`` (You et al., 2019, one trust ratio per key, MXNet's defaults; PyTorch
has none), over Adam's moments (``torch_adam.py``), as array expressions on the CPU and the
GPU alike. MXNet's own LAMB, in its two phases, is ``lamb.py``."""

from __future__ import annotations

from mixrt.base.errors import OptimizerError
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import _flag
from mixrt.runtime.training.optimizers.torch_adam import AdamMoments


class LAMB(AdamMoments):
    """LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning", Algorithm 2),
    one trust ratio per key (a key is one layer's tensor). Weight decay is decoupled: it
    joins Adam's direction, not the moments::

        m, v as Adam's; m^ = m / (1 - beta1^t), v^ = v / (1 - beta2^t)  (bias_correction)
        r = m^ / (sqrt(v^) + eps) + wd * w
        w -= lr * phi(||w||) / ||r|| * r,   phi clamps to [lower_bound, upper_bound]

    The ratio is 1 when either norm is 0 (MXNet). PyTorch has no LAMB; defaults are
    MXNet's (epsilon 1e-6).
    """

    name = "lamb"
    default_epsilon = 1e-6

    def __init__(self, *, bias_correction=True, lower_bound=None, upper_bound=None, **rest):
        self.bias_correction = _flag(self._owner, "bias_correction", bias_correction)
        self.lower_bound = _optional_bound(self._owner, "lower_bound", lower_bound)
        self.upper_bound = _optional_bound(self._owner, "upper_bound", upper_bound)
        if None not in (lower_bound, upper_bound) and self.lower_bound > self.upper_bound:
            raise OptimizerError(f"{self._owner}: lower_bound={lower_bound!r} is above "
                                 f"upper_bound={upper_bound!r}")
        super().__init__(**rest)

    def hyper_params(self) -> dict:
        return {**super().hyper_params(), "bias_correction": self.bias_correction,
                "lower_bound": self.lower_bound, "upper_bound": self.upper_bound}

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        mean, var = self._update_moments(state, grad)
        if self.bias_correction:
            mean = mean / (1 - self.beta1 ** t)
            var = var / (1 - self.beta2 ** t)
        direction = mean / (xp.sqrt(var) + self.epsilon)  # a new array: safe to add into
        if wd:
            direction += wd * weight
        weight -= (lr * self._trust_ratio(xp, weight, direction)) * direction

    def _trust_ratio(self, xp, weight, direction):
        """||w|| / ||r|| as a 0-d array of the weight's dtype (no host round trip)."""
        weight_norm = xp.linalg.norm(weight)
        if self.lower_bound is not None:
            weight_norm = xp.maximum(weight_norm, self.lower_bound)
        if self.upper_bound is not None:
            weight_norm = xp.minimum(weight_norm, self.upper_bound)
        direction_norm = xp.linalg.norm(direction)
        one = weight.dtype.type(1)
        usable = (weight_norm > 0) & (direction_norm > 0)
        return xp.where(usable, weight_norm / xp.where(usable, direction_norm, one), one)


def _optional_bound(owner: str, name: str, value):
    return None if value is None else real_param(owner, name, value, low=0.0)


KINDS = (LAMB,)
