"""MXNet's ``mx.model`` checkpoint helpers: ``prefix-symbol.json`` beside
``prefix-%04d.params`` (MXNet's binary NDArray format through ``mixrt.nd.save``/``load``,
its arrays keyed ``arg:<name>`` and ``aux:<name>``), and the ``BatchEndParam`` that
``fit`` hands its batch callbacks.

    mixrt.model.save_checkpoint("net", 3, symbol, arg_params, aux_params)
    symbol, arg_params, aux_params = mixrt.model.load_checkpoint("net", 3)
"""

from __future__ import annotations

import logging
from collections import namedtuple

from mixrt import nd, sym
from mixrt.base.errors import ModelLoadError

BatchEndParam = namedtuple("BatchEndParam", ["epoch", "nbatch", "eval_metric", "locals"])


def params_file(prefix: str, epoch: int) -> str:
    return f"{prefix}-{int(epoch):04d}.params"


def save_checkpoint(prefix, epoch, symbol, arg_params, aux_params, remove_amp_cast=True):
    """Write ``prefix-symbol.json`` (when ``symbol`` is given) and ``prefix-%04d.params``."""
    if symbol is not None:
        symbol.save(f"{prefix}-symbol.json")
    saved = {f"arg:{name}": value for name, value in arg_params.items()}
    saved.update({f"aux:{name}": value for name, value in aux_params.items()})
    nd.save(params_file(prefix, epoch), saved)
    logging.info('Saved checkpoint to "%s"', params_file(prefix, epoch))


def load_params(prefix, epoch) -> tuple[dict, dict]:
    """``(arg_params, aux_params)`` from ``prefix-%04d.params``."""
    return split_params(nd.load(params_file(prefix, epoch)), params_file(prefix, epoch))


def split_params(saved, where: str) -> tuple[dict, dict]:
    if not isinstance(saved, dict):
        raise ModelLoadError(f"{where}: a checkpoint's parameters are named arrays, got "
                             f"a {type(saved).__name__}")
    arg_params, aux_params = {}, {}
    for key, value in saved.items():
        kind, _, name = key.partition(":")
        if kind == "arg":
            arg_params[name] = value
        elif kind == "aux":
            aux_params[name] = value
        else:
            raise ModelLoadError(f"{where}: entry {key!r} is neither 'arg:' nor 'aux:'")
    return arg_params, aux_params


def load_checkpoint(prefix, epoch):
    """``(symbol, arg_params, aux_params)`` as ``save_checkpoint`` wrote them."""
    symbol = sym.load(f"{prefix}-symbol.json")
    arg_params, aux_params = load_params(prefix, epoch)
    return symbol, arg_params, aux_params


__all__ = ["BatchEndParam", "save_checkpoint", "load_checkpoint", "load_params"]
