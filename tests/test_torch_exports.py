"""Models as PyTorch's two ONNX exporters write them (tests/data/torch_exports, made by
tools/export_torch_models.py): mixrt must give PyTorch's own outputs and onnxruntime's, at
every optimization level, also at input shapes other than the exported ones where the
export declared dynamic axes. These are the graphs users bring: Shape/Gather/Concat chains,
LSTM and GRU with PyTorch's weight layout, masked softmax, opset-18 decompositions."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mixrt
from mixrt.ops.device import gpu_available

DATA = Path(__file__).parent / "data" / "torch_exports"
CASES = json.loads((DATA / "MANIFEST.json").read_text())["made"]


def _case(stem: str):
    model = (DATA / f"{stem}.onnx").read_bytes()
    with np.load(DATA / f"{stem}.npz", allow_pickle=False) as stored:
        inputs = {k.split(":", 1)[1]: stored[k] for k in stored.files if k.startswith("input:")}
        outputs = [stored[f"output:{i}"] for i in range(sum(k.startswith("output:")
                                                             for k in stored.files))]
    return model, inputs, outputs


def _close(got, want, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


def _onnxruntime(model: bytes, feeds: dict) -> list:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def test_every_model_was_exported_by_both_exporters():
    assert len(CASES) == 16
    assert {c.rsplit(".", 1)[1] for c in CASES} == {"torchscript", "dynamo"}


@pytest.mark.parametrize("opt_level", [0, 2])
@pytest.mark.parametrize("stem", CASES)
def test_mixrt_gives_pytorchs_and_onnxruntimes_outputs(stem, opt_level):
    model, inputs, expected = _case(stem)
    got = mixrt.Session(model, opt_level=opt_level).run(None, inputs)
    reference = _onnxruntime(model, inputs)
    assert len(got) == len(expected) == len(reference)
    for index, (mine, torch_out, ort_out) in enumerate(zip(got, expected, reference)):
        _close(mine, torch_out, f"{stem} output {index} vs PyTorch")
        _close(mine, ort_out, f"{stem} output {index} vs onnxruntime")


def _other_shape(value: np.ndarray, dims: list, rng) -> np.ndarray:
    """``value`` regrown along its symbolic dims (by one more row, or a repeat)."""
    shape = [d + 1 if symbolic else d for d, symbolic in zip(value.shape, dims)]
    if value.dtype == np.bool_:
        grown = np.ones(shape, bool)
        grown[..., -1] = False  # every row keeps its first key
        return grown
    if value.dtype.kind == "i":
        return rng.integers(0, int(value.max()) + 1, shape).astype(value.dtype)
    return rng.standard_normal(shape).astype(value.dtype)


DYNAMIC = [c for c in CASES if not c.startswith(("unetish", "grab_bag"))]


@pytest.mark.parametrize("stem", DYNAMIC)
def test_dynamic_axes_take_other_sizes(stem):
    model, inputs, _ = _case(stem)
    proto = onnx.load_from_string(model)
    symbolic = {v.name: [bool(d.dim_param) or not d.HasField("dim_value")
                         for d in v.type.tensor_type.shape.dim] for v in proto.graph.input}
    assert any(any(dims) for dims in symbolic.values()), "the export kept no dynamic axis"
    rng = np.random.default_rng(3)
    feeds = {name: _other_shape(value, symbolic[name], rng) for name, value in inputs.items()}
    session = mixrt.Session(model)
    for _ in range(2):  # the second run takes the planned arena
        for index, (mine, theirs) in enumerate(zip(session.run(None, feeds),
                                                   _onnxruntime(model, feeds))):
            _close(mine, theirs, f"{stem} output {index} at other sizes")


def test_mixrt_check_validate_passes_on_a_torch_export(tmp_path):
    """The CI gate users run on their export: exit 0, every node supported, outputs close."""
    path = DATA / "tiny_vit.dynamo.onnx"
    done = subprocess.run([sys.executable, "-m", "mixrt", "check", str(path), "--validate",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["error"] is None
    assert report["nodes"] and all(node["supported"] for node in report["nodes"])
    assert report["outputs"] and all(output["ok"] for output in report["outputs"])


@pytest.mark.parametrize("stem", CASES)
def test_compiled_and_reexported_forms_give_the_same_outputs(stem, tmp_path):
    """The service path (compile to .mxr, serve it) and the round trip (mixrt's ONNX export
    at opsets 17 and 21, run by onnxruntime) keep PyTorch's outputs."""
    from mixrt.exporters.onnx import export_model
    from mixrt.importers.onnx import import_model
    model, inputs, expected = _case(stem)
    done = subprocess.run([sys.executable, "-m", "mixrt", "compile",
                           str(DATA / f"{stem}.onnx"), "-o", str(tmp_path / "m.mxr")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    # dynamic axes: no plan is stored, each shape is planned at its first run
    assert ("no memory plan stored" in done.stdout) == (stem in DYNAMIC), done.stdout
    for index, got in enumerate(mixrt.Session(str(tmp_path / "m.mxr")).run(None, inputs)):
        _close(got, expected[index], f"{stem} output {index} from the .mxr")
    for opset in (17, 21):
        exported = export_model(import_model(model), opset).SerializeToString()
        for index, got in enumerate(_onnxruntime(exported, inputs)):
            _close(got, expected[index], f"{stem} output {index} exported at {opset}")


@pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("stem", CASES)
def test_the_gpu_gives_pytorchs_outputs(stem):
    model, inputs, expected = _case(stem)
    for index, got in enumerate(mixrt.Session(model, device="gpu").run(None, inputs)):
        _close(got, expected[index], f"{stem} output {index} on the GPU")


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("stem", CASES)
def test_every_export_differentiates_in_low_precision(stem, precision):
    """Each export rewritten by the mixed-precision pass (float32 weights, the compute in
    float16 or bfloat16) gives the float32 graph's gradients for every weight, to within
    the low type's resolution of the largest one. The rewrite used to cast Range's float
    bounds to float16 and feed bfloat16 to AveragePool-11, models the type check refuses."""
    import ml_dtypes

    from mixrt.importers.onnx import import_model
    from mixrt.runtime.graph import Node, Value
    from mixrt.runtime.training.mixed_precision import lower_precision
    from mixrt.runtime.passes.autodiff import gradient_graph
    model, feeds, _ = _case(stem)
    graph = import_model(model)
    weights = {n: v for n, v in graph.initializers.items()
               if v.dtype == np.float32 and v.ndim >= 1}
    graph.nodes.append(Node("ReduceSum", [graph.outputs[0].name], ["loss"], name="loss",
                            opset=17, attributes={"keepdims": 0}))
    graph.outputs = [Value("loss")]
    low = lower_precision(graph, ml_dtypes.bfloat16 if precision == "bfloat16" else np.float16)
    results = []
    for candidate in (graph, low):
        joint = gradient_graph(candidate, "loss", list(weights))
        wanted = ["loss"] + [joint.grads[n] for n in weights]
        results.append(mixrt.Session(joint.graph).run(wanted, {**feeds, **weights}))
    # bfloat16 keeps 8 bits: grab_bag's largest gradient (its conv1d bias, a sum of terms
    # that cancel) is off by 7% of itself; rounding only the inputs already moves it 0.7%
    tolerance = 1e-1 if precision == "bfloat16" else 1e-2
    (loss, *grads), (low_loss, *low_grads) = results
    assert abs(float(low_loss) - float(loss)) <= tolerance * max(abs(float(loss)), 1.0)
    if not grads:
        return
    scale = max(float(np.abs(g).max()) for g in grads)
    for name, want, got in zip(weights, grads, low_grads):
        assert got.dtype == np.float32 and np.isfinite(got).all(), name
        assert np.abs(got - want).max() <= tolerance * scale, name
