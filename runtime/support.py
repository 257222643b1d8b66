"""What this runtime supports for a given model: one row per node, from the registry.

``mixrt check`` prints it; CI pipelines gate on it. A row says which kernel version would run
the node, or why none can (op missing, opset out of range, dtype or attribute not
implemented, device cannot hold the dtype).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from mixrt.errors import UnsupportedOperatorError
from mixrt.runtime.device import Device
from mixrt.runtime.graph import Graph
from mixrt.runtime.passes.infer import first_input_dtype, infer_types
from mixrt.runtime.session import lookup_kernel


@dataclass
class NodeSupport:
    node: str
    domain: str
    op_type: str
    opset: int
    dtype: str | None
    kernel: str | None  # "Conv 11+" when supported
    supported: bool
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def support_table(graph: Graph, device: Device) -> list[NodeSupport]:
    types = infer_types(graph)
    rows = []
    for node in graph.all_nodes():
        dtype = first_input_dtype(node, types)
        row = NodeSupport(node.label, node.domain or "ai.onnx", node.op_type, node.opset,
                          dtype, None, False)
        try:
            kernel = lookup_kernel(node, device, dtype)
        except UnsupportedOperatorError as exc:
            row.reason = str(exc)
        else:
            row.kernel = f"{kernel.name} [{kernel.version_range()}]"
            row.supported, row.reason = _device_supports(node, types, device)
        rows.append(row)
    return rows


def _device_supports(node, types, device: Device) -> tuple[bool, str]:
    """CuPy has no string arrays, so a node touching strings cannot run on a GPU."""
    if device.kind != "gpu":
        return True, ""
    for name in (*node.inputs, *node.outputs):
        value_type = types.get(name)
        if getattr(value_type, "dtype", None) == np.dtype(object):
            return False, (f"node {node.label!r}: {name!r} is a string tensor, which CuPy "
                           f"cannot hold; run this model on the CPU")
    return True, ""
