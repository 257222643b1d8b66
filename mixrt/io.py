"""Data iterators: ``NDArrayIter`` over in-memory arrays (shuffling, padding, per-worker
sharding) and ``PrefetchingIter`` that prepares the next batches on a background thread.

Sharding gives every worker the same number of batches: the dataset is cut into
``num_parts`` equal shares after one shuffle that every worker computes identically from the
shared seed, and the remainder (fewer than ``num_parts`` samples) is left out of that epoch.
Unequal batch counts would make a synchronous data-parallel job wait forever for the worker
with more batches.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np

from mixrt import random_streams as mixrt_random
from mixrt.base.errors import InputError

LAST_BATCH = ("pad", "discard", "roll_over")


@dataclass
class DataBatch:
    """One batch: ``data`` and ``label`` arrays; ``pad`` samples at the end are repeats that
    metrics must not count."""

    data: np.ndarray
    label: np.ndarray | None
    pad: int = 0


class NDArrayIter:
    """Batches of ``data`` (and ``label``) along axis 0.

    ``shuffle`` reorders every epoch from a generator seeded by ``seed`` (default: drawn from
    :func:`mixrt.random.generator`, so ``mixrt.random.seed`` fixes it); ``last_batch``
    (``last_batch_handle``, MXNet's name for it) ``"pad"`` fills the last batch with samples
    from the start, ``"discard"`` drops it, ``"roll_over"`` keeps the samples left over at
    the end of an epoch for the first batch of the next; ``num_parts``/``part_index`` select
    this worker's share. Every worker's share has the same size, so every worker runs the
    same number of batches in each epoch, whichever ``last_batch``."""

    def __init__(self, data, label=None, batch_size: int = 32, *, shuffle: bool = False,
                 last_batch: str | None = None, num_parts: int = 1, part_index: int = 0,
                 seed: int | None = None, last_batch_handle: str | None = None):
        self.data = np.asarray(data)
        self.label = None if label is None else np.asarray(label)
        last_batch = _last_batch(last_batch, last_batch_handle)
        _check_arguments(self.data, self.label, batch_size, last_batch, num_parts, part_index)
        self.batch_size, self.shuffle, self.last_batch = int(batch_size), shuffle, last_batch
        self.num_parts, self.part_index = int(num_parts), int(part_index)
        if seed is None:
            seed = int(mixrt_random.generator().integers(0, 2 ** 63))
        self._rng = np.random.default_rng(seed)
        self._order = np.arange(0)
        self._position = 0
        self.reset()

    # -- epochs --------------------------------------------------------------------------

    @property
    def share(self) -> int:
        """Samples this worker sees per epoch (the same on every worker)."""
        return len(self.data) // self.num_parts

    @property
    def num_batches(self) -> int:
        """Batches in this epoch (under roll_over, the samples carried over count)."""
        return self._batches_of(len(self._order))

    def _batches_of(self, samples: int) -> int:
        full, rest = divmod(samples, self.batch_size)
        return full + (1 if rest and self.last_batch == "pad" else 0)

    def reset(self) -> None:
        """Start a new epoch (reshuffled when ``shuffle``). Under roll_over the samples an
        epoch run to its end left unserved come first."""
        order = self._rng.permutation(len(self.data)) if self.shuffle else \
            np.arange(len(self.data))
        start = self.part_index * self.share
        carried = self._left_over()
        self._order = np.concatenate([carried, order[start:start + self.share]])
        self._position = 0

    def _left_over(self) -> np.ndarray:
        finished = len(self._order) and self._position >= self.num_batches
        if self.last_batch != "roll_over" or not finished:
            return np.zeros(0, dtype=np.int64)
        return self._order[self.num_batches * self.batch_size:]

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self.num_batches

    def __next__(self) -> DataBatch:
        if self._position >= self.num_batches:
            raise StopIteration
        start = self._position * self.batch_size
        picked = self._order[start:start + self.batch_size]
        pad = self.batch_size - len(picked)
        if pad:
            picked = np.concatenate([picked, self._order[:pad]])
        self._position += 1
        label = None if self.label is None else self.label[picked]
        return DataBatch(self.data[picked], label, pad)

    # -- resuming ------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able state: the shuffle generator and the position in the epoch."""
        return {"rng": self._rng.bit_generator.state, "order": self._order.tolist(),
                "position": self._position}

    def set_state(self, state: dict) -> None:
        """Resume from :meth:`state` (read back from a checkpoint). A state this iterator
        could not have written (another dataset size, sharding or batch size, a damaged
        file) is an ``InputError`` naming the key, and changes nothing."""
        if not isinstance(state, dict) or not {"rng", "order", "position"} <= set(state):
            raise InputError(f"iterator state must be a dict with 'rng', 'order' and "
                             f"'position', got {_brief(state)}")
        order = self._checked_order(state["order"])
        position = state["position"]
        if isinstance(position, bool) or not isinstance(position, int) or \
                not 0 <= position <= self._batches_of(len(order)):
            raise InputError(f"iterator state 'position' must be an int in [0, "
                             f"{self._batches_of(len(order))}], got {_brief(position)}")
        rng = np.random.default_rng()
        try:
            rng.bit_generator.state = state["rng"]
        except (TypeError, ValueError, KeyError) as exc:
            raise InputError(f"iterator state 'rng' is not a {type(rng.bit_generator).__name__}"
                             f" state: {exc}") from exc
        self._rng, self._order, self._position = rng, order, position

    def _checked_order(self, order) -> np.ndarray:
        """This worker's sample order: ``share`` distinct indices into the data, after
        (roll_over) fewer than ``batch_size`` carried over from the epoch before."""
        if isinstance(order, (np.ndarray, tuple)):
            order = np.asarray(order).tolist()
        most = self.share + (self.batch_size - 1 if self.last_batch == "roll_over" else 0)
        if not isinstance(order, list) or not self.share <= len(order) <= most or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
            expected = f"{self.share}" if most == self.share else \
                f"{self.share} to {most}"
            raise InputError(f"iterator state 'order' must be a list of {expected} sample "
                             f"indices (this iterator's share), got {_brief(order)}")
        array = np.asarray(order, dtype=np.int64) if order else np.zeros(0, np.int64)
        shared = array[len(array) - self.share:]
        if array.size and (array.min() < 0 or array.max() >= len(self.data) or
                           len(np.unique(shared)) != shared.size):
            raise InputError(f"iterator state 'order' must hold distinct indices in [0, "
                             f"{len(self.data)})")
        return array


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _last_batch(last_batch, last_batch_handle) -> str:
    if last_batch is not None and last_batch_handle is not None and \
            last_batch != last_batch_handle:
        raise InputError(f"last_batch={last_batch!r} and last_batch_handle="
                         f"{last_batch_handle!r} disagree; give one of them")
    return last_batch or last_batch_handle or "pad"


def _check_arguments(data, label, batch_size, last_batch, num_parts, part_index) -> None:
    if label is not None and len(label) != len(data):
        raise InputError(f"data has {len(data)} samples but label has {len(label)}; they "
                         f"must match along axis 0")
    if int(batch_size) < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    if last_batch not in LAST_BATCH:
        raise InputError(f"last_batch must be one of {LAST_BATCH}, got {last_batch!r}")
    if not 0 <= int(part_index) < int(num_parts):
        raise InputError(f"part_index must be in [0, num_parts={num_parts}), got {part_index}")
    if len(data) // int(num_parts) == 0:
        raise InputError(f"{len(data)} samples cannot be split over {num_parts} workers")


class PrefetchingIter:
    """Iterates ``source`` on a background thread, ``depth`` batches ahead, so slicing and
    copying the next batch overlaps the training step. Exceptions surface at ``next``."""

    _DONE = object()

    def __init__(self, source, depth: int = 2):
        self.source, self.depth = source, depth
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self):
        self._queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._fill, args=(self._queue,), daemon=True,
                                        name="mixrt-prefetch")
        self._thread.start()
        return self

    def _fill(self, out: queue.Queue) -> None:
        try:
            for batch in self.source:
                out.put(batch)
        except BaseException as exc:  # handed to the consumer, raised at its next()
            out.put(exc)
            return
        out.put(self._DONE)

    def __next__(self):
        if self._queue is None:
            iter(self)
        item = self._queue.get()
        if item is self._DONE:
            self._thread.join()
            self._queue = None
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue = None
            raise item
        return item
