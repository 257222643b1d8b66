"""MXNet's ``mx.mod.Module``: a Symbol bound for training and inference, with MXNet's calls
and their order (``mixrt.module`` is the public module; ``mixrt.mod`` is its MXNet name, and
``mixrt.module.Module(symbol, ...)`` makes one of these):

    mod = mixrt.mod.Module(net, data_names=["data"], label_names=["softmax_label"])
    mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label)
    mod.init_params(mixrt.init.Xavier())
    mod.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    for batch in it:
        mod.forward(batch, is_train=True); mod.backward(); mod.update()
        mod.update_metric(metric, batch.label)
    mod.fit(it, eval_data=val, eval_metric="acc", num_epoch=5)
    mod.save_checkpoint("net", 5)          # net-symbol.json, net-0005.params

Under it is mixrt's symbol module (``mixrt.module.SymbolModule``): one planned program
computes the forward pass and, for a training batch, the gradients of the symbol's output
layer as MXNet defines them (SoftmaxOutput's ``softmax - onehot(label)``, ...), so
``forward(is_train=True)`` already holds what ``backward`` exposes; ``update`` applies an
MXNet optimizer (``mixrt.optimizer``) with MXNet's ``rescale_grad = 1 / batch_size``.

What differs: one data input and at most one label (MXNet takes several); several contexts
run on the first (a data-parallel split computes the same sums); ``backward(out_grads)``
and ``inputs_need_grad`` are refused (the output layer's gradient is the one computed).
"""

from __future__ import annotations

import logging
import warnings


from mixrt import model, nd, optimizer as optimizers
from mixrt.base.errors import InputError
from mixrt.context import cpu
from mixrt.initializer import Uniform
from mixrt.kvstore import create as create_store
from mixrt.mod_base import BaseModule, descs, device_of, host_array
from mixrt.optimizers import as_ndarray

# mixrt.module's SymbolModule, handed in as that module loads (it imports this one)
_SYMBOL_MODULE: list = []


def use_symbol_module(symbol_module_class) -> None:
    _SYMBOL_MODULE[:] = [symbol_module_class]


class Module(BaseModule):
    def __init__(self, symbol, data_names=("data",), label_names=("softmax_label",),
                 logger=logging, context=None, work_load_list=None, fixed_param_names=None,
                 state_names=None, group2ctxs=None, compression_params=None):
        super().__init__(logger)
        arguments = symbol.list_arguments()
        self._symbol = symbol
        self._data_names = list(data_names or [])
        self._label_names = [n for n in (label_names or []) if n in arguments]
        if label_names and not self._label_names:
            warnings.warn(f"Module: the symbol has none of the labels {list(label_names)}; "
                          f"it will not be trained against a label", stacklevel=2)
        self._fixed_param_names = list(fixed_param_names or [])
        self._context = context if context is not None else cpu()
        self._inner = _SYMBOL_MODULE[0](symbol, self._data_names, self._label_names or None,
                                        device=device_of(self._context))
        self._param_names = [n for n in arguments
                             if n not in self._data_names + self._label_names]
        self._aux_names = symbol.list_auxiliary_states()
        self._pending = None  # (arg_params, aux_params) loaded before bind
        self._outputs, self._grads = [], None
        self._optimizer = self._updater = self._kvstore = None
        self._param_index: dict = {}
        self._data_shapes = self._label_shapes = []
        self._preload_opt_states = None

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
        return self._symbol.list_outputs()

    @property
    def data_shapes(self):
        return self._data_shapes

    @property
    def label_shapes(self):
        return self._label_shapes

    @property
    def output_shapes(self):
        self._require("output_shapes", binded=True)
        shapes = {d.name: d.shape for d in self._data_shapes + self._label_shapes}
        _, out_shapes, _ = self._symbol.infer_shape(**shapes)
        return list(zip(self.output_names, out_shapes))

    # -- bind and parameters ---------------------------------------------------------------

    def bind(self, data_shapes, label_shapes=None, for_training=True, inputs_need_grad=False,
             force_rebind=False, shared_module=None, grad_req="write"):
        if self.binded and not force_rebind:
            self.logger.warning("Already bound, ignoring bind()")
            return
        if inputs_need_grad:
            raise InputError("bind: inputs_need_grad is not offered (gradients flow to the "
                             "parameters only)")
        self._data_shapes, self._label_shapes = descs(data_shapes), descs(label_shapes)
        if [d.name for d in self._data_shapes] != self._data_names[:1] or \
                len(self._data_shapes) != 1:
            raise InputError(f"bind: data_shapes must describe the one data input "
                             f"{self._data_names}, got {[d.name for d in self._data_shapes]}")
        first = self._data_shapes[0]
        self._inner.bind(first.shape, first.dtype)
        self.for_training, self.binded = for_training, True
        if grad_req == "null" or not for_training:
            self._inner.freeze()
        elif self._fixed_param_names:
            self._inner.freeze(self._fixed_param_names)
        if shared_module is not None:
            self._share_params(shared_module)
        if self._pending is not None:
            self.set_params(*self._pending, allow_missing=True)
            self._pending = None

    def _share_params(self, other: "Module") -> None:
        """Use ``other``'s Parameter objects (the same storage), as MXNet's shared_module."""
        for name in self._inner.params:
            if name in other._inner.params:
                self._inner.params[name] = other._inner.params[name]
        self.params_initialized = other.params_initialized

    def init_params(self, initializer=None, arg_params=None, aux_params=None,
                    allow_missing=False, force_init=False, allow_extra=False):
        if self.params_initialized and not force_init:
            warnings.warn("Parameters already initialized and force_init=False. "
                          "init_params call ignored.", stacklevel=2)
            return
        self._require("init_params", binded=True)
        self._inner.init_params(initializer or Uniform(0.01))
        if arg_params is not None or aux_params is not None:
            self._copy_in(arg_params or {}, aux_params or {}, allow_missing, allow_extra)
        self.params_initialized = True

    def _copy_in(self, arg_params, aux_params, allow_missing, allow_extra) -> None:
        for names, given, what in ((self._param_names, arg_params, "arg"),
                                   (self._aux_names, aux_params, "aux")):
            missing = [n for n in names if n not in given]
            if missing and not allow_missing:
                raise InputError(f"init_params: {what} {missing[0]!r} is not presented "
                                 f"(allow_missing=True keeps its initial value)")
            extra = [n for n in given if n not in names]
            if extra and not allow_extra:
                raise InputError(f"init_params: {what} params {extra} are not in the symbol "
                                 f"(allow_extra=True ignores them)")
            for name in names:
                if name in given:
                    self._inner.params[name].set_data(host_array(given[name]))
        self._inner._changed()

    def get_params(self):
        self._require("get_params", binded=True, params=True)
        params = self._inner.params
        return ({n: _copy(params[n].raw()) for n in self._param_names},
                {n: _copy(params[n].raw()) for n in self._aux_names})

    def set_params(self, arg_params, aux_params, allow_missing=False, force_init=True,
                   allow_extra=False):
        if not self.binded:  # as Module.load: applied at bind
            self._pending = (dict(arg_params), dict(aux_params or {}))
            self.params_initialized = True
            return
        if self.params_initialized and not force_init:
            warnings.warn("Parameters already initialized and force_init=False. "
                          "set_params call ignored.", stacklevel=2)
            return
        self._copy_in(arg_params, aux_params or {}, allow_missing, allow_extra)
        self.params_initialized = True

    # -- the optimizer ----------------------------------------------------------------------

    def init_optimizer(self, kvstore="local", optimizer="sgd",
                       optimizer_params=(("learning_rate", 0.01),), force_init=False):
        self._require("init_optimizer", binded=True, params=True)
        if self.optimizer_initialized and not force_init:
            self.logger.warning("optimizer already initialized, ignoring...")
            return
        store = _store(kvstore)
        workers = store.num_workers if store is not None and "dist" in store.type and \
            "async" not in store.type else 1
        rescale = 1.0 / (self._data_shapes[0].shape[0] * workers)
        idx2name = dict(enumerate(self._param_names))
        if isinstance(optimizer, str):
            params = dict(optimizer_params)
            params.setdefault("rescale_grad", rescale)
            optimizer = optimizers.create(optimizer, sym=self._symbol_info(),
                                          param_idx2name=idx2name, **params)
        elif optimizer.rescale_grad != rescale:
            warnings.warn(f"Optimizer created manually outside Module but rescale_grad is "
                          f"not normalized to 1.0/batch_size/num_workers ({optimizer.rescale_grad}"
                          f" vs. {rescale}). Is this intended?", stacklevel=2)
        self._optimizer, self._kvstore = optimizer, store
        self._updater = optimizers.get_updater(optimizer)
        self._param_index = {name: index for index, name in idx2name.items()}
        if store is not None:
            self._init_store(store)
        self.optimizer_initialized = True
        if self._preload_opt_states is not None:
            self.load_optimizer_states(self._preload_opt_states)
            self._preload_opt_states = None

    def _symbol_info(self):
        return self._symbol if hasattr(self._symbol, "attr_dict") else None

    def _init_store(self, store) -> None:
        names = self._trainable()
        store.init(names, [self._inner.params[n].raw() for n in names])
        store.pull(names, out=[self._inner.params[n].raw() for n in names])

    # -- a batch ----------------------------------------------------------------------------

    def forward(self, data_batch, is_train=None):
        self._require("forward", binded=True, params=True)
        is_train = self.for_training if is_train is None else is_train
        inputs = data_batch.data[0].asnumpy()
        wanted = self._inner._input_dtype()
        inputs = inputs.astype(wanted) if wanted is not None else inputs
        labels = data_batch.label[0].asnumpy() if data_batch.label else None
        if is_train and self._label_names and labels is not None:
            self._train_forward(inputs, labels)
        else:
            session = self._inner._session()
            self._outputs = session.run([self._inner.output], {self._data_names[0]: inputs})
            self._grads = None

    def _train_forward(self, inputs, labels) -> None:
        inner = self._inner
        program = inner._program(inner._loss(None))
        feeds = {self._data_names[0]: inputs, program.loss_spec.label: labels,
                 **inner._state_feeds()}
        _, outputs, grads = program.step(inner.params.arrays(), feeds)
        self._outputs = inner._store_state(outputs)
        # the program's gradients are MXNet's divided by the batch (its loss is a mean);
        # MXNet's optimizer divides by the batch itself (rescale_grad)
        batch = inputs.shape[0]
        self._grads = {name: grad * batch for name, grad in (grads or {}).items()}

    def backward(self, out_grads=None):
        self._require("backward", binded=True, params=True)
        if out_grads is not None:
            raise InputError("backward: out_grads are not taken; the symbol's output layer "
                             "gives its own gradient, as in MXNet")
        if self._grads is None:
            raise InputError("backward: run forward(data_batch, is_train=True) on a batch "
                             "with labels first")

    def update(self):
        self._require("update", binded=True, params=True, optimizer=True)
        if self._grads is None:
            return
        names = [n for n in self._trainable() if n in self._grads]
        if self._kvstore is not None:
            self._kvstore.push(names, [self._grads[n] for n in names])
            self._kvstore.pull(names, out=[self._grads[n] for n in names])
        for name in names:
            weight = self._inner.params[name].raw()
            index = self._param_index.setdefault(name, len(self._param_index))
            self._updater(index, as_ndarray(self._grads[name]), as_ndarray(weight))
        self._inner._changed()

    def _trainable(self) -> list:
        return [p.name for p in self._inner.params.trainable()]

    def get_outputs(self, merge_multi_context=True):
        self._require("get_outputs", binded=True, params=True)
        return [_copy(out) for out in self._outputs]

    def get_input_grads(self, merge_multi_context=True):
        raise InputError("get_input_grads: bind(inputs_need_grad=True) is not offered")

    def update_metric(self, eval_metric, labels, pre_sliced=False):
        eval_metric.update(labels, self.get_outputs())

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, prefix, epoch, save_optimizer_states=False,
                        remove_amp_cast=True):
        self._symbol.save(f"{prefix}-symbol.json")
        self.save_params(model.params_file(prefix, epoch))
        self.logger.info('Saved checkpoint to "%s"', model.params_file(prefix, epoch))
        if save_optimizer_states:
            self.save_optimizer_states(f"{prefix}-{int(epoch):04d}.states")

    @staticmethod
    def load(prefix, epoch, load_optimizer_states=False, **kwargs):
        symbol, arg_params, aux_params = model.load_checkpoint(prefix, epoch)
        loaded = Module(symbol=symbol, **kwargs)
        loaded.set_params(arg_params, aux_params)
        if load_optimizer_states:
            loaded._preload_opt_states = f"{prefix}-{int(epoch):04d}.states"
        return loaded

    def save_optimizer_states(self, fname):
        """The updater's states as ``.npz`` bytes (MXNet pickles them; mixrt does not)."""
        self._require("save_optimizer_states", optimizer=True)
        with open(fname, "wb") as out:
            out.write(self._updater.get_states())

    def load_optimizer_states(self, fname):
        self._require("load_optimizer_states", optimizer=True)
        with open(fname, "rb") as source:
            self._updater.set_states(source.read())

    def borrow_optimizer(self, shared_module) -> None:
        """Use ``shared_module``'s optimizer, updater (and so its states) and store."""
        self._optimizer, self._updater = shared_module._optimizer, shared_module._updater
        self._kvstore, self._param_index = shared_module._kvstore, shared_module._param_index
        self.optimizer_initialized = True

    def install_monitor(self, mon):
        raise InputError("install_monitor: mixrt has no executor monitor")


def _copy(raw):
    """An NDArray holding a copy of ``raw`` in its own dtype."""
    return nd.array(raw, dtype=raw.dtype)


def _store(kvstore):
    """None for a single-device local store (MXNet needs none there), else a store."""
    if kvstore is None or (isinstance(kvstore, str) and kvstore in ("local", "device")):
        return None
    return create_store(kvstore) if isinstance(kvstore, str) else kvstore


__all__ = ["Module"]
