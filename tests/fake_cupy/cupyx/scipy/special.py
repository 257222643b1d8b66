import math

import numpy as _np

from cupy._core import unwrap, wrap

_erf = _np.vectorize(math.erf, otypes=[_np.float64])


def erf(x):
    host = unwrap(x)
    return wrap(_erf(host).astype(host.dtype))
