"""Modules: training a model with MXNet's ``fit`` shape (``mixrt.mod`` is MXNet's name).

* :class:`Module` (``graph_module.py``): fine-tune a Graph (imported from ONNX or built in
  mixrt) and :class:`SymbolModule`, a Symbol trained through one planned program;
  ``Module(symbol, data_names, label_names, context=...)``, a Symbol first, makes MXNet's;
* MXNet's ``mx.mod``: ``module.Module`` over ``executor_group.DataParallelExecutorGroup``
  (one Executor per context), ``bucketing_module.BucketingModule`` and
  ``base_module.BaseModule`` (``fit``, ``score``, ``predict``), each under MXNet's module
  name, so ``mxnet.module.executor_group`` is found where MXNet has it.
"""

from mixrt.module.base_module import BaseModule
from mixrt.module.bucketing_module import BucketingModule
from mixrt.module.executor_group import DataParallelExecutorGroup
from mixrt.module.graph_module import Module, SymbolModule

__all__ = ["BaseModule", "BucketingModule", "DataParallelExecutorGroup", "Module",
           "SymbolModule"]
