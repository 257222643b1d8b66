import numpy as _np

from cupy._core import unwrap, wrap


def as_strided(x, shape=None, strides=None):
    return wrap(_np.lib.stride_tricks.as_strided(unwrap(x), shape, strides))


def sliding_window_view(x, window_shape, axis=None, **kwargs):
    return wrap(_np.lib.stride_tricks.sliding_window_view(unwrap(x), window_shape, axis,
                                                          **kwargs))
