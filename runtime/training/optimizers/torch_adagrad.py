"""The engine's ``adagrad`` (torch.optim.Adagrad's rule; MXNet's is ``adagrad.py``), as array
expressions on the CPU and the GPU alike."""

from __future__ import annotations

from mixrt.ops.device import array_module
from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, with_l2


class AdaGrad(Optimizer):
    """AdaGrad (Duchi et al.) as torch.optim.Adagrad. Weight decay is L2, added to the
    gradient before it is accumulated (MXNet adds it after; this is PyTorch's)::

        g = grad + wd * w
        sum += g^2                        (sum starts at initial_accumulator_value)
        w -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)
    """

    name = "adagrad"

    def __init__(self, *, epsilon=1e-10, lr_decay=0.0, initial_accumulator_value=0.0,
                 **common):
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.lr_decay = real_param(self._owner, "lr_decay", lr_decay, low=0.0)
        self.initial_accumulator_value = real_param(
            self._owner, "initial_accumulator_value", initial_accumulator_value, low=0.0)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"epsilon": self.epsilon, "lr_decay": self.lr_decay,
                "initial_accumulator_value": self.initial_accumulator_value}

    def state_slots(self) -> tuple[str, ...]:
        return ("sum",)

    def create_state(self, key, weight) -> dict:
        return {"sum": array_module(weight).full_like(weight, self.initial_accumulator_value)}

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        g = with_l2(grad, weight, wd)
        accumulated = state["sum"]
        accumulated += g * g
        decayed_lr = lr / (1 + (t - 1) * self.lr_decay)
        weight -= decayed_lr * (g / (xp.sqrt(accumulated) + self.epsilon))


KINDS = (AdaGrad,)
