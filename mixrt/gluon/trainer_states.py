"""The Trainer's optimizer state: read, restored and saved as ``.npz`` (no pickle).

:meth:`OptimizerStates.state_dict` reads the state from wherever the optimizer runs (this
process, or the store when ``update_on_kvstore``), :meth:`OptimizerStates.load_state_dict`
checks that a saved state fits the Trainer's parameters (keys and shapes) before restoring
it, and :meth:`OptimizerStates.save` / :meth:`OptimizerStates.load` write and read it at a
path. It stands apart from the update step (``trainer.py``) and the store
(``trainer_store.py``): a checkpoint's concern, used between runs. :class:`OptimizerStates`
is a part of :class:`~mixrt.gluon.Trainer` (its ``_states``; the Trainer's
``optimizer_state_dict``, ``load_optimizer_state_dict``, ``save_states`` and
``load_states`` are its methods).
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import OptimizerError
from mixrt.gluon.trainer_store import TrainerStore
from mixrt.runtime.training import optimizer as optim
from mixrt.runtime.npz import read_npz, write_npz


class OptimizerStates:
    """The optimizer's state of a Trainer, in arrays and in ``.npz`` files."""

    def __init__(self, trainer, store: TrainerStore):
        self.trainer, self.store = trainer, store

    def state_dict(self) -> dict:
        """The optimizer's state (from the store when it runs there)."""
        if self.store.update_on_kvstore:
            self.store.init()
            updater = self._store_updater()
            return updater.state_arrays() if updater is not None else \
                self.store.kvstore._optimizer_state_dict()
        return self.trainer.optimizer.state_dict()

    def _store_updater(self):
        """The MXNet Updater a local store runs the Trainer's MXNet optimizer through, or
        None (the store runs an engine optimizer of its own)."""
        return getattr(self.store.kvstore, "_front_updater", None)

    def load_state_dict(self, arrays: dict) -> None:
        """Restore :meth:`state_dict`'s arrays: every key must be one of the Trainer's
        parameters and every state array its shape (else an OptimizerError)."""
        self._check_state_keys(arrays)
        if self.store.update_on_kvstore:
            self.store.init()
            updater = self._store_updater()
            if updater is not None:
                updater.load_state_arrays(dict(arrays))
            else:
                self.store.kvstore._load_optimizer_state_dict(dict(arrays))
            return
        self.trainer.optimizer.load_state_dict(arrays)

    def _check_state_keys(self, arrays) -> None:
        """The optimizer checks the state's layout; only the Trainer knows the weights it
        must fit, so a state saved for another model fails here, not at a later step."""
        trainer, on_store = self.trainer, self.store.update_on_kvstore
        params = {(self.store.key(param) if on_store else param.name): param
                  for param in trainer._params}
        if trainer._updaters and not on_store:  # MXNet's Updater keys: indices
            params = {str(index): param for index, param in enumerate(trainer._params)}
        for index, key in enumerate(optim.read_meta(arrays)["keys"]):
            if key not in params:
                raise OptimizerError(f"the optimizer state is for {key!r}, which is not one "
                                     f"of this Trainer's {len(params)} parameters "
                                     f"{sorted(params)[:8]}{' ...' if len(params) > 8 else ''}")
            shape = params[key].shape
            for name in (n for n in arrays if n.startswith(f"state{index}.")):
                found = tuple(np.shape(arrays[name]))
                if shape is not None and 0 not in shape and found != tuple(shape):
                    raise OptimizerError(f"the optimizer state {name!r} of {key!r} has shape "
                                         f"{found}; the parameter's is {tuple(shape)}")

    def save(self, path) -> None:
        """The optimizer state as an ``.npz`` at exactly ``path`` (:meth:`load` reads it)."""
        write_npz(path, self.state_dict(), f"save_states {str(path)!r}")

    def load(self, path) -> None:
        arrays = read_npz(path, "optimizer state file")
        try:
            self.load_state_dict(arrays)
        except OptimizerError as exc:  # the optimizer does not know which file it read
            raise OptimizerError(f"optimizer state file {str(path)!r}: {exc}") from exc
