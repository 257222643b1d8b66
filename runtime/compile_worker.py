"""The background compiler's child process: ``python -m mixrt.runtime.compile_worker JOB``.

It loads the model a session runs, runs it on the feeds of the session's first run with
compiling in the foreground, so numba compiles exactly the kernels and signatures that
session calls into the disk cache, and then writes the warm marker that tells every later
session of that model and signature to use them at once (``runtime/kernel_tiers.py``).
It runs at a lower priority than the process it compiles for, which keeps serving meanwhile.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m mixrt.runtime.compile_worker JOB.json", file=sys.stderr)
        return 2
    os.environ["MIXRT_COMPILE"] = "foreground"
    try:
        os.nice(10)
    except OSError:
        pass  # priority is a courtesy to the serving process, not a requirement
    spec = json.loads(Path(argv[0]).read_text())
    compile_model(spec["model"], spec["opt_level"], _feeds(spec))
    write_marker(Path(spec["marker"]), spec["model"])
    return 0


def compile_model(model: str, opt_level: int, feeds: dict) -> None:
    """Run ``model`` twice on ``feeds`` (the discovery and planned runs of the first call,
    then a planned run that may replay its calls), compiling every kernel they call."""
    from mixrt.runtime.session import Session  # noqa: PLC0415
    session = Session(model, opt_level=opt_level)
    session.run(None, feeds)
    session.run(None, feeds)


def write_marker(marker: Path, model: str) -> None:
    """The marker file, written atomically (several processes may write it at once)."""
    marker.parent.mkdir(parents=True, exist_ok=True)
    temporary = marker.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({
        "model": model, "compiled": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid()}))
    os.replace(temporary, marker)


def storable(array) -> tuple[np.ndarray, str | None]:
    """``array`` in a form an .npy file records without pickle, and the dtype to restore on
    reading (None: stored as it is). Strings held as Python objects become a fixed-width
    unicode array; types NumPy's header cannot name (bfloat16, float8, int4 from
    ml_dtypes) travel as raw bytes of their width."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        return array.astype(np.str_), "object"
    recorded = np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(array.dtype))
    if recorded != array.dtype:
        raw = np.dtype(f"V{array.dtype.itemsize}")  # same width, so 0-d arrays view too
        contiguous = array if array.flags.c_contiguous else array.copy()
        return contiguous.view(raw), array.dtype.name
    return array, None


def restored(array: np.ndarray, dtype: str | None) -> np.ndarray:
    """The array ``storable`` stored, as it was."""
    if dtype is None:
        return array
    if dtype == "object":
        return array.astype(object)
    import ml_dtypes  # noqa: PLC0415
    return array.view(np.dtype(getattr(ml_dtypes, dtype)))


def _feeds(spec: dict) -> dict:
    from mixrt.runtime.npz import read_npz  # noqa: PLC0415
    arrays = read_npz(spec["feeds"], "feeds")
    dtypes = spec.get("feed_dtypes", {})
    return {name: restored(arrays[f"feed{i}"], dtypes.get(name))
            for i, name in enumerate(spec["feed_names"])}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
