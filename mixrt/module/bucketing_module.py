"""MXNet's ``BucketingModule`` (``mx.mod.BucketingModule``): one Module per bucket key, made
from ``sym_gen(key) -> (symbol, data_names, label_names)``, each bound against the default
bucket's (``shared_module``: the same parameter and gradient memory) and sharing its
optimizer; each batch runs in the module of its ``bucket_key``."""

from __future__ import annotations

import logging

from mixrt import model
from mixrt.base.errors import InputError
from mixrt.context import cpu
from mixrt.module.base_module import BaseModule
from mixrt.module.module import Module


class BucketingModule(BaseModule):
    def __init__(self, sym_gen, default_bucket_key=None, logger=logging, context=None,
                 work_load_list=None, fixed_param_names=None, state_names=None,
                 group2ctxs=None, compression_params=None):
        super().__init__(logger)
        if default_bucket_key is None:
            raise InputError("BucketingModule needs a default_bucket_key")
        self._sym_gen, self._default_bucket_key = sym_gen, default_bucket_key
        self._context = context if context is not None else cpu()
        self._fixed_param_names = fixed_param_names
        self._state_names = state_names
        self._work_load_list, self._group2ctxs = work_load_list, group2ctxs
        self._grad_req = "write"
        self._buckets: dict = {}
        self._curr_module = None
        self._curr_bucket_key = None
        self._pending = None  # parameters loaded before bind

    def _module_for(self, key) -> Module:
        symbol, data_names, label_names = self._sym_gen(key)
        return Module(symbol, data_names, label_names, logger=self.logger,
                      context=self._context, work_load_list=self._work_load_list,
                      fixed_param_names=self._fixed_param_names,
                      state_names=self._state_names, group2ctxs=self._group2ctxs)

    # -- the current bucket's description ---------------------------------------------------

    @property
    def default_bucket_key(self):
        return self._default_bucket_key

    @property
    def symbol(self):
        return self._current("symbol").symbol

    @property
    def data_names(self):
        return self._current("data_names").data_names

    @property
    def output_names(self):
        return self._current("output_names").output_names

    @property
    def data_shapes(self):
        return self._current("data_shapes").data_shapes

    @property
    def label_shapes(self):
        return self._current("label_shapes").label_shapes

    @property
    def output_shapes(self):
        return self._current("output_shapes").output_shapes

    def _current(self, what: str) -> Module:
        if self._curr_module is None:
            raise InputError(f"BucketingModule.{what}: call bind first")
        return self._curr_module

    # -- binding and buckets ------------------------------------------------------------------

    def bind(self, data_shapes, label_shapes=None, for_training=True, inputs_need_grad=False,
             force_rebind=False, shared_module=None, grad_req="write"):
        if self.binded and not force_rebind:
            self.logger.warning("Already bound, ignoring bind()")
            return
        default = self._module_for(self._default_bucket_key)
        default.bind(data_shapes, label_shapes, for_training, inputs_need_grad,
                     grad_req=grad_req)
        self._grad_req, self.inputs_need_grad = grad_req, inputs_need_grad
        self._buckets = {self._default_bucket_key: default}
        self._curr_module, self._curr_bucket_key = default, self._default_bucket_key
        self.binded, self.for_training = True, for_training
        if self._pending is not None:
            default.init_params(None, *self._pending, allow_missing=True, force_init=True)
            self.params_initialized, self._pending = True, None

    def switch_bucket(self, bucket_key, data_shapes, label_shapes=None):
        """Make ``bucket_key``'s module current (binding it on first use, sharing the
        default module's parameters and optimizer)."""
        if not self.binded:
            raise InputError("switch_bucket: call bind before switching bucket")
        if bucket_key not in self._buckets:
            default = self._buckets[self._default_bucket_key]
            module = self._module_for(bucket_key)
            module.bind(data_shapes, label_shapes, self.for_training, self.inputs_need_grad,
                        shared_module=default, grad_req=self._grad_req)
            if self.optimizer_initialized:
                module.borrow_optimizer(default)
            self._buckets[bucket_key] = module
        self._curr_module, self._curr_bucket_key = self._buckets[bucket_key], bucket_key

    # -- parameters and optimizer -------------------------------------------------------------

    def init_params(self, initializer=None, arg_params=None, aux_params=None,
                    allow_missing=False, force_init=False, allow_extra=False):
        if self.params_initialized and not force_init:
            return
        self._buckets[self._default_bucket_key].init_params(
            initializer, arg_params, aux_params, allow_missing, force_init, allow_extra)
        self.params_initialized = True
        for module in self._buckets.values():
            module.params_initialized = True

    def get_params(self):
        return self._buckets[self._default_bucket_key].get_params()

    def set_params(self, arg_params, aux_params, allow_missing=False, force_init=True,
                   allow_extra=False):
        self._buckets[self._default_bucket_key].set_params(
            arg_params, aux_params, allow_missing, force_init, allow_extra)
        self.params_initialized = True

    def init_optimizer(self, kvstore="local", optimizer="sgd",
                       optimizer_params=(("learning_rate", 0.01),), force_init=False):
        if self.optimizer_initialized and not force_init:
            self.logger.warning("optimizer already initialized, ignoring.")
            return
        default = self._buckets[self._default_bucket_key]
        default.init_optimizer(kvstore, optimizer, optimizer_params, force_init=force_init)
        for key, module in self._buckets.items():
            if key != self._default_bucket_key:
                module.borrow_optimizer(default)
        self.optimizer_initialized = True

    # -- a batch ----------------------------------------------------------------------------

    def forward(self, data_batch, is_train=None):
        key = getattr(data_batch, "bucket_key", None)
        key = self._default_bucket_key if key is None else key
        self.switch_bucket(key, data_batch.provide_data, data_batch.provide_label)
        self._curr_module.forward(data_batch, is_train=is_train)

    def backward(self, out_grads=None):
        self._current("backward").backward(out_grads)

    def update(self):
        self._current("update").update()
        for module in self._buckets.values():  # their parameters are the same memory
            module._params_dirty = True

    def get_outputs(self, merge_multi_context=True):
        return self._current("get_outputs").get_outputs(merge_multi_context)

    def get_input_grads(self, merge_multi_context=True):
        return self._current("get_input_grads").get_input_grads(merge_multi_context)

    def update_metric(self, eval_metric, labels, pre_sliced=False):
        self._current("update_metric").update_metric(eval_metric, labels, pre_sliced)

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, prefix, epoch, remove_amp_cast=False):
        """The default bucket's symbol and the shared parameters."""
        self._buckets[self._default_bucket_key].save_checkpoint(prefix, epoch)

    @staticmethod
    def load(prefix, epoch, sym_gen=None, default_bucket_key=None, **kwargs):
        if sym_gen is None or default_bucket_key is None:
            raise InputError("BucketingModule.load needs sym_gen and default_bucket_key")
        _, arg_params, aux_params = model.load_checkpoint(prefix, epoch)
        loaded = BucketingModule(sym_gen, default_bucket_key, **kwargs)
        loaded._pending = (arg_params, aux_params)
        return loaded


__all__ = ["BucketingModule"]
