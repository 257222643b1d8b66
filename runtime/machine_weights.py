"""The weights a kernel's cost model takes from this machine, measured once per machine
while ``Session.wait_compiled`` waits anyway.

The depthwise convolution picks among four forms by a model of each form's work
(``ops/conv/depthwise_costs.py``), whose weights are what each counted operation costs.
Shipped weights were fitted on one host; a machine measures its own (``ops/conv/
depthwise_calibration.py``, ~15-60 s the first time, its forms compiled into the cache)
in a process of its own, one thread, after the compile child is done, so the times are
the forms' alone. The weights are kept in mixrt's cache (``depthwise_table.py``): later
processes on the machine read them at their first pick. Picks made before them are let go
(``jit_cpu.forget_routes``), so the sizes a session ran before it waited are routed again
with them. ``MIXRT_CALIBRATE=0`` keeps the shipped weights (the test suite's default: a
test that calibrates asks for it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from mixrt.base.settings import setting
from mixrt.ops.compiled import jit_cpu
from mixrt.ops.conv import depthwise_costs, depthwise_table

# the calibration's own process: one thread, its progress and messages not the caller's
_COMMAND = "from mixrt.ops.conv.depthwise_calibration import main; main()"
CALIBRATION_ARGS: tuple = ()  # the calibration's options (a test asks for fewer geometries)
_tried: set = set()  # machine keys this process calibrated (or failed to): once each
RESERVE_S = 1.0  # of a wait's timeout left over for what follows the calibration
SHIPPED = depthwise_table.SHIPPED


def calibrate_for(graph, deadline: float | None) -> bool:
    """Measure this machine's depthwise weights where ``graph`` has a depthwise
    convolution, none are kept yet, the compiled tier is on and ``MIXRT_CALIBRATE`` is not
    0; within ``deadline`` (``time.monotonic()``), if any. True where the model takes new
    weights now (the routes picked before are let go)."""
    if setting("MIXRT_CALIBRATE", "1") == "0" or not jit_cpu.enabled() \
            or not has_depthwise(graph) or depthwise_costs.weights() is not SHIPPED:
        return False
    key = depthwise_costs.machine_key()
    if key in _tried:
        return False
    _tried.add(key)
    timeout = None if deadline is None else deadline - time.monotonic() - RESERVE_S
    if timeout is not None and timeout <= 0:
        _tried.discard(key)  # another wait, with more time, may
        return False
    failed = _measured(timeout)
    if failed is not None:
        if failed:  # ended badly, not cut short: the shipped weights kept, not asked again
            depthwise_table.write(key, SHIPPED, {"kept": "shipped", "failed": failed})
        return False
    if not depthwise_costs.refresh():
        return False
    jit_cpu.forget_routes()
    return True


def has_depthwise(graph) -> bool:
    """Does ``graph`` have a grouped convolution (the depthwise forms' nodes)?"""
    for node in graph.nodes:
        if node.op_type in ("Conv", "FusedConv") and int(node.attributes.get("group", 1)) > 1:
            return True
    return False


def _measured(timeout: float | None) -> str | None:
    """The calibration run in its own process: None where it ended well in time, "" where
    it did not run or was cut short (a later wait may), else the end of what it wrote on
    failing (kept beside the shipped weights, so that no later process spends its wait on
    a calibration that fails on this machine)."""
    environment = dict(os.environ, MIXRT_NATIVE_POOL="0", MIXRT_INTRA_OP_THREADS="1",
                       OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-c", _COMMAND, *CALIBRATION_ARGS]
    try:
        done = subprocess.run(command, env=environment, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if done.returncode == 0:
        return None
    said = done.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
    return f"exit status {done.returncode}: " + " | ".join(said)
