"""Coverage validation for CI: does mixrt support every node of a model on a device, and do
its outputs match onnxruntime's on the same inputs?

    report = validate("model.onnx", device="cpu", rtol=1e-3, atol=1e-5)
    report.ok            # every node supported and every output within tolerance

The inputs are the caller's, or random ones drawn from each input's declared type (symbolic
dimensions take ``dims`` values, default 1) with a fixed seed, so a CI job is repeatable.
Only an ONNX model can be compared (onnxruntime reads ONNX); a ``.mxr`` file is exported back
to ONNX first. ``mixrt check MODEL --validate`` prints this report and exits 0 only when it
is ok.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from mixrt.base.errors import InputError, MixrtError, missing_dependency
from mixrt.base.made_up_feeds import random_array
from mixrt.ops.ir.types import MapType, TensorType
from mixrt.ops.device import parse_device
from mixrt.runtime.graph import Graph
from mixrt.runtime.session import Session, load_graph
from mixrt.runtime.support import check_dim_names, support_table
from mixrt.runtime.format import is_mxr
from mixrt.exporters.onnx import export_model


@dataclass
class OutputCheck:
    name: str
    shape: list
    max_abs_error: float
    max_rel_error: float
    ok: bool


@dataclass
class ValidationReport:
    device: str
    rtol: float
    atol: float
    nodes: list = field(default_factory=list)  # NodeSupport.as_dict() rows
    outputs: list[OutputCheck] = field(default_factory=list)
    error: str | None = None  # why the comparison could not run, when it could not

    @property
    def unsupported(self) -> list[dict]:
        return [row for row in self.nodes if not row["supported"]]

    @property
    def ok(self) -> bool:
        return self.error is None and not self.unsupported and bool(self.outputs) and all(
            out.ok for out in self.outputs)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "device": self.device, "rtol": self.rtol, "atol": self.atol,
                "error": self.error, "nodes": self.nodes,
                "outputs": [asdict(out) for out in self.outputs]}


def validate(model, feeds: dict | None = None, *, device: str = "cpu", rtol: float = 1e-3,
             atol: float = 1e-5, dims: dict | None = None, seed: int = 0) -> ValidationReport:
    """Support table plus a numeric comparison with onnxruntime's CPU provider."""
    graph = load_graph(model)
    check_dim_names(graph.feed_inputs(), dims or {})  # a misspelt size is the caller's error
    target = parse_device(device)  # the comparison runs the model: the device must be here
    report = ValidationReport(str(target), rtol, atol,
                              [row.as_dict() for row in support_table(graph, target)])
    if report.unsupported:
        report.error = f"{len(report.unsupported)} node(s) unsupported on {target}"
        return report
    try:
        feeds = feeds if feeds is not None else random_feeds(graph, dims or {}, seed)
        ours = Session(graph, device=device).run(None, feeds)
        theirs = _onnxruntime_outputs(model, graph, feeds)
    except MixrtError as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        return report
    for value, mine, reference in zip(graph.outputs, ours, theirs):
        if _holds_maps(mine) or _holds_maps(reference):
            report.outputs.append(_compare_maps(value.name, mine, reference, rtol, atol))
        else:
            report.outputs.append(_compare(value.name, np.asarray(mine),
                                           np.asarray(reference), rtol, atol))
    return report


def random_feeds(graph: Graph, dims: dict, seed: int = 0) -> dict:
    """One array per fed input, drawn from its declared type: floats standard normal, ints in
    [0, 10), bools fair coins; a symbolic dimension takes ``dims[name]`` (default 1). A map
    that a DictVectorizer reads holds every key of its vocabulary, values drawn the same way;
    any other map is an InputError (there are no keys to draw from)."""
    check_dim_names(graph.feed_inputs(), dims)
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.feed_inputs():
        value_type = value.type
        if isinstance(value_type, MapType):
            feeds[value.name] = _random_map(rng, graph, value)
            continue
        if not isinstance(value_type, TensorType) or value_type.shape is None \
                or value_type.dtype is None:
            raise InputError(f"input {value.name!r} has no declared tensor type and shape; "
                             f"pass its values explicitly")
        shape = tuple(d if isinstance(d, int) else int(dims.get(d, 1)) for d in
                      value_type.shape)
        feeds[value.name] = random_array(rng, np.dtype(value_type.dtype), shape)
    return feeds


def _random_map(rng, graph: Graph, value) -> dict:
    keys = {}  # insertion-ordered set: the vocabularies of every DictVectorizer reading it
    for node in graph.all_nodes():
        if node.op_type == "DictVectorizer" and node.domain == "ai.onnx.ml" \
                and value.name in node.inputs:
            for attribute in ("string_vocabulary", "int64_vocabulary"):
                for key in node.attributes.get(attribute) or ():
                    keys[key.decode() if isinstance(key, bytes) else key] = None
    dtype = getattr(value.type.value, "dtype", None)
    if not keys or dtype is None:
        raise InputError(f"input {value.name!r} is a map ({value.type}); random maps are drawn "
                         f"only for a DictVectorizer's input (its vocabulary gives the keys). "
                         f"Pass this input as a dict: validate(model, feeds) in Python "
                         f"(mixrt check --input reads .npy arrays, which cannot hold a map)")
    values = random_array(rng, np.dtype(dtype), (len(keys),)).tolist()
    return dict(zip(keys, values))


def _onnxruntime_outputs(model, graph: Graph, feeds: dict) -> list:
    try:
        import onnxruntime  # noqa: PLC0415
    except ImportError as exc:
        raise missing_dependency("validation (check --validate)", "onnxruntime",
                                 "validate") from exc
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    wanted = [v.name for v in graph.outputs]
    try:
        return _run_onnxruntime(onnxruntime, _onnx_bytes(model, graph), options, wanted, feeds)
    except Exception as first:  # noqa: BLE001 (onnxruntime raises its own untyped errors)
        # a file stamped with an IR version or opset newer than this onnxruntime reads:
        # mixrt's own export writes the lowest IR version its opsets allow
        try:
            again = export_model(graph).SerializeToString()
            return _run_onnxruntime(onnxruntime, again, options, wanted, feeds)
        except Exception as second:  # noqa: BLE001
            raise InputError(f"onnxruntime could not run the model ({first}), nor mixrt's "
                             f"re-export of it ({second})") from second


def _run_onnxruntime(onnxruntime, source: bytes, options, wanted, feeds) -> list:
    session = onnxruntime.InferenceSession(source, options,
                                           providers=["CPUExecutionProvider"])
    return session.run(wanted, feeds)


def _onnx_bytes(model, graph: Graph) -> bytes:
    """The model as ONNX bytes: the ONNX file or bytes themselves, else (a .mxr file, a Graph)
    an export of the graph mixrt runs."""
    import onnx  # noqa: PLC0415
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray)) and not is_mxr(model):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)) and not is_mxr(model):
        with open(model, "rb") as handle:
            return handle.read()
    return export_model(graph).SerializeToString()


def _compare(name: str, mine: np.ndarray, reference: np.ndarray, rtol: float,
             atol: float) -> OutputCheck:
    if mine.shape != reference.shape:
        return OutputCheck(name, list(mine.shape), float("inf"), float("inf"), False)
    if mine.dtype.kind not in "fc" or reference.dtype.kind not in "fc":
        same = bool(np.array_equal(mine, reference))
        return OutputCheck(name, list(mine.shape), 0.0 if same else float("inf"),
                           0.0 if same else float("inf"), same)
    mine64, ref64 = mine.astype(np.float64), reference.astype(np.float64)
    diff = np.abs(mine64 - ref64)
    both_nan = np.isnan(mine64) & np.isnan(ref64)
    diff = np.where(both_nan, 0.0, diff)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = np.abs(ref64)
    rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1), np.where(diff > 0, np.inf,
                                                                               0.0))
    max_rel = float(rel.max()) if rel.size else 0.0
    ok = bool(np.all((diff <= atol + rtol * scale) | both_nan))
    return OutputCheck(name, list(mine.shape), max_abs, max_rel, ok)


def _holds_maps(value) -> bool:
    """A map (dict) or a sequence of them, as both runtimes return maps."""
    return isinstance(value, dict) or (isinstance(value, (list, tuple)) and bool(value)
                                       and all(isinstance(v, dict) for v in value))


def _compare_maps(name: str, mine, reference, rtol: float, atol: float) -> OutputCheck:
    """Maps match when they hold the same keys, each map of a sequence in turn, and the
    values under each key match as tensors do (labels exactly, numbers within tolerance).
    The shape reported is [maps, keys per map] ([maps] when their sizes differ)."""
    mine_maps = [mine] if isinstance(mine, dict) else list(mine)
    their_maps = [reference] if isinstance(reference, dict) else list(reference)
    sizes = {len(m) for m in mine_maps}
    shape = [len(mine_maps), *sizes] if len(sizes) == 1 else [len(mine_maps)]
    if not _holds_maps(mine) or not _holds_maps(reference) or \
            [_keys(m) for m in mine_maps] != [_keys(m) for m in their_maps]:
        return OutputCheck(name, shape, float("inf"), float("inf"), False)
    values = [np.asarray([m[k] for m in maps for k in _keys(m)])
              for maps in (mine_maps, their_maps)]
    check = _compare(name, *values, rtol, atol)
    check.shape = shape
    return check


def _keys(mapping: dict) -> list:
    return sorted(mapping, key=lambda key: (str(type(key)), key))


def format_report(report: ValidationReport) -> str:
    lines = [f"{len(report.nodes) - len(report.unsupported)} of {len(report.nodes)} nodes "
             f"supported on {report.device}"]
    for row in report.unsupported:
        lines.append(f"  UNSUPPORTED {row['node']}: {row['reason']}")
    if report.error:
        lines.append(f"comparison not run: {report.error}")
    for out in report.outputs:
        lines.append(f"  output {out.name} {tuple(out.shape)}: max abs {out.max_abs_error:.3g}, "
                     f"max rel {out.max_rel_error:.3g} -> {'ok' if out.ok else 'MISMATCH'}")
    lines.append(f"{'PASS' if report.ok else 'FAIL'} (rtol={report.rtol}, atol={report.atol})")
    return "\n".join(lines)
