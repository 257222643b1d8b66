"""MXNet 1.x's ``gluon.contrib.rnn`` cells. In MXNet 1.9 ``LSTMPCell`` and
``VariationalDropoutCell`` live here; mixrt defines them with the other cells in
``mixrt.gluon.rnn``, and this module gives them their contrib names (the same classes)."""

from mixrt.gluon.rnn.cell_wrappers import VariationalDropoutCell
from mixrt.gluon.rnn.rnn_cell import LSTMPCell

__all__ = ["LSTMPCell", "VariationalDropoutCell"]
