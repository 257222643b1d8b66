import functools
import os
import re
import sys
from pathlib import Path

import pytest

# The suite tests the kernels as they run once compiled: sessions compile on their first call
# instead of serving NumPy while a background process compiles (tests/test_kernel_tiers.py
# tests that, with MIXRT_COMPILE=background set where it needs it).
os.environ.setdefault("MIXRT_COMPILE", "foreground")

# NumPy asks the kernel for transparent huge pages on every array from 4 MB, and where the
# kernel's THP defrag setting is ``madvise`` (Ubuntu's default) a fault on such an array
# compacts memory first: on a 2-core VM whose memory the suite's processes keep fragmenting,
# the ONNX backend's real models spent 9-12 s of 23-28 in the kernel with them, 2 s without
# (2026-12-04). The tests check values, not a steady state that larger pages would speed, so
# the suite and its child processes (which inherit this) go without. Read as NumPy loads,
# which the import of mixrt below is the first to do.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

# A session's wait_compiled measures the machine's depthwise weights once per machine
# (runtime/machine_weights.py, 15-60 s): the suite's values do not depend on the forms'
# picks (every form gives the same bits), so it keeps the shipped weights;
# tests/ops/test_depthwise_calibration.py calibrates where it means to.
os.environ.setdefault("MIXRT_CALIBRATE", "0")

# mixrt before anything loads NumPy, whichever test file pytest collects first: its BLAS
# policy (runtime/blas_policy.py) then sets OpenBLAS's environment instead of restarting it
import mixrt  # noqa: E402,F401


sys.path.insert(0, str(Path(__file__).parent))  # tests import helpers.py


# -- the GPU tests ------------------------------------------------------------------------------
# Without a GPU the GPU tests skip here; tests/test_gpu_paths_on_fake_cupy.py runs them again on
# a NumPy-backed fake CuPy, taking only the tests marked ``gpu`` (the rest ran here already).
# A test that skips with one of the reasons below gets the mark from its skipif; one that skips
# from its body must carry the mark itself, or the hook below fails it, so that no GPU test
# falls out of the fake run unnoticed.
_WANTS_A_GPU = re.compile(r"needs .*(GPU|CuPy)|no CUDA GPU|could not import 'cupy'|no usable NCCL")
_CONFORMANCE = Path(__file__).parent / "conformance"  # its ``_cuda`` cases have their own run

# -- running on several cores (pytest -n auto) --------------------------------------------------
# The KVStore tests pick free ports by binding port 0 and closing it before their processes
# bind it again; two such tests on two xdist workers could be handed the same port in between.
# They form one group, which ``--dist loadgroup`` (pyproject's addopts) runs on one worker.
# That group (~10 min of a 2-core machine's ~20) and the fake-CuPy runs (two child pytests,
# ~3 and ~1.5 min) are handed out first: collected last, they would run on one worker while
# the other sat idle.
_SOCKETS = Path(__file__).parent / "kvstore"
_FIRST = (_SOCKETS, Path(__file__).parent / "test_gpu_paths_on_fake_cupy.py")


_GPU_TEST_FILES: set = set()  # the files of the GPU tests this process collected


# optionalhook: the hook is xdist's, and a run without xdist (-p no:xdist) has no such hook
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``loadgroup``'s scheduling without its quadratic bookkeeping (tests/xdist_scheduling.py);
    other ``--dist`` modes are xdist's own (None: its hook chooses)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist_scheduling import GroupScheduling  # noqa: PLC0415 (xdist is loaded here)
    return GroupScheduling(config, log)


# tryfirst: xdist's worker reads the ``xdist_group`` marks in this same hook, and a mark added
# after it ran puts nothing in a group (tests/test_xdist_groups.py)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(_WANTS_A_GPU.search(str(mark.kwargs.get("reason", "")))
               for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.gpu)
        if item.get_closest_marker("gpu") is not None:
            _GPU_TEST_FILES.add(item.path)
        if _opens_sockets(item.path):
            item.add_marker(pytest.mark.xdist_group("sockets"))
    items.sort(key=lambda item: not _runs_first(item.path))  # stable


# trylast: after xdist's own hook has told the controller what this worker collected, so the
# tests are handed out while the worker compiles its share (tests/compile_shares.py)
@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    from compile_shares import compile_share  # noqa: PLC0415
    compile_share(len(session.items))


@pytest.fixture
def collected_gpu_test_files() -> set:
    """The files holding a test marked ``gpu`` among those this run collected (the fake-CuPy
    run checks that it takes each of them)."""
    return set(_GPU_TEST_FILES)


# per file, not per test: ~23,000 tests in ~240 files, on every worker
@functools.cache
def _runs_first(path: Path) -> bool:
    return any(path == first or first in path.parents for first in _FIRST)


@functools.cache
def _opens_sockets(path: Path) -> bool:
    return _SOCKETS in path.parents


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not (report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = str(report.longrepr[2])
    if (_WANTS_A_GPU.search(reason) and item.get_closest_marker("gpu") is None
            and _CONFORMANCE not in item.path.parents and not _has_a_gpu()):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skips for want of a GPU ({reason}) but is not marked "
                           "@pytest.mark.gpu, so the fake-CuPy run would leave it out")


def _has_a_gpu() -> bool:
    from mixrt.ops.device import gpu_available  # noqa: PLC0415
    return gpu_available()
