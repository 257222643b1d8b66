"""mixrt.gluon.contrib: MXNet 1.x's ``gluon.contrib`` layers (``contrib.nn``) and cells
(``contrib.rnn``)."""

from mixrt.gluon.contrib import nn, rnn

__all__ = ["nn", "rnn"]
