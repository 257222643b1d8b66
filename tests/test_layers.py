"""Imports run one way (docs/architecture.md, "Which way imports go"), read from the source
with the ast module: every ``import`` of a mixrt module, at module level or inside a
function, goes to the importer's own layer or a lower one, and no module reaches itself
again through imports. What is still against that (an import loop among the frontends,
and imports inside functions) is listed here exactly, so that fixing one means taking it off
the list and nothing new joins it."""

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"mixrt": "mixrt", "base": "mixrt.base", "runtime": "mixrt.runtime", "ops": "mixrt.ops",
            "kvstore": "mixrt.kvstore", "importers": "mixrt.importers",
            "exporters": "mixrt.exporters", "models": "mixrt.models"}
# the applications on top of everything: the command and the jobs it runs
APPLICATIONS = {"mixrt.cli", "mixrt.__main__", "mixrt.main_job", "mixrt.demo"}
# lowest first; a module may import its own layer and those below it
LAYERS = ["ground", "ops base", "kernel machinery", "operator families", "runtime",
          "importers, exporters, kvstore", "frontends", "models", "applications"]
# imports of mixrt modules inside functions, per folder: the CLI's and the frontends' defer
# heavy subsystems on purpose; the rest are to be moved to module level
FUNCTION_LEVEL_BUDGET = {"mixrt": 48, "runtime": 5, "kvstore": 4, "models": 5,
                         "exporters": 0, "ops": 1, "importers": 0}


def layer_of(module: str) -> int:
    if module in APPLICATIONS:
        return LAYERS.index("applications")
    if module == "mixrt.base" or module.startswith("mixrt.base."):
        return LAYERS.index("ground")
    if module == "mixrt.ops":  # its __init__ imports the registry; it finds the families by
        return LAYERS.index("ops base")  # walking its folder, as a plugin loader does
    for prefixes, name in [
            (("mixrt.ops.ir", "mixrt.ops.device"), "ops base"),
            (("mixrt.ops.compiled", "mixrt.ops.panels"), "kernel machinery"),
            (("mixrt.ops",), "operator families"),
            (("mixrt.runtime",), "runtime"),
            (("mixrt.importers", "mixrt.exporters", "mixrt.kvstore"),
             "importers, exporters, kvstore"),
            (("mixrt.models",), "models")]:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return LAYERS.index(name)
    return LAYERS.index("frontends")


def _modules() -> dict[str, Path]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path):
    """(imported module, line, inside a function, named by the import) for each import of a
    mixrt module and each package ``__init__`` it runs."""
    tree = ast.parse(path.read_text())
    in_functions = {id(node) for function in ast.walk(tree)
                    if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                    for node in ast.walk(function)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("mixrt") else None
            if target is not None:
                for imported in _with_packages(target, module):
                    # (the module, the line, inside a function, named by the import itself)
                    yield imported, node.lineno, id(node) in in_functions, imported == target


def _with_packages(module: str, importer: str) -> list[str]:
    """``module`` and the packages between it and ``mixrt`` whose ``__init__`` an import of
    it from outside runs first (``mixrt.nd.dispatch`` from ``mixrt.autograd`` runs
    ``mixrt/nd/__init__.py``): a loop through a package's ``__init__`` is a loop too. A
    module inside the package finds its ``__init__`` running already, and ``mixrt`` itself
    holds every module, so those are left out."""
    parts = module.split(".")
    packages = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [p for p in packages if p in MODULES
            and not (importer == p or importer.startswith(p + "."))] + [module]


EDGES = [(module, *found) for module, path in MODULES.items()
         for found in _imports(module, path)]


def test_every_import_goes_to_the_same_layer_or_a_lower_one():
    against = [f"{module}:{line} imports {target} ({LAYERS[layer_of(module)]} -> "
               f"{LAYERS[layer_of(target)]})"
               for module, target, line, _, _ in EDGES if layer_of(target) > layer_of(module)]
    assert not against, "\n".join(against)


def test_the_runtime_never_imports_importers_or_exporters():
    against = [f"{module}:{line} imports {target}" for module, target, line, _, _ in EDGES
               if module.startswith("mixrt.runtime.")
               and target.startswith(("mixrt.importers", "mixrt.exporters", "mixrt.kvstore"))]
    assert not against, "\n".join(against)


def _loops() -> list[set[str]]:
    """The strongly connected groups of two or more modules (Tarjan), function-level
    imports included: an import deferred into a function still ties the two modules."""
    graph = defaultdict(set)
    for module, target, _, _, _ in EDGES:
        if target != module:
            graph[module].add(target)
    index, low, stack, on_stack, groups = {}, {}, [], set(), []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in list(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_reaches_itself_through_imports():
    loops = [sorted(group) for group in _loops()]
    assert not loops, f"import loops: {loops}"


def _folder_of(module: str) -> str:
    """The source folder ``module`` lives in: the one whose package is its longest prefix."""
    return max((folder for folder, package in PACKAGES.items()
                if module == package or module.startswith(package + ".")),
               key=lambda folder: len(PACKAGES[folder]))


def test_imports_inside_functions_are_the_listed_number():
    counts = defaultdict(int)
    for module, _, _, inside, named in EDGES:
        if inside and named:
            counts[_folder_of(module)] += 1
    budget = {folder: count for folder, count in FUNCTION_LEVEL_BUDGET.items() if count}
    assert dict(counts) == budget, (
        f"imports of mixrt modules inside functions, per folder: found {dict(counts)}, "
        f"listed {budget}. More: move the new one to module level (or say in the code why "
        f"it must wait); fewer: lower FUNCTION_LEVEL_BUDGET to match")


def test_the_layers_are_told_apart_as_the_map_says():
    assert layer_of("mixrt.ops.ir.registry") < layer_of("mixrt.ops.compiled.jit_cpu") \
        < layer_of("mixrt.ops.conv.conv") < layer_of("mixrt.runtime.session") \
        < layer_of("mixrt.importers.onnx") < layer_of("mixrt.gluon.block") \
        < layer_of("mixrt.models.resnet") < layer_of("mixrt.cli")
    assert layer_of("mixrt.base.errors") == 0 and layer_of("mixrt.ops.device") == 1
    # the public name of the errors is a frontend: the layers below import the ground's
    assert layer_of("mixrt.errors") == layer_of("mixrt.gluon.block")
    assert len(MODULES) > 250 and len(EDGES) > 1000  # the walk found the source
