"""What every KVStore kind shares: key and value checks, the updater, optimizer checkpoints.

A store maps keys (``int`` or ``str``; ``3`` and ``"3"`` are one key) to arrays. Workers
``push`` gradients and ``pull`` weights. A value pushed as a list (one array per device) is
summed before anything else sees it. With an updater (``set_updater``, or ``set_optimizer``)
the store applies ``updater(key, summed_gradient, stored_weight)`` in place; without one a
push replaces the stored value by the sum (MXNet's semantics).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from mixrt.base.errors import KVStoreError, OptimizerError, ShapeError
from mixrt.kvstore.compression import check_params
from mixrt.ops.device import array_module, to_host
from mixrt.runtime import engine
from mixrt.runtime.training import optimizer as optim
from mixrt.runtime.npz import read_npz, write_npz

Updater = Callable[[str, object, object], None]


# -- a frontend's arrays ----------------------------------------------------------------------
# kvstore/ sits below the frontends and may not import mixrt.nd, yet MXNet's users hand the
# stores NDArrays, MXNet-style updaters and MXNet optimizers. mixrt/kv.py hands in, as it
# loads, how those meet the stores' NumPy/CuPy arrays.

@dataclass(frozen=True)
class ArrayFront:
    """``open(value, write)``: the NumPy/CuPy array inside a frontend array (synchronized for
    a read, or for the write that follows), None for anything else; ``wrap_updater(f)``: an
    updater over raw arrays that calls ``f(key, merged, stored)`` with frontend arrays;
    ``optimizer_updater(o)``: MXNet's ``Updater`` for a frontend optimizer, else None."""

    open: Callable
    wrap_updater: Callable
    optimizer_updater: Callable
    # a frontend array's storage type (MXNet's 'default', 'row_sparse', 'csr'; None for
    # anything else), and how a row_sparse one records the rows row_sparse_pull stored
    stype: Callable = lambda value: None
    stored_rows: Callable = lambda value, rows: None


_front: ArrayFront | None = None


def set_array_front(front: ArrayFront) -> None:
    global _front
    _front = front


def opened(array, what: str):
    """The raw array to read (``init``, ``push``) or to fill (``pull``) for ``array``."""
    raw = None if _front is None else _front.open(array, write=what.startswith("pull"))
    return array if raw is None else raw


def frontend_stype(array) -> str | None:
    """MXNet's storage type of a frontend array; None for a NumPy or CuPy array."""
    return None if _front is None else _front.stype(array)


def storage_type(array) -> str:
    return frontend_stype(array) or "default"


_INT_KEY = re.compile(r"-?[0-9]+")


def user_key(name: str):
    """The key as MXNet's updaters see it: an int for an int key (``3`` and ``"3"`` are
    one key here, so a digits-only str key comes back as an int too)."""
    return int(name) if _INT_KEY.fullmatch(name) else name


def normalize_key(key) -> str:
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer, str)):
        raise KVStoreError(f"a KVStore key is an int or a str, got {type(key).__name__} "
                           f"{key!r}")
    text = str(int(key)) if isinstance(key, (int, np.integer)) else key
    if not text or len(text.encode()) > 255:
        raise KVStoreError(f"KVStore key {key!r} must be 1..255 bytes long")
    return text


def key_value_pairs(keys, values, what: str, skip_sparse: bool = False,
                    open_arrays: bool = True) -> list[tuple[str, list]]:
    """``(key, value)``, ``([k1, k2], [v1, v2])`` or ``([k1, k2], [[v1a, v1b], v2])`` as
    ``[(key, [arrays...]), ...]`` (one array per device, opened to its NumPy/CuPy data
    unless ``open_arrays`` is false). ``skip_sparse``: leave out sparse arrays (MXNet's
    ``pull(..., ignore_sparse=True)``), which may leave a key with none."""
    if isinstance(keys, (list, tuple)):
        if not isinstance(values, (list, tuple)) or len(values) != len(keys):
            raise KVStoreError(f"{what}: {len(keys)} keys need {len(keys)} values, got "
                               f"{_describe(values)}")
        return [(normalize_key(k), _as_list(v, k, what, skip_sparse, open_arrays))
                for k, v in zip(keys, values)]
    return [(normalize_key(keys), _as_list(values, keys, what, skip_sparse, open_arrays))]


def _as_list(value, key, what: str, skip_sparse: bool = False,
             open_arrays: bool = True) -> list:
    arrays = list(value) if isinstance(value, (list, tuple)) else [value]
    if not arrays:
        raise KVStoreError(f"{what} key {key!r}: no arrays given")
    if skip_sparse:
        arrays = [array for array in arrays if storage_type(array) == "default"]
    if open_arrays:
        arrays = [opened(array, what) for array in arrays]
    for array in arrays:
        if not hasattr(array, "shape") or not hasattr(array, "dtype"):
            raise KVStoreError(f"{what} key {key!r}: expected NDArrays, NumPy or CuPy "
                               f"arrays, got {type(array).__name__}")
    return arrays


def _describe(values) -> str:
    return f"{len(values)} values" if isinstance(values, (list, tuple)) else \
        f"one {type(values).__name__}"


def check_like(key: str, stored, value, what: str) -> None:
    if tuple(value.shape) != tuple(stored.shape):
        raise ShapeError(f"{what} key {key!r}: shape {tuple(value.shape)} does not match "
                         f"the initialized {tuple(stored.shape)}")
    if np.dtype(value.dtype) != np.dtype(stored.dtype):
        raise KVStoreError(f"{what} key {key!r}: dtype {value.dtype} does not match the "
                           f"initialized {stored.dtype}")


def sum_on(arrays: list, xp, device=None):
    """The sum of per-device arrays, computed with ``xp`` (on ``device`` for CuPy)."""
    if xp is np:
        total = np.array(to_host(arrays[0]), copy=True)
        for array in arrays[1:]:
            total += to_host(array)
        return total
    with xp.cuda.Device(device if device is not None else arrays[0].device.id):
        total = xp.array(arrays[0], copy=True)
        for array in arrays[1:]:
            total += xp.asarray(array)
        return total


def copy_into(out, value) -> None:
    """``out[...] = value`` across devices (host <-> GPU copies where they differ, a copy to
    ``out``'s GPU first where ``value`` is on another: a kernel reading across GPUs needs
    peer access, which not every machine has)."""
    if array_module(out) is np:
        out[...] = to_host(value)
    elif array_module(value) is np and out.flags.c_contiguous:
        out.set(np.ascontiguousarray(value, dtype=out.dtype))
    else:  # CuPy's set() takes contiguous targets only
        with out.device:
            out[...] = array_module(out).asarray(value, dtype=out.dtype)


def require_out(out) -> None:
    if out is None:
        raise KVStoreError("pull needs `out`: the array (or list of arrays) to fill")


def optimizer_updater(optimizer: optim.Optimizer) -> Updater:
    def update(key, grad, weight):
        optimizer.step(key, weight, grad)
    return update


class KVStore:
    """The API every kind implements (``mixrt.kv.create(kind)`` picks one)."""

    type = ""
    OPTIMIZER = "optimizer"  # MXNet's capability name (is_capable)

    def __init__(self):
        self._updater: Updater | None = None
        self._optimizer: optim.Optimizer | None = None
        self._front_updater = None  # MXNet's Updater, when set_optimizer got an MXNet one
        self._compression: dict | None = None
        self._engine_var = None

    # -- work queued on the dependency engine ---------------------------------------------

    @property
    def engine_var(self):
        """The engine variable every store call queued on the dependency engine writes (a
        Trainer's pushes and pulls): one per store, so the calls run one at a time, in
        order, whichever Trainer queued them (a store's sockets belong to one thread at a
        time)."""
        if self._engine_var is None:
            self._engine_var = engine.new_var(f"kvstore {self.type}")
        return self._engine_var

    def wait_queued(self) -> None:
        """Wait for the store calls queued on the engine; raise the error of one that
        failed. A barrier must count the steps a Trainer has queued but not yet pushed, and
        a call from this thread must not share the sockets with an engine thread."""
        if self._engine_var is not None and not engine.on_engine_thread():
            engine.get_engine().wait_to_write(self._engine_var)

    # -- identity -----------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return 0

    @property
    def num_workers(self) -> int:
        return 1

    def barrier(self) -> None:
        """Wait until every worker reaches this point (one worker: nothing to wait for)."""

    def close(self) -> None:
        """Release sockets and threads (the distributed kinds); a no-op otherwise."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- data ---------------------------------------------------------------------------

    def init(self, key, value) -> None:
        raise NotImplementedError

    def push(self, key, value, priority: int = 0) -> None:
        raise NotImplementedError

    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True):
        raise NotImplementedError

    def pull_settled(self, key, out=None):
        """``pull`` once every worker has pushed each key as often as this one (what a pull
        after a barrier wants). A store in one process has nothing on its way: a pull."""
        return self.pull(key, out=out)

    def pushpull(self, key, value, out=None, priority: int = 0):
        """Push ``value`` and pull the result into ``out`` (into ``value`` when ``out`` is
        None), in one call."""
        self.push(key, value, priority)
        return self.pull(key, value if out is None else out, priority)

    def broadcast(self, key, value, out, priority: int = 0):
        """MXNet's ``broadcast``: ``init`` the key with ``value``, then ``pull`` it into
        ``out``."""
        self.init(key, value)
        return self.pull(key, out=out, priority=priority)

    def row_sparse_pull(self, key, out=None, priority: int = 0, row_ids=None):
        """MXNet's ``row_sparse_pull``: each ``out`` (row_sparse NDArrays; NumPy and CuPy
        arrays get the dense view) gets the stored rows its ``row_ids`` name, and stores
        exactly those rows; the others are zero."""
        if row_ids is None:
            raise KVStoreError("row_sparse_pull needs row_ids (the rows to pull)")
        require_out(out)
        outputs = key_value_pairs(key, out, "row_sparse_pull", open_arrays=False)
        for name, arrays in outputs:
            for array in arrays:
                if frontend_stype(array) not in (None, "row_sparse"):
                    raise KVStoreError(f"row_sparse_pull key {name!r}: out must be a "
                                       f"row_sparse array, got storage type "
                                       f"{storage_type(array)!r} (use pull for dense ones)")
        self.pull(key, out=out, priority=priority, ignore_sparse=False)
        for name, arrays in outputs:
            ids = _row_ids_per_output(name, row_ids, len(arrays), key)
            for array, rows in zip(arrays, ids):
                _keep_rows(array, np.unique(np.asarray(to_host(opened(rows, "read")),
                                                       dtype=np.int64)))
        return out

    def is_capable(self, capability: str) -> bool:
        """MXNet's ``is_capable``: whether this kind can run an optimizer (``"optimizer"``)."""
        if capability != self.OPTIMIZER:
            raise KVStoreError(f"is_capable: unknown capability {capability!r}; the one "
                               f"MXNet names is {self.OPTIMIZER!r}")
        return True

    # -- updates ------------------------------------------------------------------------

    def _apply(self, name: str, total, stored) -> None:
        """The summed push ``total`` into the stored value: the updater's step, or a copy."""
        if self._updater is not None:
            self._updater(name, total, stored)
        else:
            copy_into(stored, total)

    def set_updater(self, updater: Updater) -> None:
        """Apply ``updater(key, summed_gradient, weight)`` on each push (local kinds)."""
        if not callable(updater):
            raise KVStoreError(f"set_updater takes a callable (key, grad, weight), got "
                               f"{updater!r}")
        self._updater = updater

    def _set_updater(self, updater) -> None:
        """MXNet's ``_set_updater``: ``updater(key, merged, stored)`` with NDArrays (the key
        an int for int keys) runs on each push and changes ``stored`` in place."""
        if _front is None or not callable(updater):
            raise KVStoreError(f"_set_updater takes a callable (key, merged, stored) over "
                               f"NDArrays (import mixrt.kv first), got {updater!r}")
        self.set_updater(_front.wrap_updater(updater))

    def set_optimizer(self, optimizer) -> None:
        """Run ``optimizer`` inside the store: each push updates the stored weight. An MXNet
        optimizer (``mixrt.optimizer``) runs through its ``Updater``, as MXNet's local store
        does."""
        front_updater = None if _front is None else _front.optimizer_updater(optimizer)
        if front_updater is not None:
            self._optimizer, self._front_updater = None, front_updater
            self._set_updater(front_updater)
            return
        if not isinstance(optimizer, optim.Optimizer):
            raise KVStoreError(f"set_optimizer takes a mixrt optimizer (mixrt.optimizer."
                               f"create(...)), got {type(optimizer).__name__}")
        self._optimizer, self._front_updater = optimizer, None
        self.set_updater(optimizer_updater(optimizer))

    @property
    def optimizer(self) -> optim.Optimizer | None:
        return self._optimizer

    def set_gradient_compression(self, params: dict) -> None:
        self._compression = check_params(params)

    # -- optimizer checkpoints ----------------------------------------------------------

    def save_optimizer_states(self, path, dump_optimizer: bool = False) -> None:
        """The store's optimizer state as an ``.npz`` at exactly ``path`` that loads with
        allow_pickle=False. For an MXNet optimizer the file is its Updater's ``get_states``
        (also an ``.npz``, never a pickle; ``dump_optimizer`` adds the optimizer's
        settings)."""
        if self._front_updater is not None:
            Path(path).write_bytes(self._front_updater.get_states(dump_optimizer))
            return
        write_npz(path, self._optimizer_state_dict(), f"save_optimizer_states "
                        f"{str(path)!r}")

    def load_optimizer_states(self, path) -> None:
        """Restore what ``save_optimizer_states`` wrote onto this store's optimizer. Its keys
        must be initialized first, with the shapes the states were saved for."""
        if self._front_updater is not None:
            self._front_updater.set_states(_read_bytes(path, "optimizer state file"))
            return
        arrays = read_npz(path, "optimizer state file")
        try:
            self._load_optimizer_state_dict(arrays)
        except OptimizerError as exc:  # the optimizer does not know which file it read
            raise OptimizerError(f"optimizer state file {str(path)!r}: {exc}") from exc

    def _optimizer_state_dict(self) -> dict:
        return self._require_optimizer("save_optimizer_states").state_dict()

    def _load_optimizer_state_dict(self, arrays: dict) -> None:
        optimizer = self._require_optimizer("load_optimizer_states")
        self._check_state_shapes(arrays)
        optimizer.load_state_dict(arrays)

    def _check_state_shapes(self, arrays) -> None:
        """Every saved state array has its key's shape, and every key is one this store
        holds: a state saved for another model fails when it loads, not at a later step."""
        for index, key in enumerate(optim.read_meta(arrays)["keys"]):
            try:
                shape = self._value_shape(key, "load_optimizer_states")
            except KVStoreError as exc:
                raise OptimizerError(f"the optimizer state is for key {key!r}, which this "
                                     f"store does not hold ({exc})") from exc
            for name in sorted(n for n in arrays if n.startswith(f"state{index}.")):
                found = tuple(np.shape(arrays[name]))
                if found != shape:
                    raise OptimizerError(f"the optimizer state {name!r} of key {key!r} has "
                                         f"shape {found}; the key's value has {shape}")

    def _value_shape(self, key: str, what: str) -> tuple:
        """The shape of the value stored under ``key``; KVStoreError for an unknown key
        (the in-process stores keep the values themselves: ``_stored``)."""
        return tuple(self._stored(key, what).shape)

    def _require_optimizer(self, what: str) -> optim.Optimizer:
        if self._optimizer is None:
            raise KVStoreError(f"{what}: this {self.type!r} store has no optimizer; call "
                               f"set_optimizer first")
        return self._optimizer

    def __repr__(self) -> str:
        return f"<KVStore {self.type!r} rank {self.rank} of {self.num_workers}>"


def _keep_rows(array, rows: np.ndarray) -> None:
    """Zero every row of ``array`` but ``rows``, and record them as its stored rows."""
    raw = opened(array, "pull")
    keep = np.zeros(raw.shape[0], dtype=bool)
    keep[rows] = True
    raw[array_module(raw).asarray(~keep)] = 0
    if _front is not None:
        _front.stored_rows(array, rows)


def _row_ids_per_output(name: str, row_ids, outputs: int, key) -> list:
    """One row-id array per output: a list of them (per key for a list of keys), or one
    for all."""
    if isinstance(key, (list, tuple)):
        index = [normalize_key(k) for k in key].index(name)
        row_ids = row_ids[index] if isinstance(row_ids, (list, tuple)) else row_ids
    ids = list(row_ids) if isinstance(row_ids, (list, tuple)) else [row_ids] * outputs
    if len(ids) != outputs:
        raise KVStoreError(f"row_sparse_pull key {name!r}: {outputs} outputs need as many "
                           f"row_ids, got {len(ids)}")
    return ids


def _read_bytes(path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OptimizerError(f"{what} {str(path)!r}: {exc.strerror or exc}") from None
