"""One seed for every random stream mixrt uses: ``mixrt.random.seed(42)``.

It seeds NumPy's global generator (user code and older libraries draw from it), mixrt's own
generator (parameter initializers, data shuffling), the stream of random ops without a seed
attribute (Dropout's masks, RandomNormal) and CuPy's when CuPy is already imported.
Code that needs randomness takes ``generator()`` rather than calling NumPy's global functions,
so a run is reproducible from its seed and a resumed run can restore the exact state.
"""

from __future__ import annotations

import sys

import numpy as np

from mixrt.ops.device import gpu_count
from mixrt.ops.random import random as ops_random

_generator = np.random.default_rng()


def seed(value: int) -> None:
    """Reseed NumPy, mixrt and (if loaded) CuPy, on every GPU (CuPy keeps a generator per
    device and its ``seed`` reseeds only the current one's)."""
    global _generator
    value = int(value)
    np.random.seed(value % (2 ** 32))
    _generator = np.random.default_rng(value)
    ops_random.reseed(value)
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        for index in range(gpu_count()):  # none without a GPU: nothing to seed
            with cupy.cuda.Device(index):
                cupy.random.seed(value)


def generator() -> np.random.Generator:
    """mixrt's generator (reseeded by :func:`seed`)."""
    return _generator


def spawn() -> np.random.Generator:
    """An independent generator derived from mixrt's (one per data iterator, say), so that
    streams do not shift each other when one of them draws more."""
    return np.random.default_rng(_generator.integers(0, 2 ** 63))
