"""A planned GPU run captured once as a CUDA graph and replayed (``Session(cuda_graph=True)``).

With static shapes a run's kernels, their arguments and every buffer they touch are the same
from one run to the next, so after the first planned run of a signature the whole run is
recorded into a CUDA graph and later runs launch that graph: one launch instead of a Python
call and a few kernel launches per node.

What makes a replay safe:

* **Fixed inputs.** The graph reads its inputs from buffers made for it; a run copies the
  feeds into them (on the capture stream) before the launch. Feeds the session names as
  read in place (:meth:`Captures.read_in_place`: a training step's parameters, which the
  optimizer updates in place between steps) are read where they are, without the copy;
  a launch given another array for one of them captures the signature again.
* **A private memory pool.** Everything allocated while capturing (the arena, each kernel's
  temporaries, the outputs) comes from a CuPy memory pool that only this graph uses, and
  which lives as long as the graph. Blocks a kernel frees during capture go back to that pool
  only, so no later allocation elsewhere can take an address the graph writes.
* **Relaxed capture mode**, so the pool may call cudaMalloc while capturing.
* **cuBLAS through ctypes.** CuPy refuses cuBLAS calls while a stream captures, so the
  kernels run the capture with ``runtime/cublas_capture.CapturingModule`` as their array
  module: CuPy, with matrix products that call cuBLAS on a handle and workspace of the
  capture's own. Captures run one at a time in the process (they share that handle).
* **Falling back.** A run that cannot be captured (a kernel that reads a value back to the
  host, a data-dependent shape) raises during capture; the signature is then marked, a
  RuntimeWarning names the node and the reason once, and it runs the ordinary way from then
  on. A capture never changes what a run returns.

* **Stream order.** The graph runs on a non-blocking stream of its own, which does not wait
  for the default stream by itself; the feeds were put on the device there (asynchronously).
  So before copying them in, at capture and at every launch, that stream waits for the
  caller's current stream, and the caller copies what it keeps on the graph's stream before
  the next launch may start (:meth:`CapturedRun.kept`).

Outputs are copied to the host after each launch, as every GPU run's are.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from mixrt.ops import device_checks
from mixrt.runtime.cublas_capture import WORKSPACE_BYTES, CapturingModule
from mixrt.runtime.run_loop import execute
from mixrt.runtime.arenas import Arena


@dataclass
class CapturedRun:
    graph: object  # cupy.cuda.Graph
    stream: object  # the stream it was captured on and is launched on
    inputs: dict  # feed name -> the device buffer the graph reads
    env: dict  # every value of the captured run (outputs included), kept alive
    pool: object  # the private memory pool (kept alive with the graph)
    checks: object = None  # the run's deferred checks (ops/device_checks.py)
    in_place: frozenset = frozenset()  # feeds read where they are (not copied in)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def takes(self, feeds: dict) -> bool:
        """Whether each feed read in place is the very array the graph was captured
        reading (same memory, shape and dtype)."""
        return all(_same_array(feeds[name], self.inputs[name]) for name in self.in_place)

    def launch(self, feeds: dict) -> dict:
        """Copy ``feeds`` in (all but those read in place), replay, wait; returns the run's
        values (valid until the next launch, so the caller copies what it keeps while
        holding :attr:`lock`, through :meth:`kept`)."""
        _wait_for_callers_stream(self.stream)
        with self.stream:
            for name, value in feeds.items():
                if name not in self.in_place:
                    self.inputs[name][...] = value
            self.graph.launch(self.stream)
        self.stream.synchronize()
        if self.checks is not None:  # each replay recomputed them
            import cupy  # noqa: PLC0415  (GPU sessions only)
            self.checks.raise_if_failed(cupy)
        return self.env

    def kept(self, copy):
        """``copy()`` (the caller taking what it keeps of a launch's values) run on the
        graph's stream and finished, so the next launch cannot overwrite what it reads."""
        with self.stream:
            result = copy()
        self.stream.synchronize()
        return result


class Captures:
    """A session's captured runs, by input-shape signature, and the signatures that failed."""

    def __init__(self):
        self.runs: dict = {}
        self.failed: dict = {}  # signature -> why it could not be captured
        self.in_place: frozenset = frozenset()
        self._lock = threading.Lock()

    def read_in_place(self, names) -> None:
        """Feeds named here are read by a graph where they are, not copied in: the caller
        keeps each one's array between runs (updating it in place) and passes it again."""
        self.in_place = frozenset(names)

    def get(self, signature: tuple, plan, constants: dict, feeds: dict) -> CapturedRun | None:
        """The captured run for ``signature``, capturing it now on first call (or again
        when a feed read in place is another array now); None when it cannot be
        captured."""
        if signature in self.failed:
            return None
        with self._lock:
            found = self.runs.get(signature)
            if found is not None and not found.takes(feeds):
                found = None  # a parameter was replaced: its graph reads the old one
            if found is None and signature not in self.failed:
                try:
                    found = self.runs[signature] = capture(plan, constants, feeds,
                                                           self.in_place & feeds.keys())
                except Exception as exc:  # noqa: BLE001  (any failure means: run uncaptured)
                    self.failed[signature] = f"{type(exc).__name__}: {exc}"
                    warnings.warn(f"cuda_graph=True: inputs of shapes {_shapes(feeds)} run "
                                  f"without a CUDA graph: {self.failed[signature]}",
                                  RuntimeWarning, stacklevel=4)
            return found


def capture(plan, constants: dict, feeds: dict, in_place=frozenset()) -> CapturedRun:
    """Record one planned run of ``plan`` into a CUDA graph (see the module docstring);
    the feeds named in ``in_place`` are read where they are."""
    with _CAPTURE_LOCK:
        return _capture(plan, constants, feeds, frozenset(in_place))


_CAPTURE_LOCK = threading.Lock()  # captures share each device's cuBLAS handle


def _capture(plan, constants: dict, feeds: dict, in_place: frozenset) -> CapturedRun:
    import cupy  # noqa: PLC0415  (GPU sessions only)
    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)
    _wait_for_callers_stream(stream)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        inputs = {name: _read_in_place(value, name) if name in in_place
                  else cupy.array(value, copy=True) for name, value in feeds.items()}
        arena = Arena(plan, cupy)
        env = dict(constants)
        env.update(plan.frozen)
        env.update(inputs)
        workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        xp = CapturingModule(cupy, stream, workspace)
        stream.synchronize()  # the copies above are not part of the graph
        xp.prepare()
        stream.begin_capture()  # relaxed mode (CuPy's default): the pool may cudaMalloc
        try:
            with device_checks.collecting() as checks:
                execute(plan.steps, env, xp, arena, plan)
        except BaseException:
            # ending an invalidated capture raises too; the kernel's error is the one to keep
            try:
                stream.end_capture()
            except Exception:  # noqa: BLE001,S110
                pass
            raise
        graph = stream.end_capture()
    env["__arena__"] = arena  # the graph writes into it: it must outlive the graph
    env["__cublas_workspace__"] = workspace  # and its products into this
    return CapturedRun(graph, stream, inputs, env, pool, checks, in_place)


def _read_in_place(value, name: str):
    """A feed the graph reads where it is: a C-contiguous array of the current device."""
    import cupy  # noqa: PLC0415  (GPU sessions only)
    if not isinstance(value, cupy.ndarray) or not value.flags.c_contiguous:
        raise ValueError(f"feed {name!r} is to be read in place by the CUDA graph, so it "
                         f"must be a C-contiguous array of the session's GPU")
    return value


def _same_array(value, captured) -> bool:
    return getattr(value, "data", None) is not None and value.data.ptr == captured.data.ptr \
        and value.shape == captured.shape and value.dtype == captured.dtype


def _wait_for_callers_stream(stream) -> None:
    """Make ``stream`` wait for the work queued so far on the calling thread's current
    stream (the feeds' copies to the device among it)."""
    import cupy  # noqa: PLC0415  (GPU sessions only)
    stream.wait_event(cupy.cuda.get_current_stream().record())


def _shapes(feeds: dict) -> str:
    return ", ".join(f"{name} {tuple(value.shape)}" for name, value in feeds.items())

