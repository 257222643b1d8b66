"""Two kernel tiers for a CPU session: NumPy at once, compiled kernels once they are built.

numba compiles a kernel on its first call, and on a machine with empty caches a small CNN's
first run waited 76-100 s for it (ResNet-50 12-17 s). A CI job or a new service container
starts with empty caches every time. So a session's first run of an input signature goes:

* **Prebuilt kernels for this CPU** (a platform wheel's, ``ops/compiled/prebuilt.py``), or a
  **warm marker** (``<cache>/warm/<key>.json``, written once that model's kernels for that
  signature were compiled into the user's cache): the first run goes to the compiled tier at
  once with compiling forbidden (:meth:`SessionTiers.first_run`). When every kernel loads
  from a cache the signature stays compiled and no child starts; when one would have to
  compile, the request is answered on the NumPy tier (a stale marker is removed) and the
  signature goes on as below, the child compiling only what is missing. Until 2026-11-26 a
  warm marker's first run served NumPy and the compiler loaded the kernels after it: loading
  then cost 0.4-0.8 s (numba's registries, SciPy), ``ops/compiled/numba_start.py`` took most
  of that away, and the two runs reached full speed later than one (ResNet-50 1.09 s).
* Otherwise the run, and every run of that signature until the compiled tier is in, runs with the
  compiled tier off (``ops/compiled/jit_tier.py``: every op takes its NumPy/BLAS path, which
  ``MIXRT_JIT=0`` always takes), and the signature is handed to the background compiler,
  whose child compiles first.

The background compiler is one thread per process that works through its queue with a child
process (``python -m mixrt.runtime.compile_worker``, at a lower priority): the child loads
the same graph, runs it once on the same feeds with compiling in the foreground, which
compiles exactly the kernels (and signatures) the session needs into the disk cache, and
writes the warm marker. A child process and not a thread, because numba's compiler holds
the GIL for much of its work: a compiling thread would stall every serving thread. When the
child is done, the compiler thread makes one *loading run* of the session (through the BLAS
gate like any run, compiled tier on: the kernels come from the cache), and only then flips
the signature to the compiled tier. Runs already under way finish in the tier they started
in; a run reads its tier once, at its start. Kernels with a compiled fallback (*optional*:
a depthwise form for one image size) are compiled only for a signature that comes back, by a
child at the idle priority, which a child a run needs stops (:meth:`SessionTiers._missed`).

``MIXRT_COMPILE=foreground`` compiles on the first call instead (as before the tiers);
``Session.wait_compiled()`` waits for the compiled tier (benchmarks, a warm-up step), and
``mixrt warmup MODEL`` fills the cache ahead, for a container image's build step. If the child
fails, the signature stays on NumPy with a :class:`CompileWarning` that quotes its error.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import contextvars
import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from mixrt.ops.compiled import jit_tier, prebuilt
from mixrt.ops.compiled.jit_cache import cache_root
from mixrt.ops.control.custom import IN_PROCESS_OPS
from mixrt.ops.ir.registry import MIXRT
from mixrt.runtime import quiet_time
from mixrt.runtime.compile_cores import child_cores, child_environment, spawning_confined
from mixrt.runtime.feeds import feed_signature, signature_form
from mixrt.runtime.fingerprints import environment_stamp, graph_fingerprint
from mixrt.runtime.lru import LruCache
from mixrt.runtime.format import save_mxr
from mixrt.runtime.npz import storable, write_npz
from mixrt.runtime.profiler import symbolic_profiler

# the child's module (a test points it elsewhere to see a failed compile handled)
WORKER_MODULE = "mixrt.runtime.compile_worker"
PENDING, LOADING, COMPILED, FAILED = "pending", "loading", "compiled", "failed"
# SessionTiers.compiled's answer for the first run of a signature whose kernels should all
# load (prebuilt ones, or a warm marker's)
LOADING_FIRST = "loading first run"
# the loading run is a session's run: this context variable tells _gated_run whose it is
_LOADING = contextvars.ContextVar("mixrt_loading_tiers", default=None)


class CompileWarning(RuntimeWarning):
    """The background compile of a session's kernels failed; it keeps its NumPy tier."""


class SessionTiers:
    """Which tier each input signature of one CPU session runs, and the switch between."""

    def __init__(self, session, source_path: str | None, opt_level: int):
        self._session = weakref.ref(session)
        self._source = source_path
        self._opt_level = opt_level
        self._state: dict = {}
        self._changed = threading.Condition()
        self._fingerprint: str | None = None
        self._compiling: set = set()  # forms a child is compiling for (one job a form)
        self._idle_forms: set = set()  # forms an idle child compiles optional kernels for
        self._idle_failed: set = set()  # forms whose idle child failed: not started again
        self._compiled_forms: set = set()  # forms with a signature on the compiled tier
        self._failed_forms: set = set()  # forms whose child failed: not started again
        # signatures whose runs missed only optional kernels: compiled when met again
        self._optional_seen = LruCache(OPTIONAL_SIGNATURES)

    def compiled(self, signature: tuple, feeds: dict):
        """The tier of a run of ``signature`` starting now: True (compiled), False (NumPy),
        or :data:`LOADING_FIRST` (its first run, for :meth:`first_run`)."""
        state = self._state.get(signature)
        if state is COMPILED:
            return True
        if state is None:
            state = self._first_run(signature, feeds)
            if state is LOADING_FIRST:
                return state
        return state is COMPILED or (state is LOADING and _LOADING.get() is self)

    def first_run(self, signature: tuple, feeds: dict, run):
        """The first run of ``signature`` where the CPU has prebuilt kernels
        (``ops/compiled/prebuilt.py``) or the signature a warm marker: ``run()`` on the
        compiled tier with compiling forbidden. When every kernel loads, from the prebuilt
        ones or the user's cache, the signature is compiled from this run on, and no child
        starts. When one is in no cache (a model's own generated kernel, an argument type the
        build did not see, a cache emptied under its marker), this request is answered on
        the NumPy tier and the child compiles the missing ones."""
        token = _LOADING.set(self)
        misses: list = []
        outputs = None
        try:
            with jit_tier.loading_only() as misses:
                outputs = run()
        except Exception:
            if not misses:  # the model's own error, not a missing kernel: as any run's
                self._forget(signature)
                raise
        finally:
            _LOADING.reset(token)
        if not misses:
            self._set(signature, COMPILED)
            _mark(self._session(), "kernel tier: compiled")
            return outputs
        if outputs is None:  # (where a step could not take its NumPy path alone)
            try:
                with jit_tier.using(False):
                    outputs = run()
            except Exception:
                # the model's own error at these feeds (a length past its positions, which
                # a warm-up's made-up sizes may try): no child for feeds the model refuses.
                # Its child failed, and the form was marked failed with a CompileWarning,
                # so no later size of it had its missing kernels compiled (2026-11-29)
                self._forget(signature)
                raise
        self._missed(signature, feeds, misses)
        return outputs

    def _missed(self, signature: tuple, feeds: dict, misses: list) -> None:
        """A first run of ``signature`` met kernels in no cache (their steps answered on
        their NumPy paths, ``run_loop._on_numpy_path``). One child at a time compiles for
        the signature's form: the signature is forgotten, so that its next run tries the
        caches again (and finds what the child compiled) instead of waiting on the NumPy
        tier; a service sending a new length per request started a child per length, each
        taking a core for seconds, and served NumPy kernels all the while.

        Where every miss was optional (``jit_tier.optional``: a form specialised on the
        size, whose caller ran its compiled fallback), the run lost little, and the child
        starts only when the signature comes back: a service sending a new image size per
        request kept a child compiling depthwise forms of sizes it never saw again. While
        that child compiles, the signature's runs go on loading what they can (and taking
        the fallbacks), not on the NumPy tier."""
        form = signature_form(signature)
        if all(jit_tier.is_optional(miss) for miss in misses):
            if self._optional_seen.get(signature) is None:
                self._optional_seen.put(signature, True)
                self._forget(signature)
            else:
                self._compile_when_idle(signature, feeds)
            return
        marker = self._marker(signature)
        marker.unlink(missing_ok=True)  # stale: the child compiles what it no longer holds
        with self._changed:
            if form in self._compiling or form in self._failed_forms:
                self._state.pop(signature, None)
                self._changed.notify_all()
                return
            self._compiling.add(form)
            self._state[signature] = PENDING
        compiler().submit(CompileJob(self, signature, _copied(feeds), marker))

    def _compile_when_idle(self, signature: tuple, feeds: dict) -> None:
        """A signature whose misses were all optional came back: its child compiles them at
        the idle priority (``compile_worker``), on what the cores leave, and stops for any
        child a run needs (:meth:`BackgroundCompiler.submit`). Such misses had a compiled
        fallback, so the run lost little; at the child's usual priority, one of a 2-core
        machine's cores went to compiling depthwise forms for as long as a service sending
        a new image size per request kept meeting sizes again (MobileNetV2, 200 new sizes
        10 ms apart: 37-40 ms a request at the median, 106-188 at p99, against 28-33 and
        54-81 without that child, 2026-12-01)."""
        form = signature_form(signature)
        marker = self._marker(signature)
        marker.unlink(missing_ok=True)
        with self._changed:
            self._state.pop(signature, None)
            self._changed.notify_all()
            if form in self._compiling or form in self._idle_forms \
                    or form in self._failed_forms or form in self._idle_failed:
                return
            self._idle_forms.add(form)
        compiler().submit(CompileJob(self, signature, _copied(feeds), marker, idle=True))

    def is_compiled(self, signature: tuple) -> bool:
        """Does ``signature`` run the compiled tier already (nothing is started)?"""
        return self._state.get(signature) is COMPILED

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no signature of this session is still being compiled; True when every
        signature seen runs the compiled tier."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while any(s in (PENDING, LOADING) for s in self._state.values()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return all(s is COMPILED for s in self._state.values())

    def states(self) -> dict:
        return dict(self._state)

    # -- the switch --------------------------------------------------------------------------

    def _first_run(self, signature: tuple, feeds: dict) -> str:
        with self._changed:
            if signature in self._state:
                return self._state[signature]
            if not all(isinstance(v, np.ndarray) for v in feeds.values()) or \
                    sum(v.nbytes for v in feeds.values()) > LARGE_FEEDS:
                # sequences or maps: the child cannot be handed them; feeds this large: a
                # copy, a file of them and the child's run over them cost more than the
                # kernels' compile in this process; either way, compile on demand
                self._state[signature] = COMPILED
                return COMPILED
            marker = None if prebuilt.chosen() is not None or self._form_loaded(signature) \
                else self._marker(signature)
            if marker is None or marker.is_file():
                self._state[signature] = LOADING  # first_run: the compiled tier at once
                return LOADING_FIRST
            form = signature_form(signature)
            if form in self._compiling or form in self._failed_forms:
                return PENDING  # NumPy, unrecorded: its next run asks again
            self._compiling.add(form)
            self._state[signature] = PENDING
        job = CompileJob(self, signature, _copied(feeds), marker)
        compiler().submit(job)
        return PENDING

    def _form_loaded(self, signature: tuple) -> bool:
        """Whether the kernels of ``signature``'s *form* (its feeds' ranks and dtypes, not
        their sizes) were compiled before: by this session for another signature of that
        form, or by any process (the form's marker). numba compiles a kernel per argument
        type (dtype, rank, layout), not per size, so a new sequence length or batch finds
        nearly every kernel it calls loaded already; the few made per size (a depthwise
        convolution's plane geometry) are misses that :meth:`first_run` hands the child.
        Until 2026-11-26 every new size started a child and served NumPy kernels until it
        was done, the child taking one of a 2-core machine's cores."""
        form = signature_form(signature)
        return form in self._compiled_forms or self._marker(form, shapes=False).is_file()

    def _forget(self, signature: tuple) -> None:
        with self._changed:
            self._state.pop(signature, None)
            self._changed.notify_all()

    def _set(self, signature: tuple, state: str) -> None:
        with self._changed:
            self._state[signature] = state
            if state is COMPILED:
                self._compiled_forms.add(signature_form(signature))
            self._changed.notify_all()

    def _compiled(self, job: "CompileJob") -> None:
        """The child filled the cache: load the kernels with one run, then switch. What an
        idle child compiled (optional kernels) loads where a later run meets it."""
        if job.idle:
            with self._changed:
                self._idle_forms.discard(signature_form(job.signature))
            return
        session = self._session()
        if session is None:
            return
        self._set(job.signature, LOADING)
        token = _LOADING.set(self)
        try:
            session.run(None, job.feeds)
        except Exception as exc:  # noqa: BLE001  (a failed load keeps the NumPy tier)
            self._failed(job, f"the loading run raised {type(exc).__name__}: {exc}")
            return
        finally:
            _LOADING.reset(token)
        # the form's marker first: a waiter woken by the switch finds it written
        write_marker(self._marker(signature_form(job.signature), shapes=False),
                     str(self._source or "(in memory)"))
        with self._changed:
            self._compiling.discard(signature_form(job.signature))
        self._set(job.signature, COMPILED)
        _mark(session, "kernel tier: compiled")

    def _failed(self, job: "CompileJob", why: str) -> None:
        if job.idle:  # its kernels were optional: the session runs as it did, and a child
            with self._changed:  # a run needs is still started for the form
                self._idle_forms.discard(signature_form(job.signature))
                if not job.stopped:  # (stopped for a child a run needed: asked again)
                    self._idle_failed.add(signature_form(job.signature))
            return
        with self._changed:
            self._compiling.discard(signature_form(job.signature))
            self._failed_forms.add(signature_form(job.signature))
        self._set(job.signature, FAILED)
        warnings.warn(f"the background compile of this session's kernels for inputs "
                      f"{_signature_text(job.signature)} failed, so it keeps running NumPy "
                      f"kernels: {why}", CompileWarning, stacklevel=2)

    # -- where a model's kernels are recorded as compiled ------------------------------------

    def _marker(self, signature: tuple, shapes: bool = True) -> Path:
        """The warm marker of ``signature``; with ``shapes=False``, of a signature's form
        (:func:`signature_form`), written once any signature of that form compiled."""
        if self._fingerprint is None:
            self._fingerprint = graph_fingerprint(self._session().graph)
        key = hashlib.sha256(repr((self._fingerprint, signature, self._opt_level,
                                   environment_stamp())).encode()).hexdigest()[:32]
        return cache_root() / "warm" / f"{key if shapes else 'form-' + key}.json"


# signatures with only optional misses a session remembers, to compile for when they return
OPTIONAL_SIGNATURES = 1024

# feeds of more bytes than this are not handed to the background compiler (_first_run):
# each new signature would copy them, write them to a file and run them in the child, a
# second or more per 512 MB (MXNet's Gluon tests slice 16x128x256x256 inputs through
# hybridized blocks), where compiling the few kernels on demand takes milliseconds from a
# warm cache
LARGE_FEEDS = 1 << 26


def _mark(session, name: str) -> None:
    for profiler in (session.profiler, _process_profiler()):
        if profiler is not None:
            profiler.mark(name)


def _process_profiler():
    return symbolic_profiler()


def _copied(feeds: dict) -> dict:
    return {name: np.array(value, copy=True) for name, value in feeds.items()}


def _signature_text(signature: tuple) -> str:
    return ", ".join(str(part) for part in signature) or "()"


# -- the background compiler ----------------------------------------------------------------------

class CompileJob:
    """One child's work: ``idle``, it compiles optional kernels at the idle priority;
    ``stopped``, it was stopped for a job a run needed."""

    def __init__(self, tiers: SessionTiers, signature: tuple, feeds: dict, marker: Path,
                 idle: bool = False):
        self.tiers, self.signature, self.feeds, self.marker = tiers, signature, feeds, marker
        self.idle, self.stopped = idle, False


class BackgroundCompiler:
    """One thread per process; each job is one child process at a time (two cores would
    not serve a request and compile twice at once). Jobs a run needs go first; idle ones
    (optional kernels) wait for a quiet process and stop when a run begins
    (``runtime/quiet_time.py``)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # None: look at _deferred
        self._deferred: collections.deque = collections.deque()  # idle jobs, in turn
        self._child: subprocess.Popen | None = None
        self._current: CompileJob | None = None  # the job the child runs
        self.children = 0  # compile processes started (the prebuilt kernels' tests count)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="mixrt-compiler",
                                        daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def submit(self, job: CompileJob) -> None:
        """Queue ``job``: an idle one until the process is quiet; one a run needs at once,
        stopping an idle child first (what it compiled stays in the cache, and its job
        waits for the next quiet time)."""
        if job.idle:
            self._deferred.append(job)
            self._jobs.put(None)  # the thread may be waiting for a job a run needs
            return
        current = self._current
        if not job.idle and current is not None and current.idle:
            current.stopped = True  # (a child not started yet is not started: _compile)
            child = self._child
            if child is not None and child.poll() is None:
                child.terminate()
        self._jobs.put(job)

    def close(self) -> None:
        """Stop the child (what it compiled so far stays in the cache)."""
        self._closed = True
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()

    def _serve(self) -> None:
        while not self._closed:
            job = self._next_job()
            if self._closed:
                return
            if job is None:
                continue
            self._current = job
            try:
                why = self._compile(job)
            except Exception as exc:  # noqa: BLE001  (reported, never raised in a thread)
                why = f"{type(exc).__name__}: {exc}"
            finally:
                self._current = None
            if self._closed:
                return
            if why is not None and job.idle and job.stopped:  # again when it is quiet
                job.stopped = False
                self._deferred.appendleft(job)
                continue
            if why is None:
                job.tiers._compiled(job)
            else:
                job.tiers._failed(job, why)

    def _next_job(self) -> CompileJob | None:
        """The next job a run needs; else, once the process is quiet, the first idle one;
        None to be asked again (a run began meanwhile, or a job came)."""
        if not self._deferred:
            return self._jobs.get()
        wait = quiet_time.seconds_to_quiet()
        try:
            return self._jobs.get(timeout=wait) if wait > 0 else self._jobs.get_nowait()
        except queue.Empty:
            pass
        if quiet_time.seconds_to_quiet() > 0:
            return None
        return self._deferred.popleft()

    def _stop_idle(self, job: CompileJob) -> None:
        """A run began while ``job``'s idle child compiled (on the run's thread)."""
        job.stopped = True
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()

    def _compile(self, job: CompileJob) -> str | None:
        """Run the child over ``job``; None when it succeeded, else why not."""
        session = job.tiers._session()
        if session is None:
            return None
        if job.marker.is_file():  # another session or process compiled it meanwhile
            return None
        jobs = cache_root() / "jobs"
        jobs.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="job-", dir=jobs))
        try:
            _job_spec(session, job, folder)  # writes job.json beside the log
            del session
            log = folder / "child.log"
            cores = child_cores()  # one reading for its environment and its confinement
            with open(log, "wb") as out, spawning_confined(cores):
                self.children += 1
                # -P: not the working directory first on the child's path, where a
                # folder named mixrt (a cache, a checkout's data) hid the package's modules
                # and the child failed to load the job's model
                self._child = subprocess.Popen(
                    [sys.executable, "-P", "-m", WORKER_MODULE,
                     str(folder / "job.json")],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    env=child_environment(cores, idle=job.idle))
                if job.stopped:  # stopped for a job a run needs while it started
                    self._child.terminate()
            with quiet_time.stopped_by_runs(lambda: self._stop_idle(job)) if job.idle \
                    else contextlib.nullcontext():
                if job.idle and quiet_time.seconds_to_quiet() > 0:  # a run since it began
                    self._stop_idle(job)
                code = self._child.wait()
            self._child = None
            if code == 0 and job.marker.is_file():
                return None
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            return f"the compiler process exited with {code}: " + " | ".join(tail)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _job_spec(session, job: CompileJob, folder: Path) -> dict:
    """Write what the child needs into ``folder``: the model (the session's source file
    when it has one, else its graph as a .mxr) and the feeds (.npz, no pickle)."""
    tiers = job.tiers
    if tiers._source is not None:
        model, opt_level = tiers._source, tiers._opt_level
    else:
        model, opt_level = str(folder / "model.mxr"), tiers._opt_level
        save_mxr(session.graph, model, opt_level=opt_level)
    names = sorted(job.feeds)
    stored = {name: storable(job.feeds[name]) for name in names}
    write_npz(folder / "feeds.npz", {f"feed{i}": stored[n][0] for i, n in enumerate(names)},
              "feeds")
    spec = {"model": model, "opt_level": opt_level, "feeds": str(folder / "feeds.npz"),
            "feed_names": names, "marker": str(job.marker), "job": uuid.uuid4().hex,
            "feed_dtypes": {n: kind for n, (_, kind) in stored.items() if kind is not None}}
    (folder / "job.json").write_text(json.dumps(spec))
    return spec


def warm_up(session, model, opt_level: int, feeds: dict) -> Path | None:
    """Compile, in this process and now, every kernel ``session`` calls on inputs shaped as
    ``feeds``, into the disk cache, and write the warm marker, so that later processes run
    that model's compiled tier from their first call (``mixrt warmup``). Returns the
    marker, or None where there is nothing to compile (``MIXRT_JIT=0``, a GPU session)."""
    tiers = session._tiers or tiers_for(session, model, opt_level, always=True)
    if tiers is None:
        return None
    signature = feed_signature(session._checked_feeds(feeds))
    tiers._set(signature, LOADING)
    token = _LOADING.set(tiers)
    try:
        with jit_tier.using(True):
            session.run(None, feeds)
            session.run(None, feeds)
    finally:
        _LOADING.reset(token)
    tiers._set(signature, COMPILED)
    marker = tiers._marker(signature)
    write_marker(marker, str(model))
    write_marker(tiers._marker(signature_form(signature), shapes=False), str(model))
    return marker


_compiler: list = []
_compiler_lock = threading.Lock()


def compiler() -> BackgroundCompiler:
    """The process's background compiler (started on first use, again in a forked child)."""
    with _compiler_lock:
        if not _compiler or _compiler[0][0] != os.getpid():
            _compiler[:] = [(os.getpid(), BackgroundCompiler())]
        return _compiler[0][1]


def tiers_for(session, model, opt_level: int, *, always: bool = False) -> SessionTiers | None:
    """A CPU session's tiers, or None where there is one tier only: a GPU session,
    ``MIXRT_JIT=0``, ``MIXRT_COMPILE=foreground`` (unless ``always``)."""
    if session.device.kind != "cpu" or os.environ.get("MIXRT_JIT", "1") == "0" \
            or not (always or jit_tier.background_compiles()) \
            or _runs_python_of_this_process(session.graph):
        return None
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    if isinstance(source, bytes):
        source = os.fsdecode(source)
    return SessionTiers(session, None if source is None else os.path.abspath(source),
                        opt_level)


def _runs_python_of_this_process(graph) -> bool:
    """Whether a node calls Python code registered in this process (mixrt::Custom): the
    compiler's child process has none of it, so such a graph keeps one tier."""
    return any(node.domain == MIXRT and node.op_type in IN_PROCESS_OPS
               for node in graph.nodes)


def write_marker(marker: Path, model: str) -> None:
    """The marker file, written atomically (several processes may write it at once)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    temporary = marker.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({
        "model": model, "compiled": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid()}))
    os.replace(temporary, marker)
