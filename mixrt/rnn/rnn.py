"""MXNet 1.x's RNN checkpoints (``mx.rnn``): parameters saved with each cell's packed
gate weights split per gate (``unpack_weights``), so that a checkpoint reads the same
whichever cell layout wrote it, and packed again on load."""

from __future__ import annotations

from mixrt import model
from mixrt.rnn.rnn_cell import BaseRNNCell


def _as_cells(cells) -> list:
    return [cells] if isinstance(cells, BaseRNNCell) else list(cells)


def save_rnn_checkpoint(cells, prefix, epoch, symbol, arg_params, aux_params) -> None:
    """``model.save_checkpoint`` with ``cells``' (a cell or a list) weights unpacked."""
    for cell in _as_cells(cells):
        arg_params = cell.unpack_weights(arg_params)
    model.save_checkpoint(prefix, epoch, symbol, arg_params, aux_params)


def load_rnn_checkpoint(cells, prefix, epoch):
    """(symbol, arg_params, aux_params) of a checkpoint from :func:`save_rnn_checkpoint`,
    ``cells``' weights packed again."""
    symbol, arg_params, aux_params = model.load_checkpoint(prefix, epoch)
    for cell in _as_cells(cells):
        arg_params = cell.pack_weights(arg_params)
    return symbol, arg_params, aux_params


def do_rnn_checkpoint(cells, prefix, period: int = 1):
    """An epoch-end callback saving an RNN checkpoint every ``period`` epochs."""
    period = int(max(1, period))

    def _callback(iter_no, sym=None, arg=None, aux=None):
        if (iter_no + 1) % period == 0:
            save_rnn_checkpoint(cells, prefix, iter_no + 1, sym, arg, aux)
    return _callback
