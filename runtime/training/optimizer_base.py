"""The base of the engine's optimizers (``runtime/training/optimizer.py``): the
hyper-parameters every kind shares, the per-key update counts and learning rate, ``spec()``,
and the checkpoints ``state_dict()`` writes and ``read_meta`` checks. The kinds are the files
of ``runtime/training/optimizers/``; the functions that build one by name are in
``runtime/training/optimizer.py``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping

import numpy as np

from mixrt.base.errors import DeviceMismatchError, OptimizerError, ShapeError
from mixrt.runtime.training import lr_scheduler as schedulers
from mixrt.runtime.training import optimizer_kernels
from mixrt.ops.device import array_module, to_host
from mixrt.runtime.training.lr_scheduler import LRScheduler, real_param, reject_unknown

STATE_FORMAT = 1  # bumped when the layout of state_dict() changes


class Optimizer:
    """Base class: hyper-parameters shared by every kind, counts, spec and checkpoints.

    A kind defines ``name``, ``hyper_params()`` (its own spec entries, set before calling
    ``Optimizer.__init__``), ``state_slots()`` and ``_apply(xp, weight, grad, state, lr, wd,
    t)``, which sees the rescaled and clipped gradient, this key's rate and decay and its
    update count ``t`` (1 on the first update).
    """

    name = ""
    default_learning_rate = 0.01
    default_wd = 0.0
    _COMMON = ("learning_rate", "wd", "rescale_grad", "clip_gradient", "lr_scheduler",
               "lr_mult", "wd_mult")

    def __init__(self, *, learning_rate=None, wd=None, rescale_grad=1.0, clip_gradient=None,
                 lr_scheduler=None, lr_mult=None, wd_mult=None, **unknown):
        reject_unknown(self._owner, unknown, self._COMMON + tuple(self.hyper_params()))
        self.lr_scheduler = _scheduler(self._owner, lr_scheduler)
        self._base_lr = self._pick_learning_rate(learning_rate)
        self.wd = real_param(self._owner, "wd", self.default_wd if wd is None else wd, low=0.0)
        self.rescale_grad = real_param(self._owner, "rescale_grad", rescale_grad)
        self.clip_gradient = None if clip_gradient is None else real_param(
            self._owner, "clip_gradient", clip_gradient, low=0.0, low_open=True)
        self.lr_mult = _multipliers(self._owner, "lr_mult", lr_mult)
        self.wd_mult = _multipliers(self._owner, "wd_mult", wd_mult)
        self.counts: dict[str, int] = {}
        self.num_update = 0
        self.states: dict[str, dict] = {}

    @property
    def _owner(self) -> str:
        return f"optimizer {self.name!r}"

    def _pick_learning_rate(self, learning_rate) -> float:
        """One source of truth: the scheduler's base_lr when there is a scheduler."""
        if self.lr_scheduler is None:
            chosen = self.default_learning_rate if learning_rate is None else learning_rate
            return real_param(self._owner, "learning_rate", chosen, low=0.0)
        base = self.lr_scheduler.base_lr
        if learning_rate is not None and \
                real_param(self._owner, "learning_rate", learning_rate, low=0.0) != base:
            raise OptimizerError(
                f"{self._owner}: learning_rate={learning_rate!r} disagrees with the "
                f"lr_scheduler's base_lr={base!r}; set the rate on the scheduler only")
        return base

    # -- what a kind defines ------------------------------------------------------------

    def hyper_params(self) -> dict:
        return {}

    def state_slots(self) -> tuple[str, ...]:
        return ()

    def _apply(self, xp, weight, grad, state, lr, wd, t) -> None:
        raise NotImplementedError

    # -- learning rate ------------------------------------------------------------------

    @property
    def learning_rate(self) -> float:
        """The rate at the current ``num_update`` (before a key's ``lr_mult``)."""
        if self.lr_scheduler is None:
            return self._base_lr
        return self.lr_scheduler(self.num_update)

    def set_learning_rate(self, learning_rate: float) -> None:
        if self.lr_scheduler is not None:
            raise OptimizerError(f"{self._owner} follows its lr_scheduler; change the "
                                 f"scheduler instead of setting learning_rate")
        self._base_lr = real_param(self._owner, "learning_rate", learning_rate, low=0.0)

    # -- updates ------------------------------------------------------------------------

    def create_state(self, key, weight) -> dict:
        """This kind's state for one weight: ``{slot: array like weight}`` (maybe empty)."""
        return {slot: array_module(weight).zeros_like(weight) for slot in self.state_slots()}

    def update(self, key, weight, grad, state: dict) -> None:
        """One update of ``weight`` (and ``state``) in place from ``grad``."""
        key = _key(key)
        self._check(key, weight, grad, state)
        lr, wd, t = self._advance(key)
        self._apply(array_module(weight), weight, self._rescaled_clipped(grad), state, lr, wd,
                    t)

    def _advance(self, key: str) -> tuple:
        """Count an update of ``key``: (its lr and wd, after lr_mult and wd_mult; its
        update count)."""
        t = self.counts[key] = self.counts.get(key, 0) + 1
        self.num_update = max(self.num_update, t)
        return (self.learning_rate * self.lr_mult.get(key, 1.0),
                self.wd * self.wd_mult.get(key, 1.0), t)

    def step(self, key, weight, grad) -> None:
        """``update`` with the state this optimizer keeps for ``key`` (made on first use;
        after ``load_state_dict`` moved to the weight's device on first use)."""
        key = _key(key)
        self.update(key, weight, grad, self._kept_state(key, weight))

    def _kept_state(self, key: str, weight) -> dict:
        state = self.states.get(key)
        state = self.create_state(key, weight) if state is None else \
            _state_like(key, state, weight)
        self.states[key] = state
        return state

    def step_many(self, items) -> None:
        """``step`` for each ``(key, weight, grad)``, in order. On a GPU, sgd, adam and adamw
        update every weight of one device and float dtype in one launch (each kind's
        ``many`` in ``runtime/training/optimizers/``), each with the lr, wd and update count
        ``step`` would give it; the other kinds, and arrays those kernels do not take, step one by
        one."""
        items = list(items)
        entries = self._many_entries(items) if len(items) > 1 else None
        if entries is None or not self._apply_many(*entries):
            for key, weight, grad in items:
                self.step(key, weight, grad)

    def _apply_many(self, xp, weights, grads, states, lrs, wds, counts) -> bool:
        """The multi-tensor update of :meth:`step_many` (the kinds that have one)."""
        return False

    def _updates_many(self) -> bool:
        """Whether :meth:`_apply_many` takes this optimizer's steps (asked before any count
        advances): the kinds that define one."""
        return type(self)._apply_many is not Optimizer._apply_many

    def _many_entries(self, items):
        """(xp, weights, grads, states, lrs, wds, update counts) of ``items`` with their
        counts advanced as ``update`` advances them, or None, nothing changed, where the
        multi-tensor kernels cannot take them (not one GPU, not one float dtype)."""
        weights, grads = [w for _, w, _ in items], [g for _, _, g in items]
        xp = array_module(weights[0])
        if not self._updates_many() \
                or not optimizer_kernels.many_on_gpu(xp, weights[0].dtype, weights + grads):
            return None  # the cheap refusals first: a CPU step comes here every time
        devices = {getattr(getattr(w, "device", None), "id", None) for w in weights + grads}
        if len(devices) != 1 or any(array_module(a) is not xp for a in weights + grads):
            return None
        keys = [_key(key) for key, _, _ in items]
        states = [self._kept_state(key, weight) for key, weight in zip(keys, weights)]
        for key, weight, grad, state in zip(keys, weights, grads, states):
            self._check(key, weight, grad, state)
        if not optimizer_kernels.many_on_gpu(xp, weights[0].dtype,
                                             [a for s in states for a in s.values()]):
            return None
        lrs, wds, counts = zip(*(self._advance(key) for key in keys))
        return xp, weights, grads, states, list(lrs), list(wds), list(counts)

    def _rescaled_clipped(self, grad):
        if self.rescale_grad != 1.0:
            grad = grad * self.rescale_grad
        if self.clip_gradient is not None:
            grad = array_module(grad).clip(grad, -self.clip_gradient, self.clip_gradient)
        return grad

    def _check(self, key, weight, grad, state) -> None:
        if array_module(weight) is not array_module(grad):
            raise DeviceMismatchError(f"key {key!r}: the weight and its gradient are on "
                                      f"different devices")
        if grad.shape != weight.shape:
            raise ShapeError(f"key {key!r}: gradient shape {grad.shape} does not match the "
                             f"weight's {weight.shape}")
        if weight.dtype.kind != "f" or grad.dtype != weight.dtype:
            raise OptimizerError(f"key {key!r}: weight and gradient must share one floating "
                                 f"dtype, got {weight.dtype} and {grad.dtype}")
        if set(state) != set(self.state_slots()):
            raise OptimizerError(f"key {key!r}: {self._owner} needs a state with slots "
                                 f"{list(self.state_slots())}, got {sorted(state)}")

    # -- spec ---------------------------------------------------------------------------

    def spec(self) -> dict:
        """``{"name", "params"}`` of plain JSON values; ``from_spec`` rebuilds this optimizer
        (hyper-parameters only: counts and states travel in ``state_dict``)."""
        params = {
            "learning_rate": self._base_lr, "wd": self.wd, "rescale_grad": self.rescale_grad,
            "clip_gradient": self.clip_gradient,
            "lr_scheduler": None if self.lr_scheduler is None else self.lr_scheduler.spec(),
            "lr_mult": dict(self.lr_mult), "wd_mult": dict(self.wd_mult),
        }
        params.update(self.hyper_params())
        return {"name": self.name, "params": params}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({json.dumps(self.spec()['params'])})"

    # -- checkpoints --------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """The kept states and counts as host arrays: ``"state{i}.{slot}"`` for the i-th
        key, plus ``"meta"``, a 0-d unicode array holding JSON (the spec, the keys, the
        counts), so ``numpy.savez(path, **state_dict)`` writes a checkpoint that loads
        with ``allow_pickle=False``."""
        keys = sorted(self.states)
        meta = {"format": STATE_FORMAT, "optimizer": self.spec(), "keys": keys,
                "counts": dict(self.counts)}
        arrays = {"meta": np.array(json.dumps(meta))}
        for index, key in enumerate(keys):
            for slot, value in self.states[key].items():
                arrays[f"state{index}.{slot}"] = np.array(to_host(value))  # a copy
        return arrays

    def load_state_dict(self, arrays: Mapping) -> None:
        """Restore what ``state_dict`` saved (from a dict or ``numpy.load``'s NpzFile).
        Hyper-parameters may differ from the saved ones; the state slots may not."""
        meta = read_meta(arrays)
        if meta["optimizer"]["name"] != self.name:
            raise OptimizerError(f"the checkpoint holds {meta['optimizer']['name']!r} state, "
                                 f"which {self._owner} cannot continue from")
        keys = meta["keys"]
        if len(set(keys)) != len(keys):  # two entries for one key: one would be dropped
            raise OptimizerError(f"the checkpoint lists a key twice: {keys}")
        expected = {f"state{i}.{slot}" for i in range(len(keys)) for slot in self.state_slots()}
        found = set(arrays) - {"meta"}
        if found != expected:
            raise OptimizerError(
                f"the checkpoint's arrays do not fit {self._owner} with slots "
                f"{list(self.state_slots())}: missing {sorted(expected - found)}, "
                f"unexpected {sorted(found - expected)}")
        if any(np.asarray(arrays[name]).dtype.kind != "f" for name in expected):
            raise OptimizerError("the checkpoint holds a state array that is not floating")
        self.states = {key: {slot: np.array(arrays[f"state{i}.{slot}"])
                             for slot in self.state_slots()} for i, key in enumerate(keys)}
        self.counts = dict(meta["counts"])
        self.num_update = max(self.counts.values(), default=0)


def read_meta(arrays: Mapping) -> dict:
    """The JSON metadata of a ``state_dict`` (spec, keys, counts), checked."""
    if "meta" not in arrays:
        raise OptimizerError("not an optimizer checkpoint: it has no 'meta' entry")
    try:
        meta = json.loads(np.asarray(arrays["meta"]).item())
    except (ValueError, TypeError, RecursionError) as exc:  # deep nesting: RecursionError
        raise OptimizerError(f"the checkpoint's 'meta' entry is not JSON: "
                             f"{type(exc).__name__}: {exc}") from None
    found = meta.get("format") if isinstance(meta, dict) else None
    if found != STATE_FORMAT:
        raise OptimizerError(f"the checkpoint's format is {found!r}; this mixrt reads "
                             f"format {STATE_FORMAT}")
    spec, keys, counts = meta.get("optimizer"), meta.get("keys"), meta.get("counts")
    if not (isinstance(spec, dict) and isinstance(spec.get("name"), str)
            and isinstance(keys, list) and all(isinstance(k, str) for k in keys)
            and isinstance(counts, dict) and all(
                type(c) is int and c >= 0 for c in counts.values())):
        raise OptimizerError("the checkpoint's 'meta' entry lacks a well-formed optimizer "
                             "spec, key list or update counts")
    return meta


# -- helpers --------------------------------------------------------------------------------

def _key(key) -> str:
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise OptimizerError(f"an optimizer key is a str or an int, got {key!r}")
    return str(key)


def with_l2(grad, weight, wd):
    """The gradient with L2 weight decay added (a new array: ``grad`` is never changed)."""
    return grad + wd * weight if wd else grad


def _flag(owner: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise OptimizerError(f"{owner}: {name} must be True or False, got {value!r}")
    return bool(value)


def _multipliers(owner: str, name: str, value) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise OptimizerError(f"{owner}: {name} maps keys to multipliers, got {value!r}")
    return {_key(k): real_param(owner, f"{name}[{k!r}]", v, low=0.0) for k, v in value.items()}


def _scheduler(owner: str, value):
    """A scheduler object, or one rebuilt from its spec (what a JSON spec carries)."""
    if value is None or isinstance(value, LRScheduler):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("name"), str):  # a list: TypeError
        return schedulers.from_spec(dict(value))
    raise OptimizerError(f"{owner}: lr_scheduler must be an LRScheduler or its spec, got "
                         f"{value!r}")


def _state_like(key: str, state: dict, weight) -> dict:
    """``state`` on the weight's device and in its dtype (a loaded checkpoint is on the host
    and may come from a float64 run); the same arrays when they already are."""
    for slot, value in state.items():
        if value.shape != weight.shape:
            raise ShapeError(f"key {key!r}: the kept {slot!r} state has shape {value.shape}, "
                             f"the weight {weight.shape}")
    xp = array_module(weight)
    if all(array_module(v) is xp and v.dtype == weight.dtype for v in state.values()):
        return state
    with weight.device if xp is not np else contextlib.nullcontext():  # CuPy: its GPU
        return {slot: xp.asarray(to_host(v) if xp is np else v, dtype=weight.dtype)
                for slot, v in state.items()}


__all__ = ["Optimizer", "STATE_FORMAT", "read_meta", "with_l2"]
