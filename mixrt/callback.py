"""MXNet's ``mx.callback``: what ``Module.fit`` calls after each batch or epoch."""

from __future__ import annotations

import logging
import math
import time

from mixrt import model


def do_checkpoint(prefix, period=1):
    """An epoch-end callback saving ``prefix-symbol.json`` and ``prefix-%04d.params`` every
    ``period`` epochs (numbered from 1, as MXNet's)."""
    period = int(max(1, period))

    def save(iter_no, sym, arg, aux):
        if (iter_no + 1) % period == 0:
            model.save_checkpoint(prefix, iter_no + 1, sym, arg, aux)
    return save


def module_checkpoint(mod, prefix, period=1, save_optimizer_states=False):
    """An epoch-end callback calling ``mod.save_checkpoint`` every ``period`` epochs."""
    period = int(max(1, period))

    def save(iter_no, sym=None, arg=None, aux=None):
        if (iter_no + 1) % period == 0:
            mod.save_checkpoint(prefix, iter_no + 1, save_optimizer_states)
    return save


def log_train_metric(period, auto_reset=False):
    """A batch-end callback logging the training metric every ``period`` batches."""
    def log(param):
        if param.nbatch % period == 0 and param.eval_metric is not None:
            for name, value in param.eval_metric.get_name_value():
                logging.info("Iter[%d] Batch[%d] Train-%s=%f", param.epoch, param.nbatch,
                             name, value)
            if auto_reset:
                param.eval_metric.reset_local()
    return log


class Speedometer:
    """Logs samples per second (and the metric) every ``frequent`` batches."""

    def __init__(self, batch_size, frequent=50, auto_reset=True):
        self.batch_size, self.frequent, self.auto_reset = batch_size, frequent, auto_reset
        self.init, self.tic, self.last_count = False, 0, 0

    def __call__(self, param):
        count = param.nbatch
        if self.last_count > count:
            self.init = False
        self.last_count = count
        if not self.init:
            self.init, self.tic = True, time.time()
            return
        if count % self.frequent != 0:
            return
        speed = self.frequent * self.batch_size / max(time.time() - self.tic, 1e-12)
        if param.eval_metric is not None:
            pairs = param.eval_metric.get_name_value()
            if self.auto_reset:
                param.eval_metric.reset_local()
            text = "\t".join(f"{name}={value:f}" for name, value in pairs)
            logging.info("Epoch[%d] Batch [%d-%d]\tSpeed: %.2f samples/sec\t%s",
                         param.epoch, count - self.frequent, count, speed, text)
        else:
            logging.info("Iter[%d] Batch [%d]\tSpeed: %.2f samples/sec", param.epoch, count,
                         speed)
        self.tic = time.time()


class ProgressBar:
    """Prints a bar of ``length`` characters over ``total`` batches."""

    def __init__(self, total, length=80):
        self.bar_len, self.total = length, total

    def __call__(self, param):
        filled = int(round(self.bar_len * (param.nbatch + 1) / float(self.total)))
        percents = math.ceil(100.0 * (param.nbatch + 1) / float(self.total))
        logging.info("[%s] %s%s\r", "=" * filled + "-" * (self.bar_len - filled), percents, "%")


class LogValidationMetricsCallback:
    """An eval-end callback logging the validation metrics."""

    def __call__(self, param):
        if param.eval_metric is None:
            return
        for name, value in param.eval_metric.get_name_value():
            logging.info("Epoch[%d] Validation-%s=%f", param.epoch, name, value)


__all__ = ["do_checkpoint", "module_checkpoint", "log_train_metric", "Speedometer",
           "ProgressBar", "LogValidationMetricsCallback"]
