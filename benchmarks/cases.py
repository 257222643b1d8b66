"""What the benchmarks run: a model file at a batch size, its input, and its torch twin.

The 9 light zoo models ship with one constant for every weight, which makes every output
channel of a layer equal: a runtime that mixed up channels would still agree with
onnxruntime. The benchmarks therefore run the same architectures with seeded random weights
(``light_model_with_random_weights``, written once to ``.cache/``), and compare their logits
as well as their softmax outputs.

The zoo models declare a fixed batch of 1. For batch 8 we write a copy whose first input and
output axes are symbolic (``batch``), with the intermediate shape annotations dropped since
they spell out the 1. Seven of them also bake the 1 into constant Reshape targets
(``[1, 9216]`` before the classifier); the copy gives each such Reshape its own target with
a 0 there, which ONNX reads as "copy the input's dimension": exactly the same model at batch
1, and batch-generic. A model that still fails at batch 8 in either runtime is reported as
"fixed batch", not forced. The batch-8 input is 8 different images (the reference ramp, then
seeded uniform noise), so a runtime that mixed up images would disagree too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from models import CACHE, TORCH_MODELS

from mixrt.models.zoo import LIGHT_MODELS, light_model, light_model_with_random_weights

WEIGHT_SEED = 0


@dataclass
class Case:
    model: str
    batch: int
    path: Path | None
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    torch_module: object = None
    input_name: str = ""
    kind: str = "zoo"  # "zoo" or "torch"


def all_models() -> list[str]:
    return list(LIGHT_MODELS) + list(TORCH_MODELS)


def make_case(name: str, batch: int) -> Case:
    if name in TORCH_MODELS:
        model = TORCH_MODELS[name]()
        return Case(name, batch, model.path, model.feeds(batch), model.module,
                    model.input_name, kind="torch")
    if name not in LIGHT_MODELS:
        raise SystemExit(f"unknown model {name!r}; choose from {all_models()}")
    path, inputs = random_weight_copy(name)
    if batch == 1:
        return Case(name, 1, path, inputs)
    path = dynamic_batch_copy(path, CACHE / f"{path.stem}_batch.onnx")
    return Case(name, batch, path, {n: different_images(v, batch) for n, v in inputs.items()})


def random_weight_copy(name: str) -> tuple[Path, dict[str, np.ndarray]]:
    """The light model ``name`` with seeded random weights, saved once; and its input."""
    zoo = light_model(name)
    target = CACHE / f"{zoo.path.stem}_random{WEIGHT_SEED}.onnx"
    if not target.exists() or target.stat().st_mtime < zoo.path.stat().st_mtime:
        model, _ = light_model_with_random_weights(name, WEIGHT_SEED)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        onnx.save(model, partial)
        partial.replace(target)
    return target, zoo.inputs


def different_images(first: np.ndarray, batch: int) -> np.ndarray:
    """``batch`` images: ``first`` (a batch of one), then seeded uniform noise in its range."""
    rest = np.random.default_rng(batch).random((batch - 1,) + first.shape[1:])
    return np.concatenate([first, rest.astype(first.dtype)])


def zoo_torch_twin(case: Case):
    """A PyTorch module computing a zoo case's model, converted by onnx2torch where it is
    installed (the GPU section's peer where onnxruntime has no CUDA provider: the
    benchmark-only extra, see README.md), else None. onnx2torch wants weights as
    initializers and shapes inferred at a recent opset, which the zoo's opset-3..9 files with
    their ConstantOfShape weights are not; so it reads mixrt's folded graph (opt_level 1:
    constants folded, no mixrt-domain fusions) re-exported at opset 17. A model it cannot
    convert (Inception-v1's asymmetric AveragePool padding) gets None, with the reason
    printed."""
    if case.kind != "zoo":
        return None
    try:
        from onnx2torch import convert  # noqa: PLC0415
    except ImportError:
        return None
    import mixrt  # noqa: PLC0415
    from mixrt.exporters.onnx import save_model  # noqa: PLC0415
    target = CACHE / f"{case.path.stem}_opset17.onnx"
    if not target.exists() or target.stat().st_mtime < case.path.stat().st_mtime:
        target.parent.mkdir(parents=True, exist_ok=True)
        save_model(mixrt.Session(str(case.path), opt_level=1).graph, target, 17)
    try:
        return convert(onnx.shape_inference.infer_shapes(onnx.load(target))).eval()
    except Exception as exc:  # noqa: BLE001  (an unconvertible model has no twin)
        print(f"  {case.model}: no PyTorch twin ({type(exc).__name__}: {str(exc)[:80]})",
              flush=True)
        return None


def dynamic_batch_copy(source: Path, target: Path) -> Path:
    if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    model = onnx.load(source)
    weights = {t.name for t in model.graph.initializer}  # old models list them as inputs
    feeds = [v for v in model.graph.input if v.name not in weights]
    for value in feeds + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_param = "batch"
    del model.graph.value_info[:]
    _generic_reshape_targets(model.graph)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    onnx.save(model, partial)
    partial.replace(target)
    return target


def _generic_reshape_targets(graph: onnx.GraphProto) -> None:
    """Reshape targets that are constants starting with 1 get a private copy starting with 0
    (a target may be shared, and only Reshape reads 0 as "copy")."""
    constants = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] not in constants:
            continue
        target = numpy_helper.to_array(constants[node.input[1]])
        if target.ndim != 1 or not target.size or target[0] != 1:
            continue
        generic = target.copy()
        generic[0] = 0
        name = f"{node.input[1]}__batch_generic_{node.name or node.output[0]}"
        graph.initializer.append(numpy_helper.from_array(generic, name))
        node.input[1] = name
