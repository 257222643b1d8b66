"""DataLoader: reads a dataset in batches, optionally on worker threads.

    loader = DataLoader(ArrayDataset(x, y), batch_size=64, shuffle=True, num_workers=4)
    for data, label in loader:          # NDArrays; len(loader) batches per epoch
        ...

Workers are threads, never processes, so nothing is pickled: a dataset may hold open files,
lambdas or a database handle. Threads pay off when reading a sample waits on I/O or on
NumPy, image decoders and other code that releases the GIL; a transform written in pure
Python runs no faster on more threads.

Batches arrive in sampler order whatever order the workers finish in. Every epoch
(``iter(loader)``) gets its own thread pool; it is shut down when the epoch ends, when
loading fails, or when the iterator is closed (``close()``) or dropped early, so an abandoned
epoch leaves no threads behind once the batches already being loaded are done.

MXNet's options: ``thread_pool`` chooses between its worker processes and threads; mixrt's
workers are always threads (nothing is pickled), so both values load the same way.
``pin_memory=True`` hands batches out on ``cpu_pinned(pin_device_id)``, MXNet's context for
page-locked memory (host memory to mixrt). ``auto_reload=True`` starts loading an epoch's
first batches before it is asked for: when the loader is made and whenever an epoch ends.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

from mixrt.base.errors import InputError, MixrtError
from mixrt.context import cpu_pinned
from mixrt.gluon.data.batchify import default_batchify_fn
from mixrt.gluon.data.sampler import BatchSampler, RandomSampler, SequentialSampler


class DataLoaderError(MixrtError):
    """Loading a batch failed. The message names the batch's sample indices (and the sample
    being read, when reading failed); ``indices`` holds them and ``__cause__`` is the
    original exception."""

    def __init__(self, message: str, *, indices=()):
        super().__init__(message)
        self.indices = list(indices)


class DataLoader:
    """Batches of ``dataset``, MXNet Gluon's argument rules.

    Either ``batch_size`` (with ``shuffle`` or a ``sampler``, and ``last_batch``: ``"keep"``
    by default, ``"discard"`` or ``"rollover"``) or a ``batch_sampler`` that yields lists of
    indices. ``batchify_fn`` turns a list of samples into a batch (default:
    :func:`default_batchify_fn`). ``num_workers > 0`` loads on that many threads with
    ``prefetch`` (default ``2 * num_workers``) batches in flight beyond the one being
    consumed; ``timeout`` seconds is the longest the consumer waits for one batch.
    ``pin_memory``, ``pin_device_id``, ``thread_pool`` and ``auto_reload``: see the module's
    docstring."""

    def __init__(self, dataset, batch_size=None, shuffle=False, sampler=None, last_batch=None,
                 batch_sampler=None, batchify_fn=None, num_workers=0, pin_memory=False,
                 pin_device_id=0, prefetch=None, thread_pool=False, timeout=120,
                 auto_reload=False):
        self.dataset = dataset
        self.batch_sampler = _batch_sampler(dataset, batch_size, shuffle, sampler, last_batch,
                                            batch_sampler)
        self.batchify_fn = batchify_fn or default_batchify_fn
        self.num_workers = _at_least(num_workers, 0, "num_workers")
        self.prefetch = 2 * self.num_workers if prefetch is None else \
            _at_least(prefetch, 0, "prefetch")
        if not float(timeout) > 0:
            raise InputError(f"timeout must be a positive number of seconds, got {timeout}")
        self.timeout = float(timeout)
        self.pin_memory = bool(pin_memory)
        self.pin_device_id = _at_least(pin_device_id, 0, "pin_device_id")
        self.thread_pool = bool(thread_pool)  # threads either way: see the module docstring
        self.auto_reload = bool(auto_reload)
        self._started = self._start() if self.auto_reload and self.num_workers else None

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return (self._load(indices) for indices in iter(self.batch_sampler))
        started, self._started = self._started or self._start(), None
        return self._threaded(*started)

    def _start(self):
        """An epoch's thread pool with its first batches already submitted (as many as
        are loaded ahead of the one being consumed, and that one)."""
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="mixrt-data")
        batches, pending = iter(self.batch_sampler), deque()
        for indices in batches:
            pending.append((indices, pool.submit(self._load, indices)))
            if len(pending) > self.prefetch:
                break
        return pool, batches, pending

    def _threaded(self, pool, batches, pending):
        # A generator, so that dropping or closing it runs the finally clause.
        finished = False
        try:
            while pending:
                yield self._wait(*pending.popleft())
                for more in batches:  # asked for the next: one more goes in flight
                    pending.append((more, pool.submit(self._load, more)))
                    break
            finished = True
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if finished and self.auto_reload:
            self._started = self._start()

    def _wait(self, indices, future):
        try:
            return future.result(timeout=self.timeout)
        except TimeoutError:
            raise DataLoaderError(f"loading the batch of samples {_describe(indices)} took "
                                  f"longer than timeout={self.timeout:g} s",
                                  indices=indices) from None

    def _load(self, indices):
        samples = [self._read(index, indices) for index in indices]
        try:
            batch = self.batchify_fn(samples)
        except Exception as exc:
            raise DataLoaderError(f"batchify_fn failed on the batch of samples "
                                  f"{_describe(indices)}: {type(exc).__name__}: {exc}",
                                  indices=indices) from exc
        return _pinned(batch, self.pin_device_id) if self.pin_memory else batch

    def _read(self, index, indices):
        try:
            return self.dataset[index]
        except Exception as exc:
            raise DataLoaderError(f"reading sample {index} failed (batch of samples "
                                  f"{_describe(indices)}): {type(exc).__name__}: {exc}",
                                  indices=indices) from exc


def _batch_sampler(dataset, batch_size, shuffle, sampler, last_batch, batch_sampler):
    """The batch sampler the arguments describe, or an InputError naming the conflict."""
    if batch_sampler is not None:
        also = [name for name, given in (("batch_size", batch_size is not None),
                                         ("shuffle", bool(shuffle)),
                                         ("sampler", sampler is not None),
                                         ("last_batch", last_batch is not None)) if given]
        if also:
            raise InputError(f"batch_sampler decides the batches by itself; do not also pass "
                             f"{', '.join(also)}")
        return batch_sampler
    if batch_size is None:
        raise InputError("DataLoader needs batch_size (or a batch_sampler)")
    if sampler is None:
        sampler = RandomSampler(len(dataset)) if shuffle else SequentialSampler(len(dataset))
    elif shuffle:
        raise InputError("shuffle=True cannot be combined with a sampler: the sampler decides "
                         "the order (use RandomSampler for a shuffled one)")
    return BatchSampler(sampler, batch_size, last_batch or "keep")


def _pinned(batch, device_id: int):
    """``batch`` (an NDArray, or lists and tuples of them) on ``cpu_pinned(device_id)``;
    anything else is left as it is, as MXNet does."""
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pinned(part, device_id) for part in batch)
    if hasattr(batch, "as_in_context"):
        return batch.as_in_context(cpu_pinned(device_id))
    return batch


def _at_least(value, low: int, name: str) -> int:
    if int(value) != value or int(value) < low:
        raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _describe(indices, shown: int = 10) -> str:
    """Indices for a message: all of them, or the first few and a count for a large batch."""
    indices = list(indices)
    if len(indices) <= shown:
        return str(indices)
    head = ", ".join(map(str, indices[:shown - 2]))
    return f"[{head}, ..., {indices[-1]}] ({len(indices)} samples)"


__all__ = ["DataLoader", "DataLoaderError"]
