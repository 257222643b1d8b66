"""Kernels compiled ahead of time (ops/compiled/prebuilt.py, ops/compiled/_prebuild.py): a
recorded list compiled for this CPU's x86-64 level, then a fresh process with empty caches
that runs a model on them: compiled at its first run, no compile process, the same outputs
as the NumPy tier. And the guard that keeps a prebuilt first run from compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mixrt.ops.compiled import jit_tier, prebuilt, recorded_kernels

ROOT = Path(__file__).resolve().parent.parent
LEVEL = prebuilt.host_level()
needs_level = pytest.mark.skipif(LEVEL is None, reason="this CPU is below x86-64-v3: no "
                                 "prebuilt level fits it")


def small_model(path: Path) -> Path:
    """A fused elementwise program (a generated module) and a layer norm (a kernel file's
    function): the two places a kernel comes from, kept few as each compiles twice here."""
    shape = [1, 16, 16, 32]  # an output the arena holds (64 KiB at most), so LN gets out=
    nodes = [helper.make_node("Mul", ["x", "scale"], ["m"]),
             helper.make_node("Add", ["m", "shift"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1)]
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [1, 16, 1, 1],
                                np.linspace(0.5, 1.5, 16).tolist()),
             helper.make_tensor("shift", TensorProto.FLOAT, [1, 16, 1, 1],
                                np.linspace(-0.2, 0.2, 16).tolist()),
             helper.make_tensor("gamma", TensorProto.FLOAT, [32], np.ones(32).tolist()),
             helper.make_tensor("beta", TensorProto.FLOAT, [32], np.zeros(32).tolist())]
    graph = helper.make_graph(nodes, "prebuilt", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


RUN = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mixrt
    from mixrt.runtime import kernel_tiers
    x = np.random.default_rng(0).standard_normal((1, 16, 16, 32)).astype(np.float32)
    session = mixrt.Session(sys.argv[1])
    y = session.run(None, {"x": x})[0]
    tiers = session._tiers
    states = sorted(set(tiers.states().values())) if tiers is not None else ["one tier"]
    compiled_at_first = states == ["compiled"]
    session.wait_compiled(120)
    np.save(sys.argv[2], y)
    print(json.dumps({"first": compiled_at_first, "states": states,
                      "children": kernel_tiers.compiler().children if tiers else None,
                      "module": mixrt.__file__,
                      # what numba loads to compile, not to load (ops/compiled/numba_start.py)
                      "registries": "numba.np.npyimpl" in sys.modules,
                      "scipy_linalg": "scipy.linalg" in sys.modules}))
""")


def _env(tmp: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MIXRT_COMPILE", "MIXRT_JIT", recorded_kernels.RECORD)}
    return dict(env, MIXRT_CACHE_DIR=str(tmp / "mixrt"), NUMBA_CACHE_DIR=str(tmp / "numba"),
                XDG_CACHE_HOME=str(tmp / "xdg"), **extra)


def run_model(python: str, model: Path, out: Path, env: dict) -> dict:
    done = subprocess.run([python, "-c", RUN, str(model), str(out)], env=env, cwd=out.parent,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The small model, its recorded kernels and their prebuilt level (in a folder)."""
    tmp = tmp_path_factory.mktemp("prebuilt")
    model = small_model(tmp / "model.onnx")
    lines = tmp / "kernels.jsonl"
    run_model(sys.executable, model, tmp / "recorded.npy",
              _env(tmp / "record", MIXRT_COMPILE="foreground", MIXRT_PREBUILT="0",
                   **{recorded_kernels.RECORD: str(lines)}))
    kernels = tmp / "kernels.json"
    kernels.write_text(json.dumps({"kernels": recorded_kernels.read_lines(lines)}))
    if LEVEL is not None:
        subprocess.run([sys.executable, "-m", "mixrt.ops.compiled._prebuild", "--into",
                        str(tmp / "prebuilt"), "--levels", LEVEL, "--kernels", str(kernels)],
                       env=_env(tmp / "build"), check=True, capture_output=True, timeout=600)
    return {"tmp": tmp, "model": model, "kernels": kernels, "prebuilt": tmp / "prebuilt"}


def test_the_recording_names_each_kind_of_kernel(built):
    entries = json.loads(built["kernels"].read_text())["kernels"]
    modules = {entry["module"] for entry in entries}
    assert any(m.startswith("mixrt_fused_") for m in modules), modules  # generated
    assert "mixrt.ops.nn._jit_row_reductions" in modules
    generated = [e for e in entries if e["module"].startswith("mixrt_")]
    assert generated and all("source" in e for e in generated)  # rebuilt from its source


@needs_level
def test_a_fresh_process_runs_the_prebuilt_kernels_at_its_first_run(built, tmp_path):
    manifest = json.loads((built["prebuilt"] / LEVEL / prebuilt.MANIFEST).read_text())
    assert manifest["target"][1] == LEVEL and manifest["entries"] > 0
    on_prebuilt = run_model(sys.executable, built["model"], tmp_path / "prebuilt.npy",
                            _env(tmp_path / "a", MIXRT_PREBUILT_DIR=str(built["prebuilt"])))
    assert on_prebuilt["first"] and on_prebuilt["children"] == 0, on_prebuilt
    assert not on_prebuilt["registries"] and not on_prebuilt["scipy_linalg"], on_prebuilt
    # nothing was compiled into the user's cache: no numba entry was written; nor did the
    # run leave anything in the prebuilt folder (an installed package's)
    assert not list((tmp_path / "a" / "numba").rglob("*.nbc"))
    assert not list(built["prebuilt"].rglob("*.lock"))
    numpy_tier = run_model(sys.executable, built["model"], tmp_path / "numpy.npy",
                           _env(tmp_path / "b", MIXRT_JIT="0"))
    assert numpy_tier["states"] == ["one tier"]
    np.testing.assert_allclose(np.load(tmp_path / "prebuilt.npy"),
                               np.load(tmp_path / "numpy.npy"), rtol=1e-5, atol=1e-5)


@needs_level
def test_an_entry_that_kills_its_build_process_is_skipped_and_the_rest_built(built, tmp_path):
    """LLVM aborts its process on code the level cannot hold (AVX-512 VNNI's intrinsic for
    x86-64-v4), where Python cannot catch it: the part starts again past that entry, which
    is reported, and the level holds the others."""
    (tmp_path / "crashing_kernel.py").write_text(
        "import os\n\nclass _Dies:\n    def compile(self, types):\n        os.abort()\n\n"
        "dies = _Dies()\n")
    entries = json.loads(built["kernels"].read_text())["kernels"]
    dies = {"module": "crashing_kernel", "qualname": "dies", "args": []}
    kernels = tmp_path / "kernels.json"
    kernels.write_text(json.dumps({"kernels": [dies, *entries, dies]}))
    env = _env(tmp_path / "build", PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-m", "mixrt.ops.compiled._prebuild", "--into",
                           str(tmp_path / "prebuilt"), "--levels", LEVEL, "--kernels",
                           str(kernels), "--jobs", "1"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("crashing_kernel.dies: its process died compiling it") == 2
    manifest = json.loads((tmp_path / "prebuilt" / LEVEL / prebuilt.MANIFEST).read_text())
    assert manifest["entries"] == json.loads((built["prebuilt"] / LEVEL /
                                              prebuilt.MANIFEST).read_text())["entries"]


@needs_level
def test_a_kernel_missing_from_the_list_is_compiled_by_the_child(built, tmp_path):
    """A list without the layer norm: the first run answers on NumPy, the child compiles
    the layer norm alone, and the compiled tier comes in."""
    entries = json.loads(built["kernels"].read_text())["kernels"]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"kernels": [e for e in entries
                                               if e["qualname"] != "layer_norm"]}))
    subprocess.run([sys.executable, "-m", "mixrt.ops.compiled._prebuild", "--into",
                    str(tmp_path / "prebuilt"), "--levels", LEVEL, "--kernels", str(partial)],
                   env=_env(tmp_path / "build"), check=True, capture_output=True, timeout=600)
    result = run_model(sys.executable, built["model"], tmp_path / "y.npy",
                       _env(tmp_path / "a", MIXRT_PREBUILT_DIR=str(tmp_path / "prebuilt")))
    assert not result["first"] and result["children"] == 1, result
    assert result["states"] == ["pending"]
    compiled = {".".join(p.name.split(".")[:2]) for p in
                (tmp_path / "a" / "numba").rglob("*.nbc")}
    assert compiled and all(name.startswith("_jit_row_reductions.layer_norm")
                            for name in compiled), compiled


@needs_level
def test_a_level_built_by_another_numba_is_not_used(built, tmp_path, monkeypatch):
    copy = tmp_path / "prebuilt" / LEVEL
    copy.mkdir(parents=True)
    manifest = json.loads((built["prebuilt"] / LEVEL / prebuilt.MANIFEST).read_text())
    (copy / prebuilt.MANIFEST).write_text(json.dumps(dict(manifest, numba="0.1.0")))
    monkeypatch.setenv("MIXRT_PREBUILT_DIR", str(tmp_path / "prebuilt"))
    prebuilt.chosen.cache_clear()
    try:
        assert prebuilt.chosen() is None
        (copy / prebuilt.MANIFEST).write_text(json.dumps(manifest))
        prebuilt.chosen.cache_clear()
        assert prebuilt.chosen() == (copy, tuple(manifest["target"]))
    finally:
        monkeypatch.delenv("MIXRT_PREBUILT_DIR")
        prebuilt.chosen.cache_clear()


def test_the_level_is_the_cpus_best_and_only_that(monkeypatch):
    avx512 = dict.fromkeys(prebuilt.LEVELS["x86-64-v4"] + prebuilt.LEVELS["x86-64-v3"], True)
    monkeypatch.setattr(prebuilt, "_host_features", lambda: avx512)
    assert prebuilt.host_level() == "x86-64-v4"
    avx2 = dict.fromkeys(prebuilt.LEVELS["x86-64-v3"], True)
    monkeypatch.setattr(prebuilt, "_host_features", lambda: avx2)
    assert prebuilt.host_level() == "x86-64-v3"
    # AVX-512F without the rest of v4: the kernels pick 64-byte forms, v3's code has 32-byte
    # ones, so neither level fits
    monkeypatch.setattr(prebuilt, "_host_features", lambda: dict(avx2, avx512f=True))
    assert prebuilt.host_level() is None
    monkeypatch.setattr(prebuilt, "_host_features", lambda: {"sse4.2": True})
    assert prebuilt.host_level() is None
    # numba told a level's CPU: that level, where this CPU runs it (the forms follow too)
    monkeypatch.setenv("NUMBA_CPU_NAME", "x86-64-v3")
    monkeypatch.setattr(prebuilt, "_host_features", lambda: avx512)
    assert prebuilt.host_level() == "x86-64-v3"
    monkeypatch.setenv("NUMBA_CPU_NAME", "x86-64-v4")
    monkeypatch.setattr(prebuilt, "_host_features", lambda: avx2)
    assert prebuilt.host_level() is None


def test_an_addition_is_loaded_after_its_level_where_the_cpu_has_its_features(tmp_path,
                                                                              monkeypatch):
    """The VNNI addition: only beside x86-64-v4, only on a CPU with VNNI, not where numba is
    told a CPU without it, not when built by another numba; and only entries marked for it
    are built into it."""
    def manifest(level, numba=None):
        folder = tmp_path / level
        folder.mkdir(exist_ok=True)
        target = ["x86_64-unknown-linux-gnu", *prebuilt.build_target(level)]
        (folder / prebuilt.MANIFEST).write_text(json.dumps(
            {"level": level, "target": target, "numba": numba or prebuilt._numba_version(),
             "python": prebuilt._python_tag()}))
    for level in ("x86-64-v4", "x86-64-v3", "x86-64-v4-vnni"):
        manifest(level)
    v4 = dict.fromkeys(prebuilt.LEVELS["x86-64-v4"] + prebuilt.LEVELS["x86-64-v3"], True)
    monkeypatch.setenv("MIXRT_PREBUILT_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CPU_NAME", raising=False)
    monkeypatch.delenv("MIXRT_PREBUILT", raising=False)

    def seen(features, **env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(prebuilt, "_host_features", lambda: features)
        prebuilt.chosen.cache_clear()
        prebuilt.additions.cache_clear()
        try:
            return prebuilt.level_name()
        finally:
            for name in env:
                monkeypatch.delenv(name)
    try:
        assert seen(dict(v4, avx512vnni=True)) == "x86-64-v4 + x86-64-v4-vnni"
        assert seen(v4) == "x86-64-v4"
        assert seen(dict.fromkeys(prebuilt.LEVELS["x86-64-v3"], True)) == "x86-64-v3"
        assert seen(dict(v4, avx512vnni=True), NUMBA_CPU_NAME="x86-64-v4",
                    NUMBA_CPU_FEATURES="") == "x86-64-v4"
        assert seen(dict(v4, avx512vnni=True), NUMBA_CPU_NAME="x86-64-v4",
                    NUMBA_CPU_FEATURES="+avx512vnni") == "x86-64-v4 + x86-64-v4-vnni"
        # told a CPU without features, numba compiles with the host's: VNNI included
        assert seen(dict(v4, avx512vnni=True),
                    NUMBA_CPU_NAME="x86-64-v4") == "x86-64-v4 + x86-64-v4-vnni"
        manifest("x86-64-v4-vnni", numba="0.0.1")
        assert seen(dict(v4, avx512vnni=True)) == "x86-64-v4"
    finally:
        prebuilt.chosen.cache_clear()
        prebuilt.additions.cache_clear()
    assert prebuilt.build_target("x86-64-v4-vnni") == ("x86-64-v4", "+avx512vnni")
    int8 = {"module": "mixrt.ops.quant._jit_int8", "levels": ["x86-64-v4-vnni"]}
    plain, v4_only = {"module": "m"}, {"module": "m", "levels": ["x86-64-v4"]}
    assert [prebuilt.builds_entry("x86-64-v4-vnni", e) for e in (int8, plain, v4_only)] == \
        [True, False, False]
    assert [prebuilt.builds_entry("x86-64-v4", e) for e in (int8, plain, v4_only)] == \
        [False, True, True]


def test_code_needing_a_feature_waits_for_a_told_cpu_that_states_it(monkeypatch):
    """The VNNI products (ops/quant/int8_cpu.available) and the VNNI addition ask this."""
    for told, features, expected in ((None, None, True), ("x86-64-v3", "", False),
                                     ("x86-64-v4", "+avx512vnni", True),
                                     ("x86-64-v4", "+avx512vnnix", False),
                                     ("x86-64-v4", None, True)):
        for name, value in (("NUMBA_CPU_NAME", told), ("NUMBA_CPU_FEATURES", features)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        assert prebuilt.told_features_have(("avx512vnni",)) is expected, (told, features)


def test_loading_only_refuses_to_compile_and_names_the_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXRT_CACHE_DIR", str(tmp_path))
    from mixrt.ops.compiled.generated import kernel  # noqa: PLC0415
    source = ("from numba import njit\n\n@njit(cache=True)\n"
              f"def run(x):\n    return x * {np.random.default_rng().integers(1 << 30)} + 1\n")
    run = kernel(source, prefix="mixrt_test_guard")
    with jit_tier.loading_only() as misses:
        with pytest.raises(jit_tier.CompileForbidden):
            run(np.ones(3))
    assert len(misses) == 1 and "run" in misses[0]
    assert run(np.ones(3)).shape == (3,)  # outside the guard it compiles as ever


@pytest.mark.parametrize("text", ["float32", "int64", "bool",
                                  ["array", "float32", 2, "C", False, True],
                                  ["array", "float64", 1, "A", True, False],
                                  ["unituple", "int64", 3],
                                  ["tuple", ["int64", ["array", "uint8", 3, "F", False, True]]],
                                  ["cpointer", "float32"]])
def test_recorded_types_round_trip(text):
    assert recorded_kernels.encode(recorded_kernels.decode(text)) == text


def test_kernel_file_stamps_follow_contents_not_times(tmp_path):
    from mixrt.ops.compiled import jit_cache  # noqa: PLC0415
    before = jit_cache.kernel_files_stamp()
    path = next(Path(jit_cache.__file__).resolve().parent.parent.glob("*/_jit*.py"))
    stat = path.stat()
    try:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert jit_cache.kernel_files_stamp() == before  # an installed copy has other mtimes
    finally:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@needs_level
@pytest.mark.xdist_group("wheel")  # wheel builds share the checkout's build/ folder
def test_the_built_wheel_runs_its_kernels_in_a_fresh_environment(built, tmp_path):
    """``python -m build`` with prebuilt kernels (for this CPU's level and the small model's
    list, to stay quick): a platform wheel holding them, installed into a new virtual
    environment, runs the model compiled from its first run with every cache empty."""
    env = dict(os.environ, MIXRT_PREBUILT_LEVELS=LEVEL,
               MIXRT_PREBUILT_KERNELS=str(built["kernels"]))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(tmp_path / "dist"), str(ROOT)], env=env, check=True,
                   capture_output=True, timeout=900)
    (wheel,) = (tmp_path / "dist").glob("mixrt-*.whl")
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert f"-{tag}-{tag}-linux_x86_64.whl" in wheel.name, wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert f"mixrt/ops/compiled/prebuilt/{LEVEL}/{prebuilt.MANIFEST}" in names
    assert not any(name.endswith(".lock") for name in names)
    # the kernels are the build's numba's: the wheel requires that release, and only it
    (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
    requires = [line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist: numba")]
    assert requires == [f"Requires-Dist: numba=={prebuilt._numba_version()}"], requires
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                    "--no-index", "--quiet", str(wheel)], check=True, capture_output=True)
    # the dependencies from this environment, after the new one's own site-packages
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    Path(site.stdout.strip(), "dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")
    result = run_model(python, built["model"], tmp_path / "y.npy", _env(tmp_path / "fresh"))
    assert result["module"].startswith(str(venv)), result
    assert result["first"] and result["children"] == 0, result
    assert not list((tmp_path / "fresh" / "numba").rglob("*.nbc"))


def test_without_prebuilt_levels_the_numpy_first_run_loads_no_llvm(tmp_path):
    """A checkout or an sdist install ships no level: choosing none must not import llvmlite
    (the NumPy tier's first run never loads numba)."""
    code = ("import sys, mixrt\nfrom mixrt.ops.compiled import prebuilt\n"
            "assert prebuilt.chosen() is None\nprint('llvmlite' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(tmp_path, MIXRT_PREBUILT_DIR=str(tmp_path / "none")),
                          timeout=120)
    assert done.returncode == 0, done.stderr[-1000:]
    assert done.stdout.strip() == "False"
