"""The training engine, in a package of its own: the inference engine (the rest of
``runtime/``) never imports it.

* ``program.py``: a forward graph, a loss and the trainable parameters compiled into one
  joint forward+backward graph (``TrainingProgram``);
* ``mixed_precision.py``: a graph rewritten to compute in float16 or bfloat16, and the loss
  scaler;
* ``optimizer.py``: the optimizers' kinds and the functions that build one by name, over
  ``optimizer_base.py`` (hyper-parameters, update counts, checkpoints);
  ``optimizer_mxnet_rules.py`` (the kinds that run MXNet's own rules); ``update_rules.py``
  (those rules, written once as text that is both Python and C); ``optimizer_kernels.py``
  (each update as one CuPy launch on a GPU);
* ``lr_scheduler.py``: learning-rate schedules.

The frontends (``mixrt.optimizer``, ``mixrt.gluon.Trainer``, ``Module``), the KVStore's
servers and the Trainer reach optimizers through here.
"""
