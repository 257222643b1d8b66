"""Which compiled CPU loops use AVX-512 gathers or scatters, after running some models.

numba compiles for the host CPU; where a loop's loads are strided, or indexed with signed
offsets that numba's negative-index check wraps in a select, LLVM vectorizes them as
``vgather``/``vscatter``, several times slower than contiguous loads. This runs the given
light zoo models once (batch 1, opt_level 2) with numba's and mixrt's caches in fresh
directories, so that every kernel is compiled in this process and its machine code can be
read, then prints each compiled function whose code holds a gather or a scatter, with how
many. Some are expected (a transposed pack, the spill of a partial tile); a hot loop in the
list is a lead (benchmarks/NOTES.md §25).

    python gather_scan.py squeezenet shufflenet inception_v2 resnet50
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

# these timings are of the compiled kernels (warm speed): sessions compile them on their
# first call rather than serving NumPy while a background process builds them
os.environ.setdefault("MIXRT_COMPILE", "foreground")

GATHERS = re.compile(r"\b(vp?gather\w+|vp?scatter\w+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="light zoo model names (benchmarks/cases.py)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mixrt-gathers-"))
    # before numba loads: cached code cannot be inspected, so nothing may come from a cache
    os.environ["NUMBA_CACHE_DIR"] = str(scratch / "numba")
    os.environ["MIXRT_CACHE_DIR"] = str(scratch / "mixrt")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import mixrt  # noqa: PLC0415
    from cases import make_case  # noqa: PLC0415
    for name in args.models:
        case = make_case(name, 1)
        session = mixrt.Session(str(case.path), opt_level=2)
        for _ in range(2):  # the first run is unplanned, the second takes the arena's paths
            session.run(None, case.feeds)
        print(f"ran {name}", flush=True)
    _report()


def _report() -> None:
    from numba.core.registry import CPUDispatcher  # noqa: PLC0415
    warnings.simplefilter("ignore")  # numba warns on every inspection of a cfunc's callers
    scanned = 0
    for dispatcher in (o for o in gc.get_objects() if isinstance(o, CPUDispatcher)):
        for signature in dispatcher.signatures:
            scanned += 1
            found = collections.Counter(GATHERS.findall(dispatcher.inspect_asm(signature)))
            if found:
                where = f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}"
                types = ", ".join(str(t) for t in signature)[:60]
                print(f"{where}({types}): {dict(found)}")
    print(f"{scanned} compiled signatures scanned")


if __name__ == "__main__":
    main()
