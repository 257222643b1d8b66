"""Compile the recorded kernels ahead of time, one x86-64 level at a time
(``ops/compiled/prebuilt.py`` says how they are found again).

    python -m mixrt.ops.compiled._prebuild --into DIR [--levels x86-64-v3,x86-64-v4]

The wheel build runs it (``setup.py``) into the wheel's ``mixrt/ops/compiled/prebuilt/``.
Each level builds in processes of its own, started with numba told that level's CPU
(``NUMBA_CPU_NAME``, no extra features), so the machine code runs on every CPU of the level
whatever CPU builds it: an AVX2 machine builds the AVX-512 level too. The kernels' Python
also asks the level, not the building CPU, which forms to generate (``jit_cpu.vector_bytes``).
Every process compiles its share of ``kernels.json`` (:mod:`recorded_kernels`) with caching
on, and ``jit_cache.py`` writes each entry into the level's folder beside the process's own
(throw-away) cache; the index files are locked, so the processes of one level share them.
A kernel that fails to compile is reported and left to compile at run time, also one whose
compile kills its process (LLVM aborts on an intrinsic the level lacks): the process starts
again past it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from mixrt.ops.compiled import prebuilt, recorded_kernels
from mixrt.ops.compiled.first_use import FirstUseEntry
from mixrt.ops.compiled.generated import kernel_module
from mixrt.ops.compiled.jit_cache import guard_damaged_entries

KERNELS = Path(__file__).resolve().parent / "kernels.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--into", type=Path, required=True, help="the prebuilt folder")
    parser.add_argument("--levels", default=",".join([*prebuilt.LEVELS, *prebuilt.ADDITIONS]),
                        help="comma-separated x86-64 levels and additions (default: all)")
    parser.add_argument("--kernels", type=Path, default=KERNELS, help="the recorded list")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes at once (default: one per core)")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # "i/n": one process's share
    parser.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--skip", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part:
        skipped = frozenset(int(i) for i in args.skip.split(",") if i)
        return build_part(args.kernels, args.part, args.progress, skipped)
    levels = [level for level in args.levels.split(",") if level]
    known = [*prebuilt.LEVELS, *prebuilt.ADDITIONS]
    unknown = set(levels) - set(known)
    if unknown:
        parser.error(f"unknown levels {sorted(unknown)}; known: {', '.join(known)}")
    return build(args.into, levels, args.kernels, max(1, args.jobs))


# entries one part may lose to crashes (below) before the build counts the part as failed
CRASHES_SKIPPED = 20


def build(into: Path, levels: list[str], kernels: Path, jobs: int) -> int:
    """Every level's entries into ``into/<level>/``, ``jobs`` processes at a time."""
    started = time.perf_counter()
    parts_per_level = max(1, jobs // max(1, len(levels)))
    with tempfile.TemporaryDirectory(prefix="mixrt-prebuild-") as scratch:
        runs = [(level, f"{i}/{parts_per_level}") for level in levels
                for i in range(parts_per_level)]
        with ThreadPoolExecutor(len(runs)) as pool:
            done = list(pool.map(lambda n: _run_part(into, *runs[n], kernels,
                                                     Path(scratch) / f"{runs[n][0]}-{n}"),
                                 range(len(runs))))
        failed = [f"{level} {part}" for (level, part), ok in zip(runs, done) if not ok]
    if failed:
        print(f"prebuild: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    for level in levels:
        for lock in (into / level).rglob("*.nbi.lock"):  # the build's, not the package's
            lock.unlink()
        _write_manifest(into / level, level)
    print(f"prebuild: {', '.join(levels)} in {time.perf_counter() - started:.0f} s "
          f"into {into}", file=sys.stderr)
    return 0


def _run_part(into: Path, level: str, part: str, kernels: Path, scratch: Path) -> bool:
    """One part's process, started again past an entry that killed it. LLVM aborts its
    process, where Python cannot catch it, on code its target cannot compile (an intrinsic
    the level lacks: AVX-512 VNNI's for ``x86-64-v4``); that entry is reported and left to
    compile at run time, as one that raised is. The entries compiled before it are in the
    part's cache and load again at once."""
    progress, skipped = scratch / "progress", []
    while True:
        child = _start(into, level, part, kernels, scratch, progress, skipped)
        code = child.wait()
        if code == 0:
            return True
        last = _last_started(progress)
        if last is None or last[0] in skipped or len(skipped) >= CRASHES_SKIPPED:
            return False
        skipped.append(last[0])
        print(f"prebuild: {last[1]}: its process died compiling it (exit {code}); "
              f"it compiles at run time", file=sys.stderr)


def _last_started(progress: Path) -> tuple[int, str] | None:
    try:
        lines = progress.read_text().splitlines()
    except OSError:
        return None
    if not lines:
        return None
    position, name = lines[-1].split(" ", 1)
    return int(position), name


def _start(into: Path, level: str, part: str, kernels: Path, scratch: Path, progress: Path,
           skipped: list[int]):
    cpu, features = prebuilt.build_target(level)
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=features,
               NUMBA_CACHE_DIR=str(scratch / "numba"), MIXRT_CACHE_DIR=str(scratch / "mixrt"),
               MIXRT_COMPILE="foreground", MIXRT_PREBUILT="0",
               **{prebuilt.BUILD_LEVEL: level, prebuilt.BUILD_INTO: str(into)})
    env.pop(recorded_kernels.RECORD, None)
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.write_text("")
    return subprocess.Popen([sys.executable, "-P", "-m", "mixrt.ops.compiled._prebuild",
                             "--into", str(into), "--kernels", str(kernels), "--part", part,
                             "--progress", str(progress),
                             "--skip", ",".join(str(i) for i in skipped)], env=env)


def build_part(kernels: Path, part: str, progress: Path | None = None,
               skipped: frozenset = frozenset()) -> int:
    """In a level's process: compile every ``n``-th kernel of the list from the ``i``-th,
    but those at the positions ``skipped``, noting each one in ``progress`` as it starts."""
    index, count = (int(x) for x in part.split("/"))
    guard_damaged_entries()  # numba's cache with the prebuilt level's saves (jit_cache.py)
    level = os.environ[prebuilt.BUILD_LEVEL]
    entries = [entry for entry in json.loads(kernels.read_text())["kernels"]
               if prebuilt.builds_entry(level, entry)][index::count]
    failures = len(skipped)
    for position, entry in enumerate(entries):
        if position in skipped:
            continue
        if progress is not None:
            with open(progress, "a", encoding="utf-8") as out:  # written before a crash
                out.write(f"{position} {entry['module']}.{entry['qualname']}\n")
        try:
            compile_entry(entry)
        except Exception as exc:  # noqa: BLE001  (reported; that kernel compiles at run time)
            failures += 1
            print(f"prebuild: {entry['module']}.{entry['qualname']}: "
                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                  file=sys.stderr)
    print(f"prebuild: {level} part {part}: {len(entries) - failures} of {len(entries)} "
          f"kernels", file=sys.stderr)
    return 0


def compile_entry(entry: dict) -> None:
    """Compile one recorded kernel for its recorded argument types (a cfunc compiles as its
    module is imported, or, declared with ``first_use_cfunc``, when asked to here)."""
    module = _module(entry)
    function = module
    for name in entry["qualname"].split("."):
        function = getattr(function, name)
    if entry.get("cfunc"):
        if isinstance(function, FirstUseEntry):
            function.compile()
        return
    function.compile(tuple(recorded_kernels.decode(t) for t in entry["args"]))


def _module(entry: dict):
    name = entry["module"]
    if "source" not in entry:
        return importlib.import_module(name)
    if "main" in entry:  # a part entry's module imports its names from this one
        _module(entry["main"])
    prefix = name.rsplit("_", 1)[0]
    module = kernel_module(entry["source"], prefix)
    if module.__name__ != name:
        raise ValueError(f"the recorded source of {name} hashes to {module.__name__}")
    return module


def _write_manifest(folder: Path, level: str) -> None:
    # numba's target tuple as a process told that level's CPU has it (the key of every entry)
    target = subprocess.run(
        [sys.executable, "-c", "from numba.core.registry import cpu_target; import json; "
         "print(json.dumps(cpu_target.target_context.codegen().magic_tuple()))"],
        env=dict(os.environ, **dict(zip(("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"),
                                        prebuilt.build_target(level)))),
        capture_output=True, text=True, check=True).stdout
    count = sum(1 for _ in folder.rglob("*.nbc"))
    manifest = {"level": level, "target": json.loads(target),
                "numba": prebuilt._numba_version(), "python": prebuilt._python_tag(),
                "entries": count, "built": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / prebuilt.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
