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
from pathlib import Path

from mixrt.runtime.kernel_tiers import write_marker
from mixrt.runtime.npz import read_npz, restored
from mixrt.runtime.session import Session


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
    session = Session(model, opt_level=opt_level)
    session.run(None, feeds)
    session.run(None, feeds)


def _feeds(spec: dict) -> dict:
    arrays = read_npz(spec["feeds"], "feeds")
    dtypes = spec.get("feed_dtypes", {})
    return {name: restored(arrays[f"feed{i}"], dtypes.get(name))
            for i, name in enumerate(spec["feed_names"])}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
