"""Gluon-style training pieces: Parameter, ParameterDict and Trainer (the blocks and layers
come with the imperative issue)."""

from mixrt.gluon.parameter import Parameter, ParameterDict
from mixrt.gluon.trainer import Trainer

__all__ = ["Parameter", "ParameterDict", "Trainer"]
