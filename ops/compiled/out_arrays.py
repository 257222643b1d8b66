"""The two rules every CPU ``out=`` path shares (``*_cpu.py`` in the families).

A fast path writes into the output the executor hands it (a view of the memory arena), so a
planned run allocates nothing. It applies only to NumPy arrays of one native float dtype;
for anything else it calls the generic kernel and copies the result into ``out``, so every
registered behaviour (integer wrap-around, narrow floats computed in float32) stays the
generic one.
"""

from __future__ import annotations

import numpy as np

NATIVE = (np.dtype(np.float32), np.dtype(np.float64))


def native(*arrays) -> bool:
    """All present operands are NumPy arrays of one native float dtype (a loop: this runs
    for every node of a planned CPU run)."""
    dtype = None
    for a in arrays:
        if a is None:
            continue
        if not isinstance(a, np.ndarray):
            return False
        if dtype is None:
            dtype = a.dtype
            if dtype not in NATIVE:
                return False
        elif a.dtype != dtype:
            return False
    return dtype is not None


def into(out, result):
    if out is None:
        return result
    np.copyto(out, result)
    return out
