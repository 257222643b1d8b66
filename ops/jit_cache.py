"""Where mixrt keeps what it compiles: ``MIXRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/mixrt``
or ``~/.cache/mixrt``. The generated kernels' sources live in its ``jit/`` folder, the
markers of models whose kernels are compiled in ``warm/`` (``runtime/kernel_tiers.py``)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    configured = os.environ.get("MIXRT_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mixrt"
