"""MXNet's ``mx.contrib``: the APIs MXNet 1.x kept beside its stable ones. Here:
``mixrt.contrib.autograd``, the first imperative autograd API (``train_section``,
``mark_variables``, ``grad_and_loss``), over :mod:`mixrt.autograd`."""
