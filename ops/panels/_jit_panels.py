"""The packed-panel kernels as one namespace: ``ops/compiled/jit_cpu.panel_kernels()`` imports this
module (where the CPU has AVX-512) and its callers read ``kernels.<name>``. The
kernels live in modules of their own, by what they compute, each imported (and compiled) when
its first name is read (``__getattr__`` below):

* ``ops/panels/_jit_tile.py``: the tile (up to 12 rows by a panel of two 64-byte vectors), in
  LLVM IR; ``ops/panels/_jit_dense_tiles.py``: the dense products' tiles by row count;
  ``ops/panels/_jit_prefetch.py``: cache-line hints (a panel's lines ahead);
* ``ops/panels/_jit_dense.py``: products against packed panels or read in place, batched products,
  their native driver, and the tile's C entries for kernels in other files;
* ``ops/panels/_jit_conv_direct.py``: direct convolutions over stride-phase planes and their
  driver;
* ``ops/panels/_jit_conv_weight_grad.py``: a convolution's weight gradient on the tile;
* ``ops/panels/_jit_attention.py``: fused attention heads and their driver, with the vector
  softmax of ``ops/panels/_jit_vector_softmax.py`` (which Softmax's rows use too);
* ``ops/panels/_jit_native_pool.py``: the native worker pool (control block, futex, threads, each
  job's argument slots, any kernel's parts through a function pointer);
* ``ops/panels/_jit_native_worker.py``: the worker's loop (each job through a function pointer:
  ``_jit_native_pool.worker_job``).

They call each other's compiled functions, and numba's disk cache keeps, in a cached caller, the
code of what it called from another file: ``ops/compiled/jit_cache.py`` stamps their entries with
every ``ops/_jit*.py`` file, so a change to one invalidates the others. ``ROW_BLOCK`` here is the
control block's slot (``_jit_native_pool``), as callers have always read it;
``_jit_dense.ROW_BLOCK`` is the products' row block.
"""

from __future__ import annotations

import importlib

from mixrt.ops.panels import _jit_native_pool
from mixrt.ops.panels._jit_native_pool import (ARGS, ATTENTION_JOB, ATT_BATCH, ATT_BOUNDS,
                                               ATT_HAS_MASK, ATT_HEADS, ATT_K, ATT_KEYS,
                                               ATT_KEY_COUNT, ATT_MASK, ATT_MASK_STRIDES, ATT_OUT,
                                               ATT_Q, ATT_QUERIES, ATT_SCALE, ATT_SCORES, ATT_SIZE,
                                               ATT_SPILL, ATT_V, ATT_VALUES, ATT_VALUE_SIZE, BIAS,
                                               BLOCK_WORDS, BOUNDS, BUSY, BY_ROWS, CALL_ARGS,
                                               COLUMN_BLOCK,
                                               CALL_FN, CALL_JOB, CHUNK, CLOSED, CONV_JOB,
                                               COUNT_MASK, EDGE, FUTEX_SYSCALL, FUTEX_WAIT_PRIVATE,
                                               FUTEX_WAKE_PRIVATE, HALO, HAS_RESIDUAL, IN_PLACE,
                                               ITEMSIZE, JOB, JOINED, LEFT, LIMITS, LINE, NEXT,
                                               NO_BIAS, OH, OW, PANELS, PARTS, PART_SIGNATURE, PH,
                                               PLACES, PLANES, PRODUCT_A, PRODUCT_BOUNDS,
                                               PRODUCT_C, PRODUCT_JOB, PRODUCT_PANELS,
                                               PRODUCT_SPILL, PW, RESIDUAL, ROWS_AT, ROW_BLOCK,
                                               SCALARS, SHAPE0, SHAPE1, SHAPE2, SHAPE3, SLEEPERS,
                                               SPILL, SPINS, STATE, STRIPS, SX, SY, TAPS,
                                               TOP, WAKE, WEIGHTS, WORKER_EDGE, WORKER_PLANES,
                                               WORKER_SIGNATURE, WORKER_SPILL, X, Y, Pool, begin,
                                               claim, finish, get1, get2, get3, native_for,
                                               pointer_like, pool, publish, put, wake)
from mixrt.ops.panels._jit_native_worker import native_pool, serve  # noqa: F401
from mixrt.ops.panels._jit_tile import (DENSE_ROWS, K_BLOCK, PACKED_STRIDE, PANEL_VECTORS,
                                        STRIP_ROWS, VECTOR_BYTES)

# Each family is imported, and its worker side compiled (or loaded from the cache), when a
# caller first reads one of its names: a model without attention never compiles attention.
_FAMILIES = {
    "mixrt.ops.panels._jit_attention": ("attention", "native_attention", "softmax_rows"),
    "mixrt.ops.panels._jit_conv_direct": ("gated", "left_tap_conv", "native_conv",
                                          "native_conv_images", "pack_strips",
                                          "phase_planes", "pointwise_conv", "strip_rows",
                                          "tap_conv"),
    "mixrt.ops.panels._jit_conv_weight_grad": ("pack_gradient", "weight_grad"),
    "mixrt.ops.panels._jit_dense": ("TILE_SIGNATURE", "batched_product", "native_product",
                                    "native_packed_product", "panel_product",
                                    "pixel_rows_conv", "product", "swap_last_axes", "tile_d",
                                    "tile_f"),
}
_HOME = {name: module for module, names in _FAMILIES.items() for name in names}


# each job's driver, whose family's file registers the job's entries as it is imported
_DRIVERS = {PRODUCT_JOB: "native_product", CONV_JOB: "native_conv",
            ATTENTION_JOB: "native_attention"}


def job_ready(job: int, itemsize: int) -> None:
    """``_jit_native_pool.job_ready`` with the job's family imported first: a driver's
    set-up calls it before the driver can publish the job in that dtype."""
    if _DRIVERS[job] not in globals():
        __getattr__(_DRIVERS[job])
    _jit_native_pool.job_ready(job, itemsize)


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # read once through here
    return value
