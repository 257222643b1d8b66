"""MXNet's ``NDArrayIter`` (``mixrt.io`` is the public module): batches of in-memory arrays,
as MXNet serves them, plus sharding over workers and a resumable state.

As in MXNet 1.9: sources are named and sorted by name (one array: ``data_name``/
``label_name``; several: ``_0_data``, ``_1_data``, ...); NumPy sources become float32 arrays
(NDArrays keep their dtype); ``shuffle`` reshuffles on construction and on every ``reset``,
each shuffle permuting the order the last one left (with NumPy's global generator, so
``numpy.random.seed`` gives MXNet's order; ``seed=`` gives the iterator a generator of its
own); ``last_batch_handle`` is

* ``'pad'``: the last batch is filled from the start of the data, ``pad`` says how many;
* ``'discard'``: the last, short batch is dropped;
* ``'roll_over'``: the last, short batch is kept back and opens the next epoch (whose first
  batch reports those samples' count as ``pad``, as MXNet does).

mixrt's additions: ``num_parts``/``part_index`` give each worker an equal share of each
epoch's order (the rest, fewer than ``num_parts`` samples, sits that epoch out, so every
worker runs as many batches: unequal counts would make a synchronous job wait forever);
``len()`` is the epoch's batch count; ``state()``/``set_state()`` save and resume the
position (JSON: the generator's state, the epoch's sample order, the batches served).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError
from mixrt.io_base import DataBatch, DataDesc, DataIter
from mixrt.nd.ndarray import NDArray
from mixrt.random_streams import generator as random_generator

LAST_BATCH = ("pad", "discard", "roll_over")


def named_arrays(data, allow_empty: bool, default_name: str) -> list:
    """MXNet's ``[(name, NDArray)]``, sorted by name, from an array, a list or a dict."""
    if data is None:
        if not allow_empty:
            raise InputError("NDArrayIter needs data")
        data = []
    if isinstance(data, (np.ndarray, NDArray)):
        data = [data]
    if isinstance(data, (list, tuple)):
        if not data and not allow_empty:
            raise InputError("NDArrayIter needs data")
        data = OrderedDict([(default_name, data[0])] if len(data) == 1 else
                           [(f"_{i}_{default_name}", d) for i, d in enumerate(data)])
    if not isinstance(data, dict):
        raise InputError(f"Input must be NDArray, numpy.ndarray, a list of them or dict with "
                         f"them as values, got {type(data).__name__}")
    named = {}
    for name, value in data.items():
        try:
            named[name] = value if isinstance(value, NDArray) else nd.array(
                value, dtype=np.float32)  # nd.array's MXNet default for host data
        except InputError as exc:
            raise InputError(f"Invalid type {type(value).__name__!r} for {name}, should be "
                             f"NDArray or numpy.ndarray ({exc})") from exc
    return sorted(named.items())


class NDArrayIter(DataIter):
    def __init__(self, data, label=None, batch_size=1, shuffle=False,
                 last_batch_handle="pad", data_name="data", label_name="softmax_label",
                 layout="NCHW", *, num_parts=1, part_index=0, seed=None, last_batch=None):
        super().__init__(batch_size)
        self.data = named_arrays(data, False, data_name)
        self.label = named_arrays(label, True, label_name)
        self.layout, self.shuffle = layout, bool(shuffle)
        self.last_batch_handle = _last_batch(last_batch, last_batch_handle)
        self._axis = max(layout.find("N"), 0) if layout else 0
        self._host = [(name, array.asnumpy(), array.ctx, array.dtype)
                      for name, array in self.data + self.label]
        samples = _check_arguments(self._host, self._axis, batch_size, self.last_batch_handle,
                                   num_parts, part_index)
        self.batch_size, self.num_parts, self.part_index = int(batch_size), num_parts, part_index
        self.num_data = samples // int(num_parts)
        if seed is None and num_parts > 1:  # every worker must draw the same order
            seed = int(random_generator().integers(0, 2 ** 31))
        self._rng = None if seed is None else np.random.RandomState(seed)
        self.idx = np.arange(samples)          # MXNet's: shuffled in place, epoch by epoch
        self._perm = np.arange(samples)        # the data's order after those shuffles
        self._sequence = np.zeros(0, np.int64)  # this epoch: carried over + this share
        self._carried = 0
        self._batch = -1                       # the batch last reached this epoch
        self._served_all = False               # every full batch of the epoch went out
        self.reset()

    @property
    def last_batch(self) -> str:
        return self.last_batch_handle

    # -- what MXNet's iterators describe ---------------------------------------------------

    def _described(self, sources) -> list:
        return [DataDesc(name, _with_batch(array.shape, self._axis, self.batch_size),
                         array.dtype, layout=self.layout) for name, array in sources]

    @property
    def provide_data(self) -> list:
        return self._described(self.data)

    @property
    def provide_label(self) -> list:
        return self._described(self.label)

    @property
    def cursor(self) -> int:
        """MXNet's cursor: where the current batch starts in this epoch's data (negative
        while a rolled-over batch is served)."""
        return self._batch * self.batch_size - self._carried

    # -- epochs ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._batches_of(len(self._sequence))

    @property
    def num_batches(self) -> int:
        return len(self)

    def _batches_of(self, samples: int) -> int:
        full, rest = divmod(samples, self.batch_size)
        return full + (1 if rest and self.last_batch_handle == "pad" else 0)

    def reset(self) -> None:
        carried = self._left_over()
        if self.shuffle:
            (self._rng or np.random).shuffle(self.idx)
            self._perm = self._perm[self.idx]
        start = self.part_index * self.num_data
        self._sequence = np.concatenate([carried, self._perm[start:start + self.num_data]])
        self._carried, self._batch, self._served_all = len(carried), -1, False

    def hard_reset(self) -> None:
        """A new epoch that carries nothing over."""
        self._batch = -1
        self._sequence = self._sequence[:0]
        self.reset()

    def _left_over(self) -> np.ndarray:
        """The short last batch's samples, for roll_over, once every full batch went out
        (MXNet carries them only after next() has reached them: an epoch read batch by
        batch in step with other iterators, zip-style, carries here as well)."""
        if self.last_batch_handle != "roll_over" or not self._served_all:
            return np.zeros(0, np.int64)
        return self._sequence[len(self) * self.batch_size:]

    # -- batches -----------------------------------------------------------------------------

    def iter_next(self) -> bool:
        self._batch += 1
        return self._batch * self.batch_size < len(self._sequence)

    def next(self) -> DataBatch:
        if not self.iter_next() or self._rows() is None:  # the end, or a short last batch
            self._served_all = True                       # (dropped, or kept for later)
            raise StopIteration
        if self._batch == len(self) - 1:
            self._served_all = True
        return DataBatch(data=self.getdata(), label=self.getlabel(), pad=self.getpad(),
                         index=None)

    def _rows(self):
        """This batch's sample indices; None for a short batch not padded."""
        start = self._batch * self.batch_size
        rows = self._sequence[start:start + self.batch_size]
        if len(rows) == self.batch_size:
            return rows
        if self.last_batch_handle != "pad":
            return None
        return np.concatenate([rows, np.resize(self._sequence, self.batch_size - len(rows))])

    def _batchify(self, sources) -> list:
        rows = self._rows()
        if rows is None:
            rows = self._sequence[self._batch * self.batch_size:]
        return [nd.array(np.take(host, rows, axis=self._axis), ctx=ctx, dtype=dtype)
                for name, host, ctx, dtype in sources]

    def getdata(self) -> list:
        return self._batchify(self._host[:len(self.data)])

    def getlabel(self) -> list:
        return self._batchify(self._host[len(self.data):])

    def getpad(self) -> int:
        start = self._batch * self.batch_size
        if self.last_batch_handle == "pad" and start + self.batch_size > len(self._sequence):
            return start + self.batch_size - len(self._sequence)
        if self.last_batch_handle == "roll_over" and self._batch == 0 and self._carried:
            return self._carried
        return 0

    def getindex(self):
        return None

    # -- resuming ----------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able state: the generator (None: NumPy's global one), this epoch's sample
        order and the batches served, MXNet's shuffle index and the data's order."""
        rng = None
        if self._rng is not None:
            kind, keys, position, has_gauss, gauss = self._rng.get_state()
            rng = [kind, keys.tolist(), int(position), int(has_gauss), float(gauss)]
        return {"rng": rng, "order": self._sequence.tolist(),
                "position": min(self._batch + 1, len(self)), "carried": self._carried,
                "idx": self.idx.tolist(), "perm": self._perm.tolist()}

    def set_state(self, state: dict) -> None:
        """Resume from :meth:`state`. A state this iterator could not have written (another
        dataset, sharding or batch size, a damaged file) is an ``InputError`` naming the
        key, and changes nothing."""
        if not isinstance(state, dict) or not {"rng", "order", "position"} <= set(state):
            raise InputError(f"iterator state must be a dict with 'rng', 'order' and "
                             f"'position', got {_brief(state)}")
        order = self._checked_order(state["order"])
        batches = self._batches_of(len(order))
        position = state["position"]
        if isinstance(position, bool) or not isinstance(position, int) or \
                not 0 <= position <= batches:
            raise InputError(f"iterator state 'position' must be an int in [0, {batches}], "
                             f"got {_brief(position)}")
        rng = _checked_rng(state["rng"])
        idx = self._checked_permutation(state.get("idx", self.idx.tolist()), "idx")
        perm = self._checked_permutation(state.get("perm", self._perm.tolist()), "perm")
        carried = state.get("carried", len(order) - self.num_data)
        if not isinstance(carried, int) or carried != len(order) - self.num_data:
            raise InputError(f"iterator state 'carried' must be {len(order) - self.num_data}")
        self._rng, self._sequence, self._carried = rng, order, carried
        self.idx, self._perm = idx, perm
        self._batch = position - 1
        self._served_all = position == batches

    def _checked_order(self, order) -> np.ndarray:
        """This worker's sample order: ``num_data`` distinct indices into the data, after
        (roll_over) fewer than ``batch_size`` carried over from the epoch before."""
        if isinstance(order, (np.ndarray, tuple)):
            order = np.asarray(order).tolist()
        share = self.num_data
        most = share + (self.batch_size - 1 if self.last_batch_handle == "roll_over" else 0)
        if not isinstance(order, list) or not share <= len(order) <= most or \
                not all(isinstance(i, int) and not isinstance(i, bool) for i in order):
            expected = f"{share}" if most == share else f"{share} to {most}"
            raise InputError(f"iterator state 'order' must be a list of {expected} sample "
                             f"indices (this iterator's share), got {_brief(order)}")
        array = np.asarray(order, dtype=np.int64) if order else np.zeros(0, np.int64)
        shared = array[len(array) - share:]
        samples = len(self.idx)
        if array.size and (array.min() < 0 or array.max() >= samples or
                           len(np.unique(shared)) != shared.size):
            raise InputError(f"iterator state 'order' must hold distinct indices in [0, "
                             f"{samples})")
        return array

    def _checked_permutation(self, values, key: str) -> np.ndarray:
        array = np.asarray(values) if isinstance(values, list) else None
        if array is None or array.dtype.kind not in "iu" or \
                sorted(array.tolist()) != list(range(len(self.idx))):
            raise InputError(f"iterator state {key!r} must be a permutation of "
                             f"range({len(self.idx)})")
        return array.astype(np.int64)


def _with_batch(shape, axis: int, batch_size: int) -> tuple:
    return tuple(shape[:axis]) + (batch_size,) + tuple(shape[axis + 1:])


def _checked_rng(value):
    if value is None:
        return None
    rng = np.random.RandomState()
    try:
        kind, keys, position, has_gauss, gauss = value
        rng.set_state((kind, np.asarray(keys, np.uint32), int(position), int(has_gauss),
                       float(gauss)))
    except (TypeError, ValueError, KeyError) as exc:
        raise InputError(f"iterator state 'rng' is not a RandomState state: {exc}") from exc
    return rng


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _last_batch(last_batch, last_batch_handle) -> str:
    if last_batch is not None and last_batch_handle not in (None, "pad") and \
            last_batch != last_batch_handle:
        raise InputError(f"last_batch={last_batch!r} and last_batch_handle="
                         f"{last_batch_handle!r} disagree; give one of them")
    return last_batch or last_batch_handle or "pad"


def _check_arguments(host, axis, batch_size, last_batch, num_parts, part_index) -> int:
    # MXNet's count: the first data array's; the others are read at the same indices, so
    # they may hold more rows (a table of per-sample weights longer than this data), not fewer
    lengths = {name: array.shape[axis] for name, array, _, _ in host}
    samples = next(iter(lengths.values()))
    short = {name: length for name, length in lengths.items() if length < samples}
    if short:
        raise InputError(f"the first data array has {samples} samples along the batch axis, "
                         f"but {short} have fewer; every data and label array needs at "
                         f"least as many (got {lengths})")
    if int(batch_size) < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    if last_batch not in LAST_BATCH:
        raise InputError(f"last_batch_handle must be one of {LAST_BATCH}, got "
                         f"{last_batch!r}")
    if not 0 <= int(part_index) < int(num_parts):
        raise InputError(f"part_index must be in [0, num_parts={num_parts}), got {part_index}")
    if samples // int(num_parts) == 0:
        raise InputError(f"{samples} samples cannot be split over {num_parts} workers")
    return samples


__all__ = ["NDArrayIter", "named_arrays", "LAST_BATCH"]
