"""How a product against packed panels (``matmul_cpu.py``) is cut into the parts the native
pool's threads claim (``ops/panels/_jit_dense.py``, ``native_product``).

The parts are claimed in order, each by whichever thread is free first, so a run ends when
the thread that claimed the most work ends. Parts of unequal size leave one thread working
while the other waits: BERT's hidden 384 is 12 panels, which eight runs of panels cut as
1, 2, 1, 2, ... panels, and claimed in order one thread got 7 of the 12. On a 2-core Xeon
(2026-12-01), one process, the kernel alone, 137 rows, us a call, eight such parts against
two even ones: 384 -> 384 178 / 153, 1536 -> 384 709 / 595 (a new weight each call, as in a
model's run), where onnxruntime's whole run took 159 and 549. So a product's parts are laid
out as runs of panels times bands of rows, each cut as evenly as whole panels and strips
allow, and of those layouts the one whose claims end soonest is taken (:func:`_even_layout`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from mixrt.ops.compiled import jit_tier
from mixrt.ops.compiled.parallel import intra_op_threads

# parts of a product per thread through the native pool, at most: claimed one at a time, so a
# worker that wakes late takes fewer (where as many even parts as that exist)
NATIVE_PARTS_PER_THREAD = 4
# strips of rows a thread takes through all its panels before the next (``_jit_dense
# .ROW_BLOCK`` / ``DENSE_ROWS``): a part's panels are read once per such block of its rows
ROW_BLOCK_STRIPS = 10


def native_parts(count: int, rows: int, strip: int, width: int = 0,
                 operand_bytes: int = 0) -> np.ndarray:
    """The parts of a product of ``rows`` rows against ``count`` panels that the native pool
    hands out, flat (first panel, end panel, first row, end row) each: runs of panels, over
    bands of whole strips of ``strip`` rows where there are too few panels to share evenly
    (a 1x1 convolution to 96 channels has 3: as 3 parts one thread got 2 of them, 576 -> 96
    at 6 x 6 took 32 us split, 40 on one thread). ``width``: the panels' columns, and
    ``operand_bytes`` the panels' and A's as packed strips: where they are more than a
    core's L2 holds, the parts are weighed by what they read from outside it as well
    (:func:`_part_cost`); else, or without them, by their panel-strips alone (a 1x1
    convolution's 36 pixel rows, 576 -> 96, took 36 us as six parts, 40 as the two bands
    that read least)."""
    threads = intra_op_threads()
    if operand_bytes <= l2_bytes():
        width = 0
    return _parts_table(count, rows, strip, NATIVE_PARTS_PER_THREAD * threads, threads,
                        width)


@lru_cache(maxsize=1)
def l2_bytes() -> int:
    """The size of one core's L2 cache (Linux's sysfs), or 1 MB where it does not say."""
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return 1 << 20


@lru_cache(maxsize=1024)
def _parts_table(count: int, rows: int, strip: int, wanted: int, threads: int,
                 width: int = 0) -> np.ndarray:
    """:func:`native_parts`' table, made once per product shape and thread count and shared
    (read only: the kernels read their parts from it). A model's products share their
    rows: a 2-layer BERT's twelve at a new length built twelve tables from Python lists,
    ~7 us each, of which a few differ."""
    return np.array(even_parts(count, rows, strip, wanted, threads, width),
                    np.int64).reshape(-1)


def even_parts(count: int, rows: int, strip: int, wanted: int, threads: int,
               width: int = 0) -> list[tuple[int, int, int, int]]:
    """``count`` units of work (a product's panels, attention's (batch, head) pairs) over
    ``rows`` rows, as at most ``wanted`` parts (first unit, end unit, first row, end row),
    bands of rows in whole strips of ``strip``: the layout of :func:`_even_layout`, band
    by band."""
    strips = -(-rows // strip)
    runs, bands = _even_layout(count, strips, wanted, threads, width, strip)
    unit_edges = [count * p // runs for p in range(runs + 1)]
    row_edges = [strips * q // bands * strip for q in range(bands)] + [rows]
    return [(unit_edges[p], unit_edges[p + 1], row_edges[q], row_edges[q + 1])
            for q in range(bands) for p in range(runs)]


@lru_cache(maxsize=1024)
def _even_layout(count: int, strips: int, wanted: int, threads: int, width: int = 0,
                 strip: int = 1) -> tuple[int, int]:
    """(runs of panels, bands of strips) for ``count`` panels over ``strips`` strips of rows,
    at most ``wanted`` parts: the layout whose parts, claimed in order by ``threads`` threads
    of one speed, leave the last thread done soonest; then the one of most parts (a worker
    that starts late still takes a share). A part's cost is its panel-strips, or, given the
    panels' ``width`` and the ``strip``'s rows, its multiply-adds and what it reads into
    its core's caches (:func:`_part_cost`); without a width, of the layouts that end
    soonest, the one of fewest bands (each band reads its panels again)."""
    bound = -(-count * strips // threads)  # no layout ends before an even share
    best, best_key = (1, 1), None
    for bands in range(1, min(strips, wanted) + 1):
        band_shares = _shares(strips, bands)
        for runs in range(min(count, wanted // bands), 0, -1):  # the most parts first
            run_shares = _shares(count, runs)
            if width:
                sizes = [_part_cost(band, run, width, strip, runs > 1)
                         for band in band_shares for run in run_shares]
                key = (_claimed_in_order(sizes, threads), -len(sizes))
            else:
                sizes = [band * run for band in band_shares for run in run_shares]
                key = (_claimed_in_order(sizes, threads), bands, -len(sizes))
                if key[0] <= bound:  # even: none of more bands or fewer parts is better
                    return runs, bands
            if best_key is None or key < best_key:
                best, best_key = (runs, bands), key
    return best


# Multiply-adds one core does in the time a byte comes into its caches from L3 or memory:
# AVX-512's two FMA units take 32 float multiply-adds a cycle, while a core brings in some
# 16 bytes a cycle from outside its L2.
MULTIPLY_ADDS_PER_BYTE = 2
# how much dearer a line another core wrote is to read than one from L3: its cache gives it up
OTHER_CORE_LINES = 2


def _part_cost(band: int, run: int, width: int, strip: int, shared_rows: bool) -> int:
    """A part of ``run`` panels (``width`` columns) over ``band`` strips (``strip`` rows), in
    multiply-adds per k: its own, and what it reads from outside its core's L2 counted at
    MULTIPLY_ADDS_PER_BYTE (floats): its panels once per ROW_BLOCK_STRIPS strips of its
    band, and its band's rows once, OTHER_CORE_LINES dearer where runs of panels share the
    rows (``shared_rows``: their strips are packed once, by whichever thread packs them,
    ``_jit_dense.native_packed_product``). Two threads, 752 rows, 1536 -> 384 (twelve
    panels), ms: six runs of two panels 2.82, two runs 2.86, two bands 2.65, four 2.56
    (onnxruntime 2.22); 188 rows, 384 -> 384: six runs 0.228, four bands 0.201; while at
    19 rows a band reads the whole weight for a strip, and runs of panels cost less."""
    rows = band * strip
    panels = run * width * -(-band // ROW_BLOCK_STRIPS)
    own_rows = rows * (OTHER_CORE_LINES if shared_rows else 1)
    return rows * run * width + (panels + own_rows) * 4 * MULTIPLY_ADDS_PER_BYTE


def _shares(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` runs as even as whole units allow, in order."""
    return [total * (p + 1) // parts - total * p // parts for p in range(parts)]


def _claimed_in_order(sizes: list[int], threads: int) -> int:
    """When the last of ``threads`` threads that start together ends, each claiming the next
    part of ``sizes`` as it becomes free."""
    ends = [0] * threads
    for size in sizes:
        free = ends.index(min(ends))
        ends[free] += size
    return max(ends)


def shared_packs(bounds: np.ndarray, rows: int, strip: int) -> int:
    """How many parts pack A's whole strips once for every part (``_jit_dense
    .native_packed_product``): where parts that pack their rows (runs of more than one
    panel) share them with other parts, each would pack them again; else 0, each part
    packing its own rows, or reading them in place. Answered once per parts table (they
    are shared, :func:`_parts_table`): read from the table's NumPy rows at every call it
    was 29 us (median) of a product's Python at a transformer's new length, 10 ms after the
    last request, ~0.9 ms of a 5-layer BERT's ~27 ms first run of a shape (2026-12-03)."""
    known = _PACKS.get(id(bounds))
    if known is not None and known[0] is bounds and known[1] == rows and known[2] == strip:
        return known[3]
    packs = _shared_packs(bounds.tolist(), rows, strip)
    if len(_PACKS) >= MAX_PACKS_KEPT:
        _PACKS.clear()
    _PACKS[id(bounds)] = (bounds, rows, strip, packs)  # the table held: its id stays its own
    return packs


# id of a parts table -> (the table, rows, strip, shared_packs' answer)
_PACKS: dict = {}
MAX_PACKS_KEPT = 1024


def _shared_packs(flat: list, rows: int, strip: int) -> int:
    parts = [flat[i:i + 4] for i in range(0, len(flat), 4)]
    bands = {(r0, r1) for _, _, r0, r1 in parts}
    packing = any(p1 - p0 > 1 for p0, p1, _, _ in parts)
    whole = rows // strip
    if whole == 0 or not packing or len(bands) == len(parts):
        return 0
    return min(whole, len(parts))


# (kernels, dtype) whose packed product's entry this process loaded (load_packed_entry)
_PACKED_LOADED: set = set()


def load_packed_entry(kit) -> None:
    """The packed product's entry (``_jit_dense.native_packed_product``, which a product
    whose parts share rows calls) loaded for ``kit``'s arrays' types, from the cache only,
    once a process and dtype, as the first product against a packed weight is made (a
    session's first run, or a wait's made-up ones), not in the request whose parts first
    share rows: MobileNetV2's classifier at its first batch of 14 loaded it there, 25 ms of
    a 35 ms request (2026-12-04). ``kit``: a ``matmul_cpu._RowsKit``."""
    key = (id(kit.kernels), kit.dtype.char)
    if kit.native is None or key in _PACKED_LOADED:
        return
    _PACKED_LOADED.add(key)
    import numba  # noqa: PLC0415  (loaded with the kernels already)
    rows = np.zeros((1, kit.k), kit.dtype)
    arguments = (kit.native.block, 1, rows, kit.panels, np.zeros((1, kit.n), kit.dtype),
                 np.zeros(4, np.int64), kit.spill, kit.worker_spill, kit.bias, kit.limits,
                 np.zeros(1, kit.dtype), 1)
    try:
        with jit_tier.loading_only():  # a cache's entry, never a compile here
            kit.kernels.native_packed_product.compile(
                tuple(numba.typeof(value) for value in arguments))
    except Exception:  # noqa: BLE001  (not in the cache: a request's call compiles or loads it)
        pass
