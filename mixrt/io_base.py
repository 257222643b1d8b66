"""What MXNet's data iterators share (``mixrt.io`` is the public module): ``DataDesc``,
``DataBatch``, the ``DataIter`` protocol, and a background thread that reads any iterable
ahead (``read_ahead``, what ``PrefetchingIter`` and ``Module.fit`` use)."""

from __future__ import annotations

import queue
import threading
from collections import namedtuple

import numpy as np

from mixrt.base.errors import InputError


class DataDesc(namedtuple("DataDesc", ["name", "shape"])):
    """A named input's shape, with its ``dtype`` and ``layout`` (``N`` marks the batch
    axis)."""

    def __new__(cls, name, shape, dtype=np.float32, layout="NCHW"):
        desc = super().__new__(cls, name, shape)
        desc.dtype = dtype
        desc.layout = layout
        return desc

    def __repr__(self) -> str:
        return f"DataDesc[{self.name},{self.shape},{self.dtype},{self.layout}]"

    @staticmethod
    def get_batch_axis(layout):
        """The batch axis of ``layout`` (0 when it is None, -1 when it has no ``N``)."""
        return 0 if layout is None else layout.find("N")

    @staticmethod
    def get_list(shapes, types):
        """DataDescs from ``[(name, shape)]`` and, optionally, ``[(name, dtype)]``."""
        if types is None:
            return [DataDesc(name, shape) for name, shape in shapes]
        dtypes = dict(types)
        return [DataDesc(name, shape, dtypes[name]) for name, shape in shapes]


class DataBatch:
    """One batch: lists of data and label arrays, ``pad`` (samples at the end that only
    fill the batch), ``index``, ``bucket_key`` and the batch's ``provide_data``/
    ``provide_label``."""

    def __init__(self, data, label=None, pad=None, index=None, bucket_key=None,
                 provide_data=None, provide_label=None):
        if data is not None and not isinstance(data, (list, tuple)):
            raise InputError("Data must be list of NDArrays")
        if label is not None and not isinstance(label, (list, tuple)):
            raise InputError("Label must be list of NDArrays")
        self.data, self.label, self.pad, self.index = data, label, pad, index
        self.bucket_key = bucket_key
        self.provide_data, self.provide_label = provide_data, provide_label

    def __str__(self) -> str:
        data_shapes = [d.shape for d in self.data]
        label_shapes = [lab.shape for lab in self.label] if self.label else None
        return f"{type(self).__name__}: data shapes: {data_shapes} label shapes: {label_shapes}"


class DataIter:
    """MXNet's iterator protocol: ``reset``, ``next`` (a DataBatch or StopIteration), and
    ``iter_next``/``getdata``/``getlabel``/``getpad``/``getindex`` for subclasses."""

    def __init__(self, batch_size=0):
        self.batch_size = batch_size

    def __iter__(self):
        return self

    def reset(self):
        pass

    def next(self):
        if self.iter_next():
            return DataBatch(data=self.getdata(), label=self.getlabel(), pad=self.getpad(),
                             index=self.getindex())
        raise StopIteration

    def __next__(self):
        return self.next()

    def iter_next(self):
        return False

    def getdata(self):
        return None

    def getlabel(self):
        return None

    def getindex(self):
        return None

    def getpad(self):
        return None


_DONE = object()


def read_ahead(source, depth: int = 2):
    """Iterate ``source`` on a background thread, ``depth`` items ahead, so preparing the
    next batch overlaps the work on this one; an exception the source raises comes out
    here, at the item where it happened."""
    items: queue.Queue = queue.Queue(maxsize=depth)

    def fill():
        try:
            for item in source:
                items.put(item)
        except BaseException as exc:  # handed to the consumer
            items.put(exc)
            return
        items.put(_DONE)
    thread = threading.Thread(target=fill, daemon=True, name="mixrt-prefetch")
    thread.start()
    while True:
        item = items.get()
        if item is _DONE:
            thread.join()
            return
        if isinstance(item, BaseException):
            raise item
        yield item


__all__ = ["DataDesc", "DataBatch", "DataIter", "read_ahead"]
