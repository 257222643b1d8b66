"""One Session, many request threads: throughput and correctness against serial calls.

A service shares one loaded model between its request threads. We call ``run`` 8 x N
times, once from a single thread and once from 8 threads (N calls each), each call with its
own input, and report runs per second both ways. Every threaded result is compared with the
serial result for the same input, so a race shows up here as a mismatch, not as a speed-up.
onnxruntime gets the same treatment (its ``InferenceSession.run`` is thread-safe) as the
reference for what 8 threads can buy on this machine.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from cases import make_case
from runners import mixrt_runner, ort_runner

THREADS = 8
DISTINCT_INPUTS = 16


@dataclass
class ThreadResult:
    runtime: str
    calls: int  # total run calls each way
    serial_per_s: float
    threaded_per_s: float
    identical: bool  # every threaded output bit-equal to the serial one for its input
    max_abs_diff: float

    @property
    def speedup(self) -> float:
        return self.threaded_per_s / self.serial_per_s


def _inputs(feeds: dict) -> list[dict]:
    """Distinct inputs: the case's input scaled a little differently for each."""
    return [{name: (value * np.float32(1 + k / 64)).astype(value.dtype)
             for name, value in feeds.items()} for k in range(DISTINCT_INPUTS)]


def _serial(run, inputs: list[dict], calls: int) -> tuple[float, list]:
    results = [None] * len(inputs)
    started = time.perf_counter()
    for index in range(calls):
        k = index % len(inputs)
        results[k] = run(inputs[k])
    return time.perf_counter() - started, results


def _threaded(run, inputs: list[dict], per_thread: int) -> tuple[float, list]:
    seen: list[list] = [[] for _ in range(THREADS)]
    failures: list[BaseException] = []
    gate = threading.Barrier(THREADS + 1)

    def worker(t: int) -> None:
        gate.wait()
        try:
            for i in range(per_thread):
                k = (t * per_thread + i) % len(inputs)
                seen[t].append((k, run(inputs[k])))
        except BaseException as exc:  # noqa: BLE001  (re-raised below, in the main thread)
            failures.append(exc)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    gate.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise failures[0]
    return elapsed, [pair for results in seen for pair in results]


def _compare(serial: list, threaded: list) -> tuple[bool, float]:
    identical, worst = True, 0.0
    for k, outputs in threaded:
        for got, want in zip(outputs, serial[k]):
            identical &= bool(np.array_equal(got, want))
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    return identical, worst


def measure(runner, feeds: dict, per_thread: int) -> ThreadResult:
    inputs = _inputs(feeds)
    calls = THREADS * per_thread
    runner.run(inputs[0])  # warm-up (mixrt plans its arena on the first call of a shape)
    serial_s, serial = _serial(runner.run, inputs, max(calls, len(inputs)))
    if calls < len(inputs):
        serial_s *= calls / len(inputs)
    threaded_s, threaded = _threaded(runner.run, inputs, per_thread)
    identical, worst = _compare(serial, threaded)
    return ThreadResult(runner.runtime, calls, calls / serial_s, calls / threaded_s,
                        identical, worst)


def measure_threads(model: str, per_thread: int, opt_level: int, intra_threads: int
                    ) -> list[ThreadResult]:
    case = make_case(model, 1)
    runners = [mixrt_runner(case.path, opt_level), ort_runner(case.path, intra_threads)]
    results = [measure(r, case.feeds, per_thread) for r in runners if r is not None]
    for r in results:
        print(f"  {r.runtime:12} serial {r.serial_per_s:7.1f}/s  8 threads "
              f"{r.threaded_per_s:7.1f}/s  x{r.speedup:.2f}  identical={r.identical}",
              flush=True)
    return results
