"""MXNet's ``mx.init``: the initializers of ``mixrt.initializer`` under MXNet's short name.

Loading this module also lends ``Load`` the file reader (``mixrt.nd.load``, MXNet's
``.params`` format), which ``mixrt.initializer`` cannot import: ``mixrt.nd`` imports it.
"""

from mixrt import nd
from mixrt.initializer import *  # noqa: F401,F403
from mixrt.initializer import Load, __all__  # noqa: F401

Load.file_loader = staticmethod(nd.load)
