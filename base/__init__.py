"""The ground floor every layer may import: mixrt's error types (``errors.py``).

It imports nothing of mixrt's and loads nothing heavy, so ``runtime/blas_policy.py`` can use
it before NumPy loads, and the kvstore, the runtime and the operators share one set of
errors without reaching up into the frontends' folder. Users import the same classes as
:mod:`mixrt.errors`.
"""

# MXNet's ``mxnet.base.MXNetError`` under MXNet's dotted path, for code written against MXNet
from mixrt.base.errors import MXNetError  # noqa: E402,F401
