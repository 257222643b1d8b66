"""Each gradient test draws its inputs from a generator seeded by its own name.

The modules here draw from one module-level ``rng``; shared across a module, a test's
inputs depended on which tests pytest-xdist had run before it in the same worker. Most
gradients do not care, but a kink (a clip, a ReLU, a max) crossed by a finite difference's
step reads as a huge derivative, and whether a draw lands within a step of a kink then
varied from run to run. Reseeded per test, every test sees the same inputs in any order
and on any worker, so a test passes or fails the same way everywhere."""
from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _inputs_drawn_per_test(request):
    module = request.module
    if isinstance(getattr(module, "rng", None), np.random.Generator):
        module.rng = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
    yield
