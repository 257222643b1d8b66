"""The parts of cupyx that mixrt uses, on the fake CuPy."""

import numpy as _np

from cupy._core import unwrap, unwrap_index


def scatter_add(a, slices, value):
    _np.add.at(unwrap(a), unwrap_index(slices), unwrap(value))
