"""Checks that shape inference is sound: every value a real run makes fits the type
inference gave it before the run.

Inference here sees what the session plans from: the inputs' types (with the feeds' shapes)
and nothing the model declares about its other values, so what is checked is inference's own
answer. A run records every value at the top level and inside bodies (a body value has one
entry per iteration).
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections import ChainMap

import numpy as np
import onnx
import onnx.backend.test.loader

from mixrt.ops.ir.types import SequenceType, TensorType
from mixrt.runtime import run_loop
from mixrt.runtime import session as session_module
from mixrt.runtime.graph import Value
from mixrt.runtime.passes.infer import infer_types, with_input_shapes as _with_input_shapes
from mixrt.runtime.session import Session, load_graph


def fits(value_type, value) -> bool:
    """Whether a run-time value agrees with everything its inferred type claims."""
    if value_type is None:
        return True
    if isinstance(value_type, SequenceType):
        return isinstance(value, list) and all(fits(value_type.element, v) for v in value)
    if not isinstance(value_type, TensorType) or value is None:
        return True
    if isinstance(value, list):
        return value_type.dtype is None and value_type.shape is None
    array = np.asarray(value)
    if value_type.dtype is not None and array.dtype != value_type.dtype:
        return False
    if value_type.value is not None and not _same_data(value_type.value, array):
        return False
    if value_type.shape is None:
        return True
    return len(value_type.shape) == array.ndim and all(
        not isinstance(d, int) or d == n for d, n in zip(value_type.shape, array.shape))


def _same_data(known, array) -> bool:
    """Whether a value inference computed before the run is the one the run made (the
    optimizer folds it into the graph, so a wrong one would be a wrong result)."""
    known = np.asarray(known)
    if known.shape != array.shape:
        return False
    if array.dtype.kind in "fc":
        return bool(np.array_equal(known, array, equal_nan=True))
    return bool(np.array_equal(known, array))


def run_recording(path, feeds: dict, monkeypatch, opt_level: int = 0) -> dict:
    """Run the model (unoptimized by default) and return name -> every value it had."""
    seen: dict[str, list] = {}
    plain_execute = run_loop.execute

    def recording_execute(steps, env, xp, *args, **kwargs):
        # a planned run's env (a dict) starts with the session's constants, held as its
        # kernels take them: only what the run made is recorded from it
        before = set() if isinstance(env, ChainMap) else set(env)
        plain_execute(steps, env, xp, *args, **kwargs)
        made = env.maps[0] if isinstance(env, ChainMap) else env  # not the enclosing scopes
        for name, value in made.items():
            if name not in before:
                seen.setdefault(name, []).append(value)

    # the session runs the top level, the run loop's Subgraph the bodies: both are recorded.
    # Undone on their own: ``monkeypatch.undo()`` undid the caller's patches too, and with
    # them test_infer_soundness.py's MIXRT_JIT=0 after its first case (~32 s of numba for
    # kernels the file does not check, 2026-11-30)
    with monkeypatch.context() as patched:
        patched.setattr(run_loop, "execute", recording_execute)
        patched.setattr(session_module, "execute", recording_execute)
        outputs = Session(str(path), opt_level=opt_level).run(None, feeds)
    graph = load_graph(str(path))
    for name, value in zip(graph.output_names, outputs):
        seen.setdefault(name, []).append(value)
    return seen


def inferred_from_inputs(path, feeds: dict, opt_level: int = 0) -> dict:
    """Types as the session infers them to plan for these feeds (bodies' declarations
    dropped), with the top-level outputs' declarations dropped too; past opt_level 0, of
    the graph the optimizer made (fused ops, folded constants)."""
    graph = load_graph(str(path)) if opt_level == 0 else \
        copy.deepcopy(Session(str(path), opt_level=opt_level).graph)
    graph.outputs = [Value(v.name, None) for v in graph.outputs]
    return infer_types(_with_input_shapes(graph, feeds))


def values_that_contradict(path, feeds: dict, monkeypatch,
                           opt_level: int = 0) -> tuple[dict, dict]:
    """(name -> (inferred type, the first shapes seen) for every value that does not fit
    its type, the inferred types)."""
    types = inferred_from_inputs(path, feeds, opt_level)
    seen = run_recording(path, feeds, monkeypatch, opt_level)
    wrong = {name: (str(types.get(name)), [getattr(v, "shape", type(v).__name__)
                                           for v in values][:3])
             for name, values in seen.items()
             if not all(fits(types.get(name), v) for v in values)}
    return wrong, types


def assert_sound(path, feeds: dict, monkeypatch) -> dict:
    wrong, types = values_that_contradict(path, feeds, monkeypatch)
    assert not wrong, f"values that contradict their inferred types: {wrong}"
    return types


@functools.cache
def backend_node_cases() -> tuple:
    """The ONNX backend's node cases (built in memory from the installed onnx)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators warn about their own casts
        return tuple(onnx.backend.test.loader.load_model_tests(kind="node"))


def case_inputs(case) -> list:
    """The first data set's inputs as arrays (lists for sequences, None for empty
    optionals)."""
    inputs, _ = case.data_sets[0]
    return [onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
            for v in inputs]


def stored_model_cases():
    """(name, model path, feeds) for the ONNX backend's stored whole-model cases (simple
    nets, and PyTorch's converted modules and operators) and for tests/data/torch_exports:
    graphs of many nodes, with the shape arithmetic exporters write."""
    import glob  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415
    data = Path(onnx.backend.test.loader.__file__).parent.parent / "data"
    for kind in ("simple", "pytorch-converted", "pytorch-operator"):
        for model in sorted((data / kind).glob("*/model.onnx")):
            inputs = sorted(model.parent.glob("test_data_set_0/input_*.pb"),
                            key=lambda f: int(f.stem.split("_")[1]))
            graph = onnx.load(str(model)).graph
            weights = {t.name for t in graph.initializer}  # old models list them as inputs
            names = [v.name for v in graph.input if v.name not in weights]
            tensors = [onnx.numpy_helper.to_array(onnx.load_tensor(str(f))) for f in inputs]
            yield f"{kind}/{model.parent.name}", model, dict(zip(names, tensors))
    exports = Path(__file__).parent / "data" / "torch_exports"
    for model in sorted(glob.glob(str(exports / "*.onnx"))):
        stored = np.load(model[:-len(".onnx")] + ".npz")
        feeds = {k[len("input:"):]: v for k, v in stored.items() if k.startswith("input:")}
        yield f"torch_exports/{Path(model).name}", Path(model), feeds
