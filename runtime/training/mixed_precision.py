"""Mixed-precision training: a float32 graph rewritten to compute in float16 (or bfloat16),
and the dynamic loss scaler that keeps float16 gradients from underflowing.

    low = lower_precision(graph, np.float16)     # Cast nodes at graph entry, outputs float32
    scaler = LossScaler()                        # 2**16, halve on overflow, double after 2000
    if scaler.unscale(grads):                    # grads of (loss * scaler.scale)
        ...optimizer step...
    scaler.update(finite)

The rewrite is a graph pass, so the runtime's own planner and executor run the low-precision
graph: every float32 graph input and initializer is cast once, at its first reader that
computes in the low type; ops in ``FLOAT32_OPS`` (the deny list: losses, the softmax family,
normalizations but BatchNormalization, reductions, exp/log/pow) get their inputs cast back up
to float32 (BatchNormalization takes a low X with float32 parameters); every graph
output leaves as the float32 it was. The weights the optimizer updates (graph inputs or
initializers) are never touched, so master weights, their gradients (the Cast's gradient casts
back) and the optimizer state all stay float32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
from collections import ChainMap

import ml_dtypes
import numpy as np

from mixrt.base.errors import InputError, UnsupportedOperatorError
from mixrt.ops.ir.dtypes import to_onnx_type
from mixrt.ops.ir.types import TensorType
from mixrt.ops.device import array_module
from mixrt.runtime.graph import Graph, Node, Value, outer_scope_reads
from mixrt.runtime.passes.infer import infer_node, infer_types
from mixrt.runtime.passes.rewrite import NameMaker, copy_graph, rename_output, replace_reads
from mixrt.runtime.passes.typecheck import operand_type_problem, version_accepting

FLOAT32 = np.dtype(np.float32)
PRECISIONS = {"float32": FLOAT32, "float16": np.dtype(np.float16),
              "bfloat16": np.dtype(ml_dtypes.bfloat16)}

# The deny list: ops that stay in float32 whatever the precision, because their range or
# accumulation needs it (PyTorch autocast's float32 list, MXNet AMP's FP32_FUNCS, in ONNX
# names). Everything else computes in the low type.
FLOAT32_OPS = frozenset({
    # losses and the softmax family: exp of logits overflows float16 at 11.1
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "Softmax", "LogSoftmax",
    "Hardmax",
    # normalizations: statistics and running means accumulate over a whole batch
    # (BatchNormalization instead takes a low-precision X with float32 parameters and
    # statistics, and its kernels accumulate in float32: _FIXED_INPUTS)
    "LayerNormalization", "InstanceNormalization",
    "GroupNormalization", "RMSNormalization", "LpNormalization", "LRN",
    "MeanVarianceNormalization",
    # reductions (a mean over many elements loses float16's 11 bits) and long sums
    "ReduceSum", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare", "CumSum",
    # functions whose results leave float16's range for ordinary inputs
    "Exp", "Log", "Pow", "Reciprocal", "Softplus",
})

# ops that read only an input's shape or convert it themselves: their inputs are never cast
_TYPE_BLIND_OPS = frozenset({"Shape", "Size", "Cast", "CastLike"})
# inputs whose type the spec fixes (float32 scales, regions of interest), by op and
# position; and BatchNormalization's scale, bias, mean and variance, which stay float32
# (version 15 types them apart from X, as PyTorch's autocast and cuDNN do): a float16
# convolution's output goes into it and out of it without a Cast either side, where a
# float32 BatchNormalization cost two casts and float32 traffic a layer
_FIXED_INPUTS = {"Resize": frozenset({1, 2}), "Upsample": frozenset({1}),
                 "BatchNormalization": frozenset({1, 2, 3, 4})}


def parse_precision(name, device="cpu") -> np.dtype:
    """The dtype a training precision computes in; InputError for an unknown name,
    UnsupportedOperatorError for bfloat16 on a GPU (see ``BFLOAT16_ON_GPU``)."""
    if name not in PRECISIONS:
        raise InputError(f"unknown precision {name!r}; choose one of {sorted(PRECISIONS)}")
    if name == "bfloat16" and _on_gpu(device):
        raise UnsupportedOperatorError(
            f"precision='bfloat16' cannot train on device {str(device)!r}: "
            f"{BFLOAT16_ON_GPU}; use precision='float16' (with loss scaling) or 'float32'",
            dtype="bfloat16", device=str(device))
    return PRECISIONS[name]


# On the CPU bfloat16 is the ml_dtypes NumPy type: it trains (each op computes in float32
# and rounds), for numerics that match a bfloat16 accelerator, never for speed.
BFLOAT16_ON_GPU = ("CuPy has no bfloat16 dtype (mixrt's bfloat16 is the ml_dtypes NumPy "
                   "type, CPU only)")


def _on_gpu(device) -> bool:
    return str(device).strip().lower().startswith(("gpu", "cuda"))


# -- the graph rewrite -----------------------------------------------------------------------

def lower_precision(graph: Graph, dtype, *, float32_ops: frozenset = FLOAT32_OPS,
                    keep: tuple = ()) -> Graph:
    """A copy of ``graph`` computing in ``dtype`` except for ``float32_ops``. Every graph
    output, and every value named in ``keep``, is still available in float32 under its own
    name (the low-precision producer writes a renamed value that a Cast widens)."""
    low = np.dtype(dtype)
    result = copy_graph(graph)
    result.toposort()
    wanted = list(dict.fromkeys([*result.output_names, *keep]))
    original = infer_types(result)
    caster = _Caster(result, original)
    for node in list(result.nodes):
        # control-flow bodies are not rewritten: they compute in float32
        wide = node.op_type in float32_ops or bool(node.subgraphs())
        caster.convert_inputs(node, FLOAT32 if wide else low)
        caster.add(node)
    result.nodes = caster.nodes
    for name in wanted:
        caster.restore(name, _dtype(original.get(name)))
    result.toposort()
    return result


class _Caster:
    """Walks the nodes in order, inserting one Cast per (value, dtype) that a reader needs
    and tracking every value's dtype after the rewrite."""

    def __init__(self, graph: Graph, types: dict):
        self.graph = graph
        self.types = dict(types)
        self.nodes: list[Node] = []
        self._names = NameMaker(graph)
        self._casts: dict[tuple[str, np.dtype], str] = {}

    def convert_inputs(self, node: Node, target: np.dtype) -> None:
        if node.op_type in _TYPE_BLIND_OPS or node.domain not in ("", "ai.onnx"):
            return
        fixed = _FIXED_INPUTS.get(node.op_type, frozenset())
        node.opset = node.opset or _opset(self.graph)
        # a bfloat16 Conv is Conv-22: at 11 it is a model the operand type check refuses
        moved = self._version_taking(node, fixed, target)
        if moved is None:  # no version takes the low type (Range, AveragePool-11 in bfloat16)
            target, moved = FLOAT32, node.opset
        node.inputs = [self.cast(name, target) if name and i not in fixed else name
                       for i, name in enumerate(node.inputs)]
        node.opset = moved
        for sub in node.subgraphs():
            for name in dict.fromkeys(outer_scope_reads(sub)):
                replace_reads(sub, name, self.cast(name, target))

    def _version_taking(self, node: Node, fixed, target: np.dtype) -> int | None:
        """The opset at which ``node`` takes its float inputs as ``target``, or None."""
        trial = ChainMap({}, self.types)  # the inputs' types as if cast, without a copy
        for i, name in enumerate(node.inputs):
            found = _dtype(trial.get(name)) if name and i not in fixed else None
            if found is not None and _convertible(found, target):
                trial[name] = TensorType(target, trial[name].shape)
        version = version_accepting(node, trial)
        moved = dataclasses.replace(node, opset=version)
        return version if operand_type_problem(moved, trial) is None else None

    def cast(self, name: str, target: np.dtype) -> str:
        """``name`` as ``target`` when it is a float32/low float of another type."""
        found = _dtype(self.types.get(name))
        if found is None or found == target or not _convertible(found, target):
            return name
        key = (name, target)
        if key not in self._casts:
            out = self._names(f"{name}_{target.name}")
            self.add(Node("Cast", [name], [out], name=out, opset=_opset(self.graph),
                          attributes={"to": to_onnx_type(target)}))
            self._casts[key] = out
        return self._casts[key]

    def add(self, node: Node) -> None:
        """Append ``node`` and type its outputs from its (possibly cast) inputs."""
        self.nodes.append(node)
        for name, value_type in zip(node.outputs, infer_node(node, self.types)):
            if name:
                self.types[name] = value_type
                self._retype_declared(name, _dtype(value_type))

    def _retype_declared(self, name: str, dtype: np.dtype | None) -> None:
        """A type the model declared for a value (ONNX value_info) wins over inference, so
        one that still says float32 would mislead every later pass."""
        declared = self.graph.value_types.get(name)
        if dtype is not None and isinstance(declared, TensorType) \
                and declared.dtype is not None and np.dtype(declared.dtype) != dtype:
            self.graph.value_types[name] = TensorType(dtype, declared.shape)

    def restore(self, name: str, dtype: np.dtype | None) -> None:
        """Make ``name`` a value of its original ``dtype`` again: its producer writes a
        renamed low-precision value and a Cast widens it under the old name."""
        now = _dtype(self.types.get(name))
        if dtype is None or now is None or now == dtype:
            return
        producer = next((n for n in self.graph.nodes if name in n.outputs), None)
        if producer is None:
            return  # a graph input or initializer: never changed
        renamed = self._names(f"{name}_{now.name}")
        rename_output(self.graph, producer, name, renamed)
        self.types[renamed] = self.types[name]
        self.add(Node("Cast", [renamed], [name], name=self._names(f"{name}_restore"),
                      opset=_opset(self.graph), attributes={"to": to_onnx_type(dtype)}))


def _convertible(found: np.dtype, target: np.dtype) -> bool:
    """Only float32 and the low types move; float64 and every non-float stay as they are."""
    floats = set(PRECISIONS.values())
    return found in floats and target in floats


def _dtype(value_type) -> np.dtype | None:
    if isinstance(value_type, TensorType) and value_type.dtype is not None:
        return np.dtype(value_type.dtype)
    return None


def _opset(graph: Graph) -> int:
    return graph.opsets.get("", graph.opsets.get("ai.onnx", 17))


# -- the loss scale --------------------------------------------------------------------------

def scale_loss(graph: Graph, loss: str) -> tuple[Graph, str, str]:
    """``graph`` with a float32 scalar input multiplying ``loss``: differentiating the product
    seeds the backward pass with the scale (autodiff needs no option). Returns the graph, the
    scaled loss's name and the scale input's name; ``loss`` stays an output."""
    names = NameMaker(graph)
    scale, scaled = names("loss_scale"), names(f"{loss}_scaled")
    graph.inputs.append(Value(scale, TensorType(FLOAT32, ())))
    graph.nodes.append(Node("Mul", [loss, scale], [scaled], name=scaled, opset=17))
    if loss not in graph.output_names:
        graph.outputs.append(Value(loss))
    return graph, scaled, scale


class LossScaler:
    """Dynamic loss scaling as PyTorch's GradScaler and MXNet's AMP do it: the loss is
    multiplied by ``scale`` before differentiation; a step whose gradients hold an inf or NaN
    is skipped and the scale multiplied by ``backoff_factor``; after ``growth_interval``
    clean steps in a row it is multiplied by ``growth_factor``. ``dynamic=False`` keeps the
    scale fixed (steps with non-finite gradients are still skipped)."""

    def __init__(self, init_scale: float = 2.0 ** 16, *, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 dynamic: bool = True):
        self.scale = _positive("init_scale", init_scale)
        self.growth_factor = _positive("growth_factor", growth_factor, above=1.0)
        self.backoff_factor = _positive("backoff_factor", backoff_factor)
        if not self.backoff_factor < 1.0:
            raise InputError(f"LossScaler: backoff_factor must be below 1, got "
                             f"{backoff_factor!r}")
        if not isinstance(growth_interval, int) or growth_interval < 1:
            raise InputError(f"LossScaler: growth_interval must be a positive int, got "
                             f"{growth_interval!r}")
        self.growth_interval = growth_interval
        self.dynamic = bool(dynamic)
        self.clean_steps = 0
        self.skipped_steps = 0

    def unscale(self, grads: dict) -> bool:
        """Divide every gradient by the scale, in place, when all are finite; returns
        whether they were (when not, the step must be skipped and the arrays are garbage)."""
        if not all_finite(grads.values()):
            return False
        inverse = 1.0 / self.scale
        for grad in grads.values():
            grad *= grad.dtype.type(inverse)
        return True

    def update(self, finite: bool) -> None:
        """After a step: back off on an overflow, grow after enough clean steps."""
        if not finite:
            self.skipped_steps += 1
            self.clean_steps = 0
            if self.dynamic:
                self.scale *= self.backoff_factor
            return
        self.clean_steps += 1
        if self.dynamic and self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state_dict(self) -> dict:
        """Plain numbers (JSON): what a checkpoint needs to resume bit for bit."""
        return {"scale": self.scale, "clean_steps": self.clean_steps,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        """What ``state_dict`` returned (after a JSON trip); ``skipped_steps`` may be absent
        (0), as in states saved before it was counted. Nothing changes unless all fits."""
        if not isinstance(state, dict) or not {"scale", "clean_steps"} <= set(state) \
                or set(state) - {"scale", "clean_steps", "skipped_steps"}:
            raise InputError(f"LossScaler: a state is {{'scale', 'clean_steps', "
                             f"'skipped_steps'}}, got {_preview(state)}")
        scale = _positive("scale", state["scale"])
        counts = [_count(name, state.get(name, 0)) for name in ("clean_steps", "skipped_steps")]
        self.scale, (self.clean_steps, self.skipped_steps) = scale, counts


def all_finite(arrays) -> bool:
    """Whether every element of every array is finite, read back once per device: each
    array's flag stays on its device, and the flags of one device are read together. A read
    per gradient (62 for ResNet-18) was a wait for the GPU per parameter in every step."""
    flags: dict = {}
    for array in arrays:
        xp = array_module(array)
        device = getattr(getattr(array, "device", None), "id", None)  # a CuPy device's
        flags.setdefault((xp, device), []).append(xp.isfinite(array).all())
    for (xp, device), found in flags.items():
        with _on_device(xp, device):
            if not bool(xp.stack(found).all()):
                return False
    return True


def _on_device(xp, device):
    """The block with CuPy's ``device`` current (a NumPy or device-less key: nothing)."""
    if device is None or xp is np:
        return contextlib.nullcontext()
    return xp.cuda.Device(device)


def _positive(name: str, value, above: float = 0.0) -> float:
    # a number, not whatever float() takes: "1e3" or True in a saved state is damage
    number = float("nan") if isinstance(value, bool) or not isinstance(
        value, numbers.Real) else float(value)
    if not np.isfinite(number) or number <= above:
        raise InputError(f"LossScaler: {name} must be a finite number above {above}, got "
                         f"{_preview(value)}")
    return number


def _count(name: str, value) -> int:
    """A saved step count: a whole number >= 0 (int(2.7), int(True) or int(inf) would turn
    a damaged state into a plausible one, or an OverflowError)."""
    if type(value) is not int or value < 0:
        raise InputError(f"LossScaler: {name} must be a whole number >= 0, got "
                         f"{_preview(value)}")
    return value


def _preview(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
