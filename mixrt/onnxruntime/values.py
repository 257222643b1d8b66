"""onnxruntime's ``OrtValue`` and the descriptions of where memory lies (``OrtDevice``,
``OrtMemoryInfo``), over the arrays mixrt runs on: a NumPy array on the CPU, a CuPy array on
a GPU. An OrtValue made from a NumPy array shares its memory (as onnxruntime's does), so
``update_inplace`` and a bound output write into the caller's array.
"""

from __future__ import annotations

import ctypes
import enum

import numpy as np
from onnx import helper as onnx_helper

from mixrt.onnxruntime.errors import InvalidArgument, as_onnxruntime_errors
from mixrt.ops.device import parse_device
from mixrt.runtime.feeds import type_name


class OrtMemType(enum.IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1
    DEFAULT = 0


class OrtAllocatorType(enum.IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1


class OrtDeviceMemoryType(enum.IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtMemoryInfoDeviceType(enum.IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


# onnxruntime's device type numbers (OrtDevice::CPU, GPU) and the names its Python API takes
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "gpu": 1}
NVIDIA_VENDOR_ID = 0x10DE


class OrtDevice:
    """A device as onnxruntime describes one: its type (0 CPU, 1 GPU), number, vendor."""

    def __init__(self, device_type: int = 0, mem_type: int = 0, device_id: int = 0,
                 vendor_id: int = 0):
        self._type, self._mem_type, self._id, self._vendor = (int(device_type), int(mem_type),
                                                              int(device_id), int(vendor_id))

    @classmethod
    def make(cls, device_type: str, device_id: int, vendor_id: int | None = None) -> OrtDevice:
        kind = _device_type(device_type)
        vendor = vendor_id if vendor_id is not None else (NVIDIA_VENDOR_ID if kind else 0)
        return cls(kind, 0, device_id, vendor)

    def device_type(self) -> int:
        return self._type

    def device_id(self) -> int:
        return self._id

    def device_mem_type(self) -> int:
        return self._mem_type

    def device_vendor_id(self) -> int:
        return self._vendor

    def mixrt_device(self) -> str:
        return f"gpu:{self._id}" if self._type == 1 else "cpu"

    def __repr__(self):
        return f"OrtDevice({'cuda' if self._type == 1 else 'cpu'}:{self._id})"


def _device_type(name: str) -> int:
    kind = _DEVICE_TYPES.get(str(name).lower())
    if kind is None:
        raise InvalidArgument(f"Unsupported device type: {name!r}; mixrt runs 'cpu' and "
                              f"'cuda'")
    return kind


class OrtMemoryInfo:
    """Where an input or output lies, as onnxruntime's memory info says it."""

    def __init__(self, name: str, allocator_type=OrtAllocatorType.ORT_ARENA_ALLOCATOR,
                 device_id: int = 0, mem_type=OrtMemType.DEFAULT, *,
                 device_mem_type=OrtDeviceMemoryType.DEFAULT, vendor_id: int = 0):
        self.name = name
        self.allocator_type = OrtAllocatorType(allocator_type)
        self.device_id = int(device_id)
        self.mem_type = OrtMemType(mem_type)
        self.device_mem_type = OrtDeviceMemoryType(device_mem_type)
        self.device_vendor_id = int(vendor_id)

    @classmethod
    def create_v2(cls, name: str, device_type, vendor_id: int, device_id: int,
                  device_mem_type, alignment: int, allocator_type) -> OrtMemoryInfo:
        del device_type, alignment  # the name says CPU or GPU; mixrt aligns to 64 bytes
        return cls(name, allocator_type, device_id, OrtMemType.DEFAULT,
                   device_mem_type=device_mem_type, vendor_id=vendor_id)

    @classmethod
    def for_device(cls, device) -> OrtMemoryInfo:
        if device.kind == "gpu":
            return cls("Cuda", device_id=device.index, vendor_id=NVIDIA_VENDOR_ID)
        return cls("Cpu")

    def __repr__(self):
        return f"OrtMemoryInfo({self.name!r}, device_id={self.device_id})"


def onnx_element_type(dtype) -> int:
    """The ONNX TensorProto number of a NumPy dtype (1 float, 7 int64, 8 string...)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return 8
    return int(onnx_helper.np_dtype_to_tensor_dtype(dtype))


def numpy_dtype(element_type) -> np.dtype:
    """A NumPy dtype from onnxruntime's element types: a NumPy type, or an ONNX number."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        if int(element_type) == 8:
            return np.dtype(object)
        return np.dtype(onnx_helper.tensor_dtype_to_np_dtype(int(element_type)))
    return np.dtype(element_type)


class OrtValue:
    """A tensor (or a sequence, or a map) that a run reads or writes; onnxruntime's class.

    ``_ortvalue`` is the value itself, as onnxruntime's Python class keeps its C object
    there (tests and tools reach it for ``data_ptr`` and DLPack)."""

    def __init__(self, value, element_type: int | None = None):
        self._value = value
        self._element_type = element_type

    @property
    def _ortvalue(self) -> OrtValue:
        return self  # a property, not an attribute: no reference cycle holds the array

    # -- making one ------------------------------------------------------------------------

    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        del vendor_id
        array = numpy_obj if isinstance(numpy_obj, np.ndarray) else np.asarray(numpy_obj)
        if _device_type(device_type) == 0:
            return cls(array)
        with as_onnxruntime_errors():  # no such GPU: EPFail
            return cls(parse_device(f"gpu:{int(device_id)}").put(array, "an OrtValue"))

    @classmethod
    def ortvalue_from_numpy_with_onnx_type(cls, data, onnx_element_type: int) -> OrtValue:
        """The array's bytes as ``onnx_element_type`` (its ONNX number), as onnxruntime
        takes them: reinterpreted where the item sizes agree (float16 bits held as uint16),
        converted where they do not."""
        array, dtype = np.asarray(data), numpy_dtype(onnx_element_type)
        if array.dtype != dtype:
            array = array.view(dtype) if array.dtype.itemsize == dtype.itemsize \
                else array.astype(dtype)
        return cls(array, int(onnx_element_type))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape, element_type, device_type: str = "cpu",
                                     device_id: int = 0, vendor_id: int = -1) -> OrtValue:
        del vendor_id
        dtype = numpy_dtype(element_type)
        if _device_type(device_type) == 0:
            return cls(np.empty(tuple(shape), dtype))
        with as_onnxruntime_errors():  # no such GPU: EPFail
            device = parse_device(f"gpu:{int(device_id)}")
        with device.active():
            return cls(device.xp.empty(tuple(shape), dtype))

    @classmethod
    def from_dlpack(cls, data, is_bool_tensor: bool = False) -> OrtValue:
        array = np.from_dlpack(_Capsule(data) if _is_capsule(data) else data)
        return cls(array.view(np.bool_) if is_bool_tensor else array)

    # -- what it holds ---------------------------------------------------------------------

    def is_tensor(self) -> bool:
        return hasattr(self._value, "shape") and hasattr(self._value, "dtype")

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def has_value(self) -> bool:
        return self._value is not None

    def shape(self) -> list[int]:
        return list(self._value.shape)

    def data_type(self) -> str:
        if self.is_tensor_sequence():
            inner = self._value[0].dtype if self._value else np.float32
            return f"seq(tensor({type_name(inner)}))"
        return f"tensor({type_name(self._value.dtype)})"

    def element_type(self) -> int:
        if self._element_type is not None:
            return self._element_type
        return onnx_element_type(self._value.dtype)

    def tensor_size_in_bytes(self) -> int:
        return int(self._value.nbytes)

    def device_name(self) -> str:
        return "cuda" if _on_gpu(self._value) else "cpu"

    def data_ptr(self) -> int:
        if _on_gpu(self._value):
            return int(self._value.data.ptr)
        return int(self._value.__array_interface__["data"][0])

    def numpy(self):
        if self.is_tensor_sequence():
            return [np.asarray(_host(item)) for item in self._value]
        return _host(self._value)

    def __array__(self, dtype=None, copy=None):
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def update_inplace(self, np_arr) -> None:
        source = np.asarray(np_arr)
        if tuple(source.shape) != tuple(self._value.shape):
            raise InvalidArgument(f"update_inplace: the array's shape {source.shape} is not "
                                  f"this OrtValue's {tuple(self._value.shape)}")
        if _on_gpu(self._value):
            self._value.set(source.astype(self._value.dtype, copy=False))
        else:
            np.copyto(self._value, source, casting="unsafe")

    def value(self):
        """The array (or list) itself: NumPy on the CPU, CuPy on a GPU."""
        return self._value

    # -- DLPack ----------------------------------------------------------------------------

    def to_dlpack(self):
        return self._value.__dlpack__()

    def __dlpack__(self, *args, **kwargs):
        return self._value.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._value.__dlpack_device__()

    def _get_c_value(self) -> OrtValue:
        return self

    def __repr__(self):
        if not self.is_tensor():
            return f"OrtValue({type(self._value).__name__})"
        return f"OrtValue({self.data_type()}, shape={self.shape()}, {self.device_name()})"


class OrtValueVector(list):
    """The list of OrtValues ``run_with_ort_values`` answers (onnxruntime's vector)."""


def _on_gpu(value) -> bool:
    return type(value).__module__.startswith("cupy")


def _host(value):
    return value.get() if _on_gpu(value) else value


# -- DLPack capsules ------------------------------------------------------------------------

class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DL_UINT, _DL_CPU = 1, 1


def _is_capsule(data) -> bool:
    return type(data).__name__ == "PyCapsule"


def _dl_tensor(capsule) -> _DLTensor:
    """The DLTensor at the head of an unconsumed DLPack capsule (a legacy ``dltensor``)."""
    if not _capsule_valid(capsule, b"dltensor"):
        raise InvalidArgument("expected an unconsumed DLPack capsule named 'dltensor'")
    return _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))


def is_dlpack_uint8_tensor(capsule) -> bool:
    """Whether a DLPack capsule holds uint8 (a bool tensor travels as uint8 in DLPack)."""
    dtype = _dl_tensor(capsule).dtype
    return dtype.code == _DL_UINT and dtype.bits == 8


class _Capsule:
    """A bare DLPack capsule given the protocol ``np.from_dlpack`` asks for."""

    def __init__(self, capsule):
        self._capsule = capsule
        tensor = _dl_tensor(capsule)
        self._device = (int(tensor.device_type), int(tensor.device_id))
        if self._device[0] != _DL_CPU:
            raise InvalidArgument("OrtValue.from_dlpack of a device capsule: pass the GPU "
                                  "array itself (it has __dlpack__)")

    def __dlpack__(self, *args, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return self._device
