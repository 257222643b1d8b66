"""The training engine lives in ``runtime/training/``, a package the inference engine (the
rest of ``runtime/``) never imports: a service that only runs models loads none of it."""

import ast
import os
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_inference_module_imports_the_training_package():
    offenders = {}
    for path in RUNTIME.rglob("*.py"):
        if "training" in path.relative_to(RUNTIME).parts:
            continue
        training = sorted(name for name in _imports(path)
                          if name.startswith("mixrt.runtime.training"))
        if training:
            offenders[str(path.relative_to(RUNTIME))] = training
    assert not offenders, offenders


def test_running_a_model_loads_no_training_module():
    script = ("import sys, numpy as np, mixrt\n"
              "from onnx import helper, TensorProto\n"
              "node = helper.make_node('Relu', ['x'], ['y'])\n"
              "graph = helper.make_graph([node], 'g', "
              "[helper.make_tensor_value_info('x', TensorProto.FLOAT, [2])], "
              "[helper.make_tensor_value_info('y', TensorProto.FLOAT, [2])])\n"
              "model = helper.make_model(graph, ir_version=9, "
              "opset_imports=[helper.make_opsetid('', 17)])\n"
              "mixrt.Session(model.SerializeToString()).run(None, {'x': np.ones(2, 'f')})\n"
              "print(sorted(m for m in sys.modules if m.startswith('mixrt.runtime.training')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, MIXRT_JIT="0"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
