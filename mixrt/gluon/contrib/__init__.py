"""mixrt.gluon.contrib: MXNet 1.x's ``gluon.contrib`` layers (``contrib.nn``)."""

from mixrt.gluon.contrib import nn

__all__ = ["nn"]
