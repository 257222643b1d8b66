"""What a Parameter does through the Trainer that updates it (MXNet's ``_trainer`` link).

A ``row_sparse`` parameter's weights live in its Trainer's store, so its rows are read
through the Trainer (``row_sparse_data``, ``list_row_sparse_data``), and so is the whole
value a checkpoint saves (``_reduce``, which for a dense parameter is the mean of its
copies); values written into a parameter make the store's copy stale (``_stale_store``).
These are the only places a Parameter reaches back to a Trainer, kept apart from the
copies themselves (``parameter_storage.py``) because they follow the Trainer's protocol
(``_row_sparse_pull``, ``_reset_kvstore``, ``_params_to_init``), not the NDArrays'.
:class:`TrainerLink` is a part of :class:`~mixrt.gluon.Parameter` (its ``_link``, made
by ``Parameter.__init__``; the Parameter's ``row_sparse_data``, ``list_row_sparse_data``,
``_set_trainer``, ``_stale_store`` and ``_reduce`` are its methods), and holds the
Trainer (``Parameter._trainer`` reads it).
"""

from __future__ import annotations

from mixrt import nd
from mixrt.context import as_context
from mixrt.gluon.parameter_storage import ParameterStorageError
from mixrt.nd import sparse as nd_sparse
from mixrt.nd.ndarray import NDArray


class TrainerLink:
    """A Parameter's row_sparse reads and its Trainer's store, reached through the
    Trainer (``trainer``: None until a Trainer takes the parameter)."""

    def __init__(self, param):
        self.param = param
        self.trainer = None

    def row_sparse_data(self, row_id):
        """The rows ``row_id`` names, as a RowSparseNDArray on ``row_id``'s context (the
        parameter's copy there, refreshed by its Trainer)."""
        param = self.param
        self._sparse_only("row_sparse_data")
        return self._get_row_sparse(param._check_and_get(param._checked(), row_id.ctx),
                                    row_id)

    def list_row_sparse_data(self, row_id) -> list:
        """``row_sparse_data`` on every context: the copies, with the rows ``row_id``
        names."""
        self._sparse_only("list_row_sparse_data")
        return self._get_row_sparse(list(self.param._checked()), row_id)

    def _sparse_only(self, what: str) -> None:
        param = self.param
        if param._stype != "row_sparse":
            raise ParameterStorageError(
                f"Cannot return a copy of Parameter {param.name!r} via {what}() because its "
                f"storage type is {param._stype}. Please use data() instead.")

    def _get_row_sparse(self, out, row_id, full_idx: bool = False):
        name = self.param.name
        if self.trainer is None:
            raise ParameterStorageError(f"Cannot get row_sparse data for Parameter "
                                        f"{name!r} when no Trainer is created with it.")
        pull = getattr(self.trainer, "_row_sparse_pull", None)
        if pull is None:
            raise ParameterStorageError(f"parameter {name!r}: its Trainer "
                                        f"({type(self.trainer).__name__}) cannot fetch "
                                        f"row_sparse rows (it has no _row_sparse_pull)")
        pull(self.param, out, row_id, full_idx)
        return out

    def set_trainer(self, trainer) -> None:
        """Record the Trainer that updates the parameter; a sparse parameter takes one."""
        param = self.param
        if param._stype != "default" and self.trainer is not None and trainer is not None \
                and self.trainer is not trainer:
            raise ParameterStorageError(
                f"Failed to set the trainer for Parameter {param.name!r} because it was "
                f"already set. More than one trainers for a {param._stype} Parameter is not "
                f"supported.")
        self.trainer = trainer

    def stale_store(self) -> None:
        """New values make the copy in the Trainer's store stale where the store updates
        the weights: MXNet's Trainer then drops its store and starts a fresh one."""
        trainer = self.trainer
        if trainer is not None and trainer._kv_initialized and trainer._update_on_kvstore \
                and self.param not in trainer._params_to_init:
            trainer._reset_kvstore()

    def reduce(self) -> NDArray:
        """The value on the CPU: the mean of the copies (a row_sparse parameter's every
        row, fetched through its Trainer), what checkpoints save."""
        param, cpu = self.param, as_context("cpu")
        if param._stype == "default":
            copies = param._checked()
            total = copies[0].copyto(cpu)
            for copy in copies[1:]:
                total += copy.copyto(cpu)
            return total / len(copies) if len(copies) > 1 else total
        full = nd_sparse.zeros("row_sparse", param.shape, ctx=cpu, dtype=param.dtype)
        self._get_row_sparse(full, nd.arange(0, param.shape[0], dtype="int64", ctx=cpu),
                             full_idx=True)
        return full
