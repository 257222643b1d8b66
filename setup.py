"""The one build step pyproject.toml cannot state: a wheel carries the standard kernels
compiled ahead of time, so a user's machine has nothing to compile for them
(``ops/compiled/prebuilt.py``; the build: ``ops/compiled/_prebuild.py``).

``python -m build`` (or ``pip wheel .``) compiles them after copying the package, for the
x86-64 levels in ``MIXRT_PREBUILT_LEVELS`` (comma-separated; default ``x86-64-v3,x86-64-v4``
and the latter's VNNI addition, ``x86-64-v4-vnni``, on x86-64 Linux, none elsewhere;
``none`` skips them), into the build's copy of
``mixrt/ops/compiled/prebuilt/``. Such a wheel holds machine code, so it is tagged for this
Python and platform, and requires the numba that compiled it. ``MIXRT_PREBUILT_KERNELS``
names another list than the recorded ``ops/compiled/kernels.json`` (the tests build a small
one). An editable install (the README's) and the sdist carry none: their kernels compile
where they run, as before (an editable install's metadata, which pip asks for as it asks a
wheel's, pins the build environment's numba too).
"""

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

DEFAULT_LEVELS = "x86-64-v3,x86-64-v4,x86-64-v4-vnni"


def prebuilt_levels() -> list[str]:
    configured = os.environ.get("MIXRT_PREBUILT_LEVELS")
    if configured is None:
        on_x86 = sys.platform.startswith("linux") and platform.machine() == "x86_64"
        configured = DEFAULT_LEVELS if on_x86 else "none"
    return [] if configured.strip() in ("", "none") else configured.split(",")


class BuildWithKernels(build_py):
    """build_py, then the prebuilt kernels compiled against the copied package."""

    def run(self):
        super().run()
        into = Path(self.build_lib).resolve() / "mixrt" / "ops" / "compiled" / "prebuilt"
        shutil.rmtree(into, ignore_errors=True)  # an earlier build's, in a reused build/
        levels = prebuilt_levels()
        if self.editable_mode or not levels:
            return
        command = [sys.executable, "-m", "mixrt.ops.compiled._prebuild", "--into", str(into),
                   "--levels", ",".join(levels)]
        kernels = os.environ.get("MIXRT_PREBUILT_KERNELS")
        if kernels:
            command += ["--kernels", str(Path(kernels).resolve())]
        # the copy in build/ is what the wheel holds: its files' hashes stamp the entries
        env = dict(os.environ, PYTHONPATH=os.path.abspath(self.build_lib))
        subprocess.run(command, env=env, check=True, cwd=self.build_lib)


class KernelsDistribution(Distribution):
    """A wheel with prebuilt kernels holds machine code: it is installed where compiled
    modules go and tagged for this Python and platform (numba's cache files are per Python
    version, the code per architecture), as a wheel with C extensions is. And it requires
    the numba it was compiled with: numba's cache format and the kernels' machine code are
    that release's, and a process with another numba ignores them (``prebuilt.chosen``,
    the level's ``manifest.json``) and compiles as if none were shipped."""

    def has_ext_modules(self):
        return bool(prebuilt_levels())

    def run_commands(self):
        # the wheel's metadata (bdist_wheel, or dist_info where a frontend asks for it
        # first); the sdist keeps the range, since a wheel built from it compiles anew
        if prebuilt_levels() and {"bdist_wheel", "dist_info"} & set(self.commands):
            pinned = numba_pinned(self.install_requires)
            self.install_requires = self.metadata.install_requires = pinned
        super().run_commands()


def numba_pinned(requirements) -> list[str]:
    """``requirements`` with numba's range narrowed to the release this build runs."""
    from importlib.metadata import version
    pinned = f"numba=={version('numba')}"
    return [pinned if re.match(r"numba\s*([<>=!~;\[]|$)", str(r).strip(), re.IGNORECASE)
            else str(r) for r in requirements]


setup(cmdclass={"build_py": BuildWithKernels}, distclass=KernelsDistribution)
