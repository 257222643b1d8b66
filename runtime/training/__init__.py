"""The training engine, in a package of its own: the inference engine (the rest of
``runtime/``) never imports it.

* ``program.py``: a forward graph, a loss and the trainable parameters compiled into one
  joint forward+backward graph (``TrainingProgram``);
* ``mixed_precision.py``: a graph rewritten to compute in float16 or bfloat16, and the loss
  scaler;
* ``optimizers/``: every optimizer, one file each (MXNet's as definitions, from which the
  engine's ``mxnet_*`` kinds, the nd update operators and MXNet's classes are made or read;
  PyTorch's rules as the ``torch_*`` kinds), with their GPU launches; ``optimizer.py``
  builds a kind by name, over ``optimizer_base.py`` (hyper-parameters, update counts,
  checkpoints); ``update_rules.py`` is the language MXNet's rules are written in, both
  Python and C; ``optimizer_kernels.py`` what the GPU launches share;
* ``lr_scheduler.py``: learning-rate schedules.

The frontends (``mixrt.optimizer``, ``mixrt.gluon.Trainer``, ``Module``), the KVStore's
servers and the Trainer reach optimizers through here.
"""
