"""Imperative automatic differentiation, in MXNet's words.

    x = nd.array([[1.0, 2.0]]); x.attach_grad()
    with autograd.record():              # ops on x are taped
        y = (x * x).sum()
    y.backward()                         # x.grad == 2 * x

MXNet's ``autograd`` module, standing above both array and symbol frontends as MXNet's
does: the recording itself is the tape's (``mixrt/tape/``, the floor ``mixrt.nd`` records
on), whose API this module hands on; ``get_symbol`` turns a recording into a Symbol
(``symbolize.py``, loaded on first use). The gradients are the registry's
(``@op.grad``), compiled per call signature (``mixrt/tape/opgrad.py``). ``Function`` lets
Python code define its own forward and backward. Recording and training mode are per
thread.
"""

from __future__ import annotations

# MXNet's autograd module has no __all__, so ``from mxnet.autograd import *`` also gives the
# names it imports: the array and symbol classes, and the standard library's. Its C API
# names (check_call, NDArrayHandle, ...) have nothing to stand for here.
import ctypes
import importlib
import traceback
from array import array
from ctypes import CFUNCTYPE, POINTER, c_int, c_void_p, cast
from threading import Lock

from mixrt.tape import (Function, backward, grad, is_recording, is_training, mark_variables,
                        pause, predict_mode, record, set_recording, set_training, train_mode)


def __getattr__(name: str):
    """``get_symbol`` and the array and symbol classes, loaded on first use (PEP 562): they
    stand on floors below this module, but recording alone needs neither frontend, and
    ``from mixrt import autograd`` stays as light as the tape."""
    if name == "get_symbol":
        return importlib.import_module("mixrt.autograd.symbolize").get_symbol
    if name == "Symbol":
        return importlib.import_module("mixrt.sym.symbol").Symbol
    if name == "NDArray":
        return importlib.import_module("mixrt.nd.ndarray").NDArray
    raise AttributeError(f"module 'mixrt.autograd' has no attribute {name!r}")


__all__ = ["record", "pause", "train_mode", "predict_mode", "is_recording", "is_training",
           "set_recording", "set_training", "mark_variables", "backward", "grad", "Function",
           "get_symbol", "NDArray", "Symbol", "array", "Lock", "traceback", "ctypes", "c_int",
           "c_void_p", "CFUNCTYPE", "POINTER", "cast"]
