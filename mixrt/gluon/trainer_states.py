"""The Trainer's optimizer state: read, restored and saved as ``.npz`` (no pickle).

``optimizer_state_dict`` reads the state from wherever the optimizer runs (this process,
or the store when ``update_on_kvstore``), ``load_optimizer_state_dict`` checks that a saved
state fits this Trainer's parameters (keys and shapes) before restoring it, and
``save_states``/``load_states`` write and read it at a path. It stands apart from the
update step (``trainer.py``) and the store (``trainer_store.py``): a checkpoint's concern,
used between runs. :class:`OptimizerStates` is a mixin of :class:`~mixrt.gluon.Trainer`.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import OptimizerError
from mixrt.runtime.training import optimizer as optim
from mixrt.runtime.npz import read_npz, write_npz


class OptimizerStates:
    """The optimizer's state of a Trainer, in arrays and in ``.npz`` files."""

    def optimizer_state_dict(self) -> dict:
        """The optimizer's state (from the store when it runs there)."""
        if self.update_on_kvstore:
            self._init_kvstore()
            updater = self._store_updater()
            return updater.state_arrays() if updater is not None else \
                self.kvstore._optimizer_state_dict()
        return self.optimizer.state_dict()

    def _store_updater(self):
        """The MXNet Updater a local store runs this Trainer's MXNet optimizer through, or
        None (the store runs an engine optimizer of its own)."""
        return getattr(self.kvstore, "_front_updater", None)

    def load_optimizer_state_dict(self, arrays: dict) -> None:
        """Restore ``optimizer_state_dict()``'s arrays: every key must be one of this
        Trainer's parameters and every state array its shape (else an OptimizerError)."""
        self._check_state_keys(arrays)
        if self.update_on_kvstore:
            self._init_kvstore()
            updater = self._store_updater()
            if updater is not None:
                updater.load_state_arrays(dict(arrays))
            else:
                self.kvstore._load_optimizer_state_dict(dict(arrays))
            return
        self.optimizer.load_state_dict(arrays)

    def _check_state_keys(self, arrays) -> None:
        """The optimizer checks the state's layout; only the Trainer knows the weights it
        must fit, so a state saved for another model fails here, not at a later step."""
        prefix = self.key_prefix if self.update_on_kvstore else ""
        params = {prefix + param.name: param for param in self._params}
        if self._updaters and not self.update_on_kvstore:  # MXNet's Updater keys: indices
            params = {str(index): param for index, param in enumerate(self._params)}
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

    def save_states(self, path) -> None:
        """The optimizer state as an ``.npz`` at exactly ``path`` (``load_states`` reads it)."""
        write_npz(path, self.optimizer_state_dict(), f"save_states {str(path)!r}")

    def load_states(self, path) -> None:
        arrays = read_npz(path, "optimizer state file")
        try:
            self.load_optimizer_state_dict(arrays)
        except OptimizerError as exc:  # the optimizer does not know which file it read
            raise OptimizerError(f"optimizer state file {str(path)!r}: {exc}") from exc

