"""The features whose library is an extra rather than a dependency (pyproject.toml's `plot`,
`kubernetes`, `image`, `validate` and `serve`), run without it: each raises a MissingDependencyError that names the
extra to install, and the command prints it as one line. The library is made missing by
``sys.modules[name] = None``, which makes its import fail as an absent package's does."""

import subprocess
import sys

import pytest

from helpers import add_model, save
from mixrt import sym, viz
from mixrt.errors import MissingDependencyError, MixrtError
from mixrt.kvstore import kubernetes
from mixrt.kvstore.launch import kubernetes_job
from mixrt.runtime.memory import plan_memory
from mixrt.runtime.plan_plot import draw_plan


def _net():
    return sym.FullyConnected(sym.Variable("data"), name="fc", num_hidden=8)


def test_the_error_is_a_mixrt_error_and_an_import_error():
    error = MissingDependencyError("x needs y: pip install 'mixrt[z]'", extra="z")
    assert isinstance(error, MixrtError) and isinstance(error, ImportError)
    assert error.extra == "z" and type(error).__module__ == "mixrt.errors"


def test_viz_draws_only_with_graphviz_and_summarises_without(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    for call, name in ((lambda: viz.plot_network(_net()), "plot_network"),
                       (lambda: viz.render(None, "net.svg"), "render")):
        with pytest.raises(MissingDependencyError) as caught:
            call()
        assert str(caught.value) == (f"mixrt.viz.{name} needs graphviz: "
                                     f"pip install 'mixrt[plot]'")
        assert caught.value.extra == "plot"
        assert isinstance(caught.value.__cause__, ImportError)
    # the layer table is text: it needs no drawing library
    assert "fc (Gemm)" in viz.print_summary(_net(), shape={"data": (4, 5)})
    capsys.readouterr()


def test_plan_png_needs_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"^mixrt plan --png needs matplotlib: "
                                                     r"pip install 'mixrt\[plot\]'$"):
        draw_plan(plan_memory([], "greedy"), tmp_path / "plan.png")
    assert not (tmp_path / "plan.png").exists()


def test_the_plan_command_says_which_extra_draws(tmp_path):
    path = save(add_model(), tmp_path / "m.onnx")
    code = ("import sys; sys.modules['matplotlib'] = None; from mixrt.cli import main; "
            "raise SystemExit(main())")
    result = subprocess.run([sys.executable, "-c", code, "plan", path, "--png",
                             str(tmp_path / "plan.png")], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "pip install 'mixrt[plot]'" in result.stderr and "Traceback" not in result.stderr


def test_kubernetes_manifests_need_pyyaml_to_be_written(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    message = (r"^mixrt launch --launcher kubernetes needs PyYAML: "
               r"pip install 'mixrt\[kubernetes\]'$")
    documents = kubernetes.manifests(["python", "t.py"], 1, 1, image="i:1", name="j")
    with pytest.raises(MissingDependencyError, match=message):
        kubernetes.as_yaml(documents)
    # printed or applied: kubectl is never started without the manifests to feed it
    for apply in (False, True):
        with pytest.raises(MissingDependencyError, match=message):
            kubernetes_job(["python", "t.py"], 1, 1, image="i:1", name="j", apply=apply,
                           environ={"PATH": "", "MIXRT_LAUNCH_KUBECTL": sys.executable})


def test_image_decoding_validation_and_serving_name_their_extras(monkeypatch, tmp_path):
    from mixrt import image  # noqa: PLC0415
    from mixrt.exporters import coverage  # noqa: PLC0415
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(MissingDependencyError, match=r"needs Pillow: pip install "
                                                     r"'mixrt\[image\]'$") as caught:
        image._pillow_image(b"\x89PNG", "mx.image.imdecode")
    assert caught.value.extra == "image"
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingDependencyError, match=r"needs onnxruntime: pip install "
                                                     r"'mixrt\[validate\]'$"):
        coverage._onnxruntime_outputs(None, None, {})
    path = save(add_model(), tmp_path / "m.onnx")
    code = ("import sys; sys.modules['uvicorn'] = None; from mixrt.cli import main; "
            "raise SystemExit(main())")
    result = subprocess.run([sys.executable, "-c", code, "serve", path], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "mixrt serve needs KServe: pip install 'mixrt[serve]'" in result.stderr
