"""docs/gradients.md lists exactly the ops that have a gradient definition."""

import importlib.util
from pathlib import Path

from mixrt.runtime.passes.autodiff import differentiable_ops

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gradient_list.py"
REGENERATE = "python tools/gradient_list.py --update"


def load_tool():
    spec = importlib.util.spec_from_file_location("gradient_list", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_lists_every_differentiable_op():
    tool = load_tool()
    listed = tool.listed_ops(tool.PAGE.read_text())
    actual = differentiable_ops()
    missing = sorted(set(actual) - set(listed))
    extra = sorted(set(listed) - set(actual))
    assert listed == actual, (
        f"{tool.PAGE.name} is out of date (missing: {missing}, no longer differentiable: "
        f"{extra}, or out of order); regenerate its list with: {REGENERATE}")


def test_render_and_parse_round_trip():
    tool = load_tool()
    ops = ["ai.onnx::Add", "mixrt::FusedConv"]
    page = f"intro\n{tool.BEGIN}\nstale\n{tool.END}\noutro\n"
    assert tool.listed_ops(tool.updated(page, ops)) == ops
