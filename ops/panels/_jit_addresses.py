"""The data addresses of a tuple of arrays, in one compiled call: a part on the native worker
pool reads its arrays through them (``ops/panels/native_parts.py``, ``ops/ml/forest.py``).

It lives at a module's top level, where the wheel build can name it and compile it ahead of
time (``ops/compiled/prebuilt.py``); as a closure it was in no prebuilt level, and every
AVX-512 machine compiled it in a child at its first run.
"""

from __future__ import annotations

from numba import literal_unroll, njit


@njit(cache=True, nogil=True)
def fill_addresses(out, arrays):
    """``out[i]`` = the data address of ``arrays[i]``."""
    i = 0
    for array in literal_unroll(arrays):
        out[i] = array.ctypes.data
        i += 1
