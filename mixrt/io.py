"""MXNet's data iterators (``mx.io``): ``DataDesc``, ``DataBatch``, ``DataIter``,
``NDArrayIter``, ``CSVIter``, ``ResizeIter`` and ``PrefetchingIter``, as MXNet 1.9 serves
their batches (lists of NDArrays, ``pad``, ``provide_data``/``provide_label``).

    it = mixrt.io.NDArrayIter(x, y, batch_size=32, shuffle=True, last_batch_handle="pad")
    for batch in it:
        batch.data[0], batch.label[0], batch.pad
    it.reset()

MXNet's C++ iterators (``ImageRecordIter``, ``MNISTIter``, ``LibSVMIter``, ...,
``MXDataIter``) are not provided: calling one raises an InputError that says so.
``NDArrayIter``'s sharding and resumable state are mixrt's (``mixrt/io_ndarray.py``).
"""

from __future__ import annotations

import threading

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError, ModelLoadError
from mixrt.io_base import DataBatch, DataDesc, DataIter, read_ahead  # noqa: F401
from mixrt.io_ndarray import LAST_BATCH, NDArrayIter  # noqa: F401


class _ReadsCurrentBatch(DataIter):
    """MXNet's per-part readers for an iterator that keeps the batch ``iter_next`` made in
    ``current_batch``."""

    def getdata(self):
        return self.current_batch.data

    def getlabel(self):
        return self.current_batch.label

    def getindex(self):
        return self.current_batch.index

    def getpad(self):
        return self.current_batch.pad


class ResizeIter(_ReadsCurrentBatch):
    """``data_iter`` cut or stretched to ``size`` batches an epoch (restarting it when it
    runs out); ``reset_internal`` resets it with this one."""

    def __init__(self, data_iter, size, reset_internal=True):
        super().__init__()
        self.data_iter, self.size, self.reset_internal = data_iter, size, reset_internal
        self.cur = 0
        self.current_batch = None
        self.provide_data = data_iter.provide_data
        self.provide_label = data_iter.provide_label
        self.batch_size = data_iter.batch_size
        if hasattr(data_iter, "default_bucket_key"):
            self.default_bucket_key = data_iter.default_bucket_key

    def __len__(self) -> int:
        return self.size

    def reset(self):
        self.cur = 0
        if self.reset_internal:
            self.data_iter.reset()

    def iter_next(self):
        if self.cur == self.size:
            return False
        try:
            self.current_batch = self.data_iter.next()
        except StopIteration:
            self.data_iter.reset()
            self.current_batch = self.data_iter.next()
        self.cur += 1
        return True


class _OneAhead:
    """Reads one batch of ``source`` ahead on a thread of its own."""

    def __init__(self, source):
        self.source = source
        self.wanted, self.ready = threading.Event(), threading.Event()
        self.batch, self.error, self.running = None, None, True
        self.wanted.set()
        self.thread = threading.Thread(target=self._run, daemon=True, name="mixrt-prefetch")
        self.thread.start()

    def _run(self):
        while True:
            self.wanted.wait()
            self.wanted.clear()
            if not self.running:
                return
            try:
                self.batch, self.error = self.source.next(), None
            except StopIteration:
                self.batch, self.error = None, None
            except Exception as exc:  # noqa: BLE001  (handed to the consumer)
                self.batch, self.error = None, exc
            self.ready.set()

    def take(self):
        self.ready.wait()
        self.ready.clear()
        batch, error = self.batch, self.error
        self.wanted.set()
        if error is not None:
            raise error
        return batch

    def settle(self):
        """Wait for the read under way (before the source is reset)."""
        self.ready.wait()

    def restart(self):
        self.ready.clear()
        self.wanted.set()

    def stop(self):
        self.running = False
        self.wanted.set()


class PrefetchingIter(_ReadsCurrentBatch):
    """Reads the next batch of each of ``iters`` on background threads; a batch joins
    their data and labels (renamed by ``rename_data``/``rename_label``, one dict per
    iterator)."""

    def __init__(self, iters, rename_data=None, rename_label=None):
        super().__init__()
        self.iters = iters if isinstance(iters, list) else [iters]
        if not self.iters:
            raise InputError("PrefetchingIter needs at least one iterator")
        self.n_iter = len(self.iters)
        self.rename_data, self.rename_label = rename_data, rename_label
        self.batch_size = self.provide_data[0][1][0]
        self.current_batch = None
        self._readers = [_OneAhead(it) for it in self.iters]

    def __del__(self):
        for reader in getattr(self, "_readers", ()):
            reader.stop()

    def __len__(self) -> int:
        return len(self.iters[0])

    def _renamed(self, renames, which: str) -> list:
        if renames is None:
            return sum((list(getattr(it, which)) for it in self.iters), [])
        return sum(([DataDesc(names[d.name], d.shape, d.dtype) if isinstance(d, DataDesc)
                     else DataDesc(*d) for d in getattr(it, which)]
                    for names, it in zip(renames, self.iters)), [])

    @property
    def provide_data(self):
        return self._renamed(self.rename_data, "provide_data")

    @property
    def provide_label(self):
        return self._renamed(self.rename_label, "provide_label")

    def reset(self):
        for reader in self._readers:
            reader.settle()
        for it in self.iters:
            it.reset()
        for reader in self._readers:
            reader.restart()

    def iter_next(self):
        batches = [reader.take() for reader in self._readers]
        if batches[0] is None:
            if any(b is not None for b in batches):
                raise InputError("Number of entry mismatches between iterators")
            return False
        if any(b is None or b.pad != batches[0].pad for b in batches):
            raise InputError("Number of entry mismatches between iterators")
        self.current_batch = DataBatch(sum((b.data for b in batches), []),
                                       sum((b.label for b in batches), []), batches[0].pad,
                                       batches[0].index, provide_data=self.provide_data,
                                       provide_label=self.provide_label)
        return True

    def next(self):
        if self.iter_next():
            return self.current_batch
        raise StopIteration


class CSVIter(DataIter):
    """Batches of rows of CSV files, as MXNet's CSVIter: each row of ``data_csv`` holds
    one sample of ``data_shape``; labels come from ``label_csv`` (zeros without one). With
    ``round_batch`` the last batch is filled from the start and the next epoch begins
    after the samples it borrowed; without, its unfilled rows keep the previous batch's
    values. ``pad`` counts the filler rows either way."""

    def __init__(self, data_csv, data_shape, label_csv=None, label_shape=(1,), batch_size=1,
                 round_batch=True, prefetch_buffer=4, ctx="cpu", dtype=None,
                 data_name="data", label_name="softmax_label", **unknown):
        super().__init__(int(batch_size))
        if unknown:
            raise InputError(f"CSVIter has no argument {sorted(unknown)}")
        self.dtype = np.dtype(dtype or np.float32)
        if self.dtype not in (np.float32, np.int32, np.int64):
            raise InputError(f"CSVIter: dtype must be float32, int32 or int64, got {dtype}")
        self.data_shape, self.label_shape = tuple(data_shape), tuple(label_shape)
        self._data = _read_csv(data_csv, self.data_shape, self.dtype, "data_csv")
        self._label = np.zeros((len(self._data),) + self.label_shape, self.dtype) \
            if label_csv is None else _read_csv(label_csv, self.label_shape, self.dtype,
                                                "label_csv")
        if len(self._label) != len(self._data):
            raise InputError(f"CSVIter: {len(self._data)} data rows but {len(self._label)} "
                             f"label rows")
        self.round_batch, self.data_name, self.label_name = round_batch, data_name, label_name
        self.ctx = ctx
        self._start = self._next = 0
        self._pad = 0
        self._buffers = None
        self._batch = None

    @property
    def _label_batch_shape(self) -> tuple:
        if self.label_shape == (1,):
            return (self.batch_size,)
        return (self.batch_size,) + self.label_shape

    @property
    def provide_data(self):
        return [DataDesc(self.data_name, (self.batch_size,) + self.data_shape, self.dtype)]

    @property
    def provide_label(self):
        return [DataDesc(self.label_name, self._label_batch_shape, self.dtype)]

    def reset(self):
        self._start = self._pad if self.round_batch else 0
        self._next = self._start
        self._pad = 0

    def iter_next(self):
        total = len(self._data)
        if self._next >= total:
            return False
        rows = np.arange(self._next, min(self._next + self.batch_size, total))
        self._next += len(rows)
        missing = self.batch_size - len(rows)
        if self._buffers is None:
            self._buffers = (np.zeros((self.batch_size,) + self.data_shape, self.dtype),
                             np.zeros((self.batch_size,) + self.label_shape, self.dtype))
        data, label = self._buffers
        data[:len(rows)], label[:len(rows)] = self._data[rows], self._label[rows]
        if missing and self.round_batch:
            wrapped = np.arange(missing) % total
            data[len(rows):], label[len(rows):] = self._data[wrapped], self._label[wrapped]
        self._pad = missing
        self._batch = (data.copy(), label.reshape(self._label_batch_shape).copy())
        return True

    def getdata(self):
        return [nd.array(self._batch[0], dtype=self.dtype)]

    def getlabel(self):
        return [nd.array(self._batch[1], dtype=self.dtype)]

    def getpad(self):
        return self._pad

    def getindex(self):
        return None


def _read_csv(path, shape: tuple, dtype, argument: str) -> np.ndarray:
    try:
        rows = np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"CSVIter {argument} {str(path)!r}: {exc}") from None
    if rows.shape[1] != int(np.prod(shape)):
        raise InputError(f"CSVIter {argument} {str(path)!r}: rows hold {rows.shape[1]} "
                         f"values, the shape {shape} needs {int(np.prod(shape))}")
    return rows.reshape((len(rows),) + shape).astype(dtype)


class MXDataIter(DataIter):
    """MXNet's handle to a C++ iterator: mixrt has none."""

    def __init__(self, *args, **kwargs):
        raise InputError("mixrt has no C++ data iterators (MXDataIter); use NDArrayIter, "
                         "CSVIter or mixrt.gluon.data")


def _not_provided(name: str):
    def unavailable(*args, **kwargs):
        raise InputError(f"mx.io.{name} is one of MXNet's C++ iterators, which mixrt does "
                         f"not provide; use NDArrayIter, CSVIter or mixrt.gluon.data")
    unavailable.__name__ = name
    return unavailable


ImageRecordIter = _not_provided("ImageRecordIter")
ImageRecordUInt8Iter = _not_provided("ImageRecordUInt8Iter")
ImageDetRecordIter = _not_provided("ImageDetRecordIter")
MNISTIter = _not_provided("MNISTIter")
LibSVMIter = _not_provided("LibSVMIter")

__all__ = ["DataDesc", "DataBatch", "DataIter", "NDArrayIter", "CSVIter", "ResizeIter",
           "PrefetchingIter", "MXDataIter", "ImageRecordIter", "MNISTIter", "LibSVMIter"]
