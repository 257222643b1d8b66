"""Checkpoints of a Module's training run: its parameters, the optimizer's state, the data
iterator's position, the loss scaler and the epochs' history, in one ``.npz`` file with a
JSON record (no pickle). Everything is checked before anything changes, so a bad file leaves
the module as it was. :class:`Checkpoints` is the part of :class:`mixrt.module.Module` that
writes and reads them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mixrt.base.errors import InputError, ModelLoadError, OptimizerError
from mixrt.gluon import Trainer
from mixrt.io import NDArrayIter
from mixrt.ops.device import to_host
from mixrt.runtime.training.mixed_precision import LossScaler
from mixrt.runtime.npz import read_npz, write_npz

CHECKPOINT_FORMAT = "mixrt.checkpoint/1"


class Checkpoints:
    """save_checkpoint / load_checkpoint for a class with ``params`` (a ParameterDict),
    ``loss_scaler`` and ``_changed()``: :class:`mixrt.module.Module`."""

    def save_checkpoint(self, path, trainer: Trainer, epoch: int, data: NDArrayIter | None,
                        history: list | None = None) -> Path:
        """``path``.npz: parameters, optimizer state and a JSON record (no pickle)."""
        path = Path(str(path) + ".npz") if not str(path).endswith(".npz") else Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"param/{name}": to_host(param.raw()) for name, param in self.params.items()}
        arrays.update({f"optimizer/{k}": v for k, v in trainer.optimizer_state_dict().items()})
        record = {"format": CHECKPOINT_FORMAT, "epoch": epoch, "history": history or [],
                  "data": None if data is None else data.state(),
                  "params": {n: p.grad_req for n, p in self.params.items()},
                  "loss_scaler": self.loss_scaler and self.loss_scaler.state_dict()}
        arrays["meta"] = np.array(json.dumps(record))
        write_npz(path, arrays, f"checkpoint {str(path)!r}")
        return path

    def load_checkpoint(self, path, trainer: Trainer,
                        data: NDArrayIter | None = None) -> tuple[int, list]:
        """Restore a checkpoint; returns (epochs done, history so far). Everything is
        checked before anything changes: a bad file leaves the module as it was."""
        where = f"checkpoint {str(path)!r}"
        arrays = read_npz(path, "checkpoint")
        record = _checkpoint_record(arrays.pop("meta", None), where)
        values = self._checkpoint_params(arrays, where)
        _check_scaler_state(record["loss_scaler"], where)
        self._load_run_state(trainer, data, record["data"], {
            k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("optimizer/")},
            where)
        for name, value in values.items():
            self.params[name].set_data(value)
        if record["loss_scaler"]:
            self.loss_scaler = self.loss_scaler or LossScaler()  # keeps fit's own settings
            self.loss_scaler.load_state_dict(record["loss_scaler"])
        self._changed()
        return record["epoch"], record["history"]

    @staticmethod
    def _load_run_state(trainer: Trainer, data, data_state, optimizer_state: dict,
                        where: str) -> None:
        """The iterator's and the optimizer's state; the iterator is put back as it was
        when either does not fit."""
        previous = None if data is None else data.state()
        try:
            if data is not None and data_state is not None:
                data.set_state(data_state)
            trainer.load_optimizer_state_dict(optimizer_state)
        except OptimizerError as exc:  # the optimizer does not know which file it read
            _put_back(data, previous)
            raise OptimizerError(f"{where}: {exc}") from exc
        except (InputError, KeyError, TypeError, ValueError, OverflowError) as exc:  # set_state
            _put_back(data, previous)
            raise ModelLoadError(f"{where}: the data iterator's state does not fit "
                                 f"({type(exc).__name__}: {exc})") from exc

    def _checkpoint_params(self, arrays: dict, where: str) -> dict:
        """The parameter values, each with its parameter's shape and dtype."""
        values = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("param/")}
        extra = sorted(k for k in arrays if not k.startswith(("param/", "optimizer/")))
        unknown = sorted(set(values) - set(self.params))
        if extra or unknown:
            raise ModelLoadError(f"{where}: entries this model does not have: "
                                 f"{extra + [f'param/{n}' for n in unknown]}")
        for name, param in self.params.items():
            if name not in values:
                raise ModelLoadError(f"{where} has no parameter {name!r}")
            value = values[name]
            if value.shape != param.shape or value.dtype != param.dtype:
                raise ModelLoadError(f"{where}: parameter {name!r} is {value.dtype} "
                                     f"{list(value.shape)}; the model's is {param.dtype} "
                                     f"{list(param.shape)}")
        return values


def _checkpoint_record(meta, where: str) -> dict:
    """The checkpoint's JSON record, with the fields load_checkpoint uses checked."""
    if meta is None:
        raise ModelLoadError(f"{where} is not a mixrt checkpoint: it has no 'meta' entry")
    try:
        record = json.loads(np.asarray(meta).item())
    except (TypeError, ValueError, RecursionError) as exc:  # not text, not JSON, too deep
        raise ModelLoadError(f"{where}: its 'meta' entry is not a JSON record "
                             f"({type(exc).__name__}: {exc})") from exc
    found = record.get("format") if isinstance(record, dict) else None
    if found != CHECKPOINT_FORMAT:
        raise ModelLoadError(f"{where} is not a mixrt checkpoint (format {found!r}; expected "
                             f"{CHECKPOINT_FORMAT!r})")
    epoch, history = record.get("epoch"), record.get("history", [])
    if type(epoch) is not int or epoch < 0:
        raise ModelLoadError(f"{where}: 'epoch' must be a whole number >= 0, got {epoch!r}")
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise ModelLoadError(f"{where}: 'history' must be a list of epoch records")
    if not isinstance(record.get("data"), (dict, type(None))):
        raise ModelLoadError(f"{where}: 'data' must be the data iterator's state or null")
    return {"epoch": epoch, "history": history, "data": record.get("data"),
            "loss_scaler": record.get("loss_scaler")}


def _check_scaler_state(state, where: str) -> None:
    if state:  # None or {}: the run had no loss scaler
        try:
            LossScaler().load_state_dict(state)
        except InputError as exc:
            raise ModelLoadError(f"{where}: 'loss_scaler': {exc}") from exc


def _put_back(data, previous) -> None:
    if previous is not None:
        data.set_state(previous)
