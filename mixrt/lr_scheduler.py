"""Learning-rate schedules (``runtime/training/lr_scheduler.py``).

    from mixrt import lr_scheduler
    schedule = lr_scheduler.CosineScheduler(max_update=1000, base_lr=0.1, warmup_steps=100)
"""

from mixrt.runtime.training.lr_scheduler import (  # noqa: F401
    SCHEDULERS, CosineScheduler, FactorScheduler, LRScheduler, MultiFactorScheduler,
    PolyScheduler, create, from_spec)
from mixrt.runtime.training.lr_scheduler import __all__  # noqa: F401
