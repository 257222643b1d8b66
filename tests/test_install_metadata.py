"""pyproject.toml's requirements install on every Python mixrt supports. CI installs them on
3.11 (.ci/run: ``pip install -e ".[test]"``); for 3.12 and 3.13 pip resolves the same
requirements (the dependencies, the serve extra and the test extra) without installing
anything, so that a release with no wheel for one, or a Requires-Python that leaves one out
(MLServer 1.7's ``<3.13``), fails here rather than on a user's machine. It needs the package
index: without one it skips and says so; a resolution that fails, fails, with pip's error.
And the extras fit together: the test extra holds what the suite runs, and the two builds of
onnxruntime never meet in one install."""

import functools
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
# the Pythons CI does not install on, and the extras checked there
PYTHONS = ("3.12", "3.13")
CHECKED_EXTRAS = ("serve", "test")
# the extras the suite does not run: the GPU's (a GPU machine brings its own), the schema
# compiler and the benchmarks' peers
NOT_IN_TEST = {"test", "gpu", "validate-gpu", "dev", "bench"}


def _name(requirement: str) -> str:
    """A requirement's project name as an index spells it (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group()
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> list[str]:
    return [*PROJECT["dependencies"], *(r for extra in CHECKED_EXTRAS for r in EXTRAS[extra])]


def test_the_test_extra_holds_every_extra_the_suite_runs():
    tested = {_name(r) for r in EXTRAS["test"]}
    missing = {extra: sorted(r for r in EXTRAS[extra] if _name(r) not in tested)
               for extra in EXTRAS.keys() - NOT_IN_TEST}
    assert not any(missing.values()), f"not in the test extra: {missing}"


def test_the_suite_runs_versions_the_extras_allow():
    """The test extra may pin a release (onnxruntime's, which the suite holds to exact
    answers); the release installed must still be one every extra naming it accepts."""
    for requirement in map(Requirement, _suite_requirements()):
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # the GPU's and the benchmarks' extras are not installed for the suite
        assert requirement.specifier.contains(installed, prereleases=True), \
            f"{requirement.name} {installed} is installed; pyproject.toml asks {requirement}"


def _suite_requirements() -> list[str]:
    extras = EXTRAS.keys() - NOT_IN_TEST | {"test"}
    return [*PROJECT["dependencies"], *(r for extra in extras for r in EXTRAS[extra])]


def test_onnxruntime_and_its_gpu_build_never_share_an_install():
    # both install the module `onnxruntime`: one environment with the two has either's files
    gpu_build = sorted(extra for extra, requirements in EXTRAS.items()
                       if "onnxruntime-gpu" in map(_name, requirements))
    assert gpu_build == ["validate-gpu"]
    assert "onnxruntime-gpu" not in map(_name, PROJECT["dependencies"])


@functools.cache
def _index_url() -> str:
    """The index pip resolves against: PIP_INDEX_URL, else pip's configuration, else PyPI."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                          capture_output=True, text=True, timeout=60)
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    for key in (":env:.index-url", "install.index-url", "global.index-url"):
        if key in found:
            return found[key].strip("'\"").split()[0]
    return "https://pypi.org/simple/"


@functools.cache
def _unreachable() -> str | None:
    """Why the index cannot be reached, or None where it answers."""
    url = _index_url().rstrip("/") + "/pip/"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=20).close()
    except urllib.error.HTTPError:
        return None  # it answered, if not with that page
    except (OSError, ValueError) as exc:  # URLError and timeouts are OSErrors
        return f"no package index reachable at {url}: {exc}"
    return None


def _interpreter(version: str) -> str | None:
    """A Python ``version`` on this machine: on PATH, or one pyenv installed (its shim on
    PATH fails for a version the directory has not selected)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}"),
                  *sorted(pyenv.glob(f"versions/{version}.*/bin/python{version}"))]
    for candidate in filter(None, candidates):
        try:
            done = subprocess.run([str(candidate), "-c", "import sys; "
                                   "print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip() == version:
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory) -> dict:
    """Each Python's resolution: (the interpreter or None, pip's exit status, its output's
    lines, its report's path). The two pips run side by side, as most of each one's ~30-55 s is
    reading the index."""
    if reason := _unreachable():
        pytest.skip(reason)
    started = {version: _start_resolution(version, tmp_path_factory.mktemp(f"python{version}"))
               for version in PYTHONS}
    return {version: _finished_resolution(*job) for version, job in started.items()}


def _start_resolution(version: str, folder: Path):
    report = folder / "report.json"
    install = ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
               "--quiet", "--report", str(report)]
    interpreter = _interpreter(version)
    if interpreter:
        # pip run by that Python: Requires-Python and the markers are evaluated for it
        command = [sys.executable, "-m", "pip", "--python", interpreter, *install]
    else:
        # wheels for that Python's tags; pip evaluates Requires-Python and markers for the
        # Python that runs it as well (pypa/pip#12216, #11010), which makes this stricter
        # than the install, never laxer, for the Requires-Python pins
        command = [sys.executable, "-m", "pip", *install, "--python-version", version,
                   "--target", str(folder / "target")]
    pip = subprocess.Popen([*command, *_requirements()], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True,
                           env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1",
                                    PIP_REQUIRE_VIRTUALENV="0"))
    return interpreter, pip, report


def _finished_resolution(interpreter, pip: subprocess.Popen, report: Path):
    try:
        output, _ = pip.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        pip.kill()
        output = pip.communicate()[0] + "\n(pip still resolving after 600 s)"
    # this pip's complaints about the configured local indexes are not the resolution's
    lines = [line for line in output.splitlines() if not line.startswith("WARNING: Location")]
    return interpreter, pip.returncode, lines, report


@pytest.mark.xdist_group("pip")  # one worker runs both, so the fixture resolves once
@pytest.mark.parametrize("version", PYTHONS)
def test_the_requirements_resolve_on_each_python(version, resolutions):
    interpreter, status, lines, report = resolutions[version]
    assert status == 0, (
        f"pyproject.toml's requirements do not resolve for Python {version} "
        f"({interpreter or '--python-version'}):\n" + "\n".join(lines[-40:]))
    resolved = {_name(item["metadata"]["name"]) for item in
                json.loads(report.read_text())["install"]}
    assert {_name(r) for r in _requirements()} <= resolved
