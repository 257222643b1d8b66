"""MXNet's ``KVStoreBase``: the interface a Python-level KVStore implements, the registry that
``mixrt.kv.create(name)`` consults first, and MXNet's ``TestStore``.

    @mixrt.kv.KVStoreBase.register
    class MyStore(mixrt.kv.KVStoreBase):
        def pushpull(self, key, value, out=None, priority=0): ...
        ...
    kv = mixrt.kv.create("mystore")          # the class's name, lower-cased

A Trainer given such a store sums gradients with its ``pushpull`` and, where its
``is_capable("optimizer")`` says no, updates the weights itself (``update_on_kvstore=True`` is
then a ValueError, MXNet's). mixrt's own stores (``mixrt.kvstore``) count as KVStoreBase
instances too.
"""

from __future__ import annotations

import abc
import warnings

from mixrt.kvstore.base import KVStore


class UnknownCapabilityError(ValueError):
    """A capability ``is_capable`` does not know (MXNet raises ValueError)."""


class KVStoreBase(metaclass=abc.ABCMeta):
    """What a KVStore offers (MXNet 1.9's ``mx.kvstore.KVStoreBase``); each method a store
    does not provide raises NotImplementedError."""

    OPTIMIZER = "optimizer"
    kv_registry: dict = {}

    def broadcast(self, key, value, out, priority=0):
        """Copy ``value`` (rank 0's) into every array of ``out``."""
        raise NotImplementedError()

    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` (an NDArray or a list of them) across the store and write the sum
        to ``out`` (or back into ``value``)."""
        raise NotImplementedError()

    def set_optimizer(self, optimizer):
        raise NotImplementedError()

    def is_capable(self, capability):
        """Whether the store can do ``capability`` (``"optimizer"``: run the updates)."""
        raise NotImplementedError()

    def save_optimizer_states(self, fname, dump_optimizer=False):
        raise NotImplementedError()

    def load_optimizer_states(self, fname):
        raise NotImplementedError()

    @property
    def type(self):
        raise NotImplementedError()

    @property
    def rank(self):
        raise NotImplementedError()

    @property
    def num_workers(self):
        raise NotImplementedError()

    # MXNet names its registration ``register``, which hides ABCMeta's virtual-subclass
    # registration of the same name on this class (mixrt's stores use the latter, below)
    @staticmethod
    def register(klass):
        """Register ``klass`` under its lower-cased class name for ``create``; returns it
        (a decorator). A name registered again is replaced, with a warning."""
        if not isinstance(klass, type):
            raise TypeError(f"KVStoreBase.register takes a class, got {klass!r}")
        name = klass.__name__.lower()
        previous = KVStoreBase.kv_registry.get(name)
        if previous is not None:
            warnings.warn(f"WARNING: New kvstore {klass.__module__}.{klass.__name__} is "
                          f"overriding existing kvstore {previous.__module__}."
                          f"{previous.__name__}", stacklevel=2)
        KVStoreBase.kv_registry[name] = klass
        return klass


abc.ABCMeta.register(KVStoreBase, KVStore)


def registered(name: str):
    """A new store of the class registered as ``name``, or None."""
    klass = KVStoreBase.kv_registry.get(name)
    return None if klass is None else klass()


@KVStoreBase.register
class TestStore(KVStoreBase):
    """MXNet's store for tests: one worker, sums in the first value's context, runs no
    optimizer."""

    def broadcast(self, key, value, out, priority=0):
        for target in out if isinstance(out, list) else [out]:
            target[:] = value.as_in_context(target.context)

    def pushpull(self, key, value, out=None, priority=0):
        values = value if isinstance(value, list) else [value]
        ctx = values[0].context
        total = values[0].as_in_context(ctx).copy()
        for other in values[1:]:
            total += other.as_in_context(ctx)
        targets = values if out is None else out if isinstance(out, list) else [out]
        for target in targets:
            target[:] = total.as_in_context(target.context)

    @staticmethod
    def is_capable(capability):
        if str(capability).lower() == KVStoreBase.OPTIMIZER:
            return False
        raise UnknownCapabilityError(f"Unknown capability: {capability}")

    @property
    def type(self):
        return "teststore"

    @property
    def rank(self):
        return 0

    @property
    def num_workers(self):
        return 1


__all__ = ["KVStoreBase", "TestStore", "registered"]
