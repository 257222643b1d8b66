"""``mixrt.kv.create(kind)``: the KVStore (see :mod:`mixrt.kvstore`)."""

from mixrt.kvstore import KINDS, KVStore, create  # noqa: F401

__all__ = ["KINDS", "KVStore", "create"]
