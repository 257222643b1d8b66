"""Inputs a kernel only reads on the host (``OpHandle.reads_on_host``: a Reshape's shape, an
Unsqueeze's axes, a Slice's starts) come from a host copy in planned GPU runs when the
signature fixes them, so a run does not wait for the device at every such node.

On the fake CuPy the device-to-host reads are counted: a planned run of each PyTorch export
makes one per output and one for the run's deferred checks, whatever its node count. Every
backend node case of an op with such inputs runs on the GPU with those inputs as
initializers (the data still fed), and must give the case's outputs."""

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import mixrt
from mixrt.errors import UnsupportedOperatorError
from mixrt.ops.ir.registry import REGISTRY
from mixrt.ops.device import gpu_available
from soundness import backend_node_cases, case_inputs

needs_gpu = pytest.mark.skipif(not gpu_available(), reason="needs CuPy and a CUDA GPU")
EXPORTS = Path(__file__).parent.parent / "data" / "torch_exports"


def _host_input_ops() -> set:
    return {(k.domain, k.op_type) for k in REGISTRY.all_kernels() if k.host_inputs}


def test_the_shape_ops_declare_their_host_inputs():
    kernel = REGISTRY.find("", "Reshape", 21)
    assert kernel.host_inputs == {1}
    assert REGISTRY.find("", "Slice", 13).host_inputs == {1, 2, 3, 4}
    assert REGISTRY.find("", "Pad", 21).host_inputs == {1, 3}  # not the constant value
    assert REGISTRY.find("", "Add", 14).host_inputs == frozenset()


def _reads(session, feeds) -> int:
    import cupy  # noqa: PLC0415
    before = cupy._core.host_reads()
    session.run(None, feeds)
    return cupy._core.host_reads() - before


@needs_gpu
@pytest.mark.parametrize("model", sorted(p.name for p in EXPORTS.glob("*.onnx")))
def test_a_planned_gpu_run_reads_back_only_its_outputs(model):
    import cupy  # noqa: PLC0415
    if not getattr(cupy, "IS_FAKE", False):
        pytest.skip("counts device-to-host reads, which only the fake CuPy can")
    stored = np.load(EXPORTS / model.replace(".onnx", ".npz"))
    feeds = {k[len("input:"):]: v for k, v in stored.items() if k.startswith("input:")}
    session = mixrt.Session(str(EXPORTS / model), device="gpu")
    outputs = session.run(None, feeds)  # the discovery run, then the planned ones
    assert _reads(session, feeds) <= len(outputs) + 1


def _with_host_inputs_fixed(case):
    """The case's model with the inputs its node reads on the host as initializers (the
    others still fed), and the feeds; None when there is none to fix."""
    model, node = case.model, case.model.graph.node[0]
    kernel = REGISTRY.find(node.domain, node.op_type, _opset(model, node.domain))
    inputs = dict(zip([v.name for v in model.graph.input], case_inputs(case)))
    fixed = {node.input[i] for i in (kernel.host_inputs if kernel else ())
             if i < len(node.input) and node.input[i] in inputs}
    if not fixed or not all(isinstance(inputs[n], np.ndarray) for n in inputs):
        return None
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    kept = [v for v in changed.graph.input if v.name not in fixed]
    del changed.graph.input[:]
    changed.graph.input.extend(kept)
    changed.graph.initializer.extend(numpy_helper.from_array(inputs[n], n) for n in fixed)
    return changed, {n: v for n, v in inputs.items() if n not in fixed}


def _opset(model, domain) -> int:
    """The model's opset for ``domain`` ("" and "ai.onnx" both name the default one)."""
    default = ("", "ai.onnx")
    return next(o.version for o in model.opset_import
                if o.domain == domain or (o.domain in default and domain in default))


@needs_gpu
def test_every_backend_case_of_those_ops_runs_with_its_host_inputs_fixed():
    wanted_ops, ran, failures = _host_input_ops(), 0, {}
    for case in backend_node_cases():
        node = case.model.graph.node
        if len(node) != 1 or (node[0].domain, node[0].op_type) not in wanted_ops:
            continue
        made = _with_host_inputs_fixed(case)
        if made is None:
            continue
        model, feeds = made
        expected = [numpy_helper.to_array(t) if isinstance(t, onnx.TensorProto) else t
                    for t in case.data_sets[0][1]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                session = mixrt.Session(model, device="gpu", opt_level=0)
            except UnsupportedOperatorError:
                continue  # refused when made, as it must be: a dtype CuPy cannot hold
            try:
                session.run(None, feeds)  # discovery; the next run is planned
                got = session.run(None, feeds)
                for g, e in zip(got, expected):
                    np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-6)
            except Exception as exc:  # noqa: BLE001 - collected and reported together
                failures[case.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        ran += 1
    assert ran > 120, f"only {ran} cases ran"
    assert not failures, failures
