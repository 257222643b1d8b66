"""Caches compiled per shape stay bounded: Session plans, imperative backward plans, and a
hybridized block's traced graphs, under workloads whose shapes keep changing."""

import threading

import numpy as np

from mixrt import autograd, nd
from mixrt.tape import opgrad
from mixrt.gluon import hybrid, nn
from mixrt.runtime.lru import LruCache


def test_the_least_recently_used_entry_goes_first():
    cache = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2


def test_the_first_value_stored_for_a_key_is_kept():
    cache = LruCache(4)
    assert cache.put("k", "first") == "first"
    assert cache.put("k", "second") == "first"  # a thread that lost the race gets the winner's
    assert cache.values() == ["first"]


def test_threads_putting_and_getting_keep_it_within_capacity():
    cache = LruCache(8)

    def worker(offset):
        for i in range(500):
            cache.put((offset, i % 20), i)
            cache.get((offset, (i * 7) % 20))
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 8


def test_imperative_backward_plans_stay_bounded_as_shapes_change(monkeypatch):
    monkeypatch.setattr(opgrad, "_backward_plans", LruCache(3))
    monkeypatch.setattr(opgrad, "_forward_plans", LruCache(5))
    for length in range(1, 9):
        x = nd.array(np.arange(length, dtype=np.float32))
        x.attach_grad()
        with autograd.record():
            y = (nd.Tanh(x) * 2).sum()
        y.backward()
        np.testing.assert_allclose(x.grad.asnumpy(), 2 * (1 - np.tanh(x.asnumpy()) ** 2),
                                   rtol=1e-6)
    assert len(opgrad._backward_plans) == 3 and len(opgrad._forward_plans) == 5


def test_a_hybridized_block_keeps_a_bounded_number_of_traced_graphs(monkeypatch):
    monkeypatch.setattr(hybrid, "MAX_TRACED", 3)
    net = nn.Dense(4, in_units=6)
    net.initialize()
    net.hybridize()
    weight, bias = net.weight.data().asnumpy(), net.bias.data().asnumpy()
    for batch in (1, 2, 3, 4, 5, 1):  # batch 1 was evicted and is traced again
        x = np.full((batch, 6), 0.5, np.float32)
        out = net(nd.array(x)).asnumpy()
        np.testing.assert_allclose(out, x @ weight.T + bias, rtol=1e-5)
    assert len(net._cached) == 3
