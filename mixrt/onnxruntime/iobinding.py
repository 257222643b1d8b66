"""onnxruntime's ``IOBinding``: inputs and outputs bound to memory before a run, so that a
service keeps its tensors on the GPU between runs (or writes into its own buffers).

``session.io_binding()`` makes one; ``session.run_with_iobinding(binding)`` runs the bound
feeds and leaves the outputs where they were bound: on the session's device unless bound to
the CPU, in the caller's memory where an output was bound to a buffer or an OrtValue.
"""

from __future__ import annotations

import ctypes

import numpy as np

from mixrt.onnxruntime.errors import InvalidArgument
from mixrt.onnxruntime.values import OrtValue, OrtValueVector, _device_type, numpy_dtype
from mixrt.ops.device import parse_device


class IOBinding:
    def __init__(self, session):
        self._session = session
        self._inputs: dict = {}
        self._outputs: dict[str, _Output] = {}
        self._results: dict[str, OrtValue] = {}

    # -- inputs ----------------------------------------------------------------------------

    def bind_cpu_input(self, name: str, arr_on_cpu) -> None:
        self._inputs[name] = np.asarray(arr_on_cpu)

    def bind_input(self, name: str, device_type, device_id: int, element_type, shape,
                   buffer_ptr: int) -> None:
        self._inputs[name] = _array_at(buffer_ptr, device_type, device_id,
                                       numpy_dtype(element_type), shape)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = ortvalue.value()

    def synchronize_inputs(self) -> None:
        _synchronize(self._inputs.values())

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    # -- outputs ---------------------------------------------------------------------------

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0,
                    element_type=None, shape=None, buffer_ptr: int | None = None) -> None:
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise ValueError("`element_type` and `shape` are to be provided if "
                                 "pre-allocated memory is provided")
            target = OrtValue(_array_at(buffer_ptr, device_type, device_id,
                                        numpy_dtype(element_type), shape))
            self._outputs[name] = _Output(_device_type(device_type), device_id, target)
        else:
            self._outputs[name] = _Output(_device_type(device_type), device_id, None)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._outputs[name] = _Output(1 if ortvalue.device_name() == "cuda" else 0,
                                      0, ortvalue)

    def synchronize_outputs(self) -> None:
        _synchronize(value.value() for value in self._results.values())

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results.clear()

    def get_outputs(self) -> OrtValueVector:
        return OrtValueVector(self._results[name] for name in self._outputs
                              if name in self._results)

    get_outputs_as_ortvaluevector = get_outputs

    def copy_outputs_to_cpu(self) -> list:
        return [value.numpy() for value in self.get_outputs()]

    # -- the run (InferenceSession.run_with_iobinding) -------------------------------------

    def run(self, run_on_device, all_outputs: list[str], run_options) -> None:
        names = list(self._outputs) or list(all_outputs)
        if not self._outputs:
            self._outputs = {name: _Output(None, 0, None) for name in names}
        produced = run_on_device(names, dict(self._inputs), run_options)
        self._results = {name: self._outputs[name].deliver(name, value)
                         for name, value in zip(names, produced)}


class _Output:
    """Where one bound output goes: a device (0 CPU, 1 GPU, None the session's own), or a
    caller's OrtValue to write into."""

    def __init__(self, device_type: int | None, device_id: int, target: OrtValue | None):
        self.device_type, self.device_id, self.target = device_type, int(device_id), target

    def deliver(self, name: str, value) -> OrtValue:
        if self.target is not None:
            _write_into(name, self.target, value)
            return self.target
        on_gpu = type(value).__module__.startswith("cupy")
        if self.device_type == 0 and on_gpu:
            return OrtValue(value.get())
        if self.device_type == 1 and not on_gpu:
            return OrtValue(parse_device(f"gpu:{self.device_id}").put(value, name))
        return OrtValue(value)


def _write_into(name: str, target: OrtValue, value) -> None:
    if tuple(target.shape()) != tuple(value.shape):
        raise InvalidArgument(f"output {name!r} is {tuple(value.shape)}, but the memory bound "
                              f"for it is {tuple(target.shape())}")
    destination = target.value()
    if type(destination).__module__.startswith("cupy"):
        if isinstance(value, np.ndarray):
            destination.set(value.astype(destination.dtype, copy=False))
        else:
            destination[...] = value
    else:
        np.copyto(destination, value.get() if hasattr(value, "get") else value,
                  casting="same_kind")


def _array_at(address: int, device_type, device_id: int, dtype: np.dtype, shape):
    """An array over memory the caller owns (onnxruntime's raw buffer pointers)."""
    shape = tuple(int(size) for size in shape)
    count = int(np.prod(shape)) if shape else 1
    if _device_type(device_type) == 0:
        buffer = (ctypes.c_byte * (count * dtype.itemsize)).from_address(int(address))
        return np.frombuffer(buffer, dtype, count).reshape(shape)
    device = parse_device(f"gpu:{int(device_id)}")
    cupy = device.xp
    memory = cupy.cuda.UnownedMemory(int(address), count * dtype.itemsize, None,
                                     device_id=device.index)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


def _synchronize(values) -> None:
    for value in values:
        if type(value).__module__.startswith("cupy"):
            import cupy  # noqa: PLC0415  (present: a CuPy array is here)
            cupy.cuda.Device().synchronize()
            return
