"""The server's Prometheus metrics, one set per process and summed over ``--workers``.

With several worker processes each writes its values to files in one folder
(prometheus_client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``), and the supervisor's
``/metrics`` adds them up; :func:`use_folder` must run before the first metric is made,
which is why the metrics are made on first use and not at import.
"""

from __future__ import annotations

import os
from functools import lru_cache

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, multiprocess,
                               values)

LABELS = ("model", "version")
# seconds from a request's arrival at the model to its answer: 0.5 ms (a small MLP) up to
# 10 s (a large batch through a large model on a loaded CPU)
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def use_folder(folder: str) -> None:
    """Write every metric of this process (and of processes forked from it) under
    ``folder``, to be summed by :func:`aggregate_registry`."""
    os.makedirs(folder, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    values.ValueClass = values.get_value_class()


def aggregate_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def process_ended(pid: int) -> None:
    """Drop a worker's live gauges (its queue depth) once it has exited."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)


@lru_cache(maxsize=None)
def metrics() -> "Metrics":
    return Metrics()


class Metrics:
    def __init__(self):
        self.requests = Counter("mixrt_requests", "inference requests answered, by outcome "
                                "(ok, bad_request: refused with a 4xx, error: failed in the "
                                "model, timeout: a 504 past --request-timeout-s)",
                                LABELS + ("outcome",))
        self.latency = Histogram("mixrt_request_seconds", "time from a request's arrival at "
                                 "the model to its answer", LABELS, buckets=LATENCY_BUCKETS)
        self.batch_rows = Histogram("mixrt_batch_rows", "rows of each run of the model (a "
                                    "joined batch or a request alone)", LABELS,
                                    buckets=ROW_BUCKETS)
        self.batch_requests = Histogram("mixrt_batch_requests", "requests joined in each run",
                                        LABELS, buckets=ROW_BUCKETS)
        self.queue_depth = Gauge("mixrt_queue_depth", "requests waiting to be batched",
                                 LABELS, multiprocess_mode="livesum")
        self.compiled = Gauge("mixrt_compiled_kernels", "1 where the model's runs take the "
                              "compiled kernels, 0 while they run the NumPy tier",
                              LABELS, multiprocess_mode="livemin")
        self.batching = Gauge("mixrt_batching", "1 where requests to the model are joined "
                              "into batches, 0 where each runs alone", LABELS,
                              multiprocess_mode="livemin")
