"""Record which kernels a corpus of models calls, with which argument types, into
``ops/compiled/kernels.json``: the list the wheel build compiles ahead of time
(``ops/compiled/_prebuild.py``).

Each model runs in a process of its own with ``MIXRT_RECORD_KERNELS`` set and compiling in
the foreground, so every kernel it loads or compiles is noted (``ops/compiled/
recorded_kernels.py``). The corpus: the onnx package's light zoo at its shapes and at batch
2 where the batch axis is free; every real export cached under ``benchmarks/.cache/
real_exports`` (the real-exports set with its feeds, the shape sweep at all its points); and
``mixrt demo`` (training: gradients, the optimizer's updates). Run it after a change that adds
a kernel or a call of one with new types; a kernel missing from the list still works, it is
compiled on the machine that runs it.

    python benchmarks/record_kernels.py [--only NAME ...] [--cache DIR] [--add]

The kernels' Python picks its forms by the CPU's vector width, so each x86-64 level needs the
corpus run on a CPU of that level: ``--add`` keeps the list's entries and adds this
machine's, marked for its level (an AVX-512 machine's run beside an AVX2 machine's); a
generated module's entries are every level's (its source is the model's, not the CPU's).
Where the native pool runs a pool's or a depthwise convolution's parts (AVX-512), Python
calls their modules' ``run`` for small planes only, so an AVX-512 machine records what an
AVX2 one calls with a second run under ``MIXRT_NATIVE_POOL=0``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
OUT = ROOT / "ops" / "compiled" / "kernels.json"
EXPORTS = ROOT / "benchmarks" / ".cache" / "real_exports"


def jobs() -> list[tuple[str, list[str]]]:
    """(name, the command that runs it) for each corpus member."""
    here = [sys.executable, __file__, "--child"]
    from mixrt.models.zoo import LIGHT_MODELS  # noqa: PLC0415
    every = [(f"zoo:{name}", here + [f"zoo:{name}"]) for name in LIGHT_MODELS]
    every += [(f"export:{path.stem}", here + [f"export:{path.stem}"])
              for path in sorted(EXPORTS.glob("*.onnx"))]
    every.append(("demo", [sys.executable, "-m", "mixrt", "demo"]))
    return every


# generated modules specialised to one plane geometry (the depthwise convolution's flat form,
# ops/conv/jit_depthwise.py): a model at another image size needs others, so only the
# reference shapes' are kept (every point of the sweep made 101 of them, 71 MB of code)
SHAPED = ("mixrt_depthwise_flat_",)


# the packed-panel families load only where the CPU has AVX-512 (jit_cpu.panel_kernels), so
# a corpus run on another CPU calls none of them: their modules are listed for the AVX-512
# level regardless, and importing one compiles its C entries (the worker, the jobs, the
# tile's entries) with everything they call
PANEL_FAMILIES = (("mixrt.ops.panels._jit_native_worker", "serve"),
                  ("mixrt.ops.panels._jit_dense", "tile_f"),
                  ("mixrt.ops.panels._jit_conv_direct", "_conv_job_f"),
                  ("mixrt.ops.panels._jit_conv_weight_grad", "weight_grad"),
                  ("mixrt.ops.panels._jit_attention", "_attention_job_f"))


def panel_entries() -> list[dict]:
    return [{"module": module, "qualname": name, "cfunc": True, "args": [],
             "levels": ["x86-64-v4"]} for module, name in PANEL_FAMILIES]


def _level_entries(out: Path) -> list[dict]:
    """The entries of the list being replaced that name their levels: recorded on another
    CPU (the panel drivers' argument types, from a run where the tile loads), which this
    machine's corpus run cannot call, so they are kept."""
    if not out.exists():
        return []
    return [entry for entry in json.loads(out.read_text())["kernels"] if "levels" in entry]


def child(name: str) -> None:
    """Run one corpus member in this process, each case recorded into a file of its own:
    ``<RECORD>.<case>.ref`` at a reference shape, ``.other`` elsewhere."""
    import mixrt  # noqa: PLC0415
    from mixrt.ops.compiled import recorded_kernels  # noqa: PLC0415
    base = os.environ[recorded_kernels.RECORD]
    kind, model = name.split(":", 1)
    for label, reference, path, feeds in _cases(kind, model):
        recorded_kernels.record_into(f"{base}.{model}.{label}.{'ref' if reference else 'other'}")
        session = mixrt.Session(str(path))
        for _ in range(2):
            session.run(None, feeds)


def _cases(kind: str, model: str):
    """(label, whether a reference shape, model path, feeds) for each case of a member."""
    import numpy as np  # noqa: PLC0415
    if kind == "zoo":
        from mixrt.models.zoo import light_model  # noqa: PLC0415
        zoo = light_model(model)
        yield "zoo", True, zoo.path, zoo.inputs
        return
    path = EXPORTS / f"{model}.onnx"
    from real_exports.sweeps import MODELS  # noqa: PLC0415  (torch-free: the cached files)
    sweep = MODELS.get(model)
    if sweep is None:
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as stored:
            yield "own", True, path, {key: stored[key] for key in stored.files}
        return
    for point in sweep.points:
        image = dict(point.axes).get("image")
        yield point.label, image in (None, 224), path, sweep.feeds(point)


def merge(folder: Path, out: Path, add: bool = False) -> int:
    """The recordings in ``folder`` as one sorted list, shape-specialised modules from
    reference shapes only; with ``add``, added to the list in ``out`` (below)."""
    entries = _recorded(folder)
    if add:
        entries = _added(entries, out)
    else:
        for entry in panel_entries() + _level_entries(out):
            if not any(e["module"] == entry["module"] and e["qualname"] == entry["qualname"]
                       and e["args"] == entry["args"] for e in entries.values()):
                entries[json.dumps(entry, sort_keys=True)] = entry
    kept = [entries[key] for key in sorted(entries)]
    out.write_text(json.dumps({"kernels": kept}, indent=0, sort_keys=True) + "\n")
    return len(kept)


def _recorded(folder: Path) -> dict:
    from mixrt.ops.compiled.recorded_kernels import read_lines  # noqa: PLC0415
    entries = {}
    for lines in sorted(folder.glob("kernels.jsonl*")):
        reference = not lines.name.endswith(".other")
        for entry in read_lines(lines):
            if entry["module"] in BEYOND_LEVELS:
                entry = dict(entry, levels=[BEYOND_LEVELS[entry["module"]]])
            if reference or not entry["module"].startswith(SHAPED):
                entries[json.dumps(entry, sort_keys=True)] = entry
    return entries


# modules that load only where the CPU has more than a level promises, listed for the level's
# addition (ops/compiled/prebuilt.py, ADDITIONS): the 8-bit products are LLVM IR around
# AVX-512 VNNI's vpdpbusd (ops/quant/int8_cpu.py), which x86-64-v4 lacks (LLVM aborts the
# build's process on an intrinsic its target cannot select)
BEYOND_LEVELS = {"mixrt.ops.quant._jit_int8": "x86-64-v4-vnni",
                 # the quantized LSTM's VNNI tiles are _jit_int8's, in a module of their own
                 "mixrt.ops.quant._jit_quant_lstm_vnni": "x86-64-v4-vnni"}


def _added(recorded: dict, out: Path) -> dict:
    """Every entry of the list in ``out``, and this machine's recordings for this CPU's
    level: the kernels' Python picks its forms by the CPU's vector width, so a corpus run
    on an AVX-512 machine calls other forms (and other generated modules) than on an AVX2
    one, and one machine's run must not drop what the other level needs. An entry listed
    already keeps its levels (none: every level), gaining this one where it lacked it."""
    from mixrt.ops.compiled import prebuilt  # noqa: PLC0415
    level = prebuilt.host_level()
    if level is None:
        raise SystemExit("this CPU has no prebuilt level (below x86-64-v3): nothing to add")
    listed = json.loads(out.read_text())["kernels"] if out.exists() else []
    entries = {_identity(entry): entry for entry in listed}
    for entry in recorded.values():
        if entry["module"] in BEYOND_LEVELS:  # an addition's, labelled as recorded
            entries[_identity(entry)] = entry
            continue
        known = entries.get(_identity(entry))
        if known is None and _every_level(entry):
            entries[_identity(entry)] = entry
        elif known is None:
            entries[_identity(entry)] = dict(entry, levels=[level])
        elif "levels" in known and level not in known["levels"]:
            known["levels"] = sorted([*known["levels"], level])
    return {json.dumps(entry, sort_keys=True): entry for entry in entries.values()}


def _every_level(entry: dict) -> bool:
    """A generated module (a pool, a depthwise convolution, a fused program) is made from
    the model alone, never from the CPU's vector width: whichever machine recorded it, every
    level runs it. Not so the native pool's part entries (``_part_f_``, ``_part_d_``), which
    only a CPU with the pool (AVX-512) compiles."""
    module = entry["module"]
    return module.startswith("mixrt_") and "_part_" not in module


def _identity(entry: dict) -> str:
    return json.dumps({k: v for k, v in entry.items() if k != "levels"}, sort_keys=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--only", nargs="*", help="corpus members by name (zoo:resnet50, ...)")
    parser.add_argument("--cache", type=Path, help="numba and mixrt caches to keep between runs")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--add", action="store_true",
                        help="keep the list's entries and add this machine's, for its level")
    parser.add_argument("--prebuilt", type=Path,
                        help="load kernels from this prebuilt folder while recording (a "
                             "machine with a level built: only the missing ones compile)")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory() as folder:
        caches = args.cache or Path(folder)
        lines = Path(folder) / "kernels.jsonl"
        env = dict(os.environ, MIXRT_COMPILE="foreground", MIXRT_PREBUILT="0",
                   MIXRT_RECORD_KERNELS=str(lines), NUMBA_CACHE_DIR=str(caches / "numba"),
                   MIXRT_CACHE_DIR=str(caches / "mixrt"))
        if args.prebuilt:  # a load is recorded as a compile is
            env.update(MIXRT_PREBUILT="1", MIXRT_PREBUILT_DIR=str(args.prebuilt.resolve()))
        for name, command in jobs():
            if args.only and name not in args.only:
                continue
            done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True)
            status = "ok" if done.returncode == 0 else f"failed ({done.stderr.strip()[-300:]})"
            print(f"{name}: {status}", file=sys.stderr, flush=True)
        count = merge(Path(folder), args.out, args.add)
    print(f"{count} kernels into {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
