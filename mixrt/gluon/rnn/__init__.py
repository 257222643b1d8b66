"""mixrt.gluon.rnn: recurrent layers (RNN, LSTM, GRU over whole sequences) and cells (one
step; ``unroll`` for a sequence), with PyTorch's gate equations and MXNet's names.

    layer = rnn.LSTM(hidden_size=32, num_layers=2, layout="NTC")
    layer.initialize()
    out = layer(x)                                        # x: (N, T, C) -> (N, T, 32)
    out, states = layer(x, layer.begin_state(batch_size=x.shape[0]))

    stack = rnn.HybridSequentialRNNCell()                 # cells of cells: cell_wrappers
    stack.add(rnn.BidirectionalCell(rnn.LSTMCell(32), rnn.LSTMCell(32)))
    outputs, states = stack.unroll(T, x, layout="NTC", merge_outputs=True)
"""

from mixrt.gluon.rnn.cell_wrappers import (BidirectionalCell, DropoutCell,
                                           HybridSequentialRNNCell, ModifierCell,
                                           ResidualCell, SequentialRNNCell,
                                           VariationalDropoutCell, ZoneoutCell)
from mixrt.gluon.rnn.rnn_cell import (GRUCell, HybridRecurrentCell, LSTMCell, LSTMPCell,
                                      RecurrentCell, RNNCell)
from mixrt.gluon.rnn.rnn_layer import GRU, LSTM, RNN

__all__ = ["RNN", "LSTM", "GRU", "RecurrentCell", "HybridRecurrentCell", "RNNCell",
           "LSTMCell", "LSTMPCell", "GRUCell", "SequentialRNNCell", "HybridSequentialRNNCell",
           "DropoutCell", "ModifierCell", "ResidualCell", "ZoneoutCell", "BidirectionalCell",
           "VariationalDropoutCell"]
