"""An NDArray's values leaving mixrt: as a NumPy array (``asnumpy``, ``np.array(x)``), a
scalar or Python number (``asscalar``, ``item``, ``float``, ``int``, ``bool`` with MXNet's
rules), a list, or a DLPack capsule another library takes without a copy; and MXNet's
``as_nd_ndarray``/``as_np_ndarray``.

:class:`HostValues` is one of the parts :class:`mixrt.nd.ndarray.NDArray` is composed of:
every method here reads the array once its pending writes are done (``_read``) and makes
nothing of mixrt's.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.ops.device import to_host


class HostValues:
    """An array's values as NumPy, Python and DLPack take them."""

    __slots__ = ()

    def asnumpy(self) -> np.ndarray:
        return np.array(to_host(self._read()), copy=True)

    def __array__(self, dtype=None, copy=None):
        data = self._read()
        host = to_host(data) if dtype is None else to_host(data).astype(dtype, copy=False)
        return host.copy() if copy and host is data else host  # np.array(x) must not alias x

    def asscalar(self):
        """The one element as a NumPy scalar of the array's dtype (MXNet's)."""
        if self.size != 1:
            raise NotScalarError(f"asscalar needs an array of one element, this one is "
                                 f"{self.shape}")
        return self.asnumpy().reshape(())[()]

    def item(self):
        """The one element as a Python number."""
        return self.asscalar().item()

    def __float__(self) -> float:
        return float(self.asscalar())

    def __int__(self) -> int:
        return int(self.asscalar())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer arrays can be an index, not {self.dtype}")
        return int(self.asscalar())

    def __bool__(self) -> bool:
        """MXNet's rule: an empty array is false, one element is its truth, more are
        ambiguous (``ValueError``)."""
        if self.size == 0:
            return False
        if self.size > 1:
            raise AmbiguousTruthError("The truth value of an NDArray with multiple elements "
                                      "is ambiguous.")
        return bool(self.asscalar())

    def tolist(self) -> list:
        return self.asnumpy().tolist()

    def __dlpack__(self, stream=None, **kwargs):
        data = self._read()
        if stream is not None:
            kwargs["stream"] = stream
        try:  # max_version matters: NumPy marks what a legacy capsule gives it read-only
            return data.__dlpack__(**kwargs)
        except TypeError:  # a producer that knows only `stream` (CuPy < 14)
            return data.__dlpack__() if stream is None else data.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._read().__dlpack_device__()

    def to_dlpack_for_read(self):
        """A DLPack capsule of this array's memory (MXNet's; ``nd.from_dlpack`` takes it)."""
        return self.__dlpack__()

    to_dlpack_for_write = to_dlpack_for_read

    def as_nd_ndarray(self) -> "NDArray":
        return self

    def as_np_ndarray(self):
        raise InputError("as_np_ndarray: mixrt has no mx.np arrays; use asnumpy() for a "
                         "NumPy copy")


class AmbiguousTruthError(InputError, ValueError):
    """``bool()`` of an array of several elements; a ``ValueError`` too, as in MXNet."""


class NotScalarError(InputError, ValueError):
    """``asscalar()`` of an array that is not one element; a ``ValueError`` too, as in
    MXNet."""

