"""mixrt.serve.batcher: concurrent requests joined along their first axis, with a fake run
function on a thread that records each batch it gets (no session, no server).

pytest-asyncio is not a dependency: each test drives its own loop with ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mixrt.serve.batcher import Batcher, Timing
from mixrt.serve.outcomes import Overloaded

BOTH = ("double", "negated")


class Recorder:
    """``run(feeds, outputs)``: each requested output of input ``x`` ("double": 2x,
    "negated": -x, "rows": each row's sum). Records every batch it gets; refuses (raises)
    a batch holding a NaN; ``hold`` (an Event) makes the next runs wait for it."""

    def __init__(self, seconds: float = 0.0):
        self.batches: list[tuple[dict, tuple]] = []
        self.seconds = seconds
        self.started = threading.Event()
        self.hold: threading.Event | None = None
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def __call__(self, feeds: dict, outputs: tuple) -> list:
        with self._lock:
            self.batches.append(({k: v.copy() for k, v in feeds.items()}, outputs))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.started.set()
            if self.hold is not None:
                assert self.hold.wait(10)
            time.sleep(self.seconds)
            x = feeds["x"]
            if np.isnan(x).any():
                raise ValueError("a NaN in the batch")
            made = {"double": lambda: 2 * x, "negated": lambda: -x,
                    "rows": lambda: x.reshape(len(x), -1).sum(axis=1)}
            return [made[name]() for name in outputs]
        finally:
            with self._lock:
                self.running -= 1

    def rows(self) -> list[int]:
        return [len(feeds["x"]) for feeds, _ in self.batches]


def request(tag: int, rows: int = 1, width: int = 3, dtype=np.float32) -> dict:
    """``rows`` rows whose values no other tag shares."""
    x = 1000 * tag + np.arange(rows * width, dtype=np.float64).reshape(rows, width)
    return {"x": x.astype(dtype)}


def check_own(result: list, feeds: dict, outputs=BOTH) -> None:
    """``result`` is exactly the outputs of this request's own rows."""
    x = feeds["x"]
    want = {"double": 2 * x, "negated": -x, "rows": x.reshape(len(x), -1).sum(axis=1)}
    assert len(result) == len(outputs)
    for got, name in zip(result, outputs):
        assert got.dtype == want[name].dtype and got.shape == want[name].shape
        assert got.tobytes() == want[name].tobytes(), name


def drive(body, workers: int = 1):
    """Run ``body(executor)`` (a coroutine function) on a fresh loop."""
    with ThreadPoolExecutor(max_workers=workers) as executor:
        return asyncio.run(asyncio.wait_for(body(executor), 60))


async def submit_spaced(batcher, feeds_list, outputs_list=None, gap: float = 0.002):
    """Submit each request as its own task, in order, ``gap`` apart; their tasks."""
    tasks = []
    for i, feeds in enumerate(feeds_list):
        outputs = BOTH if outputs_list is None else outputs_list[i]
        tasks.append(asyncio.create_task(batcher.submit(feeds, outputs)))
        await asyncio.sleep(gap)
    return tasks


def test_concurrent_requests_are_joined_in_arrival_order_and_split_back():
    run = Recorder()
    seen = []
    feeds = [request(1, 1), request(2, 3), request(3, 2), request(4, 1)]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=16, max_delay=0.3,
                          observe=lambda rows, requests: seen.append((rows, requests)))
        tasks = await submit_spaced(batcher, feeds)
        results = await asyncio.gather(*tasks)
        await batcher.close()
        return results

    results = drive(body)
    assert run.rows() == [7]
    joined, outputs = run.batches[0]
    assert outputs == BOTH
    assert joined["x"].tobytes() == np.concatenate([f["x"] for f in feeds]).tobytes()
    for result, own in zip(results, feeds):
        check_own(result, own)
    assert seen == [(7, 4)]


@pytest.mark.parametrize("other", [
    pytest.param(lambda tag: (request(tag, width=4), BOTH), id="shape past axis 0"),
    pytest.param(lambda tag: ({"x": request(tag)["x"].reshape(1, 3, 1)}, BOTH), id="rank"),
    pytest.param(lambda tag: (request(tag, dtype=np.float64), BOTH), id="dtype"),
    pytest.param(lambda tag: (request(tag), ("double",)), id="outputs"),
    pytest.param(lambda tag: (request(tag), ("negated", "double")), id="outputs order"),
])
def test_requests_that_differ_are_never_joined(other):
    run = Recorder()
    plain = [request(tag) for tag in (1, 3, 5)]
    odd = [other(tag) for tag in (2, 4, 6)]
    # interleaved: plain, odd, plain, odd, ...
    feeds_list = [f for pair in zip(plain, (f for f, _ in odd)) for f in pair]
    outputs_list = [o for pair in zip([BOTH] * 3, (o for _, o in odd)) for o in pair]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=16, max_delay=0.2)
        tasks = await submit_spaced(batcher, feeds_list, outputs_list)
        results = await asyncio.gather(*tasks)
        await batcher.close()
        return results

    results = drive(body)
    for result, feeds, outputs in zip(results, feeds_list, outputs_list):
        check_own(result, feeds, outputs)
    assert sorted(run.rows()) == [3, 3]
    for joined, outputs in run.batches:
        tags = sorted({int(v) // 1000 for v in joined["x"].reshape(-1)})
        assert tags in ([1, 3, 5], [2, 4, 6])
        if tags == [1, 3, 5]:
            assert outputs == BOTH and joined["x"].shape[1:] == (3,) \
                and joined["x"].dtype == np.float32
        else:
            assert joined["x"].shape[1:] == odd[0][0]["x"].shape[1:] \
                and joined["x"].dtype == odd[0][0]["x"].dtype and outputs == odd[0][1]


def test_a_batch_holds_at_most_max_rows():
    run = Recorder()
    feeds_list = [request(tag, rows) for tag, rows in enumerate([1, 2, 1, 3, 1, 1, 2], 1)]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=4, max_delay=0.3)
        tasks = await submit_spaced(batcher, feeds_list, gap=0)
        results = await asyncio.gather(*tasks)
        await batcher.close()
        return results

    results = drive(body)
    for result, feeds in zip(results, feeds_list):
        check_own(result, feeds)
    assert all(rows <= 4 for rows in run.rows())
    assert sum(run.rows()) == 11
    # taken in arrival order: 1+2+1 (3 more would pass 4), 3+1, 1+2
    assert run.rows() == [4, 4, 3]
    order = np.concatenate([feeds["x"] for feeds, _ in run.batches])
    assert order.tobytes() == np.concatenate([f["x"] for f in feeds_list]).tobytes()


def test_a_full_batch_does_not_wait_out_the_delay():
    run = Recorder()

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=2, max_delay=20.0)
        start = time.monotonic()
        results = await asyncio.gather(batcher.submit(request(1), BOTH),
                                       batcher.submit(request(2), BOTH))
        elapsed = time.monotonic() - start
        await batcher.close()
        return results, elapsed

    (first, second), elapsed = drive(body)
    check_own(first, request(1))
    check_own(second, request(2))
    assert run.rows() == [2]
    assert elapsed < 5.0


@pytest.mark.parametrize("rows", [4, 9])
def test_a_request_of_max_rows_or_more_runs_alone(rows):
    run = Recorder()
    big = request(7, rows)
    small = [request(1), request(2)]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=4, max_delay=0.2)
        tasks = await submit_spaced(batcher, [small[0], big, small[1]])
        results = await asyncio.gather(*tasks)
        await batcher.close()
        return results

    results = drive(body)
    check_own(results[0], small[0])
    check_own(results[1], big)
    check_own(results[2], small[1])
    assert sorted(run.rows()) == sorted([rows, 2])
    alone = [feeds for feeds, _ in run.batches if len(feeds["x"]) == rows]
    assert alone[0]["x"].tobytes() == big["x"].tobytes()


def test_max_rows_of_one_runs_each_request_alone():
    run = Recorder()
    feeds_list = [request(tag) for tag in range(1, 4)]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=1, max_delay=0.2)
        return await asyncio.gather(*(batcher.submit(f, BOTH) for f in feeds_list))

    for result, feeds in zip(drive(body), feeds_list):
        check_own(result, feeds)
    assert run.rows() == [1, 1, 1]


def test_a_lone_request_waits_about_max_delay():
    run = Recorder()
    delay = 0.15

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=8, max_delay=delay)
        times = []
        for tag in (1, 2):  # the second after the first consumer's batch, on the same one
            start = time.monotonic()
            result = await batcher.submit(request(tag), ("rows",))
            times.append(time.monotonic() - start)
            check_own(result, request(tag), ("rows",))
        await batcher.close()
        return times

    for elapsed in drive(body):
        assert 0.8 * delay <= elapsed < delay + 1.5
    assert run.rows() == [1, 1]


def test_requests_arriving_during_a_run_gather_into_the_next_batch():
    run = Recorder()
    run.hold = threading.Event()
    later = [request(tag) for tag in (2, 3, 4)]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=8, max_delay=0.01)
        first = asyncio.create_task(batcher.submit(request(1), BOTH))
        while not run.started.is_set():  # the first batch (of one) is running
            await asyncio.sleep(0.005)
        tasks = await submit_spaced(batcher, later)
        await asyncio.sleep(0.1)  # well past max_delay: they wait for the run, not the delay
        assert len(run.batches) == 1 and batcher.depth == 3
        run.hold.set()
        results = await asyncio.gather(first, *tasks)
        await batcher.close()
        return results

    results = drive(body, workers=2)
    assert run.rows() == [1, 3]
    assert run.most_at_once == 1
    for result, feeds in zip(results, [request(1)] + later):
        check_own(result, feeds)


def test_a_failing_joined_run_is_rerun_per_request_and_only_the_culprit_fails():
    run = Recorder()
    bad = request(2, 2)
    bad["x"][1, 1] = np.nan
    feeds_list = [request(1), bad, request(3, 3)]

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=16, max_delay=0.2)
        tasks = await submit_spaced(batcher, feeds_list)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        # the batcher goes on serving
        after = await batcher.submit(request(4), BOTH)
        await batcher.close()
        return results, after

    (first, failed, third), after = drive(body)
    check_own(first, feeds_list[0])
    check_own(third, feeds_list[2])
    assert isinstance(failed, ValueError) and "NaN" in str(failed)
    check_own(after, request(4))
    # the joined run, then each request alone in arrival order, then the next request
    assert run.rows() == [6, 1, 2, 3, 1]
    for (feeds, _), own in zip(run.batches[1:4], feeds_list):
        np.testing.assert_array_equal(feeds["x"], own["x"])


def test_a_failing_request_alone_gets_its_exception():
    run = Recorder()
    bad = request(1, 5)
    bad["x"][0, 0] = np.nan

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=4, max_delay=0.05)
        with pytest.raises(ValueError, match="NaN"):
            await batcher.submit(bad, BOTH)  # over max_rows: run at once, alone
        lone = bad.copy()
        lone["x"] = bad["x"][:1]
        with pytest.raises(ValueError, match="NaN"):
            await batcher.submit(lone, BOTH)  # through the queue, a batch of one
        await batcher.close()

    drive(body)
    assert run.rows() == [5, 1]


def test_close_finishes_the_queued_requests():
    run = Recorder()
    feeds_list = [request(tag, rows) for tag, rows in enumerate([1, 2, 1], 1)]
    wide = request(9, width=5)  # another join key, queued behind

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=64, max_delay=30.0)
        tasks = await submit_spaced(batcher, feeds_list + [wide], gap=0)
        await asyncio.sleep(0.01)
        assert batcher.depth == 4
        start = time.monotonic()
        await batcher.close()
        elapsed = time.monotonic() - start
        assert all(task.done() for task in tasks)
        return [task.result() for task in tasks], elapsed

    results, elapsed = drive(body)
    assert elapsed < 5.0  # not the 30 s delay
    for result, feeds in zip(results, feeds_list + [wide]):
        check_own(result, feeds)
    assert sorted(run.rows()) == [1, 4]


def test_close_without_requests_returns():
    async def body(executor):
        batcher = Batcher(Recorder(), executor, max_rows=4, max_delay=0.05)
        await batcher.close()
        second = Batcher(Recorder(), executor, max_rows=4, max_delay=0.05)
        check_own(await second.submit(request(1), BOTH), request(1))
        await second.close()

    drive(body)


def test_queued_depth_is_reported():
    run = Recorder()
    depths = []

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=16, max_delay=0.1, queued=depths.append)
        tasks = await submit_spaced(batcher, [request(1), request(2), request(3)])
        await asyncio.gather(*tasks)
        await batcher.close()

    drive(body)
    assert depths[:3] == [1, 2, 3] and depths[-1] == 0


def test_a_failure_outside_the_run_answers_every_request_of_the_batch():
    """A hook that raises (here the batch-size observer) must not leave requests waiting:
    each gets the error, and the batcher serves the next batch."""
    run = Recorder()
    calls = []

    def observe(rows, requests):
        calls.append(rows)
        if len(calls) == 1:
            raise RuntimeError("observer broke")

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=8, max_delay=0.05, observe=observe)
        tasks = await submit_spaced(batcher, [request(1), request(2)])
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results), results
        check_own(await batcher.submit(request(3), BOTH), request(3))
        await batcher.close()

    drive(body)


def test_adaptive_a_lone_request_runs_at_once_and_a_crowd_still_gathers():
    """With ``adaptive`` (the server's), one client at a time is never made to wait out the
    delay; requests that queue up while a batch runs are joined as before."""
    run = Recorder(seconds=0.05)

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=8, max_delay=1.0, adaptive=True)
        started = time.monotonic()
        for tag in range(3):  # one at a time: each runs at once, not after 1 s
            check_own(await batcher.submit(request(tag), BOTH), request(tag))
        assert time.monotonic() - started < 0.9
        tasks = await submit_spaced(batcher, [request(10 + i) for i in range(6)], gap=0.001)
        for i, task in enumerate(tasks):
            check_own(await task, request(10 + i))
        await batcher.close()

    drive(body)
    assert run.rows()[:3] == [1, 1, 1]
    assert max(run.rows()[3:]) > 1, run.rows()  # the later ones queued behind a run, joined


def test_a_queued_request_whose_caller_gave_up_is_not_run():
    """A request past its deadline (the server cancels its wait) leaves the queue unrun."""
    run = Recorder()
    run.hold = threading.Event()

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=4, max_delay=0.001)
        first = asyncio.create_task(batcher.submit(request(1), BOTH))  # its run held
        while not run.started.is_set():
            await asyncio.sleep(0.001)
        given_up = asyncio.create_task(batcher.submit(request(2), BOTH))
        kept = asyncio.create_task(batcher.submit(request(3), BOTH))
        await asyncio.sleep(0.01)
        given_up.cancel()
        run.hold.set()
        results = await asyncio.gather(first, kept)
        await batcher.close()
        return results

    first, kept = drive(body)
    check_own(first, request(1))
    check_own(kept, request(3))
    assert run.rows() == [1, 1]  # request 2 never ran


def test_a_joined_run_ended_by_its_time_limit_fails_every_request_once():
    """Each request of a batch whose run reached its time limit gets that error; none is
    run again alone (each would take as long)."""
    from mixrt.errors import RunTerminated

    calls = []

    def run(feeds, outputs):
        calls.append(len(feeds["x"]))
        raise RunTerminated("the run stopped at node 'n': its RunOptions.timeout passed")

    async def body(executor):
        batcher = Batcher(run, executor, max_rows=8, max_delay=0.05)
        tasks = await submit_spaced(batcher, [request(1), request(2), request(3)])
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await batcher.close()
        return results

    results = drive(body)
    assert all(isinstance(result, RunTerminated) for result in results)
    assert calls == [3]


@pytest.mark.parametrize("max_rows", [1, 8])
def test_past_max_queue_waiting_a_request_is_refused_at_once_with_a_retry(max_rows):
    async def body(executor):
        recorder = Recorder()
        recorder.hold = threading.Event()
        batcher = Batcher(recorder, executor, max_rows=max_rows, max_delay=0.0,
                          adaptive=True, max_queue=2, name="model m")
        first = asyncio.ensure_future(batcher.submit(request(0), BOTH))
        await asyncio.sleep(0.05)  # running, held: the queue is empty
        waiting = [asyncio.ensure_future(batcher.submit(request(i), BOTH)) for i in (1, 2)]
        await asyncio.sleep(0.05)
        assert batcher.depth == 2
        started = time.perf_counter()
        with pytest.raises(Overloaded, match="model m is busy: 2 requests already queued") \
                as refused:
            await batcher.submit(request(3), BOTH)
        assert time.perf_counter() - started < 0.01
        assert refused.value.retry_after > 0 and refused.value.headers()["Retry-After"] == "1"
        recorder.hold.set()
        for task, tag in zip([first, *waiting], range(3)):
            check_own(await task, request(tag))
        check_own(await batcher.submit(request(4), BOTH), request(4))  # room again
        await batcher.close()
    drive(body)


def test_max_queue_zero_admits_only_while_the_model_is_idle():
    async def body(executor):
        recorder = Recorder()
        recorder.hold = threading.Event()
        batcher = Batcher(recorder, executor, max_rows=1, max_delay=0.0, max_queue=0)
        running = asyncio.ensure_future(batcher.submit(request(0), BOTH))
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded):
            await batcher.submit(request(1), BOTH)
        recorder.hold.set()
        check_own(await running, request(0))
        check_own(await batcher.submit(request(2), BOTH), request(2))  # idle again
    drive(body)


def test_a_request_is_told_where_its_time_went_and_each_run_is_reported():
    runs = []

    async def body(executor):
        batcher = Batcher(Recorder(seconds=0.02), executor, max_rows=8, max_delay=0.05,
                          executed=lambda rows, seconds: runs.append((rows, seconds)))
        timings = [Timing(), Timing()]
        await asyncio.gather(*(batcher.submit(request(i, rows=2), BOTH, timings[i])
                               for i in range(2)))
        await batcher.close()
        return timings
    timings = drive(body)
    assert runs and runs[0][0] == 4 and runs[0][1] >= 0.02  # one joined run of 4 rows
    for timing in timings:
        assert timing.rows == 4 and timing.ran >= 0.02 and timing.queued >= 0
