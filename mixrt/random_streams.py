"""The random streams mixrt draws from, and reseeding them: what ``mixrt.random.seed`` does.

* NumPy's global generator (user code and older libraries draw from it);
* mixrt's own generator (parameter initializers, data shuffling): :func:`generator`;
* the host stream of random ops without a ``seed`` attribute on the CPU (Dropout's masks,
  RandomNormal, MXNet's samplers: ``mixrt.ops.random.random.reseed``);
* CuPy's generator of each GPU, which random ops on that GPU draw from.

Code that needs randomness takes :func:`generator` rather than NumPy's global functions, so a
run is reproducible from its seed and a resumed run can restore the exact state.

``mixrt.random`` (MXNet's ``mx.random``: the seed with its ``ctx``, and the samplers, which
it loads from ``mixrt.nd`` on first use) re-exports :func:`generator` and :func:`spawn`; a
module below ``mixrt.nd`` (the initializers its layers use, the data iterators) may import
either.
"""

from __future__ import annotations

import sys

import numpy as np

from mixrt.ops.device import gpu_count
from mixrt.ops.random import random as ops_random

_generator = np.random.default_rng()


def reseed(value: int, device_type: str | None = None, device_id: int = 0) -> None:
    """Reseed the streams of every device (``device_type`` None), of the host (``"cpu"``:
    NumPy's, mixrt's and the ops' host stream) or of one GPU (``"gpu"``, ``device_id``:
    CuPy's generator on it; a GPU this machine lacks has nothing to reseed, as in MXNet).
    ``value`` is a non-negative int below 2**64."""
    global _generator
    if device_type in (None, "cpu"):
        np.random.seed(value % (2 ** 32))
        _generator = np.random.default_rng(value)
        ops_random.reseed(value)
    if device_type in (None, "gpu"):
        count = gpu_count()  # imports CuPy where it is installed, so it can be seeded now
        cupy = sys.modules.get("cupy")
        indices = range(count) if device_type is None else \
            [device_id] if device_id < count else []
        for index in indices if cupy is not None else ():
            # CuPy keeps a generator per device and its seed reseeds the current one's
            with cupy.cuda.Device(index):
                cupy.random.seed(value % (2 ** 32))  # as NumPy's legacy seed takes it


def generator() -> np.random.Generator:
    """mixrt's generator (reseeded by ``mixrt.random.seed``)."""
    return _generator


def spawn() -> np.random.Generator:
    """An independent generator derived from mixrt's (one per data iterator, say), so that
    streams do not shift each other when one of them draws more."""
    return np.random.default_rng(_generator.integers(0, 2 ** 63))
