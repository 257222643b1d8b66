"""What numba does at a process's first kernel and mixrt defers (ops/compiled/numba_start.py):
a cached kernel loads before numba's registries (and so before SciPy's linear algebra);
whatever compiles afterwards in the same process still gets every registry and the BLAS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

FRESH = textwrap.dedent("""
    import json, sys
    import numpy as np
    from mixrt.ops.compiled.jit_cache import guard_damaged_entries
    guard_damaged_entries()
    import numba

    @numba.njit(cache=True)
    def scaled_sum(a, s):
        total = 0.0
        for i in range(a.size):
            total += a[i] * s
        return total

    a = np.arange(6.0)
    first = scaled_sum(a, 2.0)
    loaded = {"registries": "numba.np.npyimpl" in sys.modules,
              "scipy_linalg": "scipy.linalg" in sys.modules,
              "hits": sum(scaled_sum.stats.cache_hits.values())}

    @numba.njit
    def product(x, y):
        return np.dot(x, y)

    m = np.arange(9.0).reshape(3, 3)
    import numba.np.arraymath as arraymath
    print(json.dumps({**loaded, "first": first, "dot": product(m, m).tolist(),
                      "have_blas": arraymath._HAVE_BLAS}))
""")


def _fresh(tmp_path) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               MIXRT_CACHE_DIR=str(tmp_path / "mixrt"))
    script = tmp_path / "fresh.py"  # numba caches only what a file defines
    script.write_text(FRESH)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _scipy_blas_imports() -> bool:
    try:
        import scipy.linalg.cython_blas  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def test_a_cached_kernel_loads_before_the_registries_and_compiling_still_has_them(tmp_path):
    compiled = _fresh(tmp_path)  # compiles and saves scaled_sum
    assert compiled["hits"] == 0 and compiled["first"] == 30.0
    loaded = _fresh(tmp_path)  # a second process loads it
    assert loaded["hits"] == 1 and loaded["first"] == 30.0
    assert not loaded["registries"] and not loaded["scipy_linalg"], loaded
    # then a compile in the same process: every registry, and np.dot through the BLAS
    # where SciPy has one
    assert loaded["dot"] == [[15.0, 18.0, 21.0], [42.0, 54.0, 66.0], [69.0, 90.0, 111.0]]
    assert loaded["have_blas"] == _scipy_blas_imports()



LINEAR_CLASSIFIER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from onnx import TensorProto, helper
    import mixrt

    rows = np.random.default_rng(0).standard_normal((20, 5)).astype(np.float32)
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"],
                            domain="ai.onnx.ml", coefficients=[0.5] * 15,
                            intercepts=[0.1, 0.2, 0.3], classlabels_ints=[0, 1, 2],
                            post_transform="SOFTMAX")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 5])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    session = mixrt.Session(model.SerializeToString())
    session.run(None, {"x": rows})
    ready = session.wait_compiled(timeout=240)
    session.run(None, {"x": rows})  # its products through the BLAS (ml_linear.BLAS_ROWS)
    print(json.dumps({"ready": ready, "scipy_linalg": "scipy.linalg" in sys.modules}))
""")


def test_a_linear_classifier_of_many_rows_takes_numpys_blas_and_imports_no_scipy(tmp_path):
    """The compiled LinearClassifier's product of BLAS_ROWS rows or more is NumPy's: numba's
    np.dot in the kernel imported SciPy for its BLAS at the first such call of a process, ~190 ms
    of a service's first request of that many rows (ops/ml/_jit_ml.linear_classify). The
    compile child, started in a folder that holds the cache folder ``mixrt``, still finds
    the package (it did not put its working directory first on its path: ``python -P``)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               MIXRT_CACHE_DIR=str(tmp_path / "mixrt"))
    env.pop("MIXRT_COMPILE", None)  # as a service runs: a compile in-process imports SciPy
    script = tmp_path / "linear.py"
    script.write_text(LINEAR_CLASSIFIER)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"ready": True, "scipy_linalg": False}
