"""The single-process kinds: ``local`` sums per-device values on the CPU, ``device`` on a GPU.

MXNet's other names for them are served too and report themselves by that name
(``kv.type``): ``local_update_cpu`` and ``local_allreduce_cpu`` are ``local``,
``local_allreduce_device`` is ``device``.

``device`` keeps each stored value on the GPU of the first array it was initialized with and
sums pushed lists there (peer copies instead of round trips through the host), which is
what makes it the faster choice for several GPUs in one process. Given host arrays only it
sums on the CPU, as MXNet's ``device`` store does. Compression applies to the ``device``
kind's pushes as it does in MXNet (each device's gradient is quantized, with its own
residual, before the sum); ``local`` refuses it.
"""

from __future__ import annotations

import contextlib

import numpy as np

from mixrt.base.errors import KVStoreError
from mixrt.kvstore.base import (KVStore, check_like, copy_into, key_value_pairs,
                                normalize_key, require_out, sum_on, user_key)
from mixrt.kvstore.compression import create_compressor
from mixrt.ops.device import array_module


# MXNet's name -> where a pushed list is summed
AGGREGATE_ON = {"local": "cpu", "local_update_cpu": "cpu", "local_allreduce_cpu": "cpu",
                "device": "device", "local_allreduce_device": "device"}


class LocalStore(KVStore):
    def __init__(self, kind: str = "local"):
        super().__init__()
        if kind not in AGGREGATE_ON:
            raise KVStoreError(f"LocalStore serves {sorted(AGGREGATE_ON)}, not {kind!r}")
        self.type = kind
        self._on_device = AGGREGATE_ON[kind] == "device"
        self._store: dict[str, object] = {}
        self._compressor = None
        # int or str: MXNet's local stores refuse to mix the two; a digits-only str is
        # the int it spells here (3 and "3" are one key), so only names count as str
        self._key_kind = None

    def _check_key_kind(self, key, what: str) -> None:
        keys = key if isinstance(key, (list, tuple)) else [key]
        for one in keys:
            kind = type(user_key(normalize_key(one)))
            if self._key_kind is None:
                self._key_kind = kind
            elif kind is not self._key_kind:
                raise KVStoreError(f"{what}: key {one!r} is a {kind.__name__}, and this "
                                   f"store's keys are {self._key_kind.__name__}s; mixed key "
                                   f"types are not allowed (as in MXNet)")

    def init(self, key, value) -> None:
        self._check_key_kind(key, "init")
        for name, arrays in key_value_pairs(key, value, "init"):
            if name in self._store:
                raise KVStoreError(f"init: key {name!r} is already initialized")
            first = arrays[0]
            if self._on_device and array_module(first) is not np:
                with array_module(first).cuda.Device(first.device.id):
                    self._store[name] = array_module(first).array(first, copy=True)
            else:
                self._store[name] = np.array(_host(first), copy=True)

    def push(self, key, value, priority: int = 0) -> None:
        self._check_key_kind(key, "push")
        for name, arrays in key_value_pairs(key, value, "push"):
            stored = self._stored(name, "push")
            for array in arrays:
                check_like(name, stored, array, "push")
            if self._compressor is not None:
                arrays = [self._compressor.roundtrip(f"{name}/{i}", a)
                          for i, a in enumerate(arrays)]
            total = sum_on(arrays, array_module(stored), _device_of(stored))
            with _on_device_of(stored):  # the update (and new optimizer state) stays there
                self._apply(name, total, stored)

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True):
        self._check_key_kind(key, "pull")
        require_out(out)
        for name, arrays in key_value_pairs(key, out, "pull", skip_sparse=ignore_sparse):
            stored = self._stored(name, "pull")
            for array in arrays:
                check_like(name, stored, array, "pull")
                copy_into(array, stored)
        return out

    def set_gradient_compression(self, params: dict) -> None:
        if not self._on_device:
            raise KVStoreError("gradient compression is for the 'device' and 'dist_*' "
                               f"kinds; the {self.type!r} store sums on the CPU uncompressed")
        super().set_gradient_compression(params)
        self._compressor = create_compressor(self._compression)

    def _stored(self, name: str, what: str):
        if name not in self._store:
            raise KVStoreError(f"{what}: key {name!r} was never initialized (call init "
                               f"first); initialized keys: {sorted(self._store)[:20]}")
        return self._store[name]


def _host(array):
    return array if isinstance(array, np.ndarray) else array.get()


def _on_device_of(array):
    if isinstance(array, np.ndarray):
        return contextlib.nullcontext()
    return array_module(array).cuda.Device(array.device.id)


def _device_of(array):
    return None if isinstance(array, np.ndarray) else array.device.id
