"""Datasets: anything with ``__getitem__`` and ``__len__`` that returns one sample per index.

A sample is a single value (an array, a number) or a tuple of fields, ``(data, label)`` say.
The methods on :class:`Dataset` return new datasets that wrap the original rather than copy
it, so a chain such as ``ArrayDataset(x, y).shard(4, rank).transform_first(augment)`` costs
nothing until a sample is read, and random augmentations are drawn afresh on every read.
"""

from __future__ import annotations

from mixrt.base.errors import InputError


class Dataset:
    """Base class: subclasses implement ``__getitem__(index)`` and ``__len__()``."""

    def __getitem__(self, index):
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self):
        # Bounded by len() rather than by IndexError: a user dataset need not raise one.
        return (self[i] for i in range(len(self)))

    def transform(self, fn, lazy: bool = True) -> Dataset:
        """Apply ``fn`` to every sample; a tuple sample is unpacked, ``fn(*sample)``.

        ``lazy=True`` calls ``fn`` on every read (random augmentations differ per epoch);
        ``lazy=False`` calls it once per sample now and keeps the results in memory."""
        transformed = _TransformedDataset(self, fn)
        return transformed if lazy else SimpleDataset(list(transformed))

    def transform_first(self, fn, lazy: bool = True) -> Dataset:
        """Apply ``fn`` to the first field only (the data, leaving the label alone); a sample
        that is not a tuple is passed to ``fn`` whole."""
        return self.transform(_FirstField(fn), lazy)

    def filter(self, fn) -> Dataset:
        """The samples for which ``fn(sample)`` is true.

        Reads every sample once, now, to find them; the kept indices are stored, the samples
        are not."""
        return _IndexedDataset(self, [i for i, sample in enumerate(self) if fn(sample)])

    def shard(self, num_shards: int, index: int) -> Dataset:
        """Contiguous part ``index`` of ``num_shards``; the first ``len % num_shards`` parts
        hold one sample more than the rest. For parts of equal length (what synchronous
        data-parallel training needs) sample with :class:`SplitSampler` instead."""
        num_shards, index = _check_part(num_shards, index, "num_shards", "index")
        base, extra = divmod(len(self), num_shards)
        start = index * base + min(index, extra)
        stop = start + base + (1 if index < extra else 0)
        return _IndexedDataset(self, range(start, stop))

    def take(self, count: int | None) -> Dataset:
        """The first ``count`` samples (all of them when ``count`` is None or too large)."""
        if count is not None and int(count) < 0:
            raise InputError(f"take(count) needs count >= 0 or None, got {count}")
        stop = len(self) if count is None else min(int(count), len(self))
        return _IndexedDataset(self, range(stop))


class SimpleDataset(Dataset):
    """A dataset over a list (or any sequence) held in memory."""

    def __init__(self, data):
        self._data = data

    def __getitem__(self, index):
        return self._data[index]

    def __len__(self) -> int:
        return len(self._data)


class ArrayDataset(Dataset):
    """Samples taken at the same index from several arrays: ``ArrayDataset(x, y)[i]`` is
    ``(x[i], y[i])``; with one array the sample is ``x[i]`` itself.

    Arrays may be NumPy arrays, lists, or anything with ``asnumpy()`` (an NDArray), which is
    copied to the host once here so that reading a sample never touches a device."""

    def __init__(self, *arrays):
        if not arrays:
            raise InputError("ArrayDataset needs at least one array")
        lengths = [len(array) for array in arrays]
        if len(set(lengths)) > 1:
            raise InputError(f"ArrayDataset arrays must have the same length along axis 0, "
                             f"got lengths {lengths}")
        self._arrays = [_host_array(array) for array in arrays]
        self._length = lengths[0]

    def __getitem__(self, index):
        if len(self._arrays) == 1:
            return self._arrays[0][index]
        return tuple(array[index] for array in self._arrays)

    def __len__(self) -> int:
        return self._length


class _TransformedDataset(Dataset):
    def __init__(self, source, fn):
        self._source, self._fn = source, fn

    def __getitem__(self, index):
        sample = self._source[index]
        return self._fn(*sample) if isinstance(sample, tuple) else self._fn(sample)

    def __len__(self) -> int:
        return len(self._source)


class _FirstField:
    """``fn`` lifted to the first field of a sample (a class, not a closure, so that its
    repr names ``fn`` in tracebacks)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, first, *rest):
        return (self.fn(first), *rest) if rest else self.fn(first)

    def __repr__(self) -> str:
        return f"first_field({self.fn!r})"


class _IndexedDataset(Dataset):
    """A view of ``source`` through a list of its indices (filter, shard, take)."""

    def __init__(self, source, indices):
        self._source, self._indices = source, indices

    def __getitem__(self, index):
        return self._source[self._indices[index]]

    def __len__(self) -> int:
        return len(self._indices)


def _host_array(array):
    return array.asnumpy() if hasattr(array, "asnumpy") else array


def _check_part(count, index, count_name: str, index_name: str) -> tuple[int, int]:
    """Validate a (number of parts, part index) pair; shared with SplitSampler."""
    count, index = int(count), int(index)
    if count < 1:
        raise InputError(f"{count_name} must be at least 1, got {count}")
    if not 0 <= index < count:
        raise InputError(f"{index_name} must be in [0, {count_name}={count}), got {index}")
    return count, index


__all__ = ["Dataset", "SimpleDataset", "ArrayDataset"]
