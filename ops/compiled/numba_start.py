"""What numba does at a process's first kernel that a session need not wait for.

numba's ``Cache.load_overload`` makes the CPU target load every implementation it has
(``BaseContext.refresh``: ``CPUContext.load_additional_registries`` imports ~60 modules and
declares their functions) before it reads a cached entry. On a prebuilt model's first run
that was ~0.1 s of imports plus ~0.15 s of SciPy: ``numba.np.arraymath`` probes at import
for SciPy's BLAS by importing ``scipy.linalg.cython_blas``, which imports all of
``scipy.linalg``. ResNet-50's whole first run on prebuilt kernels is ~0.45 s after this.

The registries serve typing and lowering, not a cached kernel's machine code, and numba's
compiler loads them itself before it compiles anything (``CompilerBase.compile_extra``
refreshes both contexts). :func:`load_before_registries` reads the entry without them.
"""

from __future__ import annotations


def load_before_registries(cache, sig, target_context):
    """numba's ``Cache.load_overload`` without its registry load. What a loaded kernel links
    against is set up here instead: numba's runtime (NRT) and the hash-secret symbols that
    ``numba.cpython.hashing`` adds at import. Every other symbol numba's code calls (its
    C helpers, the Python C API, the parallel layer through the entry's own ``reload_init``)
    was added when the CPU target was made or comes with the entry."""
    from numba.core.runtime import rtsys  # noqa: PLC0415  (numba loads on first use)
    import numba.cpython.hashing  # noqa: F401, PLC0415  (its import adds the symbols)

    rtsys.initialize(target_context)
    with cache._guard_against_spurious_io_errors():
        return cache._load_overload(sig, target_context)
