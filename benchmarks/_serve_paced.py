"""The parts of ``serve_bench.py``'s paced mode that need no server: the lengths a run
draws, how many of them a server meets first, the pacing of one client, and the table."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

SHORTEST, LONGEST = 8, 128  # the sequence lengths a paced run with new lengths draws from


@dataclass
class PacedResult:
    model: str
    runtime: str
    mode: str  # "paced 10 ms, fixed 64" or "paced 10 ms, new lengths"
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    started: str
    ended: str


def draw_lengths(count: int, seed: int, longest: int = LONGEST) -> list:
    """``count`` sequence lengths, uniform over SHORTEST..min(LONGEST, longest)."""
    top = min(LONGEST, longest)
    return [int(n) for n in np.random.default_rng(seed).integers(SHORTEST, top + 1, count)]


def first_seen(lengths: list, seen: list) -> int:
    """How many of ``lengths`` the server meets for the first time, after ``seen``."""
    known, fresh = set(seen), 0
    for length in lengths:
        fresh += length not in known
        known.add(length)
    return fresh


def paced(send, count: int, interval_s: float, clock=time.perf_counter,
          sleep=time.sleep) -> list:
    """``send(i)`` for each i below ``count``, each call starting ``interval_s`` after the
    previous one started, or at once where that one took longer (no burst to catch up):
    what the calls returned."""
    answers, due = [], clock()
    for index in range(count):
        wait = due - clock()
        if wait > 0:
            sleep(wait)
        due = clock() + interval_s
        answers.append(send(index))
    return answers


def paced_table(results: list) -> str:
    by_key = {(r.model, r.runtime, r.mode): r for r in results}
    lines = ["| model | runtime | mode | requests | p50 ms | p99 ms "
             "| mixrt / onnxruntime p50 | mixrt / onnxruntime p99 |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ratios = ["", ""]
        other = by_key.get((r.model, "onnxruntime", r.mode)) if r.runtime == "mixrt" else None
        if other is not None:
            ratios = [f"{mine / theirs:.2f}x" if theirs > 0 else ""
                      for mine, theirs in ((r.p50_ms, other.p50_ms), (r.p99_ms, other.p99_ms))]
        lines.append(f"| {r.model} | {r.runtime} | {r.mode} | {r.requests} | {r.p50_ms:.1f} "
                     f"| {r.p99_ms:.1f} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)
