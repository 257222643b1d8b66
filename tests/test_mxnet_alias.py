"""``mxnet``, the companion distribution in ``compat/mxnet``: an alias of mixrt module for
module, which plain ``pip install mixrt`` never installs.

The import checks run in a child interpreter with ``compat/mxnet`` on its path, as an
installed ``mixrt-mxnet`` would put it, so this process's ``sys.modules`` and import hooks
stay as every other test expects them.
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "compat" / "mxnet"

PROBE = r"""
import importlib, json, sys
import mxnet as mx
import mixrt
import mxnet.gluon.nn
from mxnet import nd, gluon, autograd
from mxnet.gluon import nn
from mxnet.base import MXNetError
import mxnet.ndarray.ndarray as ndarray_module
from packaging.version import Version

report = {
    "version": mx.__version__,
    "version_release": list(Version(mx.__version__).release),
    "nd": nd is mixrt.nd and mx.nd is mixrt.nd,
    "gluon_nn": mxnet.gluon.nn is mixrt.gluon.nn and nn is mixrt.gluon.nn,
    "dense": mx.gluon.nn.Dense is mixrt.gluon.nn.Dense,
    "autograd": autograd is mixrt.autograd,
    "synonym": mx.ndarray is mixrt.nd and sys.modules["mxnet.ndarray"] is mixrt.nd,
    "synonym_child": ndarray_module is mixrt.nd.ndarray,
    "error": MXNetError is mixrt.errors.MixrtError,
    "cpu": mx.cpu is mixrt.cpu,
    "real_names": [mixrt.nd.__name__, mixrt.nd.__spec__.name, mixrt.gluon.nn.__spec__.name],
    "one_module": "mixrt.gluon.nn" in sys.modules and sys.modules["mxnet.gluon.nn"] is sys.modules["mixrt.gluon.nn"],
}
try:
    import mxnet.no_such_module
except ModuleNotFoundError as missing:
    report["missing"] = [missing.name, str(missing)]
try:
    mx.no_such_name
except AttributeError as missing:
    report["missing_attribute"] = str(missing)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def probe():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(COMPAT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_submodules_are_mixrts_own_module_objects(probe):
    assert probe["nd"] and probe["gluon_nn"] and probe["dense"] and probe["autograd"]
    assert probe["one_module"] and probe["cpu"]


def test_mxnet_synonyms_resolve_to_the_same_modules(probe):
    assert probe["synonym"] and probe["synonym_child"]


def test_aliased_modules_keep_their_real_names(probe):
    assert probe["real_names"] == ["mixrt.nd", "mixrt.nd", "mixrt.gluon.nn"]


def test_version_reads_as_mxnet_1_9_1_and_names_mixrt(probe):
    import mixrt
    assert probe["version"] == f"1.9.1+mixrt.{mixrt.__version__}"
    assert probe["version_release"] == [1, 9, 1]


def test_mxnet_error_is_mixrts_base_error(probe):
    assert probe["error"]


def test_missing_module_names_both_paths(probe):
    name, message = probe["missing"]
    assert name == "mxnet.no_such_module"
    assert "mixrt.no_such_module" in message
    assert "no_such_name" in probe["missing_attribute"]


def test_plain_mixrt_install_never_ships_mxnet():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    assert not [p for p in packages if p.split(".")[0] == "mxnet"]


def test_companion_wheel_holds_only_the_alias(tmp_path):
    config = tomllib.loads((COMPAT / "pyproject.toml").read_text())
    assert config["project"]["dependencies"] == ["mixrt"]
    source = shutil.copytree(COMPAT, tmp_path / "source")  # setuptools writes build/ there
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--outdir", str(tmp_path / "dist"), str(source)], check=True,
                   capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("mixrt_mxnet-*.whl")
    modules = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")]
    assert modules == ["mxnet/__init__.py"]
