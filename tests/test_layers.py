"""Imports run one way (docs/architecture.md, "Which way imports go" and "The frontends'
floors"), read from the source with the ast module: every ``import`` of a mixrt module, at
module level or inside a function, and every ``importlib.import_module("mixrt...")``, goes to
the importer's own layer or a lower one, and no module reaches itself again through imports.
Inside ``mixrt/`` the frontends stand on floors of their own (``FRONTEND_FLOORS``), so an
upward import between them fails here as one between the runtime and the operators does. An
import of a mixrt module inside a function is there only to put off a heavy dependency: each
is listed here with the dependency it defers, and the few still to move to module level are
listed apart, so that fixing one means taking it off the list and nothing new joins it. An
import by a name computed as the program runs is listed too, with why. And no module is
over 600 lines."""

import ast
import functools
import json
import subprocess
import sys
from collections import defaultdict, deque
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("layers")  # one worker parses the source (edges())

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"mixrt": "mixrt", "base": "mixrt.base", "runtime": "mixrt.runtime", "ops": "mixrt.ops",
            "kvstore": "mixrt.kvstore", "importers": "mixrt.importers",
            "exporters": "mixrt.exporters", "models": "mixrt.models"}
# the applications on top of everything: the command and the jobs it runs
APPLICATIONS = {"mixrt.cli", "mixrt.cli_graph", "mixrt.cli_inputs", "mixrt.cli_session",
                "mixrt.__main__", "mixrt.main_job", "mixrt.demo"}
# the frontends' floors (``mixrt/`` below the applications), lowest first; each names modules
# and packages (a package: every module in it). docs/architecture.md, "The frontends'
# floors", gives the reason for each step
FRONTEND_FLOORS = [
    # what every frontend shares and that computes nothing on arrays itself: devices, names,
    # errors, op signatures, the layers written once, initializers, metrics, the random
    # streams, the profiler; ``mixrt`` is the package's own __init__, whose eager imports
    # are these (its other names load lazily, see COMPUTED_IMPORTS)
    ("frontend ground", {
        "mixrt", "mixrt.errors", "mixrt.context", "mixrt.name", "mixrt.attribute",
        "mixrt.util", "mixrt.op_specs", "mixrt.array_methods", "mixrt.layers",
        "mixrt.output_losses", "mixrt.sampling", "mixrt.random_streams",
        "mixrt.initializer_base", "mixrt.initializer", "mixrt.metric_base",
        "mixrt.metric_values", "mixrt.metric", "mixrt.io_base", "mixrt.kv_base",
        "mixrt.profiler_objects", "mixrt.profiler", "mixrt.progress", "mixrt.engine",
        "mixrt.backend", "mixrt.numpy", "mixrt.lr_scheduler", "mixrt.registry"}),
    # one imperative op call: check, run the kernel, wrap the outputs
    ("dispatch", {"mixrt.dispatch"}),
    # the recording the dispatcher feeds, and the backward walk over it
    ("tape", {"mixrt.tape"}),
    # the array frontend: NDArray, its operator functions, custom operators and optimizer
    # steps as ops, and MXNet's modules that compute on arrays alone
    ("nd", {"mixrt.nd", "mixrt.operator", "mixrt.optimizer_ops", "mixrt.random",
            "mixrt.image", "mixrt.init", "mixrt.io_ndarray", "mixrt.monitor"}),
    # the symbol frontend, built on nd (its executor hands back NDArrays)
    ("sym", {"mixrt.sym", "mixrt.viz"}),
    # MXNet's autograd module, over the tape and both frontends (get_symbol)
    ("autograd", {"mixrt.autograd", "mixrt.contrib"}),
    # what a training loop uses beside the model: optimizers, data, kvstore, callbacks,
    # the legacy symbolic rnn cells, the test helpers
    ("training", {"mixrt.optimizers", "mixrt.optimizer", "mixrt.io", "mixrt.kv",
                  "mixrt.model", "mixrt.callback", "mixrt.rnn", "mixrt.test_utils"}),
    ("gluon", {"mixrt.gluon", "mixrt.checkpoints"}),
    # mixrt's Module trains through gluon's Parameter and Trainer
    ("module", {"mixrt.module"}),
    # the model server (a frontend over the runtime, started by the command)
    ("serving", {"mixrt.serve"}),
]
# lowest first; a module may import its own layer and those below it
LAYERS = ["ground", "ops base", "kernel machinery", "operator families", "runtime",
          "importers, exporters, kvstore",
          *[f"frontends: {floor}" for floor, _ in FRONTEND_FLOORS], "models", "applications"]
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
    ("mixrt.cli_graph", "mixrt.exporters.coverage"): "onnx",  # and onnxruntime, when it validates
    ("mixrt.cli_graph", "mixrt.exporters.onnx"): "onnx",
    ("mixrt.cli", "mixrt.kvstore.launch"): "zmq",  # pyzmq
    ("mixrt.cli", "mixrt.serve.server"): "uvicorn",
    # KServe, imported by the supervisor once the metrics' folder is set, before the fork
    ("mixrt.serve.server", "mixrt.serve.grpc_service"): "kserve",
    ("mixrt.serve.server", "mixrt.serve.model"): "kserve",
    ("mixrt.serve.server", "mixrt.serve.rest"): "kserve",
    # KServe's model class under its short name, mixrt.serve.MixrtModel
    ("mixrt.serve", "mixrt.serve.model"): "kserve",
    ("mixrt.demo", "mixrt.models.zoo"): "onnx",
    # the parameter server's ZeroMQ side, only for a dist_* store
    ("mixrt.kvstore", "mixrt.kvstore.dist"): "zmq",
    ("mixrt.kvstore", "mixrt.kvstore.dist.worker"): "zmq",
    # the zoo's symbols: mixrt.sym and the frontends under it, only for a model that needs them
    ("mixrt.models", "mixrt.models.lenet"): "onnx",
    ("mixrt.models", "mixrt.models.mlp"): "onnx",
    ("mixrt.models", "mixrt.models.resnet"): "onnx",
    ("mixrt.models", "mixrt.models.transformer"): "onnx",
    # the panel kernels, compiled on first use
    ("mixrt.ops.compiled.jit_cpu", "mixrt.ops.panels._jit_panels"): "numba",
    # the grouped convolution's compiled parts
    ("mixrt.ops.conv.grouped_cpu", "mixrt.ops.conv._grouped_parts"): "numba",
    # the .mxr reader and writer: the FlatBuffers runtime, only when a .mxr is read or written
    ("mixrt.runtime.format", "mixrt.runtime.format.reader"): "flatbuffers",
    ("mixrt.runtime.format", "mixrt.runtime.format.writer"): "flatbuffers",
}
# imports inside functions that defer nothing heavy and are to move to module level (the
# imported module is loaded by ``import mixrt`` already): where each is
NOT_YET_AT_MODULE_LEVEL: dict = {}
# the modules that import by a name computed as the program runs (``import_module(name)``),
# which this test cannot follow: why each does, and which way it reaches. A new one must
# join the list, so that nobody hides an upward import behind a computed name
COMPUTED_IMPORTS = {
    # PEP 562 lazy attributes of a package face: its own submodules, loaded on first use so
    # that ``import mixrt`` (``import mixrt.gluon``) stays light
    "mixrt": "mixrt.<name> and MXNet's synonyms, downward and sideways only",
    "mixrt.gluon": "mixrt.gluon.<nn, rnn, loss, data, ...>, its own submodules",
    "mixrt.contrib": "mixrt.nd.contrib and mixrt.sym.contrib, floors below",
    # the operator families, found by walking ops/ as a plugin loader does
    "mixrt.ops": "mixrt.ops.<family>.<module>, the families above the registry",
    # compiled kernels: each family's numba module, loaded by the name its kernel records
    "mixrt.ops.compiled.jit_cpu": "a family's _jit_* module, on first use",
    "mixrt.ops.compiled._prebuild": "the _jit_* modules it compiles ahead of time",
    "mixrt.ops.panels._jit_panels": "the panel kernels' home modules, in the same layer",
    # the optimizer definitions, one file each, found by walking the package (adding an
    # optimizer is adding its file)
    "mixrt.runtime.training.optimizers": "mixrt.runtime.training.optimizers.<optimizer>, "
                                         "its own modules",
}


def frontend_floor(module: str) -> int | None:
    """The index of ``module``'s floor in FRONTEND_FLOORS (the longest entry that names it or
    a package holding it), or None where no floor names it."""
    best, found = -1, None
    for index, (_, entries) in enumerate(FRONTEND_FLOORS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > best:
                best, found = len(entry), index
    return found


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
    floor = frontend_floor(module)
    if floor is None:
        raise KeyError(f"{module} stands on none of FRONTEND_FLOORS: add it to the floor "
                       f"whose modules it imports (tests/test_layers.py)")
    return LAYERS.index(f"frontends: {FRONTEND_FLOORS[floor][0]}")


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
    """(imported module, line, where, named by the import) for each import of a mixrt module
    and each package ``__init__`` it runs; ``where`` is "" at module level, "function", or
    "lazy attribute" inside a module's ``__getattr__`` (PEP 562: a name the module offers,
    loaded on first use; it still counts for the floors and the loops)."""
    tree = ast.parse(path.read_text())
    for node, where in _walk_with_functions(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif _named_import(node) is not None:
            names = [_named_import(node)]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("mixrt") else None
            if target is not None:
                for imported in _with_packages(target, module):
                    # (the module, the line, where, named by the import itself)
                    yield imported, node.lineno, where, imported == target


def _walk_with_functions(tree: ast.Module):
    """(node, where) for every node, breadth first as ``ast.walk``: where is "lazy attribute"
    or "function" by the innermost function holding the node (its own node included), ""
    at module level. One walk: the suite collects this file on each worker."""
    queue = deque([(tree, "")])
    while queue:
        node, around = queue.popleft()
        yield node, around
        for child in ast.iter_child_nodes(node):
            inside = around
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside = ("lazy attribute" if child.name == "__getattr__" and child in tree.body
                          else "function")
            queue.append((child, inside))


def _import_call(node) -> bool:
    """``importlib.import_module(...)`` or ``__import__(...)``, however it is spelled."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    function = node.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
    return name in ("import_module", "__import__")


def _named_import(node) -> str | None:
    """The module an import call names by a constant string (``import_module("mixrt.x")``)."""
    if _import_call(node) and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _computes_an_import_name(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(_import_call(node) and not isinstance(node.args[0], ast.Constant)
               and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__")
               for node in ast.walk(tree))


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


@functools.cache
def edges() -> list[tuple]:
    """(module, imported, line, where, named) for every import in the source: parsed where a
    test first asks, not as the file is collected (on every xdist worker, ~6 s each); the
    file's tests are one xdist group, so one worker parses."""
    return [(module, *found) for module, path in MODULES.items()
            for found in _imports(module, path)]


def test_every_frontend_module_stands_on_a_floor():
    lost = sorted(module for module in MODULES if module.startswith("mixrt.")
                  and module not in APPLICATIONS and layer_of_known(module) is None)
    assert not lost, f"modules on no floor (add each to FRONTEND_FLOORS): {lost}"


def layer_of_known(module: str) -> int | None:
    try:
        return layer_of(module)
    except KeyError:
        return None


def test_every_import_goes_to_the_same_layer_or_a_lower_one():
    against = [f"{module}:{line} imports {target} ({LAYERS[layer_of(module)]} -> "
               f"{LAYERS[layer_of(target)]})"
               for module, target, line, _, _ in edges() if layer_of(target) > layer_of(module)]
    assert not against, "\n".join(against)


def test_the_runtime_never_imports_importers_or_exporters():
    against = [f"{module}:{line} imports {target}" for module, target, line, _, _ in edges()
               if module.startswith("mixrt.runtime.")
               and target.startswith(("mixrt.importers", "mixrt.exporters", "mixrt.kvstore"))]
    assert not against, "\n".join(against)


def _loops() -> list[set[str]]:
    """The strongly connected groups of two or more modules (Tarjan), function-level
    imports included: an import deferred into a function still ties the two modules."""
    graph = defaultdict(set)
    for module, target, _, _, _ in edges():
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
    """Every import inside a function is listed; a lazy attribute (a module's
    ``__getattr__``) needs listing only where it defers a heavy dependency, as
    ``mixrt.serve.MixrtModel`` defers KServe."""
    found, lazy = defaultdict(list), set()
    for module, target, line, where, named in edges():
        if where == "function" and named:
            found[module, target].append(f"{module}:{line} imports {target}")
        elif where == "lazy attribute" and named:
            lazy.add((module, target))
    listed = {**DEFERRED, **NOT_YET_AT_MODULE_LEVEL}
    assert not DEFERRED.keys() & NOT_YET_AT_MODULE_LEVEL.keys()
    new = [where for pair in found if pair not in listed for where in found[pair]]
    assert not new, ("imports of mixrt modules inside functions that are not listed: move "
                     "them to module level, or, when one defers a heavy dependency on "
                     "purpose, add it to DEFERRED with what it defers:\n" + "\n".join(new))
    gone = [f"{module} -> {target}" for module, target in listed
            if (module, target) not in found and (module, target) not in lazy]
    assert not gone, "listed, but no longer imported inside a function:\n" + "\n".join(gone)


def test_imports_by_computed_names_are_the_listed_ones():
    found = {module for module, path in MODULES.items() if _computes_an_import_name(path)}
    new = sorted(found - COMPUTED_IMPORTS.keys())
    assert not new, (f"modules that import by a computed name, not listed in "
                     f"COMPUTED_IMPORTS (import by a literal name, or list it with why): {new}")
    gone = sorted(COMPUTED_IMPORTS.keys() - found)
    assert not gone, f"listed in COMPUTED_IMPORTS, but no longer importing so: {gone}"


# generated code, whose length is the schema's
LONG_BY_NATURE = {"mixrt.runtime.format.mixrt_generated"}
MOST_LINES = 600


def test_no_module_is_over_600_lines():
    long = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()
            if module not in LONG_BY_NATURE}
    over = sorted(f"{module}: {lines}" for module, lines in long.items() if lines > MOST_LINES)
    assert not over, f"modules over {MOST_LINES} lines (split each along what it computes): " \
        f"{over}"


# One fresh interpreter imports ``mixrt`` (which every module below imports first anyway),
# then forks a child per module, which imports it and reports which heavy names are loaded:
# the sets a fresh interpreter per module finds, without each one's ~0.7 s of interpreter
# and package start (the test took ~34 s of a worker on 2 cores that way)
_FORKED_IMPORTS = """
import importlib, json, os, sys
heavy, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def loaded():
    return sorted(n for n in heavy if n in sys.modules)
importlib.import_module("mixrt")
found = {"mixrt": loaded()}
for module in modules:
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            answer = loaded()
        except BaseException as error:
            answer = {"error": repr(error)}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[module] = json.loads(pipe.read() or '{"error": "no answer"}')
    os.wait()
print(json.dumps(found))
"""


def _loaded(modules: list[str], names: set[str]) -> dict[str, set[str]]:
    """Which of ``names`` (top-level modules) importing each of ``modules`` loads, directly or
    through its imports, as in a fresh interpreter (``mixrt`` imported first: see above)."""
    # -P: the working directory's folders are not put on the path (the installed mixrt is)
    done = subprocess.run([sys.executable, "-P", "-c", _FORKED_IMPORTS,
                           json.dumps(sorted(names)), json.dumps(modules)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the imports failed:\n{done.stderr}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {module: answer["error"] for module, answer in found.items()
              if isinstance(answer, dict)}
    assert not failed, f"imports failed: {failed}"
    return {module: set(answer) for module, answer in found.items()}


def test_each_listed_import_defers_the_dependency_it_names():
    """The imported module loads the dependency and the importing module does not: an
    import that defers nothing does not belong on DEFERRED."""
    heavy = set(DEFERRED.values())
    modules = sorted({module for pair in DEFERRED for module in pair})
    loads = _loaded(modules, heavy)
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
    assert layer_of("mixrt.errors") > layer_of("mixrt.kvstore.local")
    # the frontends' floors, in the order docs/architecture.md draws them
    assert layer_of("mixrt.errors") < layer_of("mixrt.dispatch") \
        < layer_of("mixrt.tape.nodes") < layer_of("mixrt.nd.ndarray") \
        < layer_of("mixrt.sym.symbol") < layer_of("mixrt.autograd") \
        < layer_of("mixrt.optimizers.sgd") < layer_of("mixrt.gluon.block") \
        < layer_of("mixrt.module.module") < layer_of("mixrt.serve.server") \
        < layer_of("mixrt.models.resnet")
    assert len(MODULES) > 250 and len(edges()) > 1000  # the walk found the source
