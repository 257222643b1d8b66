"""MXNet's ``Updater`` (``mx.optimizer.get_updater``): states per index, made on first use,
and the states' save format.

``updater(index, grad, weight)`` updates ``weight`` in place; ``index`` may be a list (with
lists of gradients and weights). ``get_states``/``set_states`` exchange bytes, as MXNet's do,
but the bytes are an ``.npz`` (``numpy.load(..., allow_pickle=False)`` reads it), never a
pickle: MXNet pickles its states, and unpickling a file runs whatever code it names. The
layout is the engine's checkpoint layout
(``mixrt.runtime.training.optimizer.Optimizer.state_dict``): ``state{i}.{slot}`` arrays and a
JSON ``meta`` entry, here with each state's nesting (MXNet's states are None, an NDArray or
tuples of them) and, with ``dump_optimizer=True``, the optimizer's constructor arguments and
plain attributes in place of MXNet's pickled object.
"""

from __future__ import annotations

import io
import json

import numpy as np

from mixrt.base.errors import ModelLoadError, OptimizerError
from mixrt.context import cpu
from mixrt.nd.ndarray import NDArray
from mixrt.runtime.training import lr_scheduler as schedulers
from mixrt.runtime.npz import read_npz

FORMAT = 1  # the engine's STATE_FORMAT: its read_meta accepts these files
_SKIPPED_ATTRIBUTES = ("_engine_updater", "param_dict", "_arguments", "lr_scheduler",
                       "_index_update_count")


class Updater:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.states: dict = {}
        self.states_synced: dict = {}
        self.aggregate_updates = optimizer.aggregate_num > 0

    def __call__(self, index, grad, weight):
        indices, grads, weights = _as_lists(index, grad, weight)
        if weights:
            self.optimizer._set_current_context(weights[0].ctx.device_id)
        for idx, weight_ in zip(indices, weights):
            if idx not in self.states:
                self.states[idx] = self.optimizer.create_state_multi_precision(idx, weight_)
                self.states_synced[idx] = True
            elif not self.states_synced[idx]:
                self.states[idx] = self.sync_state_context(self.states[idx], weight_.ctx)
                self.states_synced[idx] = True
        if self.aggregate_updates:
            self._update_in_groups(indices, grads, weights)
        else:
            for idx, grad_, weight_ in zip(indices, grads, weights):
                self.optimizer.update_multi_precision(idx, weight_, grad_, self.states[idx])

    def _update_in_groups(self, indices, grads, weights) -> None:
        """Weights of one dtype, ``aggregate_num`` at a time (MXNet's multi-tensor path;
        the arithmetic is the same weight by weight), or all of them at once where the
        optimizer's aggregated update takes any number (``updates_any_number``: SGD, one
        GPU launch for a whole step)."""
        by_dtype: dict = {}
        for entry in zip(indices, weights, grads):
            by_dtype.setdefault(entry[1].dtype, []).append(entry)
        for entries in by_dtype.values():
            size = len(entries) if self.optimizer.updates_any_number \
                else self.optimizer.aggregate_num
            for start in range(0, len(entries), size):
                idx, weight_, grad_ = (list(column) for column in zip(*entries[start:start + size]))
                self.optimizer.update_multi_precision(idx, weight_, grad_,
                                                      [self.states[i] for i in idx])

    def sync_state_context(self, state, context):
        """``state`` moved to ``context`` (a loaded state starts on the CPU)."""
        if isinstance(state, NDArray):
            return state.as_in_context(context)
        if isinstance(state, (tuple, list)):
            moved = [self.sync_state_context(part, context) for part in state]
            return tuple(moved) if isinstance(state, tuple) else moved
        return state

    # -- MXNet's save and load -----------------------------------------------------------

    def get_states(self, dump_optimizer: bool = False) -> bytes:
        """The states as ``.npz`` bytes; with ``dump_optimizer`` the optimizer too."""
        buffer = io.BytesIO()
        np.savez(buffer, **self.state_arrays(dump_optimizer=dump_optimizer))
        return buffer.getvalue()

    def set_states(self, states: bytes) -> None:
        """Load ``get_states``' bytes (a dumped optimizer replaces this one). The states
        move to each weight's device at its next update."""
        if not isinstance(states, (bytes, bytearray, memoryview)):
            raise OptimizerError(f"set_states takes the bytes get_states returned, got "
                                 f"{type(states).__name__}")
        data = bytes(states)
        if data[:1] == b"\x80":
            raise OptimizerError("set_states: these bytes are a pickle (MXNet's format); "
                                 "mixrt never unpickles (it would run code the file names): "
                                 "save the states with mixrt's get_states")
        try:
            arrays = read_npz(io.BytesIO(data), "optimizer states")
        except ModelLoadError as exc:
            raise OptimizerError(f"set_states: {exc}") from None
        self.load_state_arrays(arrays, restore_counts=False)

    # -- the layout, shared with Optimizer.state_dict ------------------------------------

    def state_arrays(self, dump_optimizer: bool = False) -> dict:
        keys = list(self.states)
        arrays, layouts = {}, []
        for position, key in enumerate(keys):
            layouts.append(_flatten(self.states[key], f"state{position}", arrays))
        optimizer = self.optimizer
        meta = {"format": FORMAT, "keys": [str(k) for k in keys],
                "key_types": [_key_type(k) for k in keys], "layouts": layouts,
                "counts": {str(k): int(v) for k, v in optimizer._index_update_count.items()},
                "optimizer": {"name": optimizer.name, "params": {}}}
        if dump_optimizer:
            meta["optimizer"]["params"] = _encode(optimizer._arguments)
            meta["optimizer"]["attributes"] = _attributes(optimizer)
        arrays["meta"] = np.array(json.dumps(meta))
        return arrays

    def load_state_arrays(self, arrays, restore_counts: bool = True) -> None:
        meta = _read_meta(arrays)
        described = meta["optimizer"]
        if "attributes" in described:
            self.optimizer = _rebuilt(self.optimizer, described)
            self.aggregate_updates = self.optimizer.aggregate_num > 0
        elif described["name"] != self.optimizer.name:
            raise OptimizerError(f"the states are {described['name']!r}'s, which "
                                 f"{self.optimizer.name!r} cannot continue from")
        keys = [int(k) if kind == "int" else k
                for k, kind in zip(meta["keys"], meta["key_types"])]
        states = {key: _unflatten(layout, f"state{i}", arrays)
                  for i, (key, layout) in enumerate(zip(keys, meta["layouts"]))}
        _refuse_unnamed(arrays, meta["layouts"])
        self.states = states
        self.states_synced = dict.fromkeys(states, False)
        if restore_counts:
            counts = {int(k) if _key_type_of(k, meta) == "int" else k: v
                      for k, v in meta["counts"].items()}
            self.optimizer._index_update_count.clear()
            self.optimizer._index_update_count.update(counts)
            self.optimizer.num_update = max([self.optimizer.begin_num_update,
                                             *counts.values()])


def get_updater(optimizer) -> Updater:
    return Updater(optimizer)


# -- helpers ----------------------------------------------------------------------------------

def _as_lists(index, grad, weight):
    if isinstance(index, (list, tuple)):
        return list(index), list(grad), list(weight)
    return [index], [grad], [weight]


def _key_type(key) -> str:
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return "int"
    if isinstance(key, str):
        return "str"
    raise OptimizerError(f"an optimizer index is an int or a str, got {key!r}")


def _key_type_of(text: str, meta: dict) -> str:
    keys = meta["keys"]
    return meta["key_types"][keys.index(text)] if text in keys else "str"


def _flatten(state, name: str, arrays: dict):
    """The layout of ``state`` (None, "array", or ["tuple" | "list", [parts]]); its arrays
    go into ``arrays`` as host copies named after their place."""
    if state is None:
        return None
    if isinstance(state, NDArray):
        arrays[f"{name}.value" if name.count(".") == 0 else name] = state.asnumpy()
        return "array"
    if isinstance(state, (tuple, list)):
        parts = [_flatten(part, f"{name}.{i}", arrays) for i, part in enumerate(state)]
        return ["tuple" if isinstance(state, tuple) else "list", parts]
    raise OptimizerError(f"cannot save an optimizer state of type {type(state).__name__}")


def _unflatten(layout, name: str, arrays):
    if layout is None:
        return None
    if layout == "array":
        entry = f"{name}.value" if name.count(".") == 0 else name
        if entry not in arrays:
            raise OptimizerError(f"the optimizer states lack the array {entry!r}")
        value = np.array(arrays[entry])
        if value.dtype.kind != "f":  # every MXNet optimizer's state is floating point
            raise OptimizerError(f"the optimizer state {entry!r} holds {value.dtype}; the "
                                 f"states are floating-point arrays")
        return NDArray(value, cpu())
    if isinstance(layout, list) and len(layout) == 2 and layout[0] in ("tuple", "list"):
        parts = [_unflatten(part, f"{name}.{i}", arrays) for i, part in enumerate(layout[1])]
        return tuple(parts) if layout[0] == "tuple" else parts
    raise OptimizerError(f"the optimizer states hold an unknown layout {layout!r}")


def _named(layout, name: str) -> list:
    """The array entries ``layout`` names (as ``_flatten`` wrote them)."""
    if layout == "array":
        return [f"{name}.value" if name.count(".") == 0 else name]
    if isinstance(layout, list) and len(layout) == 2:
        return [entry for i, part in enumerate(layout[1])
                for entry in _named(part, f"{name}.{i}")]
    return []


def _refuse_unnamed(arrays, layouts) -> None:
    """An array no state names is a file for another model or a tampered one."""
    named = {entry for i, layout in enumerate(layouts) for entry in _named(layout, f"state{i}")}
    extra = sorted(set(arrays) - named - {"meta"})
    if extra:
        raise OptimizerError(f"the optimizer states hold arrays no state names: {extra[:5]}")


def _read_meta(arrays) -> dict:
    if "meta" not in arrays:
        raise OptimizerError("not optimizer states: no 'meta' entry")
    try:
        meta = json.loads(np.asarray(arrays["meta"]).item())
    except (ValueError, TypeError, RecursionError) as exc:
        raise OptimizerError(f"the optimizer states' 'meta' entry is not JSON: {exc}") \
            from None
    needed = ("keys", "key_types", "layouts", "counts", "optimizer")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or \
            any(name not in meta for name in needed) or \
            len(meta["keys"]) != len(meta["key_types"]) != len(meta["layouts"]):
        raise OptimizerError(f"these are not mixrt's MXNet-optimizer states (format "
                             f"{FORMAT} with {list(needed)})")
    return meta


def _attributes(optimizer) -> dict:
    """The optimizer's plain attributes (rates, counts, multipliers), encoded; arrays and
    objects are left out (its constructor arguments rebuild those)."""
    plain = {}
    for name, value in vars(optimizer).items():
        if name in _SKIPPED_ATTRIBUTES:
            continue
        try:
            plain[name] = _encode(value)
        except OptimizerError:
            continue
    return plain


def _rebuilt(current, described: dict):
    name = described["name"]
    registry = type(current).opt_registry
    if name not in registry:
        raise OptimizerError(f"the dumped optimizer {name!r} is not registered")
    arguments = _decode(described["params"])
    optimizer = registry[name](**arguments)
    for attribute, value in described["attributes"].items():
        setattr(optimizer, attribute, _decode(value))
    optimizer._index_update_count = optimizer._all_index_update_counts.setdefault(0, {})
    return optimizer


def _encode(value):
    """``value`` as JSON data that keeps int dict keys and tuples apart."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value.item() if isinstance(value, np.generic) else value
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, (tuple, list)):
        items = [_encode(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, schedulers.LRScheduler):
        return {"lr_scheduler": value.spec()}
    raise OptimizerError(f"cannot save {type(value).__name__} {value!r:.60} without pickle")


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "dict" in value:
            return {_decode(k): _decode(v) for k, v in value["dict"]}
        if "tuple" in value:
            return tuple(_decode(v) for v in value["tuple"])
        if "lr_scheduler" in value:
            return schedulers.from_spec(value["lr_scheduler"])
        raise OptimizerError(f"unknown entry {sorted(value)} in dumped optimizer")
    return value


__all__ = ["Updater", "get_updater"]
