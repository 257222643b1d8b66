"""The constants of the depthwise convolution's cost model (``depthwise_costs.py``) as this
machine measured them, kept in mixrt's cache as JSON beside the compiled kernels.

The model weighs each form's operations (a vector of taps, a cell copied, a plane's setup)
by what each costs. Fitted once on one host's kind and shipped, those weights picked badly
on the next: on a 2-core EPYC (AVX-512) the shipped weights picked forms that took 20.3 ms
over 40 random narrow geometries where the fastest form of each took 13.6, 25 of the 40
picks more than 10% off, the channels form picked at a 96 x 40 x 24 stride-2 plane where it
took 1,003 us against the row form's 264 (2026-12-04). ``depthwise_calibration.py`` times
the forms on reference geometries on this machine and fits the weights; the fit is kept
under a key made of what the times depend on (the CPU's name, its vector width, the forms'
kernel sources), so another machine, or changed kernels, measure again. Until a machine
has measured, the shipped weights stand.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
from pathlib import Path

from mixrt.ops.compiled.jit_cache import cache_root

# what the shipped weights were fitted on: one thread, float32, an AMD EPYC with AVX-512
# (2026-11-29/30); nanoseconds a plane, per tap and unit of each form's work. "fits": the
# kernel's weights fit the vector registers beside the row loop's own; "spills": they do not.
SHIPPED = {
    # (a pass of four vectors, a vector of the remainder, a scalar output, a padded cell)
    "rows": {"fits": [0.001, 0.082, 0.060, 0.387], "spills": [1.636, 0.661, 0.135, 0.387]},
    # (a tap's vector of the flat row, a padded cell copied into its phases, a plane)
    "blocks": {"fits": [0.389, 0.378, 15.1], "spills": [0.454, 0.378, 15.1]},
    "flat": [0.521, 0.314, 12.29],
    # (a tap of an output pixel, a padded cell transposed in, an output transposed out;
    # each per lane of a vector of channels)
    "channels": [0.749, 2.646, 3.351],
}

# the kernel files whose code the forms run: a change to any measures again
_KERNEL_FILES = ("jit_depthwise.py", "jit_grouped_blocks.py", "jit_depthwise_channels.py",
                 "depthwise_common.py", "_jit_depthwise_pool.py")
FORMAT = 1  # the file's layout


def machine_key(vector_bytes: int) -> str:
    """What the forms' times depend on, as a short hash: the CPU's name, its vector width,
    the kernels' sources and this file's layout."""
    here = Path(__file__).parent
    digest = hashlib.sha256()
    digest.update(f"{FORMAT} {_cpu_name()} {vector_bytes}".encode())
    for name in _KERNEL_FILES:
        path = here / name
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table_path(key: str) -> Path:
    return cache_root() / "machine" / f"depthwise_costs-{key}.json"


def read(key: str) -> dict | None:
    """The weights this machine measured (in :data:`SHIPPED`'s layout), or None where it
    has not, or where the file is not such a table (it is then measured again)."""
    try:
        text = table_path(key).read_text(encoding="utf-8")
        found = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return None
    weights = found.get("weights")
    return weights if valid(weights) else None


def write(key: str, weights: dict, about: dict) -> Path:
    """``weights`` kept for ``key`` (written whole, then renamed into place: a reader never
    sees half a file), with ``about`` (when, on how many points, how well they fit)."""
    if not valid(weights):
        raise ValueError(f"not a table of depthwise weights: {weights!r}")
    path = table_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps({"format": FORMAT, "weights": weights, **about}, indent=1),
                       encoding="utf-8")
    os.replace(partial, path)
    return path


def valid(weights) -> bool:
    """Is ``weights`` laid out as :data:`SHIPPED`, every weight a finite number >= 0?"""
    if not isinstance(weights, dict) or set(weights) != set(SHIPPED):
        return False
    for form, shipped in SHIPPED.items():
        got = weights[form]
        pairs = [(got, shipped)] if isinstance(shipped, list) else \
            [(got.get(kind) if isinstance(got, dict) else None, shipped[kind])
             for kind in shipped]
        for values, like in pairs:
            if not isinstance(values, list) or len(values) != len(like) \
                    or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0
                               for v in values):
                return False
    return True
