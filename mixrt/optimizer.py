"""MXNet's ``mx.optimizer``: the optimizers, with MXNet's names, arguments, defaults and
update rules (``mixrt/optimizers/``).

    from mixrt import optimizer
    opt = optimizer.create("sgd", learning_rate=0.1, momentum=0.9)
    updater = optimizer.get_updater(opt)
    updater(0, grad, weight)                  # NDArrays; weight changes in place

Every optimizer here is also an engine optimizer (``step``, ``state_dict``), so a KVStore
or a Trainer takes it. The engine's own optimizers (PyTorch's rules, specs a parameter
server rebuilds) are ``mixrt.runtime.training.optimizer``. ``Updater.get_states`` writes
an ``.npz``, never a pickle.
"""

from mixrt.optimizers import *  # noqa: F401,F403
from mixrt.optimizers import __all__  # noqa: F401
from mixrt.optimizers import adaptive as contrib  # noqa: F401  (mx.optimizer.contrib.GroupAdaGrad)
from mixrt.optimizers import UnknownOptimizerError  # noqa: F401
