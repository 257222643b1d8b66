"""What MXNet's modules share (``mx.mod.BaseModule``): ``BaseModule`` with
``fit``, ``score``, ``predict``, ``iter_predict`` and ``forward_backward`` written against
bind/init_params/init_optimizer/forward/backward/update, which a module defines."""

from __future__ import annotations

import logging
import time

import numpy as np

from mixrt import metric as metrics, model, nd
from mixrt.base.errors import InputError
from mixrt.context import Context, cpu
from mixrt.initializer import Uniform
from mixrt.io_base import DataDesc
from mixrt.io_ndarray import NDArrayIter


def descs(shapes) -> list:
    """``[(name, shape)]`` or DataDescs as DataDescs."""
    if shapes is None:
        return []
    return [s if isinstance(s, DataDesc) else DataDesc(*s) for s in shapes]


def device_of(context) -> str:
    contexts = context if isinstance(context, (list, tuple)) else [context]
    first = contexts[0] if contexts else cpu()
    if not isinstance(first, Context):
        raise InputError(f"Module: context must be a Context or a list of them, got {first!r}")
    return f"{first.device_type}:{first.device_id}" if first.device_type == "gpu" else "cpu"


class BaseModule:
    """What every module shares: fit, score, predict, iter_predict, forward_backward."""

    def __init__(self, logger=logging):
        self.logger = logger
        self.binded = self.for_training = self.inputs_need_grad = False
        self.params_initialized = self.optimizer_initialized = False

    def forward_backward(self, data_batch):
        self.forward(data_batch, is_train=True)
        self.backward()

    def score(self, eval_data, eval_metric, num_batch=None, batch_end_callback=None,
              score_end_callback=None, reset=True, epoch=0, sparse_row_id_fn=None):
        """The metric over ``eval_data`` (every row of each batch, pads included, as in
        MXNet): ``[(name, value)]``."""
        self._require("score", binded=True, params=True)
        if reset:
            eval_data.reset()
        eval_metric = metrics.create(eval_metric)
        eval_metric.reset()
        nbatch = 0
        for nbatch, batch in enumerate(eval_data):
            if num_batch is not None and nbatch == num_batch:
                break
            self.forward(batch, is_train=False)
            self.update_metric(eval_metric, batch.label)
            _call_all(batch_end_callback, model.BatchEndParam(epoch, nbatch, eval_metric,
                                                              locals()))
        _call_all(score_end_callback, model.BatchEndParam(epoch, nbatch, eval_metric,
                                                          locals()))
        return eval_metric.get_name_value()

    def iter_predict(self, eval_data, num_batch=None, reset=True, sparse_row_id_fn=None):
        """Yields ``(outputs without the pad rows, batch index, batch)``."""
        self._require("iter_predict", binded=True, params=True)
        if reset:
            eval_data.reset()
        for nbatch, batch in enumerate(eval_data):
            if num_batch is not None and nbatch == num_batch:
                break
            self.forward(batch, is_train=False)
            pad = batch.pad or 0
            yield [out[:out.shape[0] - pad] for out in self.get_outputs()], nbatch, batch

    def predict(self, eval_data, num_batch=None, merge_batches=True, reset=True,
                always_output_list=False, sparse_row_id_fn=None):
        """The outputs over ``eval_data`` (an iterator or an array), pads dropped; merged
        over batches unless ``merge_batches=False``."""
        if isinstance(eval_data, (nd.NDArray, np.ndarray)):
            from_array = eval_data if isinstance(eval_data, nd.NDArray) else nd.array(eval_data)
            eval_data = NDArrayIter(from_array, batch_size=self.data_shapes[0].shape[0])
        outputs = [[o.copy() for o in outs] for outs, _, _ in
                   self.iter_predict(eval_data, num_batch, reset)]
        if not outputs:
            return []
        if not merge_batches:
            return outputs
        merged = [nd.concat(*parts, dim=0) for parts in zip(*outputs)]
        return merged[0] if len(merged) == 1 and not always_output_list else merged

    def fit(self, train_data, eval_data=None, eval_metric="acc", epoch_end_callback=None,
            batch_end_callback=None, kvstore="local", optimizer="sgd",
            optimizer_params=(("learning_rate", 0.01),), eval_end_callback=None,
            eval_batch_end_callback=None, initializer=None, arg_params=None,
            aux_params=None, allow_missing=False, force_rebind=False, force_init=False,
            begin_epoch=0, num_epoch=None, validation_metric=None, monitor=None,
            sparse_row_id_fn=None):
        """MXNet's training loop: bind, init_params, init_optimizer, then per epoch
        forward_backward/update/update_metric per batch, the callbacks, and ``score`` on
        ``eval_data``."""
        if num_epoch is None:
            raise InputError("fit: please specify number of epochs (num_epoch)")
        self.bind(train_data.provide_data, train_data.provide_label, for_training=True,
                  force_rebind=force_rebind)
        self.init_params(initializer=initializer or Uniform(0.01), arg_params=arg_params,
                         aux_params=aux_params, allow_missing=allow_missing,
                         force_init=force_init)
        self.init_optimizer(kvstore=kvstore, optimizer=optimizer,
                            optimizer_params=optimizer_params)
        validation_metric = validation_metric or eval_metric
        eval_metric = metrics.create(eval_metric)
        for epoch in range(begin_epoch, num_epoch):
            self._fit_epoch(epoch, train_data, eval_metric, batch_end_callback)
            arg_now, aux_now = self.get_params()
            if epoch_end_callback is not None:
                _call_all(epoch_end_callback, epoch, self.symbol, arg_now, aux_now)
            if eval_data is not None:
                for name, value in self.score(eval_data, validation_metric,
                                              score_end_callback=eval_end_callback,
                                              batch_end_callback=eval_batch_end_callback,
                                              epoch=epoch):
                    self.logger.info("Epoch[%d] Validation-%s=%f", epoch, name, value)
            train_data.reset()

    def _fit_epoch(self, epoch, train_data, eval_metric, batch_end_callback) -> None:
        started = time.time()
        eval_metric.reset()
        nbatch = 0
        for nbatch, batch in enumerate(train_data):
            self.forward_backward(batch)
            self.update()
            self.update_metric(eval_metric, batch.label)
            _call_all(batch_end_callback, model.BatchEndParam(epoch, nbatch, eval_metric,
                                                              locals()))
        for name, value in eval_metric.get_global_name_value():
            self.logger.info("Epoch[%d] Train-%s=%f", epoch, name, value)
        self.logger.info("Epoch[%d] Time cost=%.3f", epoch, time.time() - started)

    def _require(self, what: str, binded=False, params=False, optimizer=False) -> None:
        if binded and not self.binded:
            raise InputError(f"{what}: call bind before {what}")
        if params and not self.params_initialized:
            raise InputError(f"{what}: call init_params before {what}")
        if optimizer and not self.optimizer_initialized:
            raise InputError(f"{what}: call init_optimizer before {what}")

    def save_params(self, fname):
        arg_params, aux_params = self.get_params()
        saved = {f"arg:{k}": v for k, v in arg_params.items()}
        saved.update({f"aux:{k}": v for k, v in aux_params.items()})
        nd.save(fname, saved)

    def load_params(self, fname):
        arg_params, aux_params = model.split_params(nd.load(fname), fname)
        self.set_params(arg_params, aux_params)


def host_array(value):
    return value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)


def _call_all(callbacks, *args) -> None:
    if callbacks is None:
        return
    for callback in callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]:
        callback(*args)


__all__ = ["BaseModule"]
