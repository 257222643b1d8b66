"""The operator registry.

An operator is a plain function named after its ONNX op whose signature is the spec::

    @op("Gemm", since=13, dtypes=FLOATS)
    def gemm(xp, A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0): ...

    @gemm.infer
    def _(A, B, C=None, *, transA=0, transB=0, **_): ...

* ``xp`` is the array module (numpy or cupy), so one definition serves both devices.
* Inputs are positional; a missing optional input arrives as ``None``.
* Attributes are keyword-only with their ONNX defaults. A node carrying an attribute the
  function does not accept is rejected when the model is bound, not silently ignored.
* A kernel that needs to know how many outputs the node asked for declares ``_outputs``.
* The return value is one array or a tuple of arrays (one per output).

Stacking ``@op`` registers one function for several opset versions; ``since`` is the first
opset of a version and the next registered version ends it. ``dtypes`` constrains the dtype of
the first input (None accepts any). ``@fn.fast("gpu")`` registers a device-specific fast path
beside the generic kernel, never in place of it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

from mixrt.base.errors import UnsupportedOperatorError

# the domain of mixrt's own operators (fused kernels, optimizer steps, backward-only kernels)
MIXRT = "mixrt"

DEFAULT_DOMAIN = ""
_DOMAIN_ALIASES = {"ai.onnx": ""}
DEVICES = ("cpu", "gpu")
# what an op may do with memory, declared where its kernel is registered (``@op(...,
# memory=IN_PLACE)``, as onnxruntime's kernels declare Alias and MayInplace) and read by the
# planner (runtime/executor.py): its output views input 0 (for a contiguous input) ...
VIEW = "view"
# ... as input 0 reshaped (a planned run that knows the output's shape makes the view itself)
RESHAPE = "reshape"
# ... every output is a slice of input 0 (the kernel returns views)
SLICES = "slices"
# ... its output, computed elementwise from same-shaped inputs through ufuncs with ``out=``,
# may share its buffer with an input that dies at the node
IN_PLACE = "in place"
# ... its smaller output may start at input 0's offset: the kernel finishes reading each plane
# of the input before it writes the part of the output over it
SHRINKING_IN_PLACE = "shrinking in place"
VIEWS = frozenset({VIEW, RESHAPE})
MEMORY_KINDS = frozenset({VIEW, RESHAPE, SLICES, IN_PLACE, SHRINKING_IN_PLACE})
# in a node's ``_prepacked`` dict (runtime/binding.bind_graph): the positions of its inputs
# that are constants of the session (input 1, the weight, always is; a kernel that derives
# layouts from others, such as an LSTM's R and B, checks them here)
CONSTANT_INPUTS = ("constant inputs",)


def canonical_domain(domain: str | None) -> str:
    """ONNX spells the default domain both "" and "ai.onnx"; we use ""."""
    domain = domain or ""
    return _DOMAIN_ALIASES.get(domain, domain)


@dataclass
class Kernel:
    """One registered version of an operator."""

    op_type: str
    domain: str
    since: int
    fn: Callable
    dtypes: frozenset | None = None
    until: int | None = None  # last opset this version serves; None = open-ended
    infer_fn: Callable | None = None
    # the node's attributes checked when a model is loaded, whatever its shapes (see
    # OpHandle.check); None where the kernel's signature is all there is to check
    check_fn: Callable | None = None
    grad_fn: Callable | None = None
    # the forward in ops that have gradients of their own, for gradients of gradients when
    # grad_fn's backward kernel has none (see runtime/passes/autodiff.py)
    expand_fn: Callable | None = None
    fast: dict = field(default_factory=dict)  # device -> fn with the same signature
    # inputs the kernel only reads on the host (see OpHandle.reads_on_host)
    host_inputs: frozenset = frozenset()
    memory: str | None = None  # one of MEMORY_KINDS (see ``op``), None for none
    random: bool = False  # its outputs are not a function of its inputs alone

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def attribute_names(self) -> frozenset:
        return _signature_info(self.fn).attributes

    @property
    def accepts_any_attribute(self) -> bool:
        return _signature_info(self.fn).var_keyword

    def writes_into(self, device: str) -> bool:
        """Whether the device's function takes ``out=``: an array of the output's exact shape
        and dtype (a view of the memory arena) that it fills and returns."""
        return _signature_info(self.for_device(device)).takes_out

    def wants_prepacked(self, device: str) -> bool:
        """Whether the device's function keeps derived layouts of a constant weight between
        runs: it takes ``_prepacked``, a dict the session gives each such node (see
        ``runtime/binding.bind_graph``)."""
        return "_prepacked" in _signature_info(self.for_device(device)).attributes

    def wants_node_state(self, device: str) -> bool:
        """Whether the device's function keeps what its node's own calls share (a pool's
        replayed call, ``ops/compiled/replay.py``): it takes ``_node``, a dict the session gives
        each of its nodes."""
        return "_node" in _signature_info(self.for_device(device)).attributes

    @property
    def wants_output_count(self) -> bool:
        return "_outputs" in _signature_info(self.fn).attributes

    def infers_optional_input(self, index: int) -> bool:
        """Whether input ``index`` of the infer function has a default (an optional input:
        None there means absent, so a present input of unknown type must not arrive as
        None)."""
        return self.infer_fn is not None and \
            index in _signature_info(self.infer_fn).optional_inputs

    def version_range(self) -> str:
        return f"{self.since}+" if self.until is None else f"{self.since}-{self.until}"

    def supports_dtype(self, dtype_name: str | None) -> bool:
        return self.dtypes is None or dtype_name is None or dtype_name in self.dtypes

    def for_device(self, device: str) -> Callable:
        return self.fast.get(device, self.fn)


@dataclass(frozen=True)
class _SignatureInfo:
    attributes: frozenset
    var_keyword: bool
    takes_out: bool = False
    optional_inputs: frozenset = frozenset()  # positions of positional params with defaults


_SIGNATURES: dict[Callable, _SignatureInfo] = {}


def _signature_info(fn: Callable) -> _SignatureInfo:
    info = _SIGNATURES.get(fn)
    if info is None:
        params = inspect.signature(fn).parameters.values()
        keywords = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
        positional = [p for p in params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        info = _SignatureInfo(
            attributes=frozenset(keywords - {"out"}),
            var_keyword=any(p.kind is p.VAR_KEYWORD for p in params),
            takes_out="out" in keywords,
            optional_inputs=frozenset(i for i, p in enumerate(positional)
                                      if p.default is not p.empty),
        )
        _SIGNATURES[fn] = info
    return info


class OpHandle:
    """What ``@op`` returns: the kernel function, callable as before, plus decorators that
    attach shape inference, a gradient or a device fast path to every version it serves."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.kernels: list[Kernel] = []
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def infer(self, infer_fn: Callable) -> Callable:
        for kernel in self.kernels:
            kernel.infer_fn = infer_fn
        self._infer_fn = infer_fn
        return infer_fn

    def check(self, check_fn: Callable) -> Callable:
        """``check_fn(**attributes)`` raises ValueError, saying what is wrong, for attributes
        no input could make right (a regular expression RE2 refuses): the model is refused
        when it is loaded, naming the node (``runtime/passes/typecheck.py``), rather than at
        its first run, or never where inference had no shapes to show its infer function."""
        for kernel in self.kernels:
            kernel.check_fn = check_fn
        return check_fn

    def grad(self, grad_fn: Callable) -> Callable:
        for kernel in self.kernels:
            kernel.grad_fn = grad_fn
        return grad_fn

    def expansion(self, expand_fn: Callable) -> Callable:
        """``expand_fn(b, node)`` writes the node's forward with the GradBuilder ``b`` in
        ops that have gradients and returns one name per output (None for an output with no
        gradient, or None instead of the list when this node's attributes have no
        expansion). Used where a backward must itself be differentiable, and as the
        gradient of an op that has no ``grad``."""
        for kernel in self.kernels:
            kernel.expand_fn = expand_fn
        return expand_fn

    def reads_on_host(self, *indices: int) -> None:
        """Inputs the kernel only ever reads on the host (shapes, axes, pads, counts), never
        in device arithmetic. Where such an input is fixed for an input signature (an
        initializer, a Constant, shape arithmetic), a planned GPU run hands the kernel a
        host copy made once at plan time, so reading it does not wait for the device."""
        for kernel in self.kernels:
            kernel.host_inputs = frozenset(indices)

    def fast(self, device: str) -> Callable:
        if device not in DEVICES:
            raise ValueError(f"fast path device must be one of {DEVICES}, got {device!r}")

        def register(fast_fn: Callable) -> Callable:
            for kernel in self.kernels:
                kernel.fast[device] = fast_fn
            return fast_fn
        return register


class Registry:
    """Every kernel, by (domain, op_type), sorted by the opset they start at."""

    def __init__(self):
        self._ops: dict[tuple[str, str], list[Kernel]] = {}
        # (domain as a node spells it, op_type) -> (memory kind, random): what the planner
        # asks of every node of every plan, answered once
        self._properties: dict[tuple[str, str], tuple[str | None, bool]] = {}

    def forget_properties(self) -> None:
        self._properties = {}

    def properties(self, domain: str, op_type: str) -> tuple[str | None, bool]:
        """(memory kind, random) of ``op_type``'s newest version; (None, False) for an op
        with none registered."""
        key = (domain, op_type)
        found = self._properties.get(key)
        if found is None:
            versions = self._ops.get((canonical_domain(domain), op_type))
            found = (versions[-1].memory, versions[-1].random) if versions else (None, False)
            self._properties[key] = found
        return found

    def memory_of(self, domain: str, op_type: str) -> str | None:
        return self.properties(domain, op_type)[0]

    def is_random(self, domain: str, op_type: str) -> bool:
        return self.properties(domain, op_type)[1]

    def add(self, kernel: Kernel) -> None:
        versions = self._ops.setdefault((kernel.domain, kernel.op_type), [])
        if any(k.since == kernel.since for k in versions):
            raise ValueError(f"{kernel.domain or 'ai.onnx'}::{kernel.op_type} version "
                             f"{kernel.since} is registered twice")
        versions.append(kernel)
        versions.sort(key=lambda k: k.since)
        for current, following in zip(versions, versions[1:]):
            current.until = following.since - 1
        versions[-1].until = None
        self.forget_properties()

    def versions(self, domain: str, op_type: str) -> list[Kernel]:
        return list(self._ops.get((canonical_domain(domain), op_type), ()))

    def has_op(self, domain: str, op_type: str) -> bool:
        return (canonical_domain(domain), op_type) in self._ops

    def find(self, domain: str, op_type: str, opset: int) -> Kernel | None:
        """The version serving ``opset``, or None."""
        for kernel in reversed(self.versions(domain, op_type)):
            if kernel.since <= opset:
                return kernel
        return None

    def lookup(self, domain: str, op_type: str, opset: int, *, node: str | None = None,
               dtype: str | None = None, device: str | None = None) -> Kernel:
        """The kernel for a node, or an UnsupportedOperatorError that says what exists."""
        domain = canonical_domain(domain)
        versions = self.versions(domain, op_type)
        where = f"node {node!r}: " if node else ""
        qualified = f"{domain or 'ai.onnx'}::{op_type}"
        details = dict(node=node, domain=domain, op_type=op_type, opset=opset, dtype=dtype,
                       device=device)
        if not versions:
            raise UnsupportedOperatorError(
                f"{where}operator {qualified} (opset {opset}) is not implemented by mixrt",
                **details)
        kernel = self.find(domain, op_type, opset)
        if kernel is None:
            ranges = ", ".join(k.version_range() for k in versions)
            raise UnsupportedOperatorError(
                f"{where}{qualified} at opset {opset} is not implemented; implemented opset "
                f"ranges: {ranges}", **details)
        if not kernel.supports_dtype(dtype):
            raise UnsupportedOperatorError(
                f"{where}{qualified} (opset {opset}) has no kernel for dtype {dtype}; "
                f"implemented dtypes: {', '.join(sorted(kernel.dtypes))}", **details)
        return kernel

    def all_kernels(self) -> list[Kernel]:
        return [k for versions in self._ops.values() for k in versions]

    def op_names(self) -> list[tuple[str, str]]:
        return sorted(self._ops)


REGISTRY = Registry()


def op(op_type: str, since: int = 1, *, domain: str = DEFAULT_DOMAIN,
       dtypes: frozenset | None = None, memory: str | None = None,
       random: bool = False) -> Callable[[Callable], OpHandle]:
    """Register a kernel for ``op_type`` from opset ``since`` on (see the module docstring).
    ``memory``: what the kernel may do with memory (VIEW, RESHAPE, SLICES, IN_PLACE,
    SHRINKING_IN_PLACE), which every device's function of it honours and the planner reads;
    ``random``: its outputs are not a function of its inputs alone."""
    if memory is not None and memory not in MEMORY_KINDS:
        raise ValueError(f"{op_type}: memory kind {memory!r} is not one of "
                         f"{sorted(MEMORY_KINDS)}")

    def register(target) -> OpHandle:
        handle = target if isinstance(target, OpHandle) else OpHandle(target)
        kernel = Kernel(op_type=op_type, domain=canonical_domain(domain), since=since,
                        fn=handle.fn, dtypes=dtypes, memory=memory, random=random)
        if getattr(handle, "_infer_fn", None) is not None:
            kernel.infer_fn = handle._infer_fn
        REGISTRY.add(kernel)
        handle.kernels.append(kernel)
        return handle

    return register


def lookup_kernel(node, device, dtype: str | None = None) -> Kernel:
    """The kernel that runs ``node`` (a runtime Graph node) on ``device``; an
    UnsupportedOperatorError names the node and what is implemented where none does, or
    where the node carries an attribute the kernel does not take."""
    kernel = REGISTRY.lookup(node.domain, node.op_type, node.opset, node=node.label,
                             dtype=dtype, device=str(device))
    unknown = set(node.attributes) - kernel.attribute_names
    if unknown and not kernel.accepts_any_attribute:
        raise UnsupportedOperatorError(
            f"node {node.label!r}: {node.domain or 'ai.onnx'}::{node.op_type} (opset "
            f"{node.opset}) does not implement attribute(s) {sorted(unknown)}; implemented: "
            f"{sorted(a for a in kernel.attribute_names if not a.startswith('_'))}",
            node=node.label, domain=node.domain, op_type=node.op_type, opset=node.opset,
            device=str(device))
    return kernel
