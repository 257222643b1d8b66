"""Each model's inference statistics in the shape Triton's tools read: counts and cumulative
nanoseconds of each request's stages (queue, compute input, compute infer, compute output;
success and fail), per batch size, and the time of the last inference, served at
``GET /v2/models[/NAME[/versions/V]]/stats`` and by gRPC's ``ModelStatistics``, so that
``perf_analyzer`` and model-analyzer can profile a mixrt server.

The numbers are Prometheus counters in the server's multiprocess folder (``metrics.py``):
every worker adds to its own file, and a query read by any worker sums them all, so a
tool that takes the difference of two queries sees every request, whichever worker
answered it. A request's stages: ``compute_input`` decodes and checks its tensors,
``queue`` waits for a run (and for company, where batching), ``compute_infer`` is its
run's whole time (a joined run's, shared by its requests), ``compute_output`` encodes the
answer; ``success`` is the request's whole time at the model.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

from prometheus_client import REGISTRY, Counter, Gauge

from mixrt.serve.metrics import aggregate_registry

STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
BATCH_STAGES = ("compute_input", "compute_infer", "compute_output")
LABELS = ("model", "version", "stage")
BATCH_LABELS = ("model", "version", "batch_size", "stage")


@lru_cache(maxsize=None)
def _board() -> dict:
    """The counters, made on first use (after ``metrics.use_folder``)."""
    return {
        "count": Counter("mixrt_stats_count", "requests through each stage", LABELS),
        "seconds": Counter("mixrt_stats_seconds", "cumulative seconds in each stage", LABELS),
        "inferences": Counter("mixrt_stats_inferences", "rows inferred", LABELS[:2]),
        "executions": Counter("mixrt_stats_executions", "runs of the model", LABELS[:2]),
        "batch_count": Counter("mixrt_stats_batch_count", "runs of each batch size",
                               BATCH_LABELS),
        "batch_seconds": Counter("mixrt_stats_batch_seconds", "cumulative seconds of each "
                                 "stage by batch size", BATCH_LABELS),
        "last": Gauge("mixrt_stats_last_inference_ms", "when the last request was answered, "
                      "ms since the epoch", LABELS[:2], multiprocess_mode="max"),
    }


class Recorder:
    """One model version's statistics: ``request(...)`` per answered request,
    ``execution(rows, seconds)`` per run. Its counters are looked up once (a labelled
    counter's lookup cost as much as its increment)."""

    def __init__(self, model: str, version: str):
        self.labels = (model, version)
        self._children: dict = {}

    def _child(self, name: str, *labels):
        key = (name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _board()[name].labels(*self.labels, *labels)
        return child

    def request(self, ok: bool, total: float, decode: float = 0.0, queued: float = 0.0,
                ran: float = 0.0, encode: float = 0.0, rows: int = 0) -> None:
        stages = {"success" if ok else "fail": total}
        if ok:
            stages.update(queue=queued, compute_input=decode, compute_infer=ran,
                          compute_output=encode)
        for stage, seconds in stages.items():
            self._child("count", stage).inc()
            self._child("seconds", stage).inc(seconds)
        if ok and rows:
            size = str(rows)
            self._child("batch_seconds", size, "compute_input").inc(decode)
            self._child("batch_seconds", size, "compute_output").inc(encode)
        self._child("last").set(time.time() * 1e3)

    def execution(self, rows: int, seconds: float) -> None:
        self._child("inferences").inc(rows)
        self._child("executions").inc()
        size = str(rows)
        for stage in BATCH_STAGES:
            self._child("batch_count", size, stage).inc()
        self._child("batch_seconds", size, "compute_infer").inc(seconds)


def model_stats(served: list[tuple[str, str]]) -> list[dict]:
    """Triton's ``model_stats`` entries for the ``(name, version)`` pairs ``served``, in
    that order: zeros for a version not yet asked."""
    sums = _read()
    return [_entry(name, version, sums) for name, version in served]


def _read() -> dict:
    """{(sample name, labels as a sorted tuple): value} over every process."""
    registry = aggregate_registry() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") \
        else REGISTRY
    _board()
    sums: dict = {}
    for family in registry.collect():
        if not family.name.startswith("mixrt_stats_"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = (sample.name, tuple(sorted(sample.labels.items())))
            sums[key] = sums.get(key, 0.0) + sample.value
    return sums


def _entry(name: str, version: str, sums: dict) -> dict:
    def value(sample: str, **labels) -> float:
        wanted = tuple(sorted({"model": name, "version": version, **labels}.items()))
        return sums.get((sample, wanted), 0.0)

    def duration(stage: str, sample: str = "mixrt_stats", **labels) -> dict:
        return {"count": int(value(f"{sample}_count_total", stage=stage, **labels)),
                "ns": int(value(f"{sample}_seconds_total", stage=stage, **labels) * 1e9)}

    sizes = sorted({int(dict(labels)["batch_size"]) for sample, labels in sums
                    if sample == "mixrt_stats_batch_count_total"
                    and dict(labels).get("model") == name
                    and dict(labels).get("version") == version})
    return {
        "name": name, "version": version,
        "last_inference": int(value("mixrt_stats_last_inference_ms")),
        "inference_count": int(value("mixrt_stats_inferences_total")),
        "execution_count": int(value("mixrt_stats_executions_total")),
        "inference_stats": {**{stage: duration(stage) for stage in STAGES},
                            "cache_hit": {"count": 0, "ns": 0},
                            "cache_miss": {"count": 0, "ns": 0}},
        "batch_stats": [{"batch_size": size,
                         **{stage: duration(stage, "mixrt_stats_batch", batch_size=str(size))
                            for stage in BATCH_STAGES}} for size in sizes],
        "memory_usage": [],
    }
