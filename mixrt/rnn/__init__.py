"""MXNet 1.x's symbolic RNN API, ``mx.rnn``: cells built from ``mx.sym`` operators, their
sequence iterator and checkpoints. (``mixrt.gluon.rnn`` is the Gluon one.)"""

from mixrt.rnn.cell_wrappers import (BidirectionalCell, DropoutCell, ModifierCell,
                                     ResidualCell, ZoneoutCell)
from mixrt.rnn.io import BucketSentenceIter, encode_sentences
from mixrt.rnn.rnn import do_rnn_checkpoint, load_rnn_checkpoint, save_rnn_checkpoint
from mixrt.rnn.rnn_cell import (BaseRNNCell, GRUCell, LSTMCell, RNNCell, RNNParams,
                                SequentialRNNCell)

__all__ = ["BaseRNNCell", "BidirectionalCell", "BucketSentenceIter", "DropoutCell",
           "GRUCell", "LSTMCell", "ModifierCell", "RNNCell", "RNNParams", "ResidualCell",
           "SequentialRNNCell", "ZoneoutCell", "do_rnn_checkpoint", "encode_sentences",
           "load_rnn_checkpoint", "save_rnn_checkpoint"]
