"""The MXNet 1.x example scripts of docs/from-mxnet.md run under mixrt through the ``mxnet``
alias, unchanged, and train to the accuracy the guide states.

Each script runs in its own interpreter with ``compat/mxnet`` on PYTHONPATH, as a user's
script would after ``pip install ./compat/mxnet``; the scripts exit with status 1 when the
final accuracy stays below ``--target``, and print it as ``final accuracy: x``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "mxnet"
ALIAS = ROOT / "compat" / "mxnet"
FINAL = re.compile(r"^final accuracy: ([0-9.]+)$", re.MULTILINE)


def run_example(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ALIAS), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(EXAMPLES / script), "--out", str(tmp_path),
                           *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def final_accuracy(result: subprocess.CompletedProcess) -> float:
    assert result.returncode in (0, 1), result.stderr[-3000:]
    found = FINAL.search(result.stdout)
    assert found, f"no final accuracy in:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    return float(found.group(1))


def test_gluon_script_trains_saves_reloads_and_exports(tmp_path):
    result = run_example("gluon_train.py", tmp_path, "--epochs", "2")
    assert final_accuracy(result) >= 0.9
    assert result.returncode == 0
    # save_parameters wrote MXNet's parameter file; export wrote the traced graph
    assert (tmp_path / "cnn.params").stat().st_size > 0
    assert {"cnn.onnx", "cnn.mxr"} <= {p.name for p in tmp_path.iterdir()}


def test_module_script_trains_checkpoints_and_predicts(tmp_path):
    result = run_example("module_train.py", tmp_path, "--epochs", "2")
    assert final_accuracy(result) >= 0.9
    assert result.returncode == 0
    assert (tmp_path / "mlp-symbol.json").is_file()
    assert (tmp_path / "mlp-0002.params").is_file()
    assert "Validation-accuracy" in result.stdout + result.stderr


@pytest.mark.parametrize("script", ["gluon_train.py", "module_train.py"])
def test_script_fails_when_the_target_is_out_of_reach(tmp_path, script):
    # the exit status is the check the guide relies on, so it must be able to say no
    result = run_example(script, tmp_path, "--epochs", "1", "--target", "1.01")
    assert final_accuracy(result) <= 1.0
    assert result.returncode == 1
