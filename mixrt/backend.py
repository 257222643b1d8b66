"""mixrt as an ``onnx.backend.base.Backend``, so ONNX's backend test suite can drive it.

    import mixrt.backend
    rep = mixrt.backend.prepare(model_proto, "CPU")
    outputs = rep.run([x, y])
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from mixrt.ops.device import gpu_available
from mixrt.runtime.session import Session

_DEVICES = {"CPU": "cpu", "CUDA": "gpu:0"}


def _device_name(device: str) -> str:
    kind, _, index = str(device).upper().partition(":")
    if kind == "CUDA":
        return f"gpu:{index or 0}"
    return _DEVICES.get(kind, "cpu")


class MixrtRep(BackendRep):
    """A prepared model: positional inputs in, positional outputs out."""

    def __init__(self, session: Session, discover_first: bool = False):
        self.session = session
        self._discover_first = discover_first
        self._input_names = [arg.name for arg in session.get_inputs()]

    def run(self, inputs, **kwargs):  # noqa: ARG002  (onnx's signature)
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if not isinstance(inputs, (list, tuple)):
                inputs = [inputs]
            feeds = dict(zip(self._input_names, inputs))
        if self._discover_first:  # so the outputs returned come from a planned (arena) run
            self.session.memory_plan(feeds)
        return tuple(self.session.run(None, feeds))


class MixrtBackend(Backend):
    opt_level = 2  # Session's optimization level for prepared models
    discover_first = False  # run each new input shape once before the run that answers

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:  # noqa: ARG003
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> MixrtRep:
        super().prepare(model, device, **kwargs)
        return MixrtRep(Session(model, device=_device_name(device), opt_level=cls.opt_level),
                        cls.discover_first)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs, device: str = "CPU",
                 outputs_info=None, **kwargs):
        """Run one node by wrapping it in a model (onnx's helper for single-op tests)."""
        del outputs_info
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        values = [np.asarray(x) for x in inputs]
        graph_inputs = [onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for name, v in zip(node.input, values)]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output]
        graph = onnx.helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        model = onnx.helper.make_model(graph, opset_imports=[
            onnx.helper.make_opsetid(node.domain, opset)])
        return cls.run_model(model, values, device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = Device(device).type
        if kind == DeviceType.CPU:
            return True
        return kind == DeviceType.CUDA and gpu_available()


prepare = MixrtBackend.prepare
run_model = MixrtBackend.run_model
run_node = MixrtBackend.run_node
supports_device = MixrtBackend.supports_device
