"""The compiled-kernel machinery the families share: where compiled kernels are cached
(``jit_cache``), which tier a thread runs (``jit_tier``), the numba kernels' loader and its
wrappers (``jit_cpu``), the intra-op thread pool (``parallel``) and a node's replayed call
(``replay``).
"""
