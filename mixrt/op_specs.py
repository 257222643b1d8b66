"""An operator's signature as the frontends call it: its inputs in order (which are required,
whether the last is variadic), its attributes with their defaults and how many outputs a
node has, read from the registered kernel at the opset symbols are built at (or at a given
one); and the per-op functions ``mixrt.sym`` and ``mixrt.nd`` generate from the registry.
``mixrt.sym`` builds nodes with them and ``mixrt.dispatch`` runs NDArray calls with them.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

import onnx.defs

from mixrt.base.errors import GraphError
import mixrt.ops  # noqa: F401  (registers every kernel)
from mixrt.ops.ir.registry import REGISTRY, Kernel

OPSET = 21  # the default-domain opset symbols are built at


@dataclass(frozen=True)
class OpSpec:
    """What a generated function needs to know about one op at the opset symbols use."""

    domain: str
    op_type: str
    opset: int
    inputs: tuple[str, ...]  # input names in order (the variadic one last, if any)
    required: int  # how many leading inputs are required
    variadic: bool
    attributes: dict  # name -> default
    any_attribute: bool
    default_outputs: int | None  # None: variadic, the caller must say
    kernel: Kernel


def spec_of(domain: str, op_type: str, opset: int | None = None) -> OpSpec:
    """The op as symbols build it, or as a node of ``opset`` runs it (a gradient graph
    replayed by autograd's create_graph writes default-domain ops at opset 17)."""
    kernel = _kernel_for_symbols(domain, op_type) if opset is None else \
        REGISTRY.lookup(domain, op_type, opset)
    params = list(inspect.signature(kernel.fn).parameters.values())[1:]  # drop xp
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                  p.VAR_POSITIONAL)]
    variadic = bool(positional) and positional[-1].kind is inspect.Parameter.VAR_POSITIONAL
    required = sum(1 for p in positional if p.default is p.empty and
                   p.kind is not p.VAR_POSITIONAL)
    attributes = {p.name: (None if p.default is p.empty else p.default) for p in params
                  if p.kind is p.KEYWORD_ONLY and not p.name.startswith("_")
                  and p.name != "out"}
    at = _opset_for(kernel) if opset is None else opset
    return OpSpec(kernel.domain, op_type, at, tuple(p.name for p in positional),
                  required, variadic, attributes, kernel.accepts_any_attribute,
                  _schema_outputs(kernel.domain, op_type, at), kernel)


def _kernel_for_symbols(domain: str, op_type: str) -> Kernel:
    versions = REGISTRY.versions(domain, op_type)
    if not versions:
        raise GraphError(f"no operator {domain or 'ai.onnx'}::{op_type} is registered")
    if domain:
        return versions[-1]
    return REGISTRY.find(domain, op_type, OPSET) or versions[0]


def _opset_for(kernel: Kernel) -> int:
    return max(OPSET, kernel.since) if not kernel.domain else kernel.since


def _schema_outputs(domain: str, op_type: str, opset: int) -> int | None:
    """The outputs a node has unless asked for more: the required ones (all of them when
    every output is optional, as for LSTM); None when the last is variadic (Split)."""
    schema = schema_of(domain, op_type, opset)
    if schema is None:
        return 1
    options = [o.option for o in schema.outputs]
    if options and options[-1] == type(options[-1]).Variadic:
        return None
    required = sum(1 for o in options if o == type(o).Single)
    return required or len(options)


def schema_of(domain: str, op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


# -- the generated functions -----------------------------------------------------------------

def docstring(spec: OpSpec) -> str:
    qualified = f"{spec.domain or 'ai.onnx'}::{spec.op_type}"
    lines = [f"{qualified} (built at opset {spec.opset}; mixrt kernel "
             f"{spec.kernel.version_range()})."]
    summary = _summary(spec)
    if summary:
        lines += ["", summary]
    shown = [name if i < spec.required else f"{name}=None" for i, name in
             enumerate(spec.inputs)]
    if spec.variadic:
        shown[-1] = f"*{spec.inputs[-1]}"
    lines += ["", f"Inputs: {', '.join(shown) or '(none)'}"]
    if spec.attributes:
        lines.append("Attributes: " + ", ".join(f"{k}={v!r}" for k, v in
                                                spec.attributes.items()))
    outputs = "variadic (pass num_outputs=)" if spec.default_outputs is None else str(
        spec.default_outputs)
    lines += [f"Outputs: {outputs}", "",
              "Also takes name= and num_outputs=; a required input left out becomes a "
              "Variable named <name>_<input>."]
    return "\n".join(lines)


def _summary(spec: OpSpec) -> str:
    """The first paragraph of the ONNX schema's documentation (what the op means), then the
    kernel's own docstring (how mixrt computes it; all there is for mixrt-domain ops)."""
    schema = schema_of(spec.domain, spec.op_type, spec.opset)
    meaning = (schema.doc or "").strip().split("\n\n")[0].strip() if schema else ""
    own = inspect.getdoc(spec.kernel.fn) or ""
    if meaning and own:
        return f"{meaning}\n\nmixrt: {own}"
    return meaning or own


def generate(make) -> dict[str, dict[str, object]]:
    """{domain: {op_type: function}} for every registered op, ``make(domain, op_type)``
    making each: ``mixrt.sym.ops.make_function`` builds symbols, ``mixrt.dispatch``'s runs
    NDArrays."""
    functions: dict[str, dict[str, object]] = defaultdict(dict)
    for domain, op_type in REGISTRY.op_names():
        functions[domain][op_type] = make(domain, op_type)
    return dict(functions)


NAMESPACES = {"ai.onnx.ml": "ml", "mixrt": "mixrt", "ai.onnx.preview.training":
              "preview_training", "ai.onnx.preview": "preview"}


def install(module_globals: dict, functions: dict) -> list[str]:
    """Put the default domain's functions at the top level of a module and every other
    domain's under a namespace (``ml``, ``mixrt``, ...); returns the names added."""
    names = []
    for domain, by_op in functions.items():
        if domain == "":
            module_globals.update(by_op)
            names.extend(by_op)
        else:
            namespace = NAMESPACES.get(domain, domain.replace(".", "_"))
            module_globals[namespace] = SimpleNamespace(**by_op)
            names.append(namespace)
    return names
