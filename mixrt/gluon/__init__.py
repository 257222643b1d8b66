"""mixrt.gluon: models as Python classes (Block, HybridBlock), their Parameters, the
Trainer, the layers (``nn``, ``rnn``, ``contrib.nn``), losses (``loss``), the data pipeline
(``data``) and MXNet's model zoo (``model_zoo.vision``)."""

from mixrt.gluon.block import Block, Sequential
from mixrt.gluon.hybrid import HybridBlock, HybridSequential, static_shape
from mixrt.gluon.parameter import Constant, Parameter, ParameterDict
from mixrt.gluon.symbol_block import SymbolBlock
from mixrt.gluon.trainer import Trainer

_SUBMODULES = frozenset({"nn", "rnn", "loss", "data", "utils", "contrib", "model_zoo"})


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib  # noqa: PLC0415
        return importlib.import_module(f"mixrt.gluon.{name}")
    raise AttributeError(f"module 'mixrt.gluon' has no attribute {name!r}")


__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential", "Constant", "Parameter",
           "ParameterDict", "SymbolBlock", "Trainer", "static_shape"]
