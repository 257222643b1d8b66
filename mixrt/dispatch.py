"""Running one registered op on NDArrays, right now: the imperative half of the registry.

``nd.Gemm(x, w, b, transB=1)`` and ``sym.Gemm(x, w, b, transB=1)`` take the same arguments
(both come from the kernel's signature, see ``mixrt.op_specs.spec_of``), which is what lets a
HybridBlock run the same ``hybrid_forward`` with ``F=nd`` and ``F=sym``.

One call: split the arguments into inputs and attributes (checked against the spec), check
every array is on one device (``DeviceMismatchError`` otherwise: mixrt never copies behind
your back), wait only for arrays that asynchronous engine work still writes, run the kernel
with the device's array module, wrap the outputs, and, under ``autograd.record()``, put a node
on the tape. Errors surface here, at the call that caused them, naming the op.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import onnx

from mixrt.context import Context, current_context
from mixrt.base.errors import DeviceMismatchError, ExecutionError, InputError, MixrtError
from mixrt.op_specs import spec_of
from mixrt.ops import device_checks
from mixrt.ops.ir.dtypes import to_numpy_dtype
from mixrt.runtime import profiler as _profiler
from mixrt.runtime.engine import get_engine
from mixrt.runtime.lru import frozen, LruCache

# handed in by mixrt.nd.ndarray (the array class) and mixrt.tape.recording (the tape), which
# stand above this module
NDArray = None
_tape = None


@functools.lru_cache(maxsize=None)
def op_spec(domain: str, op_type: str, opset: int | None = None):
    """The op at the opset symbols use, or at ``opset`` (the same object each time)."""
    return spec_of(domain, op_type, opset)


def invoke(domain: str, op_type: str, args, kwargs, num_outputs: int | None = None, *,
           opset: int | None = None):
    """Run ``op_type`` (at ``opset``, or the one symbols use) on ``args`` (arrays, numbers,
    None for a missing optional input) and attributes ``kwargs``; returns an NDArray, or a
    tuple for several outputs."""
    spec = op_spec(domain, op_type, opset)
    inputs, attributes = _split(spec, args, kwargs)
    ctx = _common_context(op_type, inputs)
    if ctx.device.kind == "gpu":  # the kernels and new arrays go to the inputs' GPU
        with ctx.device.active():
            return _invoke_on(spec, inputs, attributes, ctx, num_outputs)
    return _invoke_on(spec, inputs, attributes, ctx, num_outputs)


def _invoke_on(spec, inputs: list, attributes: dict, ctx, num_outputs):
    op_type = spec.op_type
    _promote_floats(spec, inputs)
    _numeric_bools(spec, inputs)
    _check_shared_dtypes(spec, inputs)
    _numeric_conditions(spec, inputs)
    _check_allowed_dtypes(spec, inputs)
    failure = _carried_failure(inputs)
    raw = [_raw_input(spec, i, value, ctx, inputs, failure is None)
           for i, value in enumerate(inputs)]
    count = _output_count(spec, attributes, num_outputs, raw)
    recording = _tape is not None and _tape.needs_tape(inputs)
    produced = count
    if recording:
        produced = _tape.forward_outputs(spec, attributes, raw, inputs, count, ctx)
    prof = _profiler.current()
    started = time.perf_counter() if prof is not None else 0.0
    results = run_kernel(spec, raw, attributes, produced, ctx)
    if prof is not None:
        prof.imperative(op_type, started, raw, results)
        prof.memory(str(ctx), sum(int(r.nbytes) for r in results[:count] if r is not None))
    outputs = [NDArray(_own(value, raw, op_type), ctx) for value in results[:count]]
    if op_type in VIEW_OPS and isinstance(inputs[0], NDArray) and \
            shares_buffer(results[0], raw[0]):
        outputs[0]._share_memory_of(inputs[0])
    if failure is not None:
        get_engine().inherit(failure, [output.engine_var() for output in outputs])
    results[:count] = [output._data for output in outputs]  # the tape keeps the owned copies
    if recording:
        _tape.record_op(spec, attributes, inputs, raw, results, outputs)
    return outputs[0] if count == 1 else tuple(outputs)


# The dict a session gives each node that asks for one (``Kernel.wants_node_state``), here
# one per op, attributes and device: the kernels keep there what they keep in a session's
# node (a varying weight's packed layouts, per thread), so that an op takes the same kernels
# imperatively as in a hybridized block's graph. They differed once (the imperative forward
# took the im2col convolution, the graph the direct one), and a thumbnail ResNet's gradients,
# through batch statistics of 32 values, then differed by 0.5% between the two.
_node_states = LruCache(4096)


def _node_state(spec, attributes: dict, device: str) -> dict:
    key = (spec.domain, spec.op_type, spec.opset, frozen(attributes), device)
    state = _node_states.get(key)
    if state is None:
        state = _node_states.put(key, {})
    return state


# The ops whose result may stay a view of their data input (MXNet's reshape is a view):
# the result is tied to the input, so an in-place write to either counts against both
VIEW_OPS = frozenset({"Reshape"})


def _own(value, raw: list, op_type: str):
    """A result that is one of the inputs, or a view of one (Identity, Transpose, Squeeze,
    a no-op Cast, ...), copied: in MXNet these results own their memory, so an in-place
    write to ``nd.BlockGrad(x)`` or ``x.T`` must not change ``x``, nor a write to ``x``
    them. The results of ``VIEW_OPS`` stay views, as MXNet's reshape is."""
    for given in raw:
        if value is given:
            return value.copy()
        if op_type not in VIEW_OPS and given is not None and shares_buffer(value, given):
            return value.copy()
    return value


def shares_buffer(a, b) -> bool:
    """Whether two NumPy/CuPy arrays are views of one allocation (the bases they hang
    from are one object)."""
    return _allocation(a) is _allocation(b)


def _allocation(array):
    while getattr(array, "base", None) is not None and hasattr(array.base, "shape"):
        array = array.base
    return array


def run_kernel(spec, raw: list, attributes: dict, count: int, ctx) -> list:
    kernel = spec.kernel
    if kernel.wants_output_count:
        attributes = dict(attributes, _outputs=count)
    if kernel.wants_node_state(ctx.device.kind):
        attributes = dict(attributes, _node=_node_state(spec, attributes, ctx.device.kind))
    try:
        if ctx.device.kind == "gpu":
            # an index op's device-side checks (ops/device_checks.py), read back now:
            # imperative code wants its error at the op that caused it
            with device_checks.collecting() as checks:
                device_checks.at_node(f"{spec.domain or 'ai.onnx'}::{spec.op_type}")
                result = kernel.for_device(ctx.device.kind)(ctx.xp, *raw, **attributes)
            checks.raise_if_failed(ctx.xp)
        else:
            result = kernel.for_device(ctx.device.kind)(ctx.xp, *raw, **attributes)
    except MixrtError:
        raise
    except Exception as exc:
        raise ExecutionError(f"{spec.domain or 'ai.onnx'}::{spec.op_type} failed on inputs "
                             f"{_describe(raw)}: {type(exc).__name__}: {exc}") from exc
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    while len(results) < count:
        results.append(None)
    return results


def _split(spec, args, kwargs) -> tuple[list, dict]:
    inputs = list(args)
    if len(inputs) > len(spec.inputs) and not spec.variadic:
        raise InputError(f"{spec.op_type} takes at most {len(spec.inputs)} inputs "
                         f"{list(spec.inputs)}; got {len(inputs)}")
    attributes = {}
    for key, value in kwargs.items():
        if key in spec.inputs and not (spec.variadic and key == spec.inputs[-1]):
            index = spec.inputs.index(key)
            if index < len(args):
                raise InputError(f"{spec.op_type}: input {key!r} given both positionally "
                                 f"and by name")
            inputs.extend([None] * (index + 1 - len(inputs)))
            inputs[index] = value
        elif key in spec.attributes or spec.any_attribute:
            attributes[key] = list(value) if isinstance(value, tuple) else value
        else:
            raise InputError(f"{spec.op_type}: unknown argument {key!r}; inputs are "
                             f"{list(spec.inputs)}, attributes are {sorted(spec.attributes)}")
    for index in range(min(spec.required, len(spec.inputs))):
        if index >= len(inputs) or inputs[index] is None:
            raise InputError(f"{spec.op_type}: required input {spec.inputs[index]!r} "
                             f"(input {index}) is missing")
    return inputs, attributes


def _common_context(op_type: str, inputs):
    """Where the op runs and its results live: the inputs' device. Host contexts mix as in
    MXNet (all host memory): the first input's ``cpu(i)``, a ``cpu_shared``/``cpu_pinned``
    one's results on ``cpu`` of its id. GPUs never mix with anything else."""
    ctx = None
    for value in inputs:
        if isinstance(value, NDArray):
            if ctx is None:
                ctx = value.ctx
            elif value.ctx != ctx and not (ctx.device.kind == value.ctx.device.kind == "cpu"):
                raise DeviceMismatchError(
                    f"{op_type}: inputs are on different devices, {ctx} and {value.ctx}; "
                    f"mixrt does not copy implicitly: move one with "
                    f".as_in_context({ctx}) or .as_in_context({value.ctx})")
    if ctx is None:
        return current_context()
    if ctx.device_type not in ("cpu", "gpu"):  # cpu_shared, cpu_pinned
        return Context("cpu", ctx.device_id)
    return ctx


def _promote_floats(spec, inputs: list) -> None:
    """Arrays that ONNX says share one type (``Mul``'s A and B, both T) but hold different
    float dtypes are cast to their common one, as NumPy would promote them, through recorded
    ``Cast`` ops: the kernel, its inferred output type and its compiled backward then agree,
    and each gradient flows back in its own array's dtype (float32 weights, float64 data)."""
    if not _mixed_floats(inputs):  # the common case, kept to a few hundred nanoseconds
        return
    for group in _shared_type_groups(spec.domain, spec.op_type, spec.opset):
        members = [i for i in range(len(inputs)) if group(i) and isinstance(inputs[i], NDArray)
                   and inputs[i].dtype.kind == "f"]
        dtypes = {inputs[i].dtype for i in members}
        if len(dtypes) > 1:
            common = np.result_type(*dtypes)
            for i in members:
                if inputs[i].dtype != common:
                    inputs[i] = inputs[i].astype(common)


def _numeric_bools(spec, inputs: list) -> None:
    """A boolean array (what a comparison returns) given to an input whose ONNX type does
    not allow bool (``Add``, ``Mul``, ``ReduceSum``, ...) is cast, through a recorded ``Cast``,
    to the dtype of a non-boolean array it shares a type with, else to float32. MXNet's
    comparisons return 0/1 in the input's dtype, so ``(x > 0) * x``, ``(y == label).mean()``
    and ``(x > 0) + 1`` are arithmetic there; NumPy's bool arithmetic would have made them
    logical (``True``), and the product would have dropped out of the tape (a bool first
    input made the output look non-differentiable)."""
    if not any(isinstance(v, NDArray) and v.dtype == np.bool_ for v in inputs):
        return
    allowed, groups = _bool_inputs(spec.domain, spec.op_type, spec.opset)
    if allowed is None:
        return
    for i, value in enumerate(inputs):
        if not (isinstance(value, NDArray) and value.dtype == np.bool_):
            continue
        position = min(i, len(allowed) - 1)
        if allowed[position]:
            continue
        peers = [v for j, v in enumerate(inputs) if isinstance(v, NDArray) and
                 v.dtype != np.bool_ and groups[min(j, len(groups) - 1)] == groups[position]]
        inputs[i] = value.astype(peers[0].dtype if peers else np.float32)


@functools.lru_cache(maxsize=None)
def _bool_inputs(domain: str, op_type: str, opset: int):
    """(whether each formal input takes bool, each input's type parameter), or (None, None)
    for an op without an ONNX schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None, None
    if not schema.inputs:
        return None, None
    takes = {c.type_param_str: "tensor(bool)" in c.allowed_type_strs
             for c in schema.type_constraints}
    allowed = tuple(takes.get(f.type_str, f.type_str == "tensor(bool)") for f in schema.inputs)
    return allowed, tuple(f.type_str for f in schema.inputs)


def _check_shared_dtypes(spec, inputs: list) -> None:
    """Arrays that ONNX says share one type but still differ (int32 with float32, int64 with
    int32, once floats were promoted) are an ``InputError``, as in MXNet: NumPy would have
    promoted them silently (int32 + float32 gives float64) to a type the op does not have."""
    dtypes = {v.dtype for v in inputs if isinstance(v, NDArray)}
    if len(dtypes) < 2:
        return
    for group in _shared_type_groups(spec.domain, spec.op_type, spec.opset):
        members = {inputs[i].dtype for i in range(len(inputs))
                   if group(i) and isinstance(inputs[i], NDArray)}
        if len(members) > 1:
            raise InputError(f"{spec.op_type}: inputs of one type have different dtypes "
                             f"{sorted(str(d) for d in members)}; cast one with .astype() "
                             f"(MXNet does not mix dtypes either)")


def _numeric_conditions(spec, inputs: list) -> None:
    """A numeric array given to an input that takes only bool (``Where``'s condition,
    ``And``, ``Not``, ...) is read as ``x != 0``, through recorded ops: MXNet's comparisons
    give 0/1 in the data's dtype, and its masks and conditions are such numbers."""
    allowed = _allowed_for(spec)
    if not allowed:
        return
    count = len(allowed)
    for position, value in enumerate(inputs):
        if isinstance(value, NDArray) and value.dtype != np.bool_ and \
                (allowed[position] if position < count else allowed[-1]) == _ONLY_BOOL:
            inputs[position] = invoke("", "Not", [invoke("", "Equal", [value, 0], {})], {})


_ONLY_BOOL = frozenset({np.dtype(np.bool_)})


def _allowed_for(spec) -> tuple:
    """The dtypes each input of ``spec``'s op takes (``_allowed_dtypes``), worked out once
    per op: every imperative call reads them, so this is kept to a dict lookup."""
    allowed = _ALLOWED_DTYPES.get(id(spec))
    if allowed is None:
        allowed = _ALLOWED_DTYPES[id(spec)] = _allowed_dtypes(spec)
    return allowed


def _check_allowed_dtypes(spec, inputs: list) -> None:
    """An array of a dtype the op's ONNX input does not take (``sqrt`` of int32, ``softmax``
    of int64) is an ``InputError``: NumPy would have computed in float64, MXNet 1.x in the
    integers (``sqrt([2]) == [1]``), and neither is what the op means."""
    allowed = _allowed_for(spec)
    if not allowed:
        return
    count = len(allowed)
    for position, value in enumerate(inputs):
        if isinstance(value, NDArray):
            dtypes = allowed[position] if position < count else allowed[-1]
            if dtypes and value._data.dtype not in dtypes:
                raise InputError(
                    f"{spec.op_type}: input {position} is {value.dtype}, which the op does "
                    f"not take (it takes {', '.join(sorted(d.name for d in dtypes))}); cast "
                    f"it first, e.g. x.astype('float32')")


# id(spec) -> per formal input, the dtypes it takes (empty: unconstrained); op_spec caches
# every spec for the life of the process, so an id is never reused for another one
_ALLOWED_DTYPES: dict[int, tuple] = {}


def _allowed_dtypes(spec) -> tuple:
    return tuple(frozenset(np.dtype(name) for name in names)
                 for _, names in _formal_types(spec.domain, spec.op_type, spec.opset))


def _mixed_floats(inputs: list) -> bool:
    seen = None
    for value in inputs:
        if isinstance(value, NDArray):
            dtype = value.dtype
            if dtype.kind == "f":
                if seen is None:
                    seen = dtype
                elif dtype != seen:
                    return True
    return False


@functools.lru_cache(maxsize=None)
def _shared_type_groups(domain: str, op_type: str, opset: int) -> tuple:
    """Per ONNX type parameter shared by several inputs (or by a variadic one): a predicate
    on input positions. Ops without an ONNX schema (the mixrt domain) have none."""
    try:
        formals = onnx.defs.get_schema(op_type, opset, domain).inputs
    except onnx.defs.SchemaError:
        return ()
    variadic = bool(formals) and formals[-1].option == \
        onnx.defs.OpSchema.FormalParameterOption.Variadic
    last = len(formals) - 1
    by_type: dict[str, set] = {}
    for index, formal in enumerate(formals):
        by_type.setdefault(formal.type_str, set()).add(index)
    groups = []
    for indices in by_type.values():
        if len(indices) > 1 or (variadic and last in indices):
            groups.append(functools.partial(_in_group, frozenset(indices),
                                            last if variadic else None))
    return tuple(groups)


def _in_group(indices: frozenset, variadic_from: int | None, position: int) -> bool:
    if variadic_from is not None and position >= variadic_from:
        return variadic_from in indices
    return position in indices


def _carried_failure(inputs):
    """The error asynchronous work left on an input and nobody has raised yet (a sampler
    MXNet's checks refused, ``nd/random.py``). As in MXNet, the op still runs, on the values
    the input holds, and its outputs carry the error on: it is raised at the next wait on
    them (``asnumpy``, ``wait_to_read``, ``waitall``), not at this call."""
    for value in inputs:
        if isinstance(value, NDArray):
            var = value._var if value._base is None else value._base._var
            failure = None if var is None else get_engine().failure_of(var)
            if failure is not None:
                return failure
    return None


def _raw_input(spec, position: int, value, ctx, inputs, checked: bool = True):
    """The kernel's view of one argument; a number takes the dtype of the first array that
    is not boolean (``where(x > 1, x, 5)``: x's dtype, not the condition's). As in MXNet
    (whose scalar ops cast the scalar to the array's dtype) and as ``mixrt.sym`` does
    (CastLike), a float number beside an integer array is truncated to that integer type:
    ``int32 + 1.5`` is ``int32 + 1``; an integer out of range wraps (``uint8 + 300``).
    Beside boolean arrays only, a number other than True/False is float32. An input whose
    ONNX type cannot be that dtype gets one it can (Dropout's ``training_mode`` is bool)."""
    if value is None:
        return None
    if isinstance(value, NDArray):
        # unchecked: an input's failure is carried on (its writes are done already)
        return value._read() if checked else value._data
    arrays = [v for v in inputs if isinstance(v, NDArray)]
    like = next((v for v in arrays if v.dtype != np.bool_), arrays[0] if arrays else None)
    if isinstance(value, (bool, int, float)) and like is not None:
        dtype = like.dtype
        if dtype == np.bool_ and not isinstance(value, bool):  # only conditions around
            dtype = np.float32  # where(x > 2, 0.5, -1.5): MXNet's default dtype
        dtype = _allowed_number_dtype(spec, position, value, inputs, dtype)
        host = np.array(value).astype(dtype)  # C casts: truncate, wrap (MXNet's)
        return host if ctx.device.kind == "cpu" else ctx.xp.asarray(host)
    if ctx.device.kind == "cpu":
        return np.asarray(value)
    return ctx.device.put(value)  # a list, a host array, or already the device's


def _allowed_number_dtype(spec, position: int, value, inputs, preferred) -> np.dtype:
    """``preferred`` when the op's schema lets input ``position`` have it (or an array of
    the same type parameter has it); else the first of bool (for True/False), int64 and
    float32 that the input allows."""
    formals = _formal_types(spec.domain, spec.op_type, spec.opset)
    if not formals:
        return preferred
    param, allowed = formals[min(position, len(formals) - 1)]
    for j, other in enumerate(inputs):
        if isinstance(other, NDArray) and other.dtype != np.bool_ and \
                formals[min(j, len(formals) - 1)][0] == param:
            return other.dtype
    if np.dtype(preferred).name in allowed:
        return preferred
    candidates = (("bool",) if isinstance(value, bool) else ()) + ("int64", "float32")
    return np.dtype(next((c for c in candidates if c in allowed), preferred))


@functools.lru_cache(maxsize=None)
def _formal_types(domain: str, op_type: str, opset: int) -> tuple:
    """Per formal input of the op's ONNX schema: (its type parameter, the NumPy names of the
    element types it allows); empty for an op without a schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return ()
    by_param = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return tuple((f.type_str, frozenset(_numpy_names(by_param.get(f.type_str, [f.type_str]))))
                 for f in schema.inputs)


def _numpy_names(type_strings) -> list[str]:
    names = []
    for text in type_strings:
        if text.startswith("tensor(") and text.endswith(")"):
            try:
                code = onnx.TensorProto.DataType.Value(text[7:-1].upper())
                names.append(to_numpy_dtype(code).name)
            except (KeyError, ValueError):
                continue
    return names


def _output_count(spec, attributes, asked, raw) -> int:
    if asked is not None:
        return int(asked)
    if "num_outputs" in spec.attributes and attributes.get("num_outputs") is not None:
        return int(attributes["num_outputs"])
    if spec.default_outputs is None:
        if spec.op_type == "Split" and len(raw) > 1 and raw[1] is not None:
            return len(raw[1])
        raise InputError(f"{spec.op_type} has a variable number of outputs; say how many "
                         f"with num_outputs=")
    return spec.default_outputs


def _describe(raw) -> str:
    return "[" + ", ".join("None" if r is None else f"{r.dtype}{list(r.shape)}"
                           for r in raw) + "]"


def make_function(domain: str, op_type: str):
    """The imperative function for one op, named and documented like its Symbol twin."""
    def function(*args, num_outputs: int | None = None, name: str | None = None, out=None,
                 **kwargs):
        del name  # accepted so hybrid_forward code may name nodes for the traced graph
        result = invoke(domain, op_type, args, kwargs, num_outputs)
        if out is not None:
            out[:] = result
            return out
        return result

    function.__name__ = function.__qualname__ = op_type
    function.__doc__ = f"Imperative {domain or 'ai.onnx'}::{op_type}; see mixrt.sym.{op_type}."
    return function
