"""The wheel carries every package the source layout maps into ``mixrt``."""

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.xdist_group("wheel")  # wheel builds share the checkout's build/ folder
def test_wheel_contains_every_package(tmp_path):
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    mapping = config["tool"]["setuptools"]["package-dir"]
    # without prebuilt kernels (tests/test_prebuilt_kernels.py builds a wheel with them)
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                    "--outdir", str(tmp_path), str(ROOT)], check=True, capture_output=True,
                   env=dict(os.environ, MIXRT_PREBUILT_LEVELS="none"))
    (wheel,) = tmp_path.glob("mixrt-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")  # no machine code: any platform
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not any("/prebuilt/" in name for name in names)
    for package in packages:
        init = package.replace(".", "/") + "/__init__.py"
        assert init in names, f"{package} missing from the wheel"
        source = ROOT / mapping[package]
        for module in source.glob("*.py"):
            assert f"{package.replace('.', '/')}/{module.name}" in names, module
    assert any(n.endswith("entry_points.txt") for n in names)
    # PEP 561: type checkers read mixrt's annotations
    assert "mixrt/py.typed" in names
    # the wheel's version is the one the package states (pyproject reads __version__)
    from mixrt import __version__
    assert wheel.name.startswith(f"mixrt-{__version__}-")


def test_every_source_folder_with_init_is_a_listed_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapped = {Path(p) for p in config["tool"]["setuptools"]["package-dir"].values()}
    for folder in ("mixrt", "runtime", "ops", "kvstore", "importers", "exporters", "models"):
        for init in (ROOT / folder).rglob("__init__.py"):
            assert init.parent.relative_to(ROOT) in mapped, f"{init.parent} is not listed"
