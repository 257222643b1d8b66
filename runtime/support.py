"""What this runtime supports for a given model: one row per node, from the registry.

``mixrt check`` prints it; CI pipelines gate on it. A row says which kernel version would run
the node, or why none can (op missing, opset out of range, dtype or attribute not
implemented, device cannot hold the dtype).
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass

import numpy as np

from mixrt.base.errors import InputError, UnsupportedOperatorError
from mixrt.ops.device import Device, gpu_dtypes_text, gpu_holds
from mixrt.runtime.graph import Graph
from mixrt.runtime.passes.infer import first_input_dtype, infer_types
from mixrt.runtime.passes.typecheck import operand_problem
from mixrt.ops.ir.registry import lookup_kernel


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
    top_level = {id(node) for node in graph.nodes}
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
            row.supported, row.reason = _runs(node, types, device, id(node) in top_level)
        rows.append(row)
    return rows


def _runs(node, types, device: Device, top_level: bool) -> tuple[bool, str]:
    """Whether a node that has a kernel runs: its operands obey the op's type constraints
    and, where static, its shape rules (a model that breaks them is invalid; Session
    refuses it) and the device holds them."""
    problem = operand_problem(node, types, shapes=top_level)
    if problem:
        return False, f"invalid model: {problem}"
    return _device_supports(node, types, device)


def _device_supports(node, types, device: Device) -> tuple[bool, str]:
    """A node reading or writing a dtype CuPy cannot hold (strings, float8, int4, ...)
    cannot run on a GPU."""
    if device.kind != "gpu":
        return True, ""
    for name in (*node.inputs, *node.outputs):
        dtype = getattr(types.get(name), "dtype", None)
        if dtype is None or gpu_holds(dtype):
            continue
        if dtype == np.dtype(object):
            return False, (f"node {node.label!r}: {name!r} is a string tensor, which CuPy "
                           f"cannot hold; run this model on the CPU")
        return False, (f"node {node.label!r}: {name!r} is {np.dtype(dtype).name}, which CuPy "
                       f"cannot hold ({gpu_dtypes_text()}); run this model on the CPU")
    return True, ""


def check_gpu_dtypes(graph: Graph, device: Device) -> None:
    """Raise for the first node of ``graph`` whose values a GPU cannot hold, naming it, so
    that a GPU session fails when it is made rather than inside a run."""
    types = infer_types(graph)
    for node in graph.all_nodes():
        supported, reason = _device_supports(node, types, device)
        if not supported:
            raise UnsupportedOperatorError(reason, node=node.label, domain=node.domain,
                                           op_type=node.op_type, opset=node.opset,
                                           device=str(device))


def symbolic_dims(inputs) -> list[str]:
    """The names of the symbolic dimensions the given graph inputs declare, in order."""
    names: dict[str, None] = {}
    for value in inputs:
        for dim in getattr(value.type, "shape", None) or ():
            if isinstance(dim, str):
                names[dim] = None
    return list(names)


def check_dim_names(inputs, sizes: dict) -> None:
    """Refuse a size given for a symbolic dimension no input declares (``--dim batchsize=8``
    for a model whose dimension is ``batch``): it would be ignored, and the model planned or
    validated at a size the caller did not ask for."""
    known = symbolic_dims(inputs)
    unknown = [name for name in sizes if name not in known]
    if not unknown:
        return
    hints = [f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
             for name in unknown for close in [difflib.get_close_matches(name, known, 1)]]
    declared = ", ".join(repr(name) for name in known) or "none: every input dimension is fixed"
    raise InputError(f"no input declares the symbolic dimension {', '.join(hints)}; the "
                     f"model's symbolic dimensions are {declared}")
