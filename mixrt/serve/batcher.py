"""Dynamic batching: concurrent requests to one model joined along their first axis.

A request waits at most ``max_delay`` for company; with ``adaptive`` (the server's), not at
all when it is alone and the last batch was a single request too: a lone client is not made
to wait for others, and under load requests still gather while a batch runs. Requests join
only where every input has the same dtype and the same shape past the first axis, and the
same outputs were asked for;
a batch holds at most ``max_rows`` rows, and a request of that many rows or more runs alone.
One batch runs at a time (the session spreads a run over the cores already), and while it
runs the next requests gather, so under load batches fill without waiting out the delay.

Each request was checked before it came here (``tensors.decode``), so one bad request
cannot fail its neighbours; should a joined run raise all the same, each of its requests is
run again alone, and only the one that fails alone gets the error (but a run ended by its
time limit fails them all: each alone would take as long). A request whose caller gave up
waiting (the server's deadline cancels it) is dropped from the queue unrun.

The queue is bounded: with ``max_queue`` requests already waiting (admitted, not yet
running; with 0, as soon as the model is busy), the next is refused at once with
:class:`Overloaded`, which says when to retry (the queue's wait, from the runs' recent
times), rather than queued for seconds behind work it cannot overtake. Under overload the
requests accepted keep the latency of a short queue, and the rest learn so at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from mixrt.base.errors import RunTerminated
from mixrt.serve.outcomes import Overloaded

# weight of the newest run in the running mean of a run's time (Retry-After's estimate)
RUN_TIME_WEIGHT = 0.2


@dataclass
class Timing:
    """Where one request's time went, filled in by the batcher: seconds queued (admitted
    to run start), seconds its run took (a joined run's whole time), rows of that run."""

    queued: float = 0.0
    ran: float = 0.0
    rows: int = 0


@dataclass
class Pending:
    feeds: dict
    outputs: tuple
    rows: int
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)
    timing: Timing = field(default_factory=Timing)


class Batcher:
    """``await batcher.submit(feeds, outputs)``: the outputs of ``run(feeds, outputs)`` for
    this request's rows. ``run`` is called on ``executor`` (a thread), one batch at a time;
    with ``adaptive``, a request alone in the queue after a batch of one runs at once;
    ``observe(rows, requests)`` is told each batch's size before its run, ``executed(rows,
    seconds)`` its time after, ``queued(depth)`` the number of requests waiting; past
    ``max_queue`` waiting (None: no bound), ``submit`` raises :class:`Overloaded`."""

    def __init__(self, run, executor, *, max_rows: int, max_delay: float, adaptive=False,
                 max_queue: int | None = None, name: str = "the model",
                 observe=lambda rows, requests: None, queued=lambda depth: None,
                 executed=lambda rows, seconds: None):
        self._run = run
        self._executor = executor
        self.max_rows = max_rows
        self.max_delay = max_delay
        self.adaptive = adaptive  # a lone request after a lone batch runs at once
        self.max_queue = max_queue
        self.name = name
        self._observe = observe
        self._queued = queued
        self._executed = executed
        self._waiting: dict[tuple, deque] = {}
        self._arrived = asyncio.Event()
        self._consumer: asyncio.Task | None = None
        self._closed = False
        self._last_requests = 0  # requests in the last batch run
        self._alone_waiting = 0  # requests run alone, handed to the executor, not started
        self._count_lock = threading.Lock()
        self._running = 0  # runs handed to the executor and not yet answered
        self._run_seconds = 0.0  # a run's time, a running mean

    async def submit(self, feeds: dict, outputs: tuple, timing: Timing | None = None) -> list:
        """The request's outputs; ``timing``, where given, is told where its time went."""
        self._admit()
        timing = timing or Timing()
        if self.max_rows <= 1:
            return await self._execute([Pending(feeds, outputs, 1, None, timing=timing)],
                                       alone=True)
        rows = next(iter(feeds.values())).shape[0]  # batching: every input has a first axis
        if rows >= self.max_rows:
            return await self._execute([Pending(feeds, outputs, rows, None, timing=timing)],
                                       alone=True)
        if self._consumer is None or self._consumer.done():
            self._consumer = asyncio.get_running_loop().create_task(self._consume())
        pending = Pending(feeds, outputs, rows, asyncio.get_running_loop().create_future(),
                          timing=timing)
        self._waiting.setdefault(_join_key(feeds, outputs), deque()).append(pending)
        self._queued(self.depth)
        self._arrived.set()
        return await pending.future

    @property
    def depth(self) -> int:
        """Requests admitted and not yet running."""
        return sum(len(q) for q in self._waiting.values()) + self._alone_waiting

    def _admit(self) -> None:
        """Refuse a request that would wait behind ``max_queue`` others (with 0, one that
        finds the model busy at all)."""
        depth = self.depth
        if self.max_queue is None or depth < self.max_queue \
                or (depth == 0 and not self._running):
            return
        per_run = max(1, self._last_requests)
        wait = max(self._run_seconds, 1e-3) * (depth // per_run + 1)
        raise Overloaded(f"{self.name} is busy: {depth} requests already queued (--max-queue "
                         f"{self.max_queue}); retry in {wait:.3g} s", wait)

    async def close(self) -> None:
        """Finish what is queued, then stop the consumer (graceful shutdown)."""
        self._closed = True
        self._arrived.set()
        if self._consumer is not None:
            await self._consumer

    async def _consume(self) -> None:
        while self._waiting or not self._closed:
            if not self._waiting:
                self._arrived.clear()
                if self._closed:
                    return
                await self._arrived.wait()
                continue
            key = min(self._waiting, key=lambda k: self._waiting[k][0].arrived)
            await self._gather(key)
            batch = self._take(key)
            if not batch:  # each request gave up waiting (its deadline passed)
                continue
            self._last_requests = len(batch)
            try:
                self._queued(self.depth)
                results = await self._execute(batch, alone=False)
            except Exception as exc:  # noqa: BLE001 - answered, so no request waits forever
                results = [exc] * len(batch)
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    if isinstance(result, BaseException):
                        pending.future.set_exception(result)
                    else:
                        pending.future.set_result(result)

    async def _gather(self, key: tuple) -> None:
        """Wait until ``key``'s requests fill a batch or its oldest has waited max_delay;
        not at all for a request alone in the queue when the last batch was one request
        too (nothing suggests company: at one client at a time a 2 ms delay had cut a BERT
        encoder's requests from 173 to 108 a second)."""
        queue = self._waiting[key]
        if self.adaptive and len(queue) == 1 and self._last_requests <= 1:
            return
        deadline = queue[0].arrived + self.max_delay
        while sum(p.rows for p in queue) < self.max_rows and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    def _take(self, key: tuple) -> list:
        """The oldest of ``key``'s requests that fit a batch, past those whose callers gave
        up (a request's deadline cancels its future): no run for an answer nobody waits for."""
        queue = self._waiting[key]
        while queue and queue[0].future.done():
            queue.popleft()
        batch, rows = [], 0
        while queue and (not batch or rows + queue[0].rows <= self.max_rows):
            pending = queue.popleft()
            if not pending.future.done():
                rows += pending.rows
                batch.append(pending)
        if not queue:
            del self._waiting[key]
        return batch

    async def _execute(self, batch: list, alone: bool) -> list:
        """Each request's outputs (or its exception, when not ``alone``) for one run of the
        joined batch."""
        self._running += 1
        try:
            return await self._execute_counted(batch, alone)
        finally:
            self._running -= 1

    async def _execute_counted(self, batch: list, alone: bool) -> list:
        loop = asyncio.get_running_loop()
        self._observe(sum(p.rows for p in batch), len(batch))
        if len(batch) == 1:
            if alone:
                return await self._alone(loop, batch[0])
            call = loop.run_in_executor(self._executor, self._timed, batch,
                                        batch[0].feeds, batch[0].outputs)
            try:
                return [await call]
            except Exception as exc:  # noqa: BLE001 - handed to the request that caused it
                return [exc]
        try:
            joined = {name: np.concatenate([p.feeds[name] for p in batch])
                      for name in batch[0].feeds}
            outputs = await loop.run_in_executor(self._executor, self._timed, batch, joined,
                                                 batch[0].outputs)
        except RunTerminated:  # the run's time limit: each alone would take as long
            raise
        except Exception:  # noqa: BLE001 - rerun alone, so that only the culprit fails
            return [(await self._execute([p], alone=False))[0] for p in batch]
        return _split(outputs, [p.rows for p in batch])

    async def _alone(self, loop, pending: Pending) -> list:
        """One request on the executor, counted as waiting until its run starts (or it is
        given up first). The executor's thread takes it off the count under a lock, not
        through the event loop: a wake-up of the loop at every run's start took the GIL
        from the run."""
        state = ["waiting"]
        with self._count_lock:
            self._alone_waiting += 1

        def leave(now: str) -> bool:
            with self._count_lock:
                if state[0] != "waiting":
                    return False
                state[0] = now
                self._alone_waiting -= 1
                return True

        def run():
            if not leave("started"):
                return None  # given up before it started: nobody waits for its answer
            return self._timed([pending], pending.feeds, pending.outputs)
        try:
            return await loop.run_in_executor(self._executor, run)
        finally:
            leave("dropped")

    def _timed(self, batch: list, feeds: dict, outputs: tuple) -> list:
        """``run`` on the executor's thread, its time told to each request of ``batch``."""
        started = time.monotonic()
        try:
            return self._run(feeds, outputs)
        finally:
            took = time.monotonic() - started
            self._run_seconds += RUN_TIME_WEIGHT * (took - self._run_seconds)
            rows = sum(p.rows for p in batch)
            self._executed(rows, took)
            for pending in batch:
                pending.timing.queued = started - pending.arrived
                pending.timing.ran = took
                pending.timing.rows = rows


def _join_key(feeds: dict, outputs: tuple) -> tuple:
    return (tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(feeds.items())),
            outputs)


def _split(outputs: list, rows: list) -> list:
    """The joined outputs cut back into each request's rows."""
    results, start = [], 0
    for count in rows:
        results.append([out[start:start + count] for out in outputs])
        start += count
    return results
