"""Imports run one way (docs/architecture.md, "Which way imports go"), read from the source
with the ast module: every ``import`` of a mixrt module, at module level or inside a
function, goes to the importer's own layer or a lower one, and no module reaches itself
again through imports. An import of a mixrt module inside a function is there only to
put off a heavy dependency: each is listed here with the dependency it defers, and the few
still to move to module level are listed apart, so that fixing one means taking it off the
list and nothing new joins it."""

import ast
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
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
# the imports of mixrt modules made inside functions, each (importing module, imported
# module): the heavy dependency it defers, named as Python imports it. Each defers it on
# purpose, so that ``import mixrt``, ``mixrt --version`` and ``mixrt --help`` do not load
# it; the test checks that the imported module loads it and the importing one does not
DEFERRED = {
    # the ONNX loader, registered by ``import mixrt``, needs protobuf only when a model is
    # loaded (and onnx itself only for a node its kernels lack, whose schema body it expands)
    ("mixrt", "mixrt.importers.onnx"): "google.protobuf",
    ("mixrt", "mixrt.importers.proto"): "google.protobuf",
    # the CLI's subcommands: only the one run loads what it needs
    ("mixrt.cli", "mixrt.main_job"): "onnx",  # and the training frontends
    ("mixrt.cli", "mixrt.exporters.coverage"): "onnx",  # and onnxruntime, when it validates
    ("mixrt.cli", "mixrt.exporters.onnx"): "onnx",
    ("mixrt.cli", "mixrt.kvstore.launch"): "zmq",  # pyzmq
    ("mixrt.cli", "mixrt.serve.server"): "mlserver",
    # MLServer's runtime class under its short name, mixrt.serve.MixrtRuntime
    ("mixrt.serve", "mixrt.serve.runtime"): "mlserver",
    ("mixrt.demo", "mixrt.models.zoo"): "onnx",
    # the parameter server's ZeroMQ side, only for a dist_* store
    ("mixrt.kvstore", "mixrt.kvstore.dist"): "zmq",
    ("mixrt.kvstore", "mixrt.kvstore.dist.worker"): "zmq",
    # the zoo's symbols: mixrt.sym and the frontends under it, only for a model that needs them
    ("mixrt.models", "mixrt.models.lenet"): "onnx",
    ("mixrt.models", "mixrt.models.mlp"): "onnx",
    ("mixrt.models", "mixrt.models.resnet"): "onnx",
    ("mixrt.models", "mixrt.models.transformer"): "onnx",
    # the grouped convolution's compiled parts
    ("mixrt.ops.conv.grouped_cpu", "mixrt.ops.conv._grouped_parts"): "numba",
    # the .mxr reader and writer: the FlatBuffers runtime, only when a .mxr is read or written
    ("mixrt.runtime.format", "mixrt.runtime.format.reader"): "flatbuffers",
    ("mixrt.runtime.format", "mixrt.runtime.format.writer"): "flatbuffers",
}
# imports inside functions that defer nothing heavy and are to move to module level (the
# imported module is loaded by ``import mixrt`` already): where each is
NOT_YET_AT_MODULE_LEVEL: dict = {}


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


def test_imports_inside_functions_are_the_listed_ones():
    found = defaultdict(list)
    for module, target, line, inside, named in EDGES:
        if inside and named:
            found[module, target].append(f"{module}:{line} imports {target}")
    listed = {**DEFERRED, **NOT_YET_AT_MODULE_LEVEL}
    assert not DEFERRED.keys() & NOT_YET_AT_MODULE_LEVEL.keys()
    new = [where for pair in found if pair not in listed for where in found[pair]]
    assert not new, ("imports of mixrt modules inside functions that are not listed: move "
                     "them to module level, or, when one defers a heavy dependency on "
                     "purpose, add it to DEFERRED with what it defers:\n" + "\n".join(new))
    gone = [f"{module} -> {target}" for module, target in listed if (module, target) not in found]
    assert not gone, "listed, but no longer imported inside a function:\n" + "\n".join(gone)


def _loaded(module: str, names: set[str]) -> set[str]:
    """Which of ``names`` (top-level modules) importing ``module`` loads, directly or through
    its imports, in a fresh interpreter."""
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            f"print(sorted(n for n in {sorted(names)!r} if n in sys.modules))")
    # -P: the working directory's folders are not put on the path (the installed mixrt is)
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"import {module} failed:\n{done.stderr}"
    return set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


def test_each_listed_import_defers_the_dependency_it_names():
    """The imported module loads the dependency and the importing module does not: an
    import that defers nothing does not belong on DEFERRED."""
    heavy = set(DEFERRED.values())
    modules = sorted({module for pair in DEFERRED for module in pair})
    with ThreadPoolExecutor(max_workers=2) as pool:
        loads = dict(zip(modules, pool.map(lambda m: _loaded(m, heavy), modules)))
    against = [f"{target} does not load {dependency}" for (_, target), dependency
               in DEFERRED.items() if dependency not in loads[target]]
    against += [f"{module} loads {dependency} already: importing {target} inside a function "
                f"defers nothing" for (module, target), dependency in DEFERRED.items()
                if dependency in loads[module]]
    assert not against, "\n".join(against)
    # and so ``import mixrt``, ``mixrt --version`` and ``mixrt --help`` load none of them
    assert not loads["mixrt.cli"], f"mixrt.cli loads {sorted(loads['mixrt.cli'])}"


def test_the_layers_are_told_apart_as_the_map_says():
    assert layer_of("mixrt.ops.ir.registry") < layer_of("mixrt.ops.compiled.jit_cpu") \
        < layer_of("mixrt.ops.conv.conv") < layer_of("mixrt.runtime.session") \
        < layer_of("mixrt.importers.onnx") < layer_of("mixrt.gluon.block") \
        < layer_of("mixrt.models.resnet") < layer_of("mixrt.cli")
    assert layer_of("mixrt.base.errors") == 0 and layer_of("mixrt.ops.device") == 1
    # the public name of the errors is a frontend: the layers below import the ground's
    assert layer_of("mixrt.errors") == layer_of("mixrt.gluon.block")
    assert len(MODULES) > 250 and len(EDGES) > 1000  # the walk found the source
