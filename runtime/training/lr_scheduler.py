"""Learning-rate schedules: the learning rate as a function of the update count.

A scheduler is called with ``num_update`` (how many updates the optimizer has done, counting
the one about to happen, so the first update asks for ``scheduler(1)``) and returns a Python
float. Schedulers are pure functions of that count: they hold no state that changes while
training, so a checkpoint never needs to save one, and the spec below rebuilds one exactly.

Every scheduler has a spec, ``{"name": ..., "params": {...}}`` of plain JSON values, and
``from_spec`` rebuilds it; a parameter-server KVStore ships optimizers (and so schedulers) to
its servers that way, never by pickle.

The kinds and their parameters follow MXNet's ``mxnet.lr_scheduler`` (names, defaults, when a
decay happens). Every kind takes the same warm-up options: for ``num_update < warmup_steps``
the rate goes from ``warmup_begin_lr`` to ``base_lr`` in equal increments ('linear') or
stays at ``warmup_begin_lr`` ('constant'). Where MXNet keeps state (it multiplies the rate
by the factor once per decay), mixrt computes the same schedule in closed form, which can
differ from MXNet's in the last bit.
"""

from __future__ import annotations

import math
import numbers

from mixrt.base.errors import OptimizerError

_WARMUP_MODES = ("linear", "constant")


# -- parameter checks, shared with runtime/training/optimizer.py -----------------------------

def real_param(owner: str, name: str, value, *, low=None, high=None, low_open=False,
               high_open=False) -> float:
    """``value`` as a float, or an OptimizerError naming ``owner``'s parameter and its range.

    Python floats (not NumPy scalars) on purpose: a float64 NumPy scalar would promote a
    float32 weight it multiplies, a Python float does not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value):
        raise OptimizerError(f"{owner}: {name} must be a finite number, got {value!r}")
    value = float(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        bounds = f"{'(' if low_open else '['}{'-inf' if low is None else low}, " \
                 f"{'inf' if high is None else high}{')' if high_open else ']'}"
        raise OptimizerError(f"{owner}: {name}={value!r} is outside its valid range {bounds}")
    return value


def int_param(owner: str, name: str, value, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise OptimizerError(f"{owner}: {name} must be an integer >= {low}, got {value!r}")
    return int(value)


def choice_param(owner: str, name: str, value, choices) -> str:
    if value not in choices:
        raise OptimizerError(f"{owner}: {name}={value!r} is not one of {list(choices)}")
    return value


def reject_unknown(owner: str, unknown: dict, valid) -> None:
    if unknown:
        bad = sorted(unknown)
        raise OptimizerError(f"{owner} has no parameter {', '.join(map(repr, bad))}; "
                             f"valid parameters: {sorted(valid)}")


# -- the schedulers -------------------------------------------------------------------------

class LRScheduler:
    """Base class: warm-up handling, the spec, parameter checks. Subclasses define
    ``name``, ``_own_params()`` (their spec entries) and ``_after_warmup(num_update)``."""

    name = ""
    _COMMON = ("base_lr", "warmup_steps", "warmup_begin_lr", "warmup_mode")

    def __init__(self, *, base_lr=0.01, warmup_steps=0, warmup_begin_lr=0.0,
                 warmup_mode="linear", **unknown):
        reject_unknown(self._owner, unknown,
                       self._COMMON + tuple(self._own_params()))
        self.base_lr = real_param(self._owner, "base_lr", base_lr, low=0.0)
        self.warmup_steps = int_param(self._owner, "warmup_steps", warmup_steps)
        self.warmup_begin_lr = real_param(self._owner, "warmup_begin_lr", warmup_begin_lr,
                                          low=0.0)
        self.warmup_mode = choice_param(self._owner, "warmup_mode", warmup_mode,
                                        _WARMUP_MODES)

    @property
    def _owner(self) -> str:
        return f"lr scheduler {self.name!r}"

    def __call__(self, num_update: int) -> float:
        if num_update < self.warmup_steps:
            return self._warmup_lr(num_update)
        return self._after_warmup(num_update)

    def _warmup_lr(self, num_update: int) -> float:
        if self.warmup_mode == "constant":
            return self.warmup_begin_lr
        progress = num_update / self.warmup_steps
        return self.warmup_begin_lr + (self.base_lr - self.warmup_begin_lr) * progress

    def _after_warmup(self, num_update: int) -> float:
        raise NotImplementedError

    def _own_params(self) -> dict:
        """This kind's own parameters by name (subclasses set them before calling
        ``LRScheduler.__init__``, which lists them when it rejects an unknown one)."""
        return {}

    def spec(self) -> dict:
        params = {name: getattr(self, name) for name in self._COMMON}
        params.update(self._own_params())
        return {"name": self.name, "params": params}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.spec()["params"].items())
        return f"{type(self).__name__}({params})"

    def __eq__(self, other) -> bool:
        return isinstance(other, LRScheduler) and self.spec() == other.spec()


class FactorScheduler(LRScheduler):
    """Multiply the rate by ``factor`` every ``step`` updates: after ``k*step`` updates
    (update ``k*step + 1`` onwards) it is ``base_lr * factor**k``, as MXNet counts. Decays
    never take it below ``stop_factor_lr``. Steps count from 0, warm-up included."""

    name = "factor"

    def __init__(self, step, factor=1.0, stop_factor_lr=1e-8, **common):
        self.step = int_param(self._owner, "step", step, low=1)
        self.factor = real_param(self._owner, "factor", factor, low=0.0, high=1.0,
                                 low_open=True)
        self.stop_factor_lr = real_param(self._owner, "stop_factor_lr", stop_factor_lr,
                                         low=0.0)
        super().__init__(**common)

    def _own_params(self) -> dict:
        return {"step": self.step, "factor": self.factor, "stop_factor_lr": self.stop_factor_lr}

    def _after_warmup(self, num_update: int) -> float:
        decays = max(0, (num_update - 1) // self.step)
        return decayed(self.base_lr, self.factor, decays, min(self.base_lr, self.stop_factor_lr))


class MultiFactorScheduler(LRScheduler):
    """Multiply the rate by ``factor`` once past each of the increasing update counts in
    ``step``: from update ``step[i] + 1`` on it is ``base_lr * factor**(i + 1)``."""

    name = "multifactor"

    def __init__(self, step, factor=1.0, **common):
        owner = self._owner
        if not isinstance(step, (list, tuple)) or not step:
            raise OptimizerError(f"{owner}: step must be a non-empty list of update counts, "
                                 f"got {step!r}")
        self.step = [int_param(owner, "step", s, low=1) for s in step]
        if any(b <= a for a, b in zip(self.step, self.step[1:])):
            raise OptimizerError(f"{owner}: step must be strictly increasing, got {step!r}")
        self.factor = real_param(owner, "factor", factor, low=0.0, high=1.0, low_open=True)
        super().__init__(**common)

    def _own_params(self) -> dict:
        return {"step": list(self.step), "factor": self.factor}

    def _after_warmup(self, num_update: int) -> float:
        decays = sum(1 for s in self.step if num_update > s)
        return decayed(self.base_lr, self.factor, decays)


def decayed(lr: float, factor: float, times: int, floor: float = 0.0) -> float:
    """``lr`` multiplied by ``factor`` ``times`` times, never below ``floor``. One product
    at a time, as MXNet's schedulers decay their rate, so the rates are MXNet's to the last
    bit (``0.1 ** 4`` and ``0.1 * 0.1 * 0.1 * 0.1`` differ in it)."""
    if factor == 1.0:
        return lr
    for _ in range(times):
        lr *= factor
        if lr <= floor or lr == 0.0:  # every later product stays there
            return max(lr, floor)
    return lr


class _DecayToFinal(LRScheduler):
    """Shared by the cosine and polynomial schedules: decay from ``base_lr`` at the end of
    warm-up to ``final_lr`` at ``max_update``, then stay at ``final_lr``."""

    def __init__(self, max_update, final_lr=0.0, **common):
        self.max_update = int_param(self._owner, "max_update", max_update, low=1)
        self.final_lr = real_param(self._owner, "final_lr", final_lr, low=0.0)
        super().__init__(**common)
        if self.warmup_steps >= self.max_update:
            raise OptimizerError(f"{self._owner}: warmup_steps={self.warmup_steps} must be "
                                 f"less than max_update={self.max_update}")

    def _own_params(self) -> dict:
        return {"max_update": self.max_update, "final_lr": self.final_lr}

    def _after_warmup(self, num_update: int) -> float:
        done = min(num_update, self.max_update) - self.warmup_steps
        progress = done / (self.max_update - self.warmup_steps)
        return self.final_lr + (self.base_lr - self.final_lr) * self._shape(progress)

    def _shape(self, progress: float) -> float:
        raise NotImplementedError


class CosineScheduler(_DecayToFinal):
    """Half a cosine from ``base_lr`` to ``final_lr`` over ``max_update`` updates."""

    name = "cosine"

    def _shape(self, progress: float) -> float:
        return (1 + math.cos(math.pi * progress)) / 2


class PolyScheduler(_DecayToFinal):
    """``(1 - progress) ** pwr`` from ``base_lr`` to ``final_lr`` over ``max_update``."""

    name = "poly"

    def __init__(self, max_update, pwr=2.0, **rest):
        self.pwr = real_param(self._owner, "pwr", pwr, low=0.0, low_open=True)
        super().__init__(max_update, **rest)

    def _own_params(self) -> dict:
        return {**super()._own_params(), "pwr": self.pwr}

    def _shape(self, progress: float) -> float:
        return (1 - progress) ** self.pwr


SCHEDULERS = {cls.name: cls for cls in
              (FactorScheduler, MultiFactorScheduler, CosineScheduler, PolyScheduler)}


def create(name: str, **params) -> LRScheduler:
    """A scheduler by its spec name: ``create("cosine", max_update=1000, base_lr=0.1)``."""
    if name not in SCHEDULERS:
        raise OptimizerError(f"unknown lr scheduler {name!r}; valid names: {sorted(SCHEDULERS)}")
    try:
        return SCHEDULERS[name](**params)
    except TypeError as exc:  # a required parameter is missing
        raise OptimizerError(f"lr scheduler {name!r}: {exc}") from None


def from_spec(spec: dict) -> LRScheduler:
    """Rebuild a scheduler from ``scheduler.spec()`` (or that spec after a JSON round trip)."""
    if not isinstance(spec, dict) or set(spec) != {"name", "params"} \
            or not isinstance(spec["params"], dict):
        raise OptimizerError(f"an lr scheduler spec is {{'name': str, 'params': dict}}, "
                             f"got {spec!r}")
    return create(spec["name"], **spec["params"])


__all__ = ["LRScheduler", "FactorScheduler", "MultiFactorScheduler", "CosineScheduler",
           "PolyScheduler", "SCHEDULERS", "create", "from_spec"]
