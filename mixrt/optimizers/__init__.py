"""MXNet's optimizers (``mx.optimizer``), by topic: ``base`` (the Optimizer class and its
registry), ``updater`` (states per index and their save format), ``sgd``, ``adaptive`` and
``large_batch`` (the kinds written as MXNet writes them; each over its definition in
``runtime/training/optimizers/`` where it has one), ``made`` (a class made for a
definition no kind here is written for). ``mixrt.optimizer`` is the public name."""

from mixrt.optimizers.base import (Optimizer, UnknownOptimizerError, as_ndarray,  # noqa: F401
                                   create, register)
from mixrt.optimizers.updater import Updater, get_updater  # noqa: F401
from mixrt.optimizers.sgd import DCASGD, NAG, SGD, SGLD, Signum, Test, ccSGD  # noqa: F401
from mixrt.optimizers.adaptive import (FTML, AdaDelta, AdaGrad, Adam, Adamax,  # noqa: F401
                                       Ftrl, GroupAdaGrad, Nadam, RMSProp)
from mixrt.optimizers.large_batch import LAMB, LARS, LBSGD  # noqa: F401
from mixrt.optimizers.made import register_made

# an optimizer defined by its file in runtime/training/optimizers/ alone: a class made for it
register_made(Optimizer.opt_registry)

__all__ = ["Optimizer", "Updater", "create", "get_updater", "register", "SGD", "ccSGD", "NAG",
           "Signum", "SGLD", "DCASGD", "Test", "Adam", "AdaGrad", "GroupAdaGrad", "RMSProp",
           "AdaDelta", "Ftrl", "Adamax", "Nadam", "FTML", "LAMB", "LARS", "LBSGD"]
