"""mixrt's BLAS policy (runtime/blas_policy.py), in fresh interpreters: imported before NumPy
it sets OpenBLAS's environment; imported after, it re-tunes the loaded OpenBLAS in place, so
both orders compute the same bits, or it warns once where it cannot."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mixrt.runtime import blas_policy

pytestmark = pytest.mark.skipif(
    "openblas" not in np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"].lower(),
    reason="NumPy does not use OpenBLAS here: the policy leaves other BLAS libraries alone")

# products in four dtypes (some large enough for OpenBLAS's threads) and LAPACK calls,
# hashed, with what the loaded OpenBLAS reports about itself
PROBE = """
import hashlib, json
import numpy as np
from mixrt.runtime import blas_policy
rng = np.random.default_rng(1)
digest = hashlib.sha256()
for dtype in (np.float32, np.float64, np.complex64):
    for m, k, n in [(3, 7, 2), (64, 300, 70), (512, 512, 512), (17, 4096, 33)]:
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        digest.update((a @ b).tobytes())
x = rng.standard_normal((200, 200))
digest.update(np.linalg.solve(x, x[:, :3]).tobytes())
digest.update(np.linalg.eigh(x + x.T)[0].tobytes())
library = blas_policy._loaded_openblas()
print(json.dumps({"bits": digest.hexdigest(), "core": blas_policy._corename(library),
                  "timeout": blas_policy._timeout(library)}))
"""


def _run(first: str, **env) -> tuple[dict, str]:
    """The probe in a fresh interpreter after ``first``; its report and its stderr. The
    environment asks for OpenBLAS's AVX2 kernels, as the machines this was measured on do (OpenBLAS
    0.3.31 alone picks SkylakeX on their AVX-512 EPYC), unless ``env`` says otherwise."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_THREAD_TIMEOUT", "MIXRT_BLAS")}
    clean["OPENBLAS_CORETYPE"] = "Haswell"
    done = subprocess.run([sys.executable, "-c", first + "\n" + PROBE], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_after_numpy_the_loaded_openblas_is_retuned_to_the_same_bits_as_before():
    before, said_before = _run("import mixrt\nimport numpy")
    after, said_after = _run("import numpy\nimport mixrt")
    assert "BlasPolicyWarning" not in said_before + said_after
    assert after == before
    assert after["timeout"] == int(blas_policy.THREAD_TIMEOUT)
    if blas_policy.cpu_has_avx512():
        assert after["core"].lower() in blas_policy.AVX512_CORES


def test_the_users_own_timeout_is_kept_and_system_leaves_openblas_alone():
    kept, _ = _run("import numpy\nimport mixrt", OPENBLAS_THREAD_TIMEOUT="20")
    assert kept["timeout"] == 20
    untouched, said = _run("import numpy\nimport mixrt", MIXRT_BLAS="system")
    assert untouched["core"] == "Haswell" and untouched["timeout"] == 0
    assert "BlasPolicyWarning" not in said


def test_with_another_thread_running_it_warns_once_and_names_the_fix():
    """Another thread could be inside a BLAS call, so the library is not restarted: one
    warning, at the user's import line, with what is missed, why, and the fixes."""
    busy = ("import threading, time\nimport numpy\n"
            "threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n"
            "import mixrt")
    report, said = _run(busy)
    assert said.count("BlasPolicyWarning") == 1, said
    assert "another thread was running" in said and "OPENBLAS_THREAD_TIMEOUT=16" in said
    assert "Import mixrt before NumPy" in said and ":4:" in said
    assert report["timeout"] != int(blas_policy.THREAD_TIMEOUT)  # nothing was changed
    # the variables the warning names: the AVX-512 core only where the CPU has AVX-512 (an
    # AVX2 CPU given OPENBLAS_CORETYPE=SkylakeX dies of SIGILL in its first product)
    exported = {"OPENBLAS_THREAD_TIMEOUT": blas_policy.THREAD_TIMEOUT}
    if blas_policy.cpu_has_avx512():
        exported["OPENBLAS_CORETYPE"] = blas_policy.CORETYPE
    assert "BlasPolicyWarning" not in _run(busy, **exported)[1]
    assert "BlasPolicyWarning" not in _run(busy, MIXRT_BLAS="system")[1]
