"""mixrt.gluon.data: datasets, samplers, batchify functions and the threaded DataLoader."""

import random
import threading
import time

import mixrt  # noqa: F401  (before NumPy: it picks OpenBLAS's kernels)
import numpy as np
import pytest

from mixrt import random as mixrt_random
from mixrt.errors import InputError
from mixrt.gluon.data import (ArrayDataset, BatchSampler, DataLoader, DataLoaderError, Dataset,
                              RandomSampler, SequentialSampler, SimpleDataset, SplitSampler,
                              default_batchify_fn)
from mixrt.gluon.data.batchify import Pad, Stack, Tuple


class HostArray:
    """Something with ``asnumpy()``, as an NDArray has."""

    def __init__(self, array):
        self.array = np.asarray(array)

    def __len__(self):
        return len(self.array)

    def asnumpy(self):
        return self.array


class SlowDataset(Dataset):
    """(features, label) samples that take a random few milliseconds to read, so worker
    threads finish out of order; ``bad_index`` raises; ``reads`` records what was read."""

    def __init__(self, length=40, bad_index=None, delay=0.003):
        self.length, self.bad_index, self.delay = length, bad_index, delay
        self.jitter = random.Random(0)
        self.reads = []

    def __getitem__(self, index):
        time.sleep(self.jitter.uniform(0, self.delay))
        self.reads.append(index)
        if index == self.bad_index:
            raise KeyError(f"corrupt record {index}")
        return np.full(3, index, dtype=np.float32), index

    def __len__(self):
        return self.length


def as_numpy(batch):
    return tuple(field.asnumpy() for field in batch)


def wait_for_threads(allowed, grace=2.0):
    """The threads alive now that are not in ``allowed``, after waiting up to ``grace``."""
    deadline = time.monotonic() + grace
    while True:
        extra = [t for t in threading.enumerate() if t not in allowed]
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.01)


# -- datasets -----------------------------------------------------------------------------

def test_array_dataset_needs_equal_lengths():
    with pytest.raises(InputError, match=r"\[3, 4\]"):
        ArrayDataset(np.zeros(3), np.zeros(4))
    with pytest.raises(InputError, match="at least one"):
        ArrayDataset()


def test_array_dataset_samples():
    x, y = np.arange(12).reshape(4, 3), HostArray([10, 11, 12, 13])
    pairs = ArrayDataset(x, y)
    assert len(pairs) == 4
    sample = pairs[2]
    assert isinstance(sample, tuple)
    np.testing.assert_array_equal(sample[0], [6, 7, 8])
    assert sample[1] == 12
    assert ArrayDataset([5, 6, 7])[1] == 6  # one array: the sample is the element itself
    assert [s[1] for s in pairs] == [10, 11, 12, 13]


def test_transform_is_lazy_unless_asked():
    calls = []

    def double(x):
        calls.append(x)
        return 2 * x

    data = SimpleDataset([1, 2, 3])
    lazy = data.transform(double)
    assert calls == []
    assert [lazy[1], lazy[1]] == [4, 4] and calls == [2, 2]  # called on every read
    eager = data.transform(double, lazy=False)
    assert calls == [2, 2, 1, 2, 3]  # called once per sample, now
    assert list(eager) == [2, 4, 6] and len(calls) == 5
    pairs = SimpleDataset([(1, "a"), (2, "b")])
    assert list(pairs.transform(lambda x, y: y * x)) == ["a", "bb"]


def test_transform_first_leaves_the_label():
    pairs = SimpleDataset([(1, "a"), (2, "b")]).transform_first(lambda x: x + 10)
    assert list(pairs) == [(11, "a"), (12, "b")]
    assert list(SimpleDataset([1, 2]).transform_first(lambda x: -x)) == [-1, -2]


def test_filter_shard_take():
    data = SimpleDataset(list(range(10)))
    assert list(data.filter(lambda x: x % 3 == 0)) == [0, 3, 6, 9]
    assert [list(data.shard(3, i)) for i in range(3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert list(data.shard(3, 1).take(2)) == [4, 5]
    assert list(data.take(3)) == [0, 1, 2]
    assert len(data.take(None)) == len(data.take(100)) == 10
    with pytest.raises(InputError, match=r"index must be in \[0, num_shards=3\), got 3"):
        data.shard(3, 3)


# -- samplers -----------------------------------------------------------------------------

def test_sequential_and_random_samplers():
    assert list(SequentialSampler(4, start=2)) == [2, 3, 4, 5]
    mixrt_random.seed(3)
    first = RandomSampler(20)
    epochs = [list(first), list(first)]
    assert sorted(epochs[0]) == list(range(20)) and epochs[0] != epochs[1]
    mixrt_random.seed(3)
    again = RandomSampler(20)
    assert [list(again), list(again)] == epochs


@pytest.mark.parametrize("last_batch, epochs", [
    ("keep", [[[0, 1, 2], [3, 4, 5], [6]], [[0, 1, 2], [3, 4, 5], [6]]]),
    ("discard", [[[0, 1, 2], [3, 4, 5]], [[0, 1, 2], [3, 4, 5]]]),
    ("rollover", [[[0, 1, 2], [3, 4, 5]], [[6, 0, 1], [2, 3, 4]],
                  [[5, 6, 0], [1, 2, 3], [4, 5, 6]], [[0, 1, 2], [3, 4, 5]]]),
])
def test_batch_sampler_last_batch(last_batch, epochs):
    sampler = BatchSampler(SequentialSampler(7), 3, last_batch)
    for expected in epochs:
        assert len(sampler) == len(expected)
        assert list(sampler) == expected


def test_batch_sampler_rejects_unknown_last_batch():
    with pytest.raises(InputError, match="'keep', 'discard', 'rollover'; got 'pad'"):
        BatchSampler(SequentialSampler(7), 3, "pad")


@pytest.mark.parametrize("length, num_parts", [(10, 3), (9, 3), (2, 5), (7, 1), (0, 2)])
def test_split_sampler_parts_are_equal_and_cover_everything(length, num_parts):
    parts = [list(SplitSampler(length, num_parts, i)) for i in range(num_parts)]
    assert {len(part) for part in parts} == {-(-length // num_parts)}
    assert {len(SplitSampler(length, num_parts, i)) for i in range(num_parts)} == \
        {len(parts[0])}
    assert set().union(*parts) == set(range(length))


def test_split_sampler_wraps_and_shuffles_within_its_part():
    parts = [list(SplitSampler(10, 3, i)) for i in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    mixrt_random.seed(1)
    shuffled = SplitSampler(10, 3, 1, shuffle=True)
    epochs = [list(shuffled) for _ in range(4)]
    assert all(sorted(epoch) == [4, 5, 6, 7] for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1
    with pytest.raises(InputError, match=r"part_index must be in \[0, num_parts=3\), got -1"):
        SplitSampler(10, 3, -1)
    with pytest.raises(InputError, match="num_parts must be at least 1"):
        SplitSampler(10, 0, 0)


# -- batchify -----------------------------------------------------------------------------

def test_default_batchify_stacks_each_field():
    samples = [(np.full(2, i, np.float32), i, (i * 1.5, np.int8(i))) for i in range(3)]
    data, label, (score, small) = default_batchify_fn(samples)
    assert data.shape == (3, 2) and data.dtype == np.float32
    np.testing.assert_array_equal(label.asnumpy(), [0, 1, 2])
    assert np.issubdtype(label.dtype, np.integer) and small.dtype == np.int8
    np.testing.assert_allclose(score.asnumpy(), [0, 1.5, 3])
    with pytest.raises(InputError, match=r"different shapes \[\(2,\), \(3,\)\].*Pad"):
        default_batchify_fn([np.zeros(2), np.zeros(3)])


def test_pad_and_tuple():
    samples = [(np.array([1, 2, 3]), 0), (np.array([4]), 1), (np.array([5, 6]), 2)]
    tokens, labels = Tuple(Pad(val=-1), Stack())(samples)
    np.testing.assert_array_equal(tokens.asnumpy(), [[1, 2, 3], [4, -1, -1], [5, 6, -1]])
    np.testing.assert_array_equal(labels.asnumpy(), [0, 1, 2])
    assert len(Tuple([Pad(), Stack()]).fns) == 2  # the functions may come as one list
    with pytest.raises(InputError, match="samples must have 3 fields"):
        Tuple(Stack(), Stack(), Stack())(samples)
    with pytest.raises(InputError, match="other axes differ"):
        Pad()([np.zeros((2, 3)), np.zeros((2, 4))])


# -- DataLoader ---------------------------------------------------------------------------

def test_threads_give_the_same_batches_in_the_same_order():
    dataset = SlowDataset()
    serial = DataLoader(dataset, batch_size=6)
    threaded = DataLoader(dataset, batch_size=6, num_workers=3)
    expected = [as_numpy(batch) for batch in serial]
    assert len(serial) == len(threaded) == len(expected) == 7
    for _ in range(2):  # a second epoch works too
        got = [as_numpy(batch) for batch in threaded]
        assert len(got) == len(expected)
        for (data, label), (want_data, want_label) in zip(got, expected):
            np.testing.assert_array_equal(data, want_data)
            np.testing.assert_array_equal(label, want_label)
    np.testing.assert_array_equal(expected[-1][1], [36, 37, 38, 39])


def test_len_follows_last_batch():
    data = SimpleDataset(list(range(10)))
    assert len(DataLoader(data, batch_size=4)) == 3
    assert len(DataLoader(data, batch_size=4, last_batch="discard")) == 2
    assert [b.asnumpy().tolist() for b in DataLoader(data, 4, last_batch="discard")] == \
        [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_seeded_shuffle_is_reproducible():
    data = SimpleDataset(list(range(30)))

    def two_epochs(num_workers):
        mixrt_random.seed(11)
        loader = DataLoader(data, batch_size=8, shuffle=True, num_workers=num_workers)
        return [[b.asnumpy().tolist() for b in loader] for _ in range(2)]

    first = two_epochs(0)
    assert first == two_epochs(0) == two_epochs(2)
    assert first[0] != first[1]
    assert sorted(sum(first[0], [])) == list(range(30))


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_failing_sample_is_named(num_workers):
    loader = DataLoader(SlowDataset(bad_index=13), batch_size=4, num_workers=num_workers)
    with pytest.raises(DataLoaderError, match=r"sample 13 .*\[12, 13, 14, 15\]") as caught:
        list(loader)
    assert isinstance(caught.value.__cause__, KeyError)
    assert caught.value.indices == [12, 13, 14, 15]


def test_a_failing_batchify_fn_is_named():
    def broken(samples):
        raise ValueError("no")

    loader = DataLoader(SimpleDataset([1, 2, 3]), batch_size=2, batchify_fn=broken)
    with pytest.raises(DataLoaderError, match=r"batchify_fn failed .*\[0, 1\]"):
        next(iter(loader))


def test_prefetch_bounds_the_work_ahead():
    dataset = SlowDataset(delay=0)
    loader = DataLoader(dataset, batch_size=1, num_workers=2, prefetch=2)
    batches = iter(loader)
    next(batches)
    time.sleep(0.05)
    assert len(dataset.reads) == 3  # the batch handed out and two in flight
    batches.close()


def test_timeout_names_the_batch():
    class Stuck(SimpleDataset):
        def __getitem__(self, index):
            time.sleep(0.3)
            return index

    loader = DataLoader(Stuck([0, 1]), batch_size=2, num_workers=1, timeout=0.05)
    with pytest.raises(DataLoaderError, match=r"\[0, 1\] took longer than timeout=0.05"):
        next(iter(loader))


def test_abandoned_epochs_leave_no_threads():
    before = set(threading.enumerate())
    loader = DataLoader(SlowDataset(length=200), batch_size=4, num_workers=3)
    batches = iter(loader)
    next(batches)
    del batches  # dropped mid-epoch
    for _ in loader:
        break  # a for loop left early
    closed = iter(loader)
    next(closed)
    closed.close()
    with pytest.raises(DataLoaderError):
        list(DataLoader(SlowDataset(bad_index=5), batch_size=2, num_workers=3))
    assert wait_for_threads(before) == []


@pytest.mark.parametrize("arguments, message", [
    ({"batch_sampler": [[0]], "batch_size": 2}, "do not also pass batch_size$"),
    ({"batch_sampler": [[0]], "shuffle": True, "last_batch": "keep"},
     "do not also pass shuffle, last_batch$"),
    ({"batch_sampler": [[0]], "sampler": SequentialSampler(3)}, "do not also pass sampler$"),
    ({"batch_size": 2, "shuffle": True, "sampler": SequentialSampler(3)},
     "shuffle=True cannot be combined with a sampler"),
    ({}, "needs batch_size"),
    ({"batch_size": 2, "last_batch": "pad"}, "'keep', 'discard', 'rollover'"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
    ({"batch_size": 2, "num_workers": -1}, "num_workers must be an integer >= 0"),
    ({"batch_size": 2, "timeout": 0}, "timeout must be a positive"),
])
def test_argument_conflicts(arguments, message):
    with pytest.raises(InputError, match=message):
        DataLoader(SimpleDataset([1, 2, 3]), **arguments)


def test_batch_sampler_and_samplers_drive_the_loader():
    data = SimpleDataset(list(range(6)))
    by_batches = DataLoader(data, batch_sampler=[[5, 0], [2]])
    assert [b.asnumpy().tolist() for b in by_batches] == [[5, 0], [2]]
    split = DataLoader(data, batch_size=2, sampler=SplitSampler(6, 2, 1))
    assert [b.asnumpy().tolist() for b in split] == [[3, 4], [5]]
