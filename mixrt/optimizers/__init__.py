"""MXNet's optimizers (``mx.optimizer``), by topic: ``base`` (the Optimizer class and its
registry), ``updater`` (states per index and their save format), ``sgd``, ``adaptive`` and
``large_batch`` (the kinds). ``mixrt.optimizer`` is the public name."""

from mixrt.optimizers.base import (Optimizer, UnknownOptimizerError, as_ndarray,  # noqa: F401
                                   create, register)
from mixrt.optimizers.updater import Updater, get_updater  # noqa: F401
from mixrt.optimizers.sgd import DCASGD, NAG, SGD, SGLD, Signum, Test, ccSGD  # noqa: F401
from mixrt.optimizers.adaptive import (FTML, AdaDelta, AdaGrad, Adam, Adamax,  # noqa: F401
                                       Ftrl, GroupAdaGrad, Nadam, RMSProp)
from mixrt.optimizers.large_batch import LAMB, LARS, LBSGD  # noqa: F401

__all__ = ["Optimizer", "Updater", "create", "get_updater", "register", "SGD", "ccSGD", "NAG",
           "Signum", "SGLD", "DCASGD", "Test", "Adam", "AdaGrad", "GroupAdaGrad", "RMSProp",
           "AdaDelta", "Ftrl", "Adamax", "Nadam", "FTML", "LAMB", "LARS", "LBSGD"]
