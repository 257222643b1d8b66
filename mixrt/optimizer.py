"""Optimizers, their specs and checkpoints, and gradient clipping (``runtime/optimizer.py``).

    from mixrt import optimizer
    opt = optimizer.create("sgd", learning_rate=0.1, momentum=0.9)
"""

from mixrt.runtime.optimizer import (  # noqa: F401
    OPTIMIZERS, SGD, AdaGrad, Adam, AdamW, LAMB, Optimizer, RMSProp, clip_global_norm, create,
    from_spec, from_state_dict, read_meta)
from mixrt.runtime.optimizer import __all__  # noqa: F401
