"""MXNet's ``Optimizer`` base class: hyper-parameters, per-index update counts, learning-rate
and weight-decay multipliers, the registry, and the engine protocol the rest of mixrt uses.

An MXNet optimizer is driven one of two ways. MXNet's way: ``create_state(index, weight)``
(or ``create_state_multi_precision``) once per index, then ``update(index, weight, grad,
state)`` (or ``update_multi_precision``) with NDArrays, usually through ``get_updater``.
mixrt's engine way (a KVStore's ``set_optimizer``, a Trainer): ``step(key, weight, grad)``
with NDArrays or bare NumPy/CuPy arrays, the optimizer keeping the states itself, and
``state_dict()``/``load_state_dict()`` for checkpoints. That is why the class derives from
the engine's optimizer type (``mixrt.runtime.training.optimizer.Optimizer``): it is accepted
wherever one is, though every rule and every number here is MXNet's.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import numpy as np

from mixrt import nd, optimizer_ops
from mixrt.base.errors import OptimizerError
from mixrt.context import cpu, gpu
from mixrt.nd.ndarray import NDArray
from mixrt.ops.device import array_module
from mixrt.optimizers.updater import Updater
from mixrt.registry import Registry
from mixrt.runtime.training import optimizer as engine


class UnknownOptimizerError(OptimizerError, ValueError):
    """An optimizer name nothing registered (MXNet raises ValueError here)."""


class Optimizer(engine.Optimizer):
    """MXNet's base optimizer (``mx.optimizer.Optimizer``), same arguments and defaults."""

    opt_registry: Registry  # the optimizers by name (MXNet's dict), made below
    # the definition (runtime/training/optimizers/) a kind runs, where it runs one: its
    # state slots, its nd operators and its engine twin come from there
    definition = None
    state_is_tuple = True  # MXNet's state layout: the slots' arrays as a tuple, else one
    # whether the aggregated update (a list of indices) takes any number of weights at once,
    # rather than MXNet's ``aggregate_num`` at a time (the Updater asks)
    updates_any_number = False

    def __init__(self, rescale_grad=1.0, param_idx2name=None, wd=0.0, clip_gradient=None,
                 learning_rate=None, lr_scheduler=None, sym=None, begin_num_update=0,
                 multi_precision=False, param_dict=None):
        # engine.Optimizer.__init__ is not called: its PyTorch-style checks are not MXNet's
        self.rescale_grad = rescale_grad
        self.lr_scheduler = lr_scheduler
        if lr_scheduler is None and learning_rate is None:
            learning_rate = 0.01
        self.lr = learning_rate
        if lr_scheduler is not None and learning_rate is not None and \
                lr_scheduler.base_lr != learning_rate:
            warnings.warn("learning rate from ``lr_scheduler`` has been overwritten by "
                          "``learning_rate`` in optimizer.", UserWarning, stacklevel=3)
            lr_scheduler.base_lr = learning_rate
        self.wd = wd
        self.begin_num_update = begin_num_update
        self.num_update = begin_num_update
        self._all_index_update_counts = {0: {}}
        self._index_update_count = self._all_index_update_counts[0]
        self.clip_gradient = clip_gradient
        self.multi_precision = multi_precision
        self.aggregate_num = 0
        if param_idx2name is None:
            param_idx2name = {}
        if not isinstance(param_idx2name, dict):
            raise OptimizerError(f"param_idx2name should be a dict of param indexes to "
                                 f"names, got {type(param_idx2name).__name__}")
        self.idx2name = param_idx2name.copy()
        self.sym_info = _symbol_info(sym)
        self.param_dict = param_dict if param_dict else {}
        self.set_lr_mult({})
        self.set_wd_mult({})
        self._engine_updater = None  # made on the first step()

    def __init_subclass__(cls, **kwargs):
        """Every subclass's outermost ``__init__`` records the arguments it was called
        with: ``Updater.get_states(dump_optimizer=True)`` rebuilds the optimizer from them
        (MXNet pickles the object; mixrt writes no pickle)."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:
            cls.__init__ = _recording(init)

    # -- the registry --------------------------------------------------------------------

    @staticmethod
    def register(klass):
        """Register ``klass`` under its lower-cased class name (what ``create`` looks up)."""
        return Optimizer.opt_registry.register(klass)

    @staticmethod
    def create_optimizer(name, **kwargs):
        """The optimizer registered as ``name`` (case-insensitive), made with ``kwargs``."""
        return Optimizer.opt_registry.find(name)(**kwargs)

    @property
    def name(self) -> str:
        return type(self).__name__.lower()

    # -- states and updates (what a kind defines) ----------------------------------------

    def create_state(self, index, weight):
        """This kind's state for one weight: None, an NDArray or a tuple of them (a zero
        array for each of its definition's slots, in MXNet's layout)."""
        slots = () if self.definition is None else self.definition.slots(self.engine_hyper())
        if not slots:
            return None
        arrays = tuple(zeros_like(weight) for _ in slots)
        return arrays if self.state_is_tuple or len(arrays) > 1 else arrays[0]

    def engine_hyper(self) -> dict:
        """The hyper-parameters of this kind's definition, read from MXNet's attributes of
        the same names (a kind whose attributes are named otherwise says how)."""
        return {hyper.name: getattr(self, hyper.name) for hyper in self.definition.hyper}

    def _apply_operator(self, operator: str, weight, grad, state, **given) -> None:
        """MXNet's nd update ``operator`` of this kind's definition on ``weight`` in place,
        with the state's arrays, this kind's hyper-parameters, ``rescale_grad``, MXNet's
        ``clip_gradient`` and ``given`` (``lr``, ``wd``, ...); a hyper-parameter that is
        None takes the operator's default (-1: "not set")."""
        declared = self.definition.operator(operator)
        values = {**self.engine_hyper(), "rescale_grad": self.rescale_grad,
                  "clip_gradient": self.clip_gradient if self.clip_gradient else -1.0, **given}
        params = {name: default if values.get(name) is None else values[name]
                  for name, default in declared.params if name in values}
        if declared.lazy == "flag":
            params["lazy_update"] = getattr(self, "lazy_update", True)
        states = () if state is None else state if isinstance(state, tuple) else (state,)
        getattr(optimizer_ops, operator)(weight, grad, *states, out=weight, **params)

    def create_state_multi_precision(self, index, weight):
        """With ``multi_precision`` and a float16 weight: ``(float32 master copy, state of
        the copy)``; otherwise ``create_state``."""
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (master, self.create_state(index, master))
        warn_float16(weight, self.multi_precision, type(self).__name__)
        return self.create_state(index, weight)

    def update(self, index, weight, grad, state):
        raise NotImplementedError(f"{type(self).__name__} defines no update")

    def update_multi_precision(self, index, weight, grad, state):
        """``update`` on the float32 master copy of a float16 weight (then copied back),
        or ``update`` itself."""
        if self.multi_precision and weight.dtype == np.float16:
            master, inner = state
            self.update(index, master, grad.astype(np.float32), inner)
            weight[:] = master.astype(weight.dtype)
        else:
            self.update(index, weight, grad, state)

    # -- learning rate and weight decay --------------------------------------------------

    @property
    def learning_rate(self):
        if self.lr_scheduler is not None:
            return self.lr_scheduler(self.num_update)
        return self.lr

    def set_learning_rate(self, lr):
        if self.lr_scheduler is not None:
            raise UserWarning("LRScheduler of the optimizer has already been defined. Note "
                              "that set_learning_rate can mutate the value of the learning "
                              "rate of the optimizer only when the LRScheduler of the "
                              "optimizer is undefined.")
        self.lr = lr

    def set_lr_scale(self, args_lrscale):
        raise DeprecationWarning("set_lr_scale is deprecated; use set_lr_mult")

    def set_lr_mult(self, args_lr_mult):
        """Per-parameter rate multipliers by index or name; a symbol's ``__lr_mult__``
        attributes come first."""
        self.lr_mult = self._symbol_multipliers("__lr_mult__")
        self.lr_mult.update(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        """Per-parameter decay multipliers. Parameters ``param_idx2name`` names that are
        not ``*_weight`` or ``*_gamma`` (biases, betas) get 0, as in MXNet."""
        self.wd_mult = {name: 0.0 for name in self.idx2name.values()
                        if not self._decays_by_default(name)}
        self.wd_mult.update(self._symbol_multipliers("__wd_mult__"))
        self.wd_mult.update(args_wd_mult)

    @staticmethod
    def _decays_by_default(name: str) -> bool:
        return name.endswith("_weight") or name.endswith("_gamma")

    def _symbol_multipliers(self, attribute: str) -> dict:
        if not self.sym_info:
            return {}
        attrs, arguments = self.sym_info
        return {name: float(attrs[name][attribute]) for name in arguments
                if attribute in attrs.get(name, {})}

    def _set_current_context(self, device_id):
        """Count updates per device: each device's copy of a weight counts its own."""
        self._index_update_count = self._all_index_update_counts.setdefault(device_id, {})

    def _update_count(self, index):
        for idx in index if isinstance(index, (list, tuple)) else [index]:
            count = self._index_update_count.get(idx, self.begin_num_update) + 1
            self._index_update_count[idx] = count
            self.num_update = max(count, self.num_update)

    def _get_lrs(self, indices):
        lr = self.lr_scheduler(self.num_update) if self.lr_scheduler is not None else self.lr
        return [lr * self._multiplier(index, "lr_mult") for index in indices]

    def _get_lr(self, index):
        return self._get_lrs([index])[0]

    def _get_wds(self, indices):
        return [self.wd * self._multiplier(index, "wd_mult") for index in indices]

    def _get_wd(self, index):
        return self._get_wds([index])[0]

    def _multiplier(self, index, which: str) -> float:
        """A Parameter's own multiplier, else one set for the index, else for its name."""
        if index in self.param_dict:
            return getattr(self.param_dict[index], which)
        table = getattr(self, which)
        if index in table:
            return table[index]
        if index in self.idx2name:
            return table.get(self.idx2name[index], 1.0)
        return 1.0

    # -- the engine protocol -------------------------------------------------------------

    def step(self, key, weight, grad) -> None:
        """One MXNet update of ``weight`` in place, with the state kept for ``key``
        (NDArrays, or NumPy/CuPy arrays, which are updated in place too)."""
        self._updater().__call__(key, as_ndarray(grad), as_ndarray(weight))

    def _updater(self) -> Updater:
        if self._engine_updater is None:
            self._engine_updater = Updater(self)
        return self._engine_updater

    @property
    def counts(self) -> dict:
        """Updates per key (the engine's name for ``_index_update_count``)."""
        return {str(k): v for k, v in self._index_update_count.items()}

    @property
    def states(self) -> dict:
        """The states ``step`` keeps, by key (MXNet's: None, an NDArray or a tuple)."""
        return self._updater().states

    def spec(self) -> dict:
        """The engine optimizer that runs these same steps bit for bit, as a spec a
        parameter server rebuilds: the engine's ``mxnet_<name>`` kind made from this kind's
        definition (``sgd``, ``nag``, ``adam``, ``rmsprop``, ``adagrad``, ``ftrl``,
        ``signum`` and ``lamb`` have one), which runs the same rule text."""
        if self.definition is None or self.definition.engine_name is None:
            self._no_twin()
        return self._twin_spec(self.definition.engine_name, **self.engine_hyper())

    def _no_twin(self):
        raise OptimizerError(
            f"MXNet's {type(self).__name__} runs in this process only; a parameter server "
            f"runs mixrt.runtime.training.optimizer's kinds (the 'sgd', 'nag', 'adam', "
            f"'rmsprop', 'adagrad', 'ftrl', 'signum' and 'lamb' optimizers have twins there)")

    def _twin_spec(self, name: str, **hyper) -> dict:
        """The spec of the engine's kind ``name`` with this optimizer's common settings and
        ``hyper``; refused where the twin could not take the same steps."""
        if self.multi_precision or self.param_dict or self.idx2name or \
                (self.clip_gradient is not None and self.clip_gradient <= 0):
            raise OptimizerError(f"{type(self).__name__} with multi_precision, param_dict, "
                                 f"param_idx2name or clip_gradient <= 0 has no engine twin "
                                 f"for a parameter server")
        scheduler = self.lr_scheduler
        params = {"learning_rate": self.lr if scheduler is None else None,
                  "wd": self.wd, "rescale_grad": self.rescale_grad,
                  "clip_gradient": self.clip_gradient,
                  "lr_scheduler": None if scheduler is None else scheduler.spec(),
                  "lr_mult": {str(k): v for k, v in self.lr_mult.items()},
                  "wd_mult": {str(k): v for k, v in self.wd_mult.items()}, **hyper}
        return {"name": name, "params": params}

    def state_dict(self) -> dict:
        """The kept states and update counts as host arrays plus a JSON ``meta`` entry
        (the engine's checkpoint layout: ``numpy.savez`` writes it, no pickle)."""
        return self._updater().state_arrays()

    def load_state_dict(self, arrays) -> None:
        self._updater().load_state_arrays(arrays)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(learning_rate={self.learning_rate!r}, wd={self.wd!r})"


class ImplUpdates:
    """For an optimizer whose one ``_update_impl(index, weight, grad, state,
    multi_precision)`` takes a single index or a list: MXNet's ``update`` and
    ``update_multi_precision`` (float32 master weights for float16 ones) over it."""

    def update(self, index, weight, grad, state):
        self._update_impl(index, weight, grad, state, multi_precision=False)

    def update_multi_precision(self, index, weight, grad, state):
        first = weight[0] if isinstance(index, (list, tuple)) else weight
        self._update_impl(index, weight, grad, state,
                          multi_precision=self.multi_precision and first.dtype == np.float16)


Optimizer.opt_registry = Registry(
    Optimizer, lambda name, known: UnknownOptimizerError(
        f"Cannot find optimizer {name!r}; registered: {known}"),
    error_type=OptimizerError, warn_on_override=True)
register = Optimizer.register
create = Optimizer.create_optimizer


def zeros_like(weight, dtype=None):
    """Zeros of ``weight``'s shape on its context, in its dtype or ``dtype``."""
    return nd.zeros(weight.shape, weight.ctx, dtype=dtype or weight.dtype)


def as_ndarray(array) -> NDArray:
    """``array`` as an NDArray sharing its memory (NDArrays pass through)."""
    if isinstance(array, NDArray):
        return array
    if array_module(array) is np:
        return NDArray(array, cpu())
    return NDArray(array, gpu(array.device.id))


def warn_float16(weight, multi_precision: bool, kind: str) -> None:
    if weight.dtype == np.float16 and not multi_precision:
        warnings.warn(f"Accumulating with float16 in optimizer can lead to poor accuracy or "
                      f"slow convergence. Consider using multi_precision=True option of the "
                      f"{kind} optimizer", stacklevel=3)


def _symbol_info(sym):
    """(attribute dict, argument names) of a symbol, for its ``__lr_mult__`` and
    ``__wd_mult__`` attributes; () without one."""
    if sym is None:
        return ()
    return (sym.attr_dict(), sym.list_arguments())


def _recording(init):
    signature = inspect.signature(init)

    @functools.wraps(init)
    def recording(self, *args, **kwargs):
        if "_arguments" not in self.__dict__:  # the outermost __init__ of the call
            bound = signature.bind(self, *args, **kwargs)
            arguments = {}
            for name, value in list(bound.arguments.items())[1:]:
                kind = signature.parameters[name].kind
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(value)
                elif kind is not inspect.Parameter.VAR_POSITIONAL:
                    arguments[name] = value
            self.__dict__["_arguments"] = arguments
        init(self, *args, **kwargs)
    return recording


__all__ = ["Optimizer", "register", "create", "as_ndarray", "UnknownOptimizerError"]
