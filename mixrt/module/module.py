"""MXNet's ``mx.mod.Module``: a Symbol bound for training and inference on one or more
contexts, with MXNet's calls and their order:

    mod = mixrt.mod.Module(net, data_names=["data"], label_names=["softmax_label"])
    mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label)
    mod.init_params(mixrt.init.Xavier())
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    for batch in it:
        mod.forward(batch, is_train=True); mod.backward(); mod.update()
        mod.update_metric(metric, batch.label)
    mod.save_checkpoint("net", 5)          # net-symbol.json, net-0005.params

Under it is a :class:`~mixrt.module.executor_group.DataParallelExecutorGroup`: one
:class:`~mixrt.sym.executor.Executor` per context, each taking a slice of every batch. The
executors' backward gives MXNet's output-layer gradients (SoftmaxOutput's
``softmax - one_hot(label)``), and ``update`` applies an MXNet optimizer (``mixrt.optimizer``)
with ``rescale_grad = 1 / batch_size`` to the gradients summed over the contexts.
Optimizer states are saved in the Updater's ``.npz`` format (``mixrt/optimizers/updater.py``),
never pickled.
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np

from mixrt import model, nd, optimizer as optimizers
from mixrt.base.errors import InputError, ShapeError
from mixrt.context import cpu
from mixrt.initializer import InitDesc, starting_value, Uniform
from mixrt.kv import create as create_store, summed_workers
from mixrt.module.base_module import BaseModule, descs
from mixrt.module.executor_group import DataParallelExecutorGroup
from mixrt.nd.ndarray import _STORAGE_TYPE_ID_TO_STR


class MissingParameterError(InputError, RuntimeError):
    """``init_params``/``set_params`` lack a parameter and ``allow_missing`` is off (MXNet
    raises RuntimeError)."""


class Module(BaseModule):
    def __init__(self, symbol, data_names=("data",), label_names=("softmax_label",),
                 logger=logging, context=None, work_load_list=None, fixed_param_names=None,
                 state_names=None, group2ctxs=None, compression_params=None):
        super().__init__(logger)
        context = cpu() if context is None else context
        self._context = list(context) if isinstance(context, (list, tuple)) else [context]
        self._work_load_list = work_load_list or [1] * len(self._context)
        if len(self._work_load_list) != len(self._context):
            raise InputError(f"Module: work_load_list has {len(self._work_load_list)} "
                             f"entries for {len(self._context)} contexts")
        self._group2ctxs = group2ctxs
        self._symbol = symbol
        arguments = symbol.list_arguments()
        self._data_names = list(data_names or [])
        self._label_names = list(label_names or [])
        self._state_names = list(state_names or [])
        self._fixed_param_names = list(fixed_param_names or [])
        _check_names(arguments, self._data_names, "data", throw=True)
        _check_names(arguments, self._label_names, "label", throw=False)
        _check_names(arguments, self._state_names, "state", throw=True)
        _check_names(arguments, self._fixed_param_names, "fixed_param", throw=True)
        inputs = set(self._data_names + self._label_names + self._state_names)
        self._param_names = [n for n in arguments if n not in inputs]
        self._aux_names = symbol.list_auxiliary_states()
        self._output_names = symbol.list_outputs()
        self._arg_params = self._aux_params = None
        self._params_dirty = False
        self._optimizer = self._kvstore = self._updater = None
        self._update_on_kvstore = False
        self._preload_opt_states = None
        self._grad_req = None
        self._exec_group = None
        self._data_shapes = self._label_shapes = None

    # -- what it is ------------------------------------------------------------------------

    @property
    def symbol(self):
        return self._symbol

    @property
    def data_names(self):
        return self._data_names

    @property
    def label_names(self):
        return self._label_names

    @property
    def output_names(self):
        return self._output_names

    @property
    def data_shapes(self):
        self._require("data_shapes", binded=True)
        return self._data_shapes

    @property
    def label_shapes(self):
        self._require("label_shapes", binded=True)
        return self._label_shapes

    @property
    def output_shapes(self):
        self._require("output_shapes", binded=True)
        return list(zip(self._output_names, [o.shape for o in self.get_outputs()])) \
            if self._exec_group.execs[0].outputs else self._inferred_output_shapes()

    def _inferred_output_shapes(self):
        shapes = {d.name: d.shape for d in self._data_shapes + (self._label_shapes or [])}
        _, out_shapes, _ = self._symbol.infer_shape(**shapes)
        if out_shapes is None:
            raise ShapeError(f"output_shapes: the bound shapes {shapes} do not determine "
                             f"the outputs {self._output_names}")
        return list(zip(self._output_names, out_shapes))

    @property
    def _total_exec_bytes(self) -> int:
        return self._exec_group._total_exec_bytes if self._exec_group is not None else 0

    # -- parameters --------------------------------------------------------------------------

    def get_params(self):
        self._require("get_params", binded=True, params=True)
        if self._params_dirty:
            self._sync_params_from_devices()
        return self._arg_params, self._aux_params

    def init_params(self, initializer=Uniform(0.01), arg_params=None, aux_params=None,
                    allow_missing=False, force_init=False, allow_extra=False):
        """Initialize the parameters: from ``arg_params``/``aux_params`` where given, else
        with ``initializer`` (a missing one is an error unless ``allow_missing``)."""
        if self.params_initialized and not force_init:
            warnings.warn("Parameters already initialized and force_init=False. "
                          "init_params call ignored.", stacklevel=2)
            return
        self._require("init_params", binded=True)
        attrs = _attributes(self._symbol)
        if self._arg_params is None:
            self._arg_params = {n: _host_param(a[0], attrs.get(n)) for n, a in
                                zip(self._exec_group.param_names_in_order(),
                                    self._exec_group.param_arrays)}
            self._aux_params = {n: _host_param(a[0], attrs.get(n)) for n, a in
                                zip(self._aux_names, self._exec_group.aux_arrays)}
        declared = {node.name: node.info.get("init") for node in self._symbol._variables()}
        for table, given in ((self._arg_params, arg_params), (self._aux_params, aux_params)):
            for name, array in sorted(table.items()):
                chosen = self._initializer_of(name, initializer, declared.get(name))
                self._init_one(name, array, given, chosen, allow_missing, attrs.get(name))
        self.params_initialized, self._params_dirty = True, False
        self._exec_group.set_params(self._arg_params, self._aux_params,
                                    allow_extra=allow_extra)

    def _initializer_of(self, name: str, initializer, declared):
        """A Variable's own ``init`` wins, filling the array whatever its name (MXNet
        hands it to the global initializer as ``__init__``, whose weight rule runs);
        running statistics start at MXNet's values (means 0, variances 1), whatever the
        module's initializer."""
        if initializer is None:
            return None
        start = starting_value(name, declared, name in self._aux_names)
        if isinstance(start, float):
            return _filler(start)
        if start is not None:
            fill = getattr(start, "_init_weight", None)  # Load and Mixed are plain callables
            return start if fill is None else (lambda desc, array: fill(desc, array))
        return initializer

    @staticmethod
    def _init_one(name, array, given, initializer, allow_missing, attrs) -> None:
        if given is not None and name in given:
            if given[name] is not array:
                array[:] = nd.array(given[name], dtype=array.dtype) \
                    if not isinstance(given[name], nd.NDArray) else given[name]
            return
        if given is not None and not allow_missing:
            raise MissingParameterError(f"init_params: parameter {name!r} is not presented "
                                        f"(allow_missing=True initializes it instead)")
        if initializer is not None:
            initializer(InitDesc(name, attrs), array)

    def set_params(self, arg_params, aux_params, allow_missing=False, force_init=True,
                   allow_extra=False):
        """Assign parameter values (as ``init_params`` with them and no initializer)."""
        if not allow_missing or self._arg_params is None:
            self.init_params(initializer=None, arg_params=arg_params, aux_params=aux_params,
                             allow_missing=allow_missing, force_init=force_init,
                             allow_extra=allow_extra)
            return
        if self.params_initialized and not force_init:
            warnings.warn("Parameters already initialized and force_init=False. "
                          "set_params call ignored.", stacklevel=2)
            return
        self._exec_group.set_params(arg_params, aux_params, allow_extra=allow_extra)
        self._params_dirty, self.params_initialized = True, True

    def _sync_params_from_devices(self) -> None:
        self._exec_group.get_params(self._arg_params, self._aux_params)
        self._params_dirty = False

    # -- binding -------------------------------------------------------------------------------

    def bind(self, data_shapes, label_shapes=None, for_training=True, inputs_need_grad=False,
             force_rebind=False, shared_module=None, grad_req="write"):
        """Make the executors for inputs of these shapes (``[(name, shape)]`` or
        DataDescs); ``shared_module`` lends its parameters and memory."""
        if force_rebind:
            self._reset_bind()
        if self.binded:
            self.logger.warning("Already bound, ignoring bind()")
            return
        if not for_training and inputs_need_grad:
            raise InputError("bind: inputs_need_grad needs for_training=True")
        self._data_shapes = _parse_descs(self._data_names, data_shapes, "data")
        self._label_shapes = _parse_descs(self._label_names, label_shapes, "label") \
            if label_shapes is not None else None
        self.for_training, self.inputs_need_grad = for_training, inputs_need_grad
        self._grad_req = grad_req
        shared_group = None
        if shared_module is not None:
            if not (shared_module.binded and shared_module.params_initialized):
                raise InputError("bind: shared_module must be bound and initialized")
            shared_group = shared_module._exec_group
        self._exec_group = DataParallelExecutorGroup(
            self._symbol, self._context, self._work_load_list, self._data_shapes,
            self._label_shapes, self._param_names, for_training, inputs_need_grad,
            shared_group, logger=self.logger, fixed_param_names=self._fixed_param_names,
            grad_req=grad_req, group2ctxs=self._group2ctxs, state_names=self._state_names)
        self.binded = True
        if shared_module is not None:
            self.params_initialized = True
            self._arg_params, self._aux_params = shared_module._arg_params, \
                shared_module._aux_params
        elif self.params_initialized:
            self._exec_group.set_params(self._arg_params, self._aux_params)

    def _reset_bind(self) -> None:
        self.binded = False
        self._exec_group = None
        self._data_shapes = self._label_shapes = None

    def reshape(self, data_shapes, label_shapes=None):
        """Rebind the executors for new input shapes (the batch size, say)."""
        self._require("reshape", binded=True)
        self._data_shapes = _parse_descs(self._data_names, data_shapes, "data")
        self._label_shapes = _parse_descs(self._label_names, label_shapes, "label") \
            if label_shapes is not None else None
        self._exec_group.reshape(self._data_shapes, self._label_shapes)

    # -- the optimizer ---------------------------------------------------------------------------

    def init_optimizer(self, kvstore="local", optimizer="sgd",
                       optimizer_params=(("learning_rate", 0.01),), force_init=False):
        """Make the optimizer (a name with ``optimizer_params``, or an Optimizer) and the
        store; ``rescale_grad`` defaults to 1 / (batch size x workers)."""
        self._require("init_optimizer", binded=True, params=True)
        if self.optimizer_initialized and not force_init:
            self.logger.warning("optimizer already initialized, ignoring...")
            return
        if self._params_dirty:
            self._sync_params_from_devices()
        store = _store(kvstore, len(self._context))
        rescale = 1.0 / (self._exec_group.batch_size * summed_workers(store))
        idx2name = dict(enumerate(self._exec_group.param_names_in_order()))
        if isinstance(optimizer, str):
            params = dict(optimizer_params)
            params.setdefault("rescale_grad", rescale)
            optimizer = optimizers.create(optimizer, sym=self._symbol,
                                          param_idx2name=idx2name, **params)
        else:
            if optimizer.rescale_grad != rescale:
                warnings.warn(f"Optimizer created manually outside Module but rescale_grad "
                              f"is not normalized to 1.0/batch_size/num_workers "
                              f"({optimizer.rescale_grad} vs. {rescale}). Is this intended?",
                              stacklevel=2)
            if not optimizer.idx2name:
                optimizer.idx2name = dict(idx2name)
        self._optimizer, self._kvstore = optimizer, store
        self._update_on_kvstore = store is not None and _updates_on_store()
        if self._update_on_kvstore:
            # the store runs the optimizer on each push, as MXNet's does: its Updater holds
            # the states and the module has none of its own
            store.set_optimizer(optimizer)
            self._updater = None
        else:
            self._updater = optimizers.get_updater(optimizer)
        if store is not None:
            names = list(idx2name.values())
            store.init(names, [self._arg_params[n] for n in names])
        self.optimizer_initialized = True
        if self._preload_opt_states is not None:
            self.load_optimizer_states(self._preload_opt_states)
            self._preload_opt_states = None

    def borrow_optimizer(self, shared_module) -> None:
        """Use ``shared_module``'s optimizer, updater (its states) and store."""
        if not shared_module.optimizer_initialized:
            raise InputError("borrow_optimizer: the shared module has no optimizer yet")
        self._optimizer, self._updater = shared_module._optimizer, shared_module._updater
        self._kvstore = shared_module._kvstore
        self._update_on_kvstore = shared_module._update_on_kvstore
        self.optimizer_initialized = True

    # -- a batch -------------------------------------------------------------------------------

    def forward(self, data_batch, is_train=None):
        """Run the executors on ``data_batch`` (anything with ``.data``, a list of arrays),
        reshaping them first when its shapes differ from the bound ones."""
        self._require("forward", binded=True, params=True)
        new_shapes = _batch_shapes(data_batch, self._data_names)
        if new_shapes != [tuple(d.shape) for d in self._data_shapes]:
            self._reshape_for(data_batch, new_shapes)
        self._exec_group.forward(data_batch, is_train)

    def _reshape_for(self, data_batch, new_shapes) -> None:
        data = [_desc_like(d, shape) for d, shape in zip(self._data_shapes, new_shapes)]
        labels = getattr(data_batch, "label", None)
        label_shapes = None
        if self._label_shapes and labels:
            label_shapes = [_desc_like(d, tuple(a.shape))
                            for d, a in zip(self._label_shapes, labels)]
        elif self._label_shapes:  # no labels given: keep them in step with the batch
            batch = new_shapes[0][0]
            label_shapes = [_desc_like(d, (batch, *d.shape[1:])) for d in self._label_shapes]
        self.reshape(data, label_shapes)

    def backward(self, out_grads=None):
        self._require("backward", binded=True, params=True)
        self._exec_group.backward(out_grads=out_grads)

    def update(self):
        """One optimizer step on every parameter, with the gradients summed over the
        contexts (through the store when there is one; in it when it runs the optimizer,
        every context then pulling the updated weight)."""
        self._require("update", binded=True, params=True, optimizer=True)
        self._params_dirty = True
        group = self._exec_group
        names = group.param_names_in_order()
        for index, (name, weights, grads) in enumerate(zip(names, group.param_arrays,
                                                           group.grad_arrays or [])):
            if grads is None or group.grad_req.get(name, "null") == "null":
                continue
            if self._update_on_kvstore:
                self._kvstore.push(name, list(grads))
                self._kvstore.pull(name, out=list(weights))
                continue
            total = _summed(grads)
            if self._kvstore is not None:
                self._kvstore.push(name, total)
                self._kvstore.pull(name, out=total)
            for weight in weights:
                self._updater(index, total.as_in_context(weight.ctx), weight)

    def get_outputs(self, merge_multi_context=True):
        self._require("get_outputs", binded=True, params=True)
        return self._exec_group.get_outputs(merge_multi_context=merge_multi_context)

    def get_input_grads(self, merge_multi_context=True):
        self._require("get_input_grads", binded=True, params=True)
        if not self.inputs_need_grad:
            raise InputError("get_input_grads: bind with inputs_need_grad=True first")
        return self._exec_group.get_input_grads(merge_multi_context=merge_multi_context)

    def get_states(self, merge_multi_context=True):
        self._require("get_states", binded=True, params=True)
        return self._exec_group.get_states(merge_multi_context=merge_multi_context)

    def set_states(self, states=None, value=None):
        self._require("set_states", binded=True, params=True)
        self._exec_group.set_states(states, value)

    def update_metric(self, eval_metric, labels, pre_sliced=False):
        self._exec_group.update_metric(eval_metric, labels, pre_sliced)

    def install_monitor(self, mon):
        """Install ``mon`` (an ``mx.monitor.Monitor``) on every executor."""
        self._require("install_monitor", binded=True)
        self._exec_group.install_monitor(mon)

    # -- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self, prefix, epoch, save_optimizer_states=False,
                        remove_amp_cast=True):
        """``prefix-symbol.json`` and ``prefix-%04d.params`` (MXNet's formats), and with
        ``save_optimizer_states`` ``prefix-%04d.states`` (the Updater's ``.npz`` bytes)."""
        self._symbol.save(f"{prefix}-symbol.json")
        self.save_params(model.params_file(prefix, epoch))
        self.logger.info('Saved checkpoint to "%s"', model.params_file(prefix, epoch))
        if save_optimizer_states:
            self.save_optimizer_states(_states_file(prefix, epoch))

    @staticmethod
    def load(prefix, epoch, load_optimizer_states=False, **kwargs):
        """A Module of the saved symbol holding the saved parameters (applied at bind);
        the optimizer's states load at ``init_optimizer`` when asked for."""
        symbol, arg_params, aux_params = model.load_checkpoint(prefix, epoch)
        loaded = Module(symbol=symbol, **kwargs)
        loaded._arg_params, loaded._aux_params = arg_params, aux_params
        loaded.params_initialized = True
        if load_optimizer_states:
            loaded._preload_opt_states = _states_file(prefix, epoch)
        return loaded

    def save_optimizer_states(self, fname):
        self._require("save_optimizer_states", optimizer=True)
        if self._update_on_kvstore:
            self._kvstore.save_optimizer_states(fname)
            return
        with open(fname, "wb") as out:
            out.write(self._updater.get_states())

    def load_optimizer_states(self, fname):
        self._require("load_optimizer_states", optimizer=True)
        if self._update_on_kvstore:
            self._kvstore.load_optimizer_states(fname)
            return
        with open(fname, "rb") as source:
            self._updater.set_states(source.read())


def _filler(value: float):
    """An initializer call that fills the whole array with ``value``."""
    def fill(_desc, array) -> None:
        array[:] = value
    return fill


def _summed(grads: list):
    """One parameter's gradients from every context, added on the first one's."""
    if len(grads) == 1:
        return grads[0]
    total = grads[0].copy()
    for grad in grads[1:]:
        total += grad.as_in_context(total.ctx)
    return total


def _states_file(prefix, epoch) -> str:
    return f"{prefix}-{int(epoch):04d}.states"


def _check_names(arguments, names, what: str, throw: bool) -> None:
    missing = [n for n in names if n not in arguments]
    if not missing:
        return
    message = (f"Module: {what}_names {missing} are not arguments of the symbol; its "
               f"arguments are {arguments}")
    if throw:
        raise InputError(message)
    warnings.warn(message, stacklevel=3)


def _parse_descs(names, shapes, what: str) -> list:
    """``shapes`` as DataDescs, checked against ``names``; a shape must be a tuple."""
    parsed = descs(shapes)
    for desc in parsed:
        if not isinstance(desc.shape, (tuple, list)) or \
                not all(isinstance(d, (int, np.integer)) for d in desc.shape):
            raise TypeError(f"bind: the shape of {what} {desc.name!r} must be a tuple of "
                            f"ints, got {desc.shape!r}")
    given = [d.name for d in parsed]
    if sorted(given) != sorted(names):
        raise InputError(f"bind: {what}_shapes name {given}; the module's {what}_names are "
                         f"{list(names)}")
    order = {name: i for i, name in enumerate(names)}
    return sorted(parsed, key=lambda d: order[d.name])


def _desc_like(desc, shape):
    return type(desc)(desc.name, tuple(shape), getattr(desc, "dtype", np.float32),
                      getattr(desc, "layout", "NCHW"))


def _batch_shapes(data_batch, names) -> list:
    data = data_batch.data if hasattr(data_batch, "data") else data_batch
    if len(data) != len(names):
        raise InputError(f"forward: the batch has {len(data)} data arrays; the module "
                         f"takes {len(names)}: {list(names)}")
    return [tuple(a.shape) for a in data]


def _host_param(array, attrs: dict | None):
    """The module's own copy of a parameter: zeros of the bound array's shape and dtype,
    in the storage its Variable declares (``stype='row_sparse'``), as MXNet's."""
    code = (attrs or {}).get("__storage_type__")
    stype = _STORAGE_TYPE_ID_TO_STR.get(int(code), "default") if code else "default"
    return nd.zeros(array.shape, dtype=array.dtype, stype=stype)


def _attributes(symbol) -> dict:
    attr_dict = getattr(symbol, "attr_dict", None)
    return attr_dict() if callable(attr_dict) else {}


def _updates_on_store() -> bool:
    """MXNet's MXNET_UPDATE_ON_KVSTORE (default on): whether a store, where there is one,
    runs the optimizer rather than the module."""
    return os.environ.get("MXNET_UPDATE_ON_KVSTORE", "1").strip() not in ("0", "")


def _store(kvstore, contexts: int):
    """None where MXNet uses none (one context, a local store), else a store."""
    if kvstore is None:
        return None
    if isinstance(kvstore, str):
        if contexts == 1 and "dist" not in kvstore:
            return None
        return create_store(kvstore)
    return kvstore


__all__ = ["Module"]
