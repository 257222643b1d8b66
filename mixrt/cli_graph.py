"""The ``mixrt`` subcommands that read a model's graph without making a session of it:
``info`` (inputs, outputs, opsets, where a .mxr was compiled from, the operator
histogram), ``check`` (the per-node support table, for a device here or, with
``--registry-only``, one that is not; ``--validate`` compares with onnxruntime) and
``export`` (the graph written as ONNX). ``check --validate`` and ``export`` import onnx in
the function that needs it, so that ``mixrt --help`` does not load it.
"""

from __future__ import annotations

import collections
import json
import warnings

from mixrt.base.errors import InputError, LenientLoadWarning
from mixrt.cli_inputs import read_dim, read_input
from mixrt.ops.device import device_named, parse_device
from mixrt.runtime.session import load_graph
from mixrt.runtime.support import support_table


def _load_graph(model: str):
    graph = load_graph(model)
    graph.validate()
    return graph


# -- info ------------------------------------------------------------------------------------

def cmd_info(args) -> int:
    graph = _load_graph(args.model)
    print(f"model: {args.model}")
    for line in _provenance(graph.metadata):
        print(line)
    print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(graph.opsets.items())))
    print("inputs:")
    for value in graph.feed_inputs():
        print(f"  {value.name}: {value.type or '?'}")
    print("outputs:")
    for value in graph.outputs:
        print(f"  {value.name}: {value.type or '?'}")
    weights = sum(a.nbytes for a in graph.initializers.values())
    print(f"initializers: {len(graph.initializers)} ({weights / 2**20:.1f} MiB)")
    histogram = collections.Counter(
        f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in graph.all_nodes())
    print(f"operators ({sum(histogram.values())} nodes):")
    for name, count in histogram.most_common():
        print(f"  {count:6}  {name}")
    return 0


def _provenance(metadata: dict) -> list[str]:
    """Who wrote the model and, for a compiled .mxr, which model file it was compiled from."""
    lines = []
    if metadata.get("producer"):
        lines.append(f"producer: {metadata['producer']} "
                     f"{metadata.get('producer_version', '')}".rstrip())
    if "opt_level" not in metadata or "format_version" not in metadata:
        return lines  # not a .mxr
    if "source_name" in metadata:
        size = metadata.get("source_bytes")
        facts = [f"sha256 {metadata['source_sha256']}"] if "source_sha256" in metadata else []
        facts += [f"{size:,} bytes"] if isinstance(size, int) else []
        facts += [f"written by {metadata['source_producer']}"] \
            if metadata.get("source_producer") else []
        lines.append(f"compiled from: {metadata['source_name']}"
                     + (f" ({', '.join(facts)})" if facts else ""))
    else:
        lines.append("compiled from: a model given as bytes or a graph (no file recorded)")
    lines.append(f"compiled at opt level {metadata['opt_level']}, .mxr format "
                 f"{metadata['format_version']}")
    return lines


# -- export ----------------------------------------------------------------------------------

def cmd_export(args) -> int:
    from mixrt.exporters.onnx import save_model  # noqa: PLC0415 (onnx)

    model = save_model(_load_graph(args.model), args.output, opset=args.opset)
    opset = next((o.version for o in model.opset_import if not o.domain), None)
    size = args.output.stat().st_size
    print(f"wrote {args.output} ({size / 2**20:.1f} MiB, "
          f"{'opset ' + str(opset) if opset else 'no default-domain nodes'}, "
          f"{len(model.graph.node)} nodes)")
    return 0


# -- check -----------------------------------------------------------------------------------

def cmd_check(args) -> int:

    if args.validate:
        if args.registry_only:
            raise InputError("--validate runs the model, so it needs the device itself; "
                             "--registry-only answers without running anything")
        return _check_validate(args)
    if args.dim or args.input:
        raise InputError(f"--{'dim' if args.dim else 'input'} gives values to run the model "
                         f"with, which only --validate does")
    graph, lenient = _load_graph_noting_leniency(args.model)
    # a device that is not here fails the check (a GPU job would fail the same way), unless
    # the caller asks only what the operator registry supports for it
    device = device_named(args.device) if args.registry_only else parse_device(args.device)
    rows = support_table(graph, device)
    unsupported = [r for r in rows if not r.supported]
    if args.json:
        print(json.dumps({"model": args.model, "device": str(device),
                          "supported": not unsupported, "nodes": [r.as_dict() for r in rows],
                          "warnings": lenient}, indent=2))
    else:
        _print_table(rows, device)
    return 1 if unsupported else 0


def _load_graph_noting_leniency(model: str):
    """The graph, and the messages of the LenientLoadWarnings its load gave: what mixrt
    assumed where the model breaks the spec as onnxruntime tolerates. A CI gate reading
    ``--json`` sees them there; each is also shown on stderr, as any warning is."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LenientLoadWarning)
        graph = _load_graph(model)
    lenient = []
    for record in caught:
        if issubclass(record.category, LenientLoadWarning):
            lenient.append({"kind": record.category.__name__, "message": str(record.message)})
        warnings.warn_explicit(record.message, record.category, record.filename,
                               record.lineno)
    return graph, lenient


def _check_validate(args) -> int:
    """Support table plus a numeric comparison with onnxruntime: the CI gate."""
    from mixrt.exporters import coverage  # noqa: PLC0415 (onnx)
    feeds = dict(read_input(item) for item in args.input) or None
    dims = dict(read_dim(item) for item in args.dim)
    report = coverage.validate(args.model, feeds, device=args.device, rtol=args.rtol,
                               atol=args.atol, dims=dims)
    if args.json:
        print(json.dumps({"model": args.model, **report.as_dict()}, indent=2))
    else:
        print(coverage.format_report(report))
    return 0 if report.ok else 1


def _print_table(rows, device) -> None:
    header = ("node", "op", "opset", "dtype", "kernel / reason")
    table = [(r.node, f"{'' if r.domain == 'ai.onnx' else r.domain + '::'}{r.op_type}",
              str(r.opset), r.dtype or "?", r.kernel if r.supported else "UNSUPPORTED: "
              + r.reason) for r in rows]
    widths = [min(40, max([len(h)] + [len(t[i]) for t in table])) for i, h in
              enumerate(header[:-1])]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[-1]
    print(line)
    print("-" * len(line))
    for entry in table:
        print("  ".join(c[:w].ljust(w) for c, w in zip(entry, widths)) + "  " + entry[-1])
    bad = sum(not r.supported for r in rows)
    print(f"\n{len(rows) - bad} of {len(rows)} nodes supported on {device}"
          + (f"; {bad} unsupported" if bad else ""))
