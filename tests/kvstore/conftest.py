"""The KVStore tests run the NumPy kernels (``MIXRT_JIT=0``, a user's setting), in this process
and in every process a test starts, which inherits the environment: they test the parameter
server, its launchers and its jobs, and with the compiled tier each job's processes compiled
their model's kernels before their first step, at once and each for itself (a 20-step
dist_sync job of the digits CNN took 79 s on a 2-core machine, 8 without). The compiled
kernels have their own tests, and tests/test_main_job.py runs the main job on them."""

import pytest


@pytest.fixture(autouse=True)
def numpy_kernels(monkeypatch):
    monkeypatch.setenv("MIXRT_JIT", "0")
