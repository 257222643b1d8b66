"""The shared methods of NDArray and Symbol (``mixrt/array_methods.py``) with MXNet's
meanings for an NDArray where they differ: ``reshape``'s codes resolved against the known
shape (``mxnet_shape``), ``argmax``/``argmin`` over the flattened array by default with
indices as floats, ``flatten``/``expand_dims``/``squeeze`` as views with ``inplace=``, a
fully squeezed array of shape ``(1,)``.

:class:`NDArrayMethods` is one of the parts :class:`mixrt.nd.ndarray.NDArray` is composed of;
a Symbol keeps array_methods' meanings (its shape is known only when its graph runs).
"""

from __future__ import annotations

import numpy as np

from mixrt.array_methods import ArrayMethods
from mixrt.base.errors import InputError
from mixrt.ops.shape import shape_mxnet


class NDArrayMethods(ArrayMethods):
    """array_methods' shared methods, as MXNet's NDArray has them."""

    __slots__ = ()

    def _reshaped(self, codes: list[int], reverse: bool) -> "NDArray":
        # every code is resolved here against the known shape (a bad one is an InputError
        # naming it), so the op run is ONNX Reshape with sizes only
        target = mxnet_shape(self.shape, codes, reverse)
        return self._op("Reshape", [self, self._int_tensor(target)], {})

    def argmax(self, axis=None, keepdims: bool = False, out=None) -> "NDArray":
        """Indices of the largest values along ``axis`` (``None``, MXNet's default: over the
        flattened array, shape ``(1,)``), as floats of this array's dtype (MXNet's); so
        ``np.argmax(x, axis=1)`` is an NDArray too, as with MXNet."""
        return self._arg_index(ArrayMethods.argmax, axis, keepdims, out)

    def argmin(self, axis=None, keepdims: bool = False, out=None) -> "NDArray":
        """Indices of the smallest values along ``axis``, as ``argmax``."""
        return self._arg_index(ArrayMethods.argmin, axis, keepdims, out)

    def _arg_index(self, method, axis, keepdims: bool, out) -> "NDArray":
        if axis is None:
            flat = method(self.reshape(-1), 0, False)
            index = flat.reshape((1,) * self.ndim if keepdims else (1,))
        else:
            index = method(self, axis, keepdims)
        index = index.astype(self.dtype)
        if out is not None:
            out[:] = index
            return out
        return index

    def flatten(self, inplace: bool = False) -> "NDArray":
        """``(n, rest)``: a copy, or with ``inplace`` a view (MXNet's)."""
        if inplace:
            return self.reshape((self.shape[0] if self.ndim else 1, -1))
        return ArrayMethods.flatten(self)

    def expand_dims(self, axis: int, inplace: bool = False) -> "NDArray":
        """A new length-1 axis at ``axis``: a copy, or with ``inplace`` a view."""
        if inplace:
            axis = axis + self.ndim + 1 if axis < 0 else axis
            return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])
        return ArrayMethods.expand_dims(self, axis)

    def squeeze(self, axis=None, inplace: bool = False) -> "NDArray":
        """Without the length-1 axes (``axis``: those named); all of them squeezed gives
        shape ``(1,)``, as MXNet has no 0-d arrays there. ``inplace``: a view."""
        if not inplace:
            squeezed = ArrayMethods.squeeze(self, axis)
            return squeezed.reshape((1,)) if squeezed.ndim == 0 else squeezed
        named = range(self.ndim) if axis is None else \
            {a % self.ndim for a in np.atleast_1d(axis)}
        kept = tuple(d for a, d in enumerate(self.shape) if a not in named or d != 1)
        return self.reshape(kept or (1,))


class ReshapeError(InputError, ValueError):
    """A reshape whose target does not fit; a ``ValueError`` too, as in MXNet."""


def mxnet_shape(source: tuple, codes, reverse: bool = False) -> tuple:
    """The shape MXNet's reshape makes of ``source`` from ``codes`` (its 0/-1/-2/-3/-4, see
    ``NDArray.reshape``), -1 resolved; the rules are mixrt::MXReshape's (ops/shape/shape_mxnet.py),
    which a hybridized block runs instead."""
    try:
        return shape_mxnet.mxnet_shape(source, codes, reverse)
    except ValueError as exc:
        raise ReshapeError(f"reshape: {exc}") from None
