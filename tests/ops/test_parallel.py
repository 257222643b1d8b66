"""ops/compiled/parallel.py: every part runs exactly once, errors reach the caller, and calls from
many threads at once neither deadlock nor mix their parts up."""

import threading

import numpy as np
import pytest

from mixrt.ops.compiled import parallel
from mixrt.ops.nn.nn_cpu import softmax_cpu
from mixrt.ops.nn.nn import softmax


def test_every_part_runs_once():
    seen = []
    lock = threading.Lock()

    def record(start, stop):
        with lock:
            seen.append((start, stop))
    parts = [(i, i + 1) for i in range(37)]
    parallel.parallel_for(parts, record)
    assert sorted(seen) == parts


def test_row_parts_cover_rows_and_stay_whole_when_small():
    assert parallel.row_parts(10, 1) == [(0, 10)]  # too little work to hand out
    parts = parallel.row_parts(1000, 1000)
    assert parts[0][0] == 0 and parts[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_an_error_in_a_part_reaches_the_caller():
    def fail_on_three(start, stop):
        if start == 3:
            raise ValueError("part 3")
    with pytest.raises(ValueError, match="part 3"):
        parallel.parallel_for([(i, i + 1) for i in range(8)], fail_on_three)


def test_one_thread_setting_runs_inline(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "1")
    assert parallel.intra_op_threads() == 1
    caller = threading.get_ident()
    threads = set()
    parallel.parallel_for([(0, 1), (1, 2)], lambda a, b: threads.add(threading.get_ident()))
    assert threads == {caller}


def test_many_callers_at_once(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "3")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((64, 2048)).astype(np.float32) for _ in range(8)]
    expected = [softmax(np, x) for x in inputs]
    results = [None] * len(inputs)

    def serve(index):
        for _ in range(20):
            out = np.empty_like(inputs[index])
            results[index] = softmax_cpu(np, inputs[index], out=out)
    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive()
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_softmax_in_place_over_its_input():
    x = np.random.default_rng(2).standard_normal((4, 300, 100)).astype(np.float32)
    expected = softmax(np, x)
    assert softmax_cpu(np, x, out=x) is x
    np.testing.assert_allclose(x, expected, rtol=1e-6, atol=1e-7)


def test_a_pinned_block_reads_the_thread_count_once(monkeypatch):
    monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "3")
    with parallel.pinned():
        assert parallel.intra_op_threads() == 3  # read when first asked
        monkeypatch.setenv("MIXRT_INTRA_OP_THREADS", "5")
        assert parallel.intra_op_threads() == 3
        with parallel.pinned():  # reentrant: the outer block's reading holds
            assert parallel.intra_op_threads() == 3
        assert parallel.intra_op_threads() == 3
        assert parallel.pinned_values() == {}
        seen = []
        other = threading.Thread(target=lambda: seen.append(parallel.intra_op_threads()))
        other.start()
        other.join()
        assert seen == [5]  # other threads read the environment as before
    assert parallel.intra_op_threads() == 5
    assert parallel.pinned_values() is None
