"""The native worker pool: worker threads that take a compiled kernel's parts without the
GIL, through a control block of int64 words. Here: the block's layout (each job's argument slots
included), the callers' side (take the pool, publish a job, claim parts, finish), the futex the
workers sleep on, the threads themselves, and jobs that run any kernel's parts through a function
pointer. The workers' loop and its dispatch to the drivers (of ``ops/panels/_jit_dense.py``,
``ops/panels/_jit_conv_direct.py``, ``ops/panels/_jit_attention.py``) are
``ops/panels/_jit_native_worker.py``. Compiled, because the hand-off is what costs through Python
threads (below).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time

import numpy as np
from llvmlite import binding, ir
from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from mixrt.ops.panels._jit_atomics import address, compare_swap, fetch_add, load, pause, store
from mixrt.ops.compiled.parallel import intra_op_threads

_jit = njit(nogil=True, cache=True, boundscheck=False)
binding.initialize_native_asmparser()  # for the futex's inline ``syscall`` (numba leaves it out)


# -- native worker threads ---------------------------------------------------------------------
#
# Worker threads that take a compiled kernel's parts without the GIL.
#
# ``ops/compiled/parallel.py`` hands a part to a Python thread: the worker wakes from its queue,
# then waits for the GIL, which the caller holds until its own part enters compiled code. Each of
# those is a sleep: a job of two 236 us parts of a 1x1 convolution ran 280 us, the worker starting
# 15 us after the caller and the caller seeing the end 13 us after the worker (benchmarks/NOTES.md
# §19). Here the hand-off never leaves native code: a kernel's driver (compiled, called once from
# Python) publishes its arguments in a shared control block, takes parts itself, and waits for the
# worker's by spinning; the worker is a thread started with ``pthread_create`` on a numba ``cfunc``
# that spins on the same block, so two 7 us parts take 7.4 us instead of 21-31.
#
# A worker spins for SPIN_SECONDS after its last job or the end of the last run (a worker
# spinning without end took a core from OpenBLAS and the Python threads between jobs,
# ResNet-50 22 -> 31-39 ms), then sleeps on a futex until a caller wakes it. 1 ms since
# 2026-12-01 (50 us before): a service's own work between two requests (its pre- and
# post-processing, a few hundred microseconds) outlasted 50 us, and each request then found
# the worker asleep, whose wake cost ~35 us on the 2-core Xeon, more than a small model's
# split gains, so the plan ran alone: a 4-layer MLP at 8 rows with ~0.3 ms of NumPy and
# Python between requests 75-79 -> 58-65 us (onnxruntime, whose threads spin too, 50-55);
# requests 10 ms apart, the same (the spin is over by then);
# ``conv_direct_cpu.conv`` wakes it before its setup, which covers the ~10-15 us a sleeping
# thread takes to run again. While a session's run is in progress (``RUNS``,
# :func:`run_begins`) it spins RUN_SPIN_SECONDS: a transformer's attention runs ~50-100 us of
# small steps between two split products, and a worker asleep by then left the next product's
# parts to the caller (a 64-token 256 x 256 layer 25 -> 48 us); in one A/B set, TorchScript
# BERT 1.57 -> 1.48x onnxruntime, T5 1.43 -> 1.36, EfficientNet-B0 2.22 -> 2.15, the KV-cache
# Llama 2.21 -> 2.09, ResNet-18 and Swin-T unchanged. It takes a core a thread of OpenBLAS
# may want: the 4-bit Llama, while its products went through NumPy's matmul, ran 20% slower.
# Waiting with sched_yield instead kept that but cost the KV-cache GPT-2 10%.
# The spins are counted in pauses, as many as the pool measured to fill those times when it
# started (``SPINS``): a pause took ~22 ns on an EPYC and 8.4 ns on a Xeon, where counts
# fixed on the first left ~17 us and ~170 us. Waking a sleeper costs more than its own
# 10-15 us: in a virtual machine the futex call that wakes it held the caller 12-16 us
# (the kernel's interrupt to an idle virtual CPU), at the start of every run that found the
# worker asleep (2026-11-25); a plan whose runs gain less than that from their split runs
# alone instead (``ALONE``: the workers stay asleep, ``ops/compiled/worker_wakes.py``).
# A caller never waits for a worker to arrive: parts are claimed one at a time from a
# counter, so a sleeping or busy worker only means the caller takes more of them; it waits
# only for parts a worker has already claimed.
#
# The control block (int64), one 64-byte line per word the threads write:
#
# * ``STATE``: the job's sequence number << 16, plus the workers inside it, plus ``CLOSED``
#   once the caller has taken the last part (no worker may join after that);
# * ``NEXT``: the next part to claim; ``BUSY``: a caller owns the pool (another caller runs
#   all of its parts itself), ``OWNER`` (in BUSY's line) the thread that took it;
#   ``SLEEPERS``: workers asleep on the futex word ``WAKE`` (the
#   low 32 bits of its word); ``JOINED``: jobs a worker took part in (for the tests);
#   ``RUNS``: sessions' runs in progress that use the pool; ``ALONE`` (in RUNS's line):
#   runs in progress that found the workers asleep and leave them so (below);
# * ``SPINS``: the pauses a worker spins idle, and while a run is in progress (set when the
#   pool starts; the workers read them as they spin);
# * ``ARGS`` on: the job's arguments, written by the driver before it publishes the job.
#
# A pool is made per process on first use and again in a forked child (whose threads did not
# survive the fork). Its block and threads live until the process ends.

LINE = 8  # int64 words per 64-byte line
STATE, NEXT, BUSY, SLEEPERS, WAKE, JOINED, RUNS = (LINE * i for i in range(7))
ALONE = RUNS + 1  # runs in progress that leave the sleeping workers asleep (callers write it)
OWNER = BUSY + 1  # the thread (its kernel id) whose job holds the pool (written by that caller)
SPINS = 7 * LINE  # and SPINS + 1
TABLE = SPINS + 2  # the job table's address (below); written once, as SPINS is
ARGS = 8 * LINE
BLOCK_WORDS = ARGS + 128
CLOSED = 1 << 15
COUNT_MASK = CLOSED - 1
SPIN_SECONDS = 1e-3  # a worker's spin before it sleeps (after a job or a run: see above)
# the same while a run is in progress: below SPIN_SECONDS since 2026-12-01, so it extends
# nothing at these values (the worker spins while either count runs)
RUN_SPIN_SECONDS = 500e-6
FUTEX_SYSCALL, FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 202, 128, 129
GETCPU_SYSCALL = 309
GETTID_SYSCALL = 186
# what :func:`run_starts` did: the run uses workers it found awake, woke them, left them
# asleep (its caller takes every part), or nothing yet: its caller is on another CPU than
# the workers were kept off (the caller places them, then starts again)
FOUND_AWAKE, WOKEN, LEFT_ASLEEP, CALLER_MOVED = 0, 1, 2, 3
NO_CPU_CHECK = -1  # run_starts' ``placed_off``: no placement to keep (none, or turned off)


# -- atomics: ops/panels/_jit_atomics.py ---------------------------------------------------------

@intrinsic
def pointer_like(typingctx, value, like):
    """The int64 ``value`` as a pointer to ``like``'s type (a scalar's, an array's
    elements')."""
    element = like.dtype if isinstance(like, types.Array) else like

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_data_type(element).as_pointer())
    return types.CPointer(element)(types.int64, like), codegen


@_jit
def put(block, slot, array):
    """``array`` (contiguous, up to 3 dimensions) into slots slot..slot + 3."""
    block[slot] = address(array)
    for axis in range(array.ndim):
        block[slot + 1 + axis] = array.shape[axis]


@_jit
def get1(block, slot, like):
    return carray(pointer_like(block[slot], like), (block[slot + 1],))


@_jit
def get2(block, slot, like):
    return carray(pointer_like(block[slot], like), (block[slot + 1], block[slot + 2]))


@_jit
def get3(block, slot, like):
    return carray(pointer_like(block[slot], like),
                  (block[slot + 1], block[slot + 2], block[slot + 3]))


@intrinsic
def _as_block(typingctx, raw):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(types.voidptr), codegen


@intrinsic
def _futex(typingctx, word, operation, value):
    """The futex system call on ``word`` (an int32 array's first element), as an inline
    ``syscall`` (Linux x86-64): through ctypes numba could not cache the callers."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        i64 = ir.IntType(64)
        call = ir.InlineAsm(ir.FunctionType(i64, [i64] * 7), "syscall",
                            "={rax},{rax},{rdi},{rsi},{rdx},{r10},{r8},{r9},~{rcx},~{r11},"
                            "~{memory}", side_effect=True)
        zero = ir.Constant(i64, 0)
        return builder.call(call, [ir.Constant(i64, FUTEX_SYSCALL),
                                   builder.ptrtoint(data, i64), args[1],
                                   builder.sext(args[2], i64), zero, zero, zero])
    return types.int64(word, types.int64, types.int32), codegen


@intrinsic
def _thread_id(typingctx):
    """The calling thread's id as the kernel numbers it (gettid, inline as the futex's; what
    ``threading.get_native_id`` says in Python)."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        call = ir.InlineAsm(ir.FunctionType(i64, [i64]), "syscall",
                            "={rax},{rax},~{rcx},~{r11},~{memory}", side_effect=True)
        return builder.call(call, [ir.Constant(i64, GETTID_SYSCALL)])
    return types.int64(), codegen


@intrinsic
def _current_cpu(typingctx):
    """The CPU the calling thread is on (the getcpu system call, inline as the futex's), or
    -1 where the call fails."""
    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        slot = cgutils.alloca_once_value(builder, ir.Constant(i32, -1))
        call = ir.InlineAsm(ir.FunctionType(i64, [i64] * 4), "syscall",
                            "={rax},{rax},{rdi},{rsi},{rdx},~{rcx},~{r11},~{memory}",
                            side_effect=True)
        zero = ir.Constant(i64, 0)
        result = builder.call(call, [ir.Constant(i64, GETCPU_SYSCALL),
                                     builder.ptrtoint(slot, i64), zero, zero])
        cpu = builder.sext(builder.load(slot), i64)
        return builder.select(builder.icmp_signed("<", result, zero), ir.Constant(i64, -1), cpu)
    return types.int64(), codegen


# -- the caller's side, called from a kernel's compiled driver ---------------------------------

@_jit
def begin(block) -> int:
    """Takes the pool for one job: its sequence number, or -1 when another caller has it
    (then the driver runs every part itself)."""
    if not compare_swap(block, BUSY, 0, 1):
        return -1
    block[OWNER] = _thread_id()
    block[NEXT] = 0
    return (load(block, STATE) >> 16) + 1


@_jit
def wake(block):
    """Wakes the sleeping workers, unless a run in progress leaves them asleep (``ALONE``:
    its kernels' parts are all its caller's). A driver calls it before its own setup (its
    phase planes), which covers the ~10-15 us a sleeping thread takes to run again."""
    if load(block, ALONE) == 0:
        _wake_sleepers(block)


@_jit
def _wake_sleepers(block):
    if fetch_add(block, SLEEPERS, 0) > 0:
        word = block[WAKE:WAKE + 1].view(np.int32)
        fetch_add(word, 0, np.int32(1))
        _futex(word, FUTEX_WAKE_PRIVATE, np.int32(1 << 30))


@_jit
def run_begins(block):
    """A session's run that uses the pool starts: the workers spin longer until it ends
    (:func:`run_ends`), and any asleep wake now (they take 10-15 us to run again)."""
    fetch_add(block, RUNS, 1)
    _wake_sleepers(block)


@_jit
def run_ends(block):
    fetch_add(block, RUNS, -1)


@_jit
def run_starts(block, workers, wake_if_asleep, placed_off):
    """A planned run's start as one call (a service's request 10 ms after the last paid
    ~100 us for the same steps as Python calls, each cold: the caller's CPU through ctypes,
    the pool's lookup, the sleepers' count, the begin): CALLER_MOVED where the caller is
    on another CPU than ``placed_off`` (the one the workers were last kept off, or -2 for
    none yet; NO_CPU_CHECK: not asked), and nothing is started; else :func:`run_begins`
    where a worker is awake (FOUND_AWAKE) or ``wake_if_asleep`` (WOKEN), and
    :func:`alone_begins` otherwise (LEFT_ASLEEP)."""
    if placed_off != NO_CPU_CHECK:
        cpu = _current_cpu()
        if cpu >= 0 and cpu != placed_off:
            return CALLER_MOVED
    if fetch_add(block, SLEEPERS, 0) < workers:
        run_begins(block)
        return FOUND_AWAKE
    if wake_if_asleep:
        run_begins(block)
        return WOKEN
    alone_begins(block)
    return LEFT_ASLEEP


@_jit
def alone_begins(block):
    """A session's run that found the workers asleep starts without waking them: its
    kernels publish their jobs as ever, and take every part themselves
    (``ops/compiled/worker_wakes.py`` says when a run does this)."""
    fetch_add(block, ALONE, 1)


@_jit
def alone_ends(block):
    fetch_add(block, ALONE, -1)


@_jit
def publish(block, sequence):
    """Opens job ``sequence`` (its arguments are in ``block[ARGS:]``) and wakes workers still
    asleep."""
    store(block, STATE, sequence << 16)
    wake(block)


@_jit
def claim(block, parts) -> int:
    """The next unclaimed part of the job, or -1 when all are taken."""
    part = fetch_add(block, NEXT, 1)
    return part if part < parts else -1


@_jit
def finish(block):
    """Closes the job (no worker joins after this) and waits for the workers inside it to
    leave; then the pool is free."""
    while True:
        state = load(block, STATE)
        if compare_swap(block, STATE, state, state | CLOSED):
            break
    while load(block, STATE) & COUNT_MASK:
        pause()
    store(block, BUSY, 0)


@_jit
def release_abandoned(block, thread) -> bool:
    """Closes a job that ``thread`` began and left (its driver raised between :func:`begin`
    and :func:`finish`; compiled code has no ``finally``) and frees the pool: whether there
    was one. Another thread's job in progress is left alone. Without this, a pool left taken
    made every later split kernel of the process run on its caller alone."""
    if load(block, BUSY) == 0 or block[OWNER] != thread:
        return False
    finish(block)
    return True


WORKER_SIGNATURE = types.voidptr(types.voidptr)


_libc = ctypes.CDLL(None)


class Pool:
    """A control block and its worker threads (``intra_op_threads() - 1`` of them)."""

    def __init__(self, worker, workers: int):
        self.block = np.zeros(BLOCK_WORDS, np.int64)
        per_second = pauses_per_second()
        self.block[SPINS] = max(1, round(SPIN_SECONDS * per_second))
        self.block[SPINS + 1] = max(1, round(RUN_SPIN_SECONDS * per_second))
        self.block[TABLE] = JOB_TABLE.ctypes.data
        self.workers = 0
        for _ in range(workers):
            thread = ctypes.c_ulong()
            if _libc.pthread_create(ctypes.byref(thread), None, ctypes.c_void_p(worker.address),
                                    ctypes.c_void_p(self.block.ctypes.data)) != 0:
                break  # fewer threads than asked: the callers take the parts left
            _libc.pthread_detach(thread)
            self.workers += 1
        # a run's begin and end, once now: their compiled code loads with the pool (~7 ms
        # each from the cache) rather than at the first run that wakes the workers, which
        # was a service's first request of a size whose plan splits (2026-11-28); and the
        # driver of every CALL_JOB, on no parts (a depthwise row form's first split met it
        # in a run that may not compile)
        run_begins(self.block)
        run_ends(self.block)
        alone_begins(self.block)
        alone_ends(self.block)
        run_starts(self.block, self.workers, True, NO_CPU_CHECK)  # a planned run's start
        run_ends(self.block)
        native_for(self.block, 0, np.zeros(1, np.uint64), 0)

    def wake(self):
        wake(self.block)

    def asleep(self) -> bool:
        """Is every worker asleep (so that a run that wants them pays their wake)?"""
        return self.block[SLEEPERS] >= self.workers

    def published(self) -> int:
        """The sequence number of the last job handed to the workers: a run that leaves it
        as it found it handed them none."""
        return int(self.block[STATE]) >> 16

    def run_begins(self):
        run_begins(self.block)

    def run_starts(self, wake_if_asleep: bool, placed_off: int = NO_CPU_CHECK) -> int:
        """:func:`run_starts` on this pool: what it did (FOUND_AWAKE, WOKEN, LEFT_ASLEEP,
        CALLER_MOVED)."""
        return run_starts(self.block, self.workers, wake_if_asleep, placed_off)

    def run_ends(self):
        run_ends(self.block)

    def alone_begins(self):
        alone_begins(self.block)

    def alone_ends(self):
        alone_ends(self.block)

    def release_abandoned(self) -> bool:
        """:func:`release_abandoned` for the calling thread (after a kernel of it raised)."""
        return release_abandoned(self.block, threading.get_native_id())


@_jit
def _pauses(count):
    for _ in range(count):
        pause()


def pauses_per_second() -> float:
    """How many pauses this CPU runs in a second, from the fastest of three rounds of 4,096
    (35-90 us; a preemption only slows a round)."""
    count = 1 << 12
    _pauses(1)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        _pauses(count)
        best = min(best, time.perf_counter() - start)
    return count / max(best, 1e-9)


_pools: dict = {}
_lock = threading.Lock()


def pool(name: str, worker) -> Pool | None:
    """This process's pool ``name``, its threads running the ``cfunc`` ``worker`` (which
    calls ``_jit_native_worker.serve``), or None when one thread is all this process may use
    or no worker started."""
    workers = intra_op_threads() - 1
    if workers < 1:
        return None
    key = (name, os.getpid(), workers)
    found = _pools.get(key)
    if found is None:
        with _lock:
            found = _pools.get(key)
            if found is None:
                found = _pools[key] = Pool(worker, workers)  # kept for the process's life
    return found if found.workers else None


# -- each job's argument slots -------------------------------------------------------------
#
# Laid out in one place, so that the asserts below check them against each other: the words
# every job shares (ITEMSIZE, PARTS, JOB) stay clear of the others, and all fit the block.

# the convolution's (ops/panels/_jit_conv_direct.py, :func:`native_conv`), from ARGS on: arrays
# take four (address, shape), then scalars
(X, PLANES, WORKER_PLANES, ROWS_AT, PLACES, BOUNDS, PANELS, WEIGHTS, Y, BIAS, RESIDUAL,
 WORKER_SPILL, WORKER_EDGE, NO_BIAS, LIMITS) = (ARGS + 4 * i for i in range(15))
SCALARS = ARGS + 60
(ITEMSIZE, TAPS, BY_ROWS, STRIPS, IN_PLACE, PARTS, CHUNK, ROW_BLOCK, HAS_RESIDUAL, SHAPE0,
 SHAPE1, SHAPE2, SHAPE3, PH, PW, SY, SX, TOP, LEFT, HALO, OH, OW, COLUMN_BLOCK) = \
    range(SCALARS, SCALARS + 23)
# a kit's own slots (:func:`native_conv`), past those it copies into the block: the calling
# thread's spill and edge scratch
SPILL, EDGE = COLUMN_BLOCK + 1, COLUMN_BLOCK + 5
# the block's own (no kit has it): a job of whole images, or 0 (parts of one image), and
# the runs of consecutive images it is cut into (its parts)
IMAGES, IMAGE_RUNS = EDGE + 5, EDGE + 6
assert IMAGE_RUNS < BLOCK_WORDS - 1  # the block's last word names the job


# -- dense products and attention, split between threads in native code ----------------------
#
# ``ops/nn/matmul_cpu.py``'s panel products and ``ops/attention/fused_attention.py``'s heads go
# through the same pool: the driver publishes its arrays in the block (the slots from ARGS on, as
# the convolution's do) and the job's kind in JOB, and both threads claim parts. Through
# ``parallel_for`` the hand-off cost 55-70 us a call (BERT's 128 x 768 @ 768 x 768: 0.39 ms against
# 0.32 for one thread's half; numba's prange, 0.33).

JOB = BLOCK_WORDS - 1
CONV_JOB, PRODUCT_JOB, ATTENTION_JOB, CALL_JOB = 0, 1, 2, 3
# product slots (arrays)
(PRODUCT_A, PRODUCT_PANELS, PRODUCT_C, PRODUCT_BOUNDS, PRODUCT_SPILL, PRODUCT_BIAS,
 PRODUCT_LIMITS, PRODUCT_STRIPS) = (ARGS + 4 * i for i in range(8))
# product scalars: the parts that pack A's strips for every part first, and how many of them
# are done (counted up as each ends; the product parts wait for all)
PRODUCT_PACKS, PRODUCT_PACKED = PARTS + 1, PARTS + 2
# attention slots: Q, K, V and the output flat with their dims as scalars, the mask's span
(ATT_Q, ATT_K, ATT_V, ATT_OUT, ATT_MASK, ATT_MASK_STRIDES, ATT_BOUNDS, ATT_KEYS, ATT_VALUES,
 ATT_SCORES, ATT_SPILL, ATT_SCALE) = (ARGS + 4 * i for i in range(12))
(ATT_BATCH, ATT_QUERIES, ATT_KEY_COUNT, ATT_HEADS, ATT_SIZE, ATT_VALUE_SIZE,
 ATT_HAS_MASK) = range(PARTS + 1, PARTS + 8)
assert ATT_SCALE + 3 < ITEMSIZE and ATT_HAS_MASK < JOB and PRODUCT_STRIPS + 3 < ITEMSIZE


# -- the drivers' own jobs, through the job table -------------------------------------------
#
# The worker sides of the panel products, the direct convolutions and the attention heads are
# ``cfunc`` entries of JOB_SIGNATURE, ``entry(block, 0)``, that each family's file registers
# when it is imported (:func:`register_job`); the worker calls the one for the block's JOB and
# dtype through this table, whose address every pool's block holds. The worker's compiled code
# holds none of them: compiled with all three inside, as it was, the worker took ~110 s on an
# AMD EPYC Zen 3 (2026-11-25) before any job could run, also for a model of pools and
# layer norms, which only hand their parts over as CALL_JOB.
#
# An entry is compiled, and its address put in the table, where a driver of its dtype is
# first set up (:func:`job_ready`, from the family's Python: ``matmul_cpu``,
# ``conv_direct_cpu``, ``attention_cpu``), not as its file is imported: registered at
# import, both dtypes' entries were compiled there, and with them each family's whole
# float64 side (the tile, the products, the direct convolutions), which a float32 model
# never runs: the three families with their float32 entries, from empty caches, 61.5 s
# that way, 32.0 s this way (a 2-core Xeon, 2026-11-30). A job whose slot is still empty is
# left by the worker to its caller, which takes every part itself, as when no worker comes.

JOB_SIGNATURE = types.void(types.CPointer(types.int64), types.int64)
JOB_TABLE = np.zeros(2 * CALL_JOB, np.int64)  # [2 * job + (dtype is float64)]
_JOB_ENTRIES: dict = {}  # job -> (float32 entry, float64 entry)
_jobs_lock = threading.Lock()


def register_job(job: int, float32_entry, float64_entry) -> None:
    """The worker sides of a family's jobs (``cfunc`` entries of JOB_SIGNATURE, declared
    with ``first_use_cfunc`` and kept alive by their module), compiled by :func:`job_ready`."""
    _JOB_ENTRIES[job] = (float32_entry, float64_entry)


def job_ready(job: int, itemsize: int) -> None:
    """Put the worker side of ``job`` for floats of ``itemsize`` bytes in the job table,
    compiling (or loading) it the first time; a driver's set-up calls it before the driver
    can publish such a job. Under ``jit_tier.loading_only`` an entry in no cache raises
    ``CompileForbidden`` as any kernel does (the step runs its NumPy path)."""
    slot = 2 * job + (itemsize == 8)
    if JOB_TABLE[slot]:
        return
    entries = _JOB_ENTRIES.get(job)
    if entries is None:
        raise RuntimeError(f"job {job} has no entries: its family's file is not imported yet "
                           "(_jit_panels.job_ready imports it)")
    with _jobs_lock:
        JOB_TABLE[slot] = entries[itemsize == 8].address


# -- any kernel's parts, through a function pointer ----------------------------------------
#
# A kernel in another file hands its parts to the pool as a ``cfunc`` of PART_SIGNATURE,
# ``part(args, index)``: ``args`` points at the caller's array of addresses (its arrays'
# data, and one int64 array of its sizes and scalars), which the cfunc reads back with
# ``carray(args[i], shape, dtype)``. The worker calls it without knowing what it computes, so
# nothing of the kernel is compiled into the worker's cached code (numba's cache keeps, in a
# cached caller, the code of what it called), and a kernel whose file changes is compiled
# again on its own.

PART_SIGNATURE = types.void(types.CPointer(types.voidptr), types.int64)
CALL_FN, CALL_ARGS = ARGS, ARGS + 1


@intrinsic
def _call_part(typingctx, fn, args, part):
    """Calls the PART_SIGNATURE function at address ``fn`` on (``args``, ``part``)."""
    def codegen(context, builder, signature, values):
        i64 = ir.IntType(64)
        arguments = ir.IntType(8).as_pointer().as_pointer()
        function = ir.FunctionType(ir.VoidType(), [arguments, i64])
        target = builder.inttoptr(values[0], function.as_pointer())
        builder.call(target, [builder.inttoptr(values[1], arguments), values[2]])
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@_jit
def native_for(block, fn, args, parts):
    """``fn(args, p)`` for p < ``parts`` (``fn`` a PART_SIGNATURE address, ``args`` the
    uint64 array of addresses it reads), taken by this thread and the pool's worker (with
    another caller using the pool, all here)."""
    where = address(args)
    sequence = begin(block) if parts > 1 else -1
    if sequence < 0:
        for part in range(parts):
            _call_part(fn, where, part)
        return
    block[JOB], block[CALL_FN], block[CALL_ARGS], block[PARTS] = CALL_JOB, fn, where, parts
    block[ITEMSIZE] = 0
    publish(block, sequence)
    part = claim(block, parts)
    while part >= 0:
        _call_part(fn, where, part)
        part = claim(block, parts)
    finish(block)


@_jit
def worker_job(block):
    """The worker's side of the job in the block: a CALL_JOB's parts, or the registered
    entry of a driver's job (in the job's dtype)."""
    if block[JOB] == CALL_JOB:
        _worker_calls(block)
        return
    table = carray(pointer_like(block[TABLE], block), (2 * CALL_JOB,))
    entry = table[2 * block[JOB] + (1 if block[ITEMSIZE] == 8 else 0)]
    if entry != 0:  # (else not set up by job_ready: the caller takes every part)
        _call_part(entry, address(block), 0)


@_jit
def _worker_calls(block):
    fn, where, parts = block[CALL_FN], block[CALL_ARGS], block[PARTS]
    part = claim(block, parts)
    while part >= 0:
        _call_part(fn, where, part)
        part = claim(block, parts)
