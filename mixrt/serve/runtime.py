"""One version of a model as ``mixrt serve`` serves it: prepared once per process, its
requests checked, queued (joined into batches where that cannot change an answer), run and
counted. Nothing here knows the transport: ``model.py`` puts the versions of a name behind
KServe's model class, ``rest.py`` and ``grpc_service.py`` carry the protocol.

A version's settings (the command line's, or ``parameters.extra`` of a model-settings.json
beside its file): ``max_batch_size`` (rows a joined batch holds; 0 or 1: no batching),
``max_delay_ms`` (how long a request waits for company), ``max_queue`` (requests waiting
beyond those running; past it a request is refused at once with 503 and Retry-After),
``device`` ("cpu", "gpu:0") and ``request_timeout_s`` (a request unanswered by then gets a
504 naming it, and its run is ended: a request whose run would take hours, a Loop's trip
count in its input, holds a worker no longer than that; 0: no limit; a client's own
deadline, where shorter, wins).

Preparing (:func:`prepare`) makes the session, runs it once at one row and at a full batch
so that its kernels are compiled before the model reports ready, and checks batching.
Batching is only switched on where the check finds each row of a joined batch
bit-identical to the same row run alone, so that joining requests can never change an
answer; a model that fails it (a kernel whose sums depend on the batch, an output that is
not per row) is served one request at a time, and says so in its log and in the
``mixrt_batching`` metric.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import mixrt
from mixrt.base.errors import InputError, MixrtError, RunTerminated
from mixrt.serve import tensors
from mixrt.serve.batcher import Batcher, Timing
from mixrt.serve.metrics import metrics
from mixrt.serve.outcomes import BadRequest, NotFound, RunFailed, ServeError, TimedOut
from mixrt.serve.statistics import Recorder

logger = logging.getLogger("mixrt.serve")

DEFAULT_MAX_DELAY_MS = 2.0
DEFAULT_REQUEST_TIMEOUT_S = 60.0


def default_max_queue(max_batch_size: int) -> int:
    """Requests a model holds waiting by default: 64, or four full batches where that is
    more. Enough that a burst, a benchmark's 32 clients or a profiler's sweep of
    concurrency is queued rather than refused, and a bound all the same (Triton's default
    has none). A service that wants its requests refused rather than kept waiting sets it
    to the wait it accepts divided by a run's time; 0 keeps an unloaded server's latency."""
    return max(64, 4 * max_batch_size)


# size of an open dimension other than the batch in the warm-up feeds: a sequence's length,
# and an image's height and width (a float input of rank 4)
WARMUP_OPEN_DIM = 8
WARMUP_IMAGE_SIDE = 224
# rows the batching check runs alone, each compared with its row of joined runs of 2, 3 and
# max_batch_size rows
CHECK_ROWS = 8

# prepared models of this process, by (path, its modification time and size, device, max
# rows): the supervisor prepares each before it forks its workers, so that they share its
# pages
_PREPARED: dict[tuple, "Prepared"] = {}


@dataclass
class Prepared:
    session: object
    inputs: list
    outputs: list
    batching: bool
    reason: str  # why batching is off, or "" where it is on


def prepare(path: str, device: str = "cpu", max_rows: int = 0) -> Prepared:
    """The session for ``path``, warmed up and checked for batching (once per process)."""
    status = os.stat(path)  # a file replaced in place is prepared again (a reload)
    key = (os.path.realpath(path), status.st_mtime_ns, status.st_size, device, max_rows)
    if key not in _PREPARED:
        for stale in [k for k in _PREPARED if k[0] == key[0]]:  # the file's older contents
            del _PREPARED[stale]
        _PREPARED[key] = _prepare(path, device, max_rows)
    return _PREPARED[key]


def _prepare(path: str, device: str, max_rows: int) -> Prepared:
    serving_environment(max_rows)
    session = mixrt.load(path, device=device)
    inputs = [tensors.TensorSpec.of(a) for a in session.get_inputs()]
    outputs = [tensors.TensorSpec.of(a) for a in session.get_outputs()]
    rows = [1] + ([max_rows] if max_rows > 1 else [])
    try:
        for count in rows:  # compile the kernels of both signatures before serving
            session.run(None, _warmup_feeds(inputs, count))
    except MixrtError as exc:
        # made-up feeds may not suit the model (an image too small for its strides, ids
        # past a vocabulary): it still serves, compiling on its first requests, unbatched
        logger.warning("%s: the warm-up run on made-up feeds failed (%s); serving without "
                       "it, one request at a time", path, exc)
        return Prepared(session, inputs, outputs, False,
                        f"the warm-up run on made-up feeds failed: {exc}")
    session.wait_compiled()
    if max_rows <= 1:
        return Prepared(session, inputs, outputs, False, "max_batch_size is below 2")
    reason = _batching_refused(session, inputs, outputs, max_rows)
    return Prepared(session, inputs, outputs, not reason, reason)


def serving_environment(max_rows: int) -> None:
    """The process-wide switches a server runs with, unless the environment set them:
    compiled kernels from a session's first run (``MIXRT_COMPILE=foreground``; a run on the
    NumPy tier would answer in other bits than the same request later), and, where requests
    are joined, the dense products' batch-invariant forms (``MIXRT_BATCH_INVARIANT``)."""
    os.environ.setdefault("MIXRT_COMPILE", "foreground")
    if max_rows > 1:
        os.environ.setdefault("MIXRT_BATCH_INVARIANT", "1")


def _warmup_feeds(inputs: list, rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in inputs:
        dtype = tensors.DATATYPES[spec.datatype]
        image = len(spec.shape) == 4 and dtype.kind == "f"
        shape = [rows if i == 0 and d == -1 else d if d != -1
                 else WARMUP_IMAGE_SIDE if image else WARMUP_OPEN_DIM
                 for i, d in enumerate(spec.shape)]
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == object:  # words, different row to row
            feeds[spec.name] = rng.choice(np.array(["a", "b c", "d e f"], dtype=object), shape)
        else:  # 0 and 1: valid token ids, masks and segment ids, different row to row
            feeds[spec.name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def _batching_refused(session, inputs: list, outputs: list, max_rows: int) -> str:
    """Why requests to this model cannot be joined, or "" where they can: every input must
    have an open first axis, every output as many rows as were joined, and each row of a
    joined run must equal, bit for bit, the same row run alone."""
    if not inputs:
        return "the model takes no input"
    fixed = [s.name for s in inputs if not s.batched]  # outputs: their runs tell below
    if fixed:
        return f"{', '.join(fixed)} {'has' if len(fixed) == 1 else 'have'} no open first axis"
    feeds = _warmup_feeds(inputs, max_rows, seed=1)
    checked = min(max_rows, CHECK_ROWS)
    alone = [session.run(None, {n: a[i:i + 1] for n, a in feeds.items()})
             for i in range(checked)]
    for count in sorted({c for c in (2, 3, max_rows) if c <= max_rows}):
        joined = session.run(None, {n: a[:count] for n, a in feeds.items()})
        for spec, out in zip(outputs, joined):
            if np.ndim(out) == 0 or out.shape[0] != count:
                return (f"output '{spec.name}' has shape {list(np.shape(out))} for {count} "
                        f"rows joined: its first axis is not the batch")
        for i in range(min(count, checked)):
            for spec, out, single in zip(outputs, joined, alone[i]):
                if out[i:i + 1].tobytes() != np.ascontiguousarray(single).tobytes():
                    return (f"output '{spec.name}' of row {i} differs when {count} rows run "
                            f"joined: a row's answer depends on the rows beside it (a sum "
                            f"over the batch, or a statistic of the whole input such as "
                            f"dynamic quantization's scale)")
    return ""


class ServedVersion:
    """One version of a model: ``await load()``, then ``await infer_arrays(...)``."""

    def __init__(self, name: str, version: str | None, path: str, extra: dict):
        self.name = name
        self.version = version
        self.path = path
        self.extra = extra
        self.ready = False
        self.labels = (name, version or "")
        self.statistics = Recorder(*self.labels)

    @property
    def described(self) -> str:
        return self.name if self.version is None else f"{self.name} version {self.version}"

    async def load(self) -> None:
        extra = self.extra
        max_rows = int(extra.get("max_batch_size", 0))
        device = str(extra.get("device", "cpu"))
        timeout = float(extra.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S))
        self.timeout = timeout if timeout > 0 else None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"mixrt-{self.name}")
        loop = asyncio.get_running_loop()
        try:
            prepared = await loop.run_in_executor(self._executor, prepare, self.path, device,
                                                  max_rows)
        except MixrtError as exc:
            self._executor.shutdown(wait=False)
            raise RunFailed(f"model {self.described}: {exc}") from exc
        self.prepared = prepared
        self.by_name = {spec.name: spec for spec in prepared.inputs}
        self.output_names = [spec.name for spec in prepared.outputs]
        board = metrics()
        board.batching.labels(*self.labels).set(1 if prepared.batching else 0)
        board.compiled.labels(*self.labels).set(
            1 if prepared.session.wait_compiled(0) else 0)
        max_queue = int(extra.get("max_queue", default_max_queue(max_rows)))
        self.batcher = Batcher(
            self._run, self._executor,
            max_rows=max_rows if prepared.batching else 1,
            max_delay=float(extra.get("max_delay_ms", DEFAULT_MAX_DELAY_MS)) / 1000,
            adaptive=True, max_queue=max_queue,
            name=f"model {self.described}", observe=self._observe_batch,
            executed=self.statistics.execution,
            queued=lambda depth: board.queue_depth.labels(*self.labels).set(depth))
        self.ready = True
        logger.info("model %s ready from %s: batching %s, queue up to %s", self.described,
                    self.path, "on, up to %d rows" % max_rows if prepared.batching
                    else f"off ({prepared.reason})", max_queue)

    async def unload(self) -> None:
        self.ready = False
        await self.batcher.close()
        self._executor.shutdown(wait=True)

    def metadata(self) -> dict:
        return {"name": self.name, "versions": [self.version] if self.version else [],
                "platform": "mixrt",
                "inputs": [spec.metadata() for spec in self.prepared.inputs],
                "outputs": [spec.metadata() for spec in self.prepared.outputs]}

    def config(self) -> dict:
        """Triton's model configuration, the part its tools read (perf_analyzer asks it
        before it profiles): where requests are joined, ``max_batch_size`` and each
        tensor's dims past the batch axis, else 0 and the whole shape (-1: open)."""
        batch = int(self.extra.get("max_batch_size", 0)) if self.prepared.batching else 0

        def tensors_of(specs, dims_field):
            return [{"name": spec.name, "data_type": f"TYPE_{_config_type(spec.datatype)}",
                     dims_field: list(spec.shape[1:] if batch else spec.shape)}
                    for spec in specs]
        config = {"name": self.name, "platform": "mixrt", "backend": "mixrt",
                  "max_batch_size": batch,
                  "input": tensors_of(self.prepared.inputs, "dims"),
                  "output": tensors_of(self.prepared.outputs, "dims")}
        if batch:
            config["dynamic_batching"] = {"max_queue_delay_microseconds": int(
                float(self.extra.get("max_delay_ms", DEFAULT_MAX_DELAY_MS)) * 1000)}
        return config

    async def infer_arrays(self, items: list, asked, request_id,
                           deadline: float | None = None, encode=None):
        """``encode(output names, arrays)`` (default: the pair itself) for the inputs
        ``items`` (name, datatype, shape, data: a list or raw bytes) and the outputs
        ``asked`` (None: all). ``deadline``: the client's own, in seconds from now, where it
        sent one. Raises a ``ServeError``: a bad request's ``BadRequest`` naming what was
        wrong, ``Overloaded`` where the queue is full, ``TimedOut`` past the deadline,
        ``RunFailed`` for a failed run."""
        started = time.perf_counter()
        board = metrics()
        timing = Timing()
        try:
            try:
                feeds = self._feeds(items)
                wanted = self._wanted(asked)
            except InputError as exc:
                raise BadRequest(str(exc)) from None
            decoded = time.perf_counter()
            outputs = await self._answer(feeds, wanted, request_id, deadline, timing)
        except ServeError as exc:
            board.requests.labels(*self.labels, exc.outcome).inc()
            self.statistics.request(False, time.perf_counter() - started)
            log = logger.warning if exc.status < 500 else logger.error
            log("request %s to %s: %s: %s", request_id, self.described,
                "refused" if exc.status < 500 else "failed", exc)
            raise
        ran = time.perf_counter()
        answer = (wanted, outputs) if encode is None else encode(wanted, outputs)
        board.requests.labels(*self.labels, "ok").inc()
        took = time.perf_counter() - started
        board.latency.labels(*self.labels).observe(took)
        self.statistics.request(True, took, decoded - started, timing.queued, timing.ran,
                                time.perf_counter() - ran, timing.rows)
        logger.debug("request %s to %s: answered in %.2f ms", request_id, self.described,
                     took * 1e3)
        return answer

    async def _answer(self, feeds: dict, wanted: tuple, request_id, deadline,
                      timing: Timing) -> list:
        limit = self.timeout if deadline is None else (
            deadline if self.timeout is None else min(deadline, self.timeout))
        try:
            return await asyncio.wait_for(self.batcher.submit(feeds, wanted, timing), limit)
        except (asyncio.TimeoutError, RunTerminated) as exc:
            why = (f"no answer within {limit:g} s ("
                   f"{'--request-timeout-s' if limit == self.timeout else 'its deadline'})")
            logger.debug("request %s: %s", request_id, exc or "still queued or running")
            raise TimedOut(f"request {request_id or '(no id)'} to model {self.described}: "
                           f"{why}") from None
        except ServeError:
            raise
        except MixrtError as exc:
            raise RunFailed(f"model {self.described}: {exc}") from None

    def _feeds(self, items: list) -> dict:
        feeds = {}
        for name, datatype, shape, data in items:
            spec = self.by_name.get(name)
            if spec is None:
                raise InputError(f"model {self.name} has no input '{name}'; its inputs "
                                 f"are {', '.join(self.by_name)}")
            if name in feeds:
                raise InputError(f"input '{name}' is given twice")
            feeds[name] = tensors.decode(spec, datatype, shape, data)
        missing = [name for name in self.by_name if name not in feeds]
        if missing:
            raise InputError(f"model {self.name} needs input {', '.join(missing)}, which the "
                             f"request lacks")
        rows = {a.shape[0] for a in feeds.values() if a.ndim}
        if self.prepared.batching and len(rows) > 1:
            raise InputError(f"the inputs' first axes differ ({sorted(rows)}): each is the "
                             f"batch")
        return feeds

    def _wanted(self, asked) -> tuple:
        if not asked:
            return tuple(self.output_names)
        wanted = tuple(asked)
        unknown = [name for name in wanted if name not in self.output_names]
        if unknown:
            raise InputError(f"model {self.name} has no output {', '.join(unknown)}; its "
                             f"outputs are {', '.join(self.output_names)}")
        return wanted

    def _run(self, feeds: dict, wanted: tuple) -> list:
        limits = None if self.timeout is None else mixrt.RunOptions(timeout=self.timeout)
        return self.prepared.session.run(list(wanted), feeds, limits)

    def _observe_batch(self, rows: int, requests: int) -> None:
        board = metrics()
        board.batch_rows.labels(*self.labels).observe(rows)
        board.batch_requests.labels(*self.labels).observe(requests)
        board.compiled.labels(*self.labels).set(
            1 if self.prepared.session.wait_compiled(0) else 0)


def _config_type(datatype: str) -> str:
    return "STRING" if datatype == "BYTES" else datatype


def no_such_version(name: str, version: str, known: list) -> NotFound:
    return NotFound(f"model {name} version {version} not found; its versions are "
                    f"{', '.join(known) or 'none'}")
