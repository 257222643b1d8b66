"""Samplers decide which sample indices are read, and in what order and grouping.

A sampler is an iterable of indices with a ``len``; a batch sampler is an iterable of lists
of indices. Samplers run in the thread that iterates the DataLoader (never in its workers),
so they need no locking and their random draws happen in a reproducible order.
"""

from __future__ import annotations

import numpy as np

from mixrt import random as mixrt_random
from mixrt.base.errors import InputError
from mixrt.gluon.data.dataset import _check_part

LAST_BATCH = ("keep", "discard", "rollover")


class Sampler:
    """Base class: ``__iter__`` yields indices, ``__len__`` says how many."""

    def __iter__(self):
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """``start, start + 1, ..., start + length - 1``."""

    def __init__(self, length: int, start: int = 0):
        self._length, self._start = _check_length(length), int(start)

    def __iter__(self):
        return iter(range(self._start, self._start + self._length))

    def __len__(self) -> int:
        return self._length


class RandomSampler(Sampler):
    """A fresh permutation of ``range(length)`` every epoch.

    The generator is spawned from mixrt's when the sampler is made, so ``mixrt.random.seed``
    called *before* building the sampler (or the DataLoader) fixes every epoch's order, and
    other code drawing random numbers in between does not shift it."""

    def __init__(self, length: int):
        self._length = _check_length(length)
        self._rng = mixrt_random.spawn()

    def __iter__(self):
        return iter(self._rng.permutation(self._length).tolist())

    def __len__(self) -> int:
        return self._length


class BatchSampler(Sampler):
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    ``last_batch`` says what happens to a final batch that is short: ``"keep"`` yields it,
    ``"discard"`` drops it, ``"rollover"`` carries its indices into the first batch of the
    next epoch (so no sample is skipped and every batch is full)."""

    def __init__(self, sampler, batch_size: int, last_batch: str = "keep"):
        if int(batch_size) < 1:
            raise InputError(f"batch_size must be at least 1, got {batch_size}")
        if last_batch not in LAST_BATCH:
            raise InputError(f"last_batch must be one of {', '.join(map(repr, LAST_BATCH))}; "
                             f"got {last_batch!r}")
        self._sampler, self._batch_size, self._last_batch = sampler, int(batch_size), last_batch
        self._carried: list = []

    def __iter__(self):
        batch, self._carried = self._carried, []
        for index in self._sampler:
            batch.append(index)
            if len(batch) == self._batch_size:
                yield batch
                batch = []
        if batch and self._last_batch == "keep":
            yield batch
        elif batch and self._last_batch == "rollover":
            self._carried = batch

    def __len__(self) -> int:
        total = len(self._sampler) + len(self._carried)
        if self._last_batch == "keep":
            return -(-total // self._batch_size)
        return total // self._batch_size


class SplitSampler(Sampler):
    """Part ``part_index`` of ``num_parts`` equal parts of ``range(length)``, for data-parallel
    training where each worker reads its own part.

    Every part has ``ceil(length / num_parts)`` indices: when ``length`` does not divide
    evenly the index list is padded by wrapping around to its start, so a few samples are
    read twice per epoch. Equal counts matter: in a synchronous job each step waits for every
    worker's gradients, and a worker with one batch fewer would leave the others waiting
    forever.

    ``shuffle=True`` reorders the part's own indices every epoch (from a generator spawned
    from mixrt's). The parts themselves stay fixed, so workers never need to agree on a
    random permutation to keep their parts disjoint."""

    def __init__(self, length: int, num_parts: int = 1, part_index: int = 0,
                 shuffle: bool = False):
        length = _check_length(length)
        num_parts, part_index = _check_part(num_parts, part_index, "num_parts", "part_index")
        per_part = -(-length // num_parts)
        wrapped = np.resize(np.arange(length), per_part * num_parts)  # cycles from the start
        start = part_index * per_part
        self._indices = wrapped[start:start + per_part].tolist()
        self._rng = mixrt_random.spawn() if shuffle else None

    def __iter__(self):
        if self._rng is None:
            return iter(self._indices)
        return iter(self._rng.permutation(self._indices).tolist())

    def __len__(self) -> int:
        return len(self._indices)


def _check_length(length) -> int:
    if int(length) < 0:
        raise InputError(f"a sampler's length must be >= 0, got {length}")
    return int(length)


__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "BatchSampler", "SplitSampler",
           "LAST_BATCH"]
