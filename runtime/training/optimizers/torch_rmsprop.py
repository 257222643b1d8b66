"""The engine's ``rmsprop`` (torch.optim.RMSprop's rule; MXNet's is ``rmsprop.py``), as array
expressions on the CPU and the GPU alike."""

from __future__ import annotations

from mixrt.runtime.training.lr_scheduler import real_param
from mixrt.runtime.training.optimizer_base import Optimizer, _flag, with_l2


class RMSProp(Optimizer):
    """RMSProp as torch.optim.RMSprop (``rho`` is PyTorch's ``alpha``). Weight decay is L2,
    added to the gradient::

        g = grad + wd * w
        sq = rho * sq + (1 - rho) * g^2
        avg = sqrt(sq - ga^2) + eps, ga = rho * ga + (1 - rho) * g   (centered)
              sqrt(sq) + eps                                          (otherwise)
        buf = momentum * buf + g / avg; w -= lr * buf   (momentum > 0; else w -= lr g / avg)

    MXNet's RMSProp puts epsilon inside the square root and its centered form differs; this
    is PyTorch's.
    """

    name = "rmsprop"

    def __init__(self, *, rho=0.99, momentum=0.0, epsilon=1e-8, centered=False, **common):
        self.rho = real_param(self._owner, "rho", rho, low=0.0, high=1.0)
        self.momentum = real_param(self._owner, "momentum", momentum, low=0.0)
        self.epsilon = real_param(self._owner, "epsilon", epsilon, low=0.0)
        self.centered = _flag(self._owner, "centered", centered)
        super().__init__(**common)

    def hyper_params(self) -> dict:
        return {"rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}

    def state_slots(self) -> tuple[str, ...]:
        return (("square_avg",) + (("grad_avg",) if self.centered else ())
                + (("momentum",) if self.momentum else ()))

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        g = with_l2(grad, weight, wd)
        square_avg = state["square_avg"]
        square_avg *= self.rho
        square_avg += (1 - self.rho) * (g * g)
        if self.centered:
            grad_avg = state["grad_avg"]
            grad_avg *= self.rho
            grad_avg += (1 - self.rho) * g
            avg = xp.sqrt(square_avg - grad_avg * grad_avg) + self.epsilon
        else:
            avg = xp.sqrt(square_avg) + self.epsilon
        if not self.momentum:
            weight -= lr * (g / avg)
            return
        buf = state["momentum"]
        buf *= self.momentum
        buf += g / avg
        weight -= lr * buf


KINDS = (RMSProp,)
