"""Symbol files read back, without pickle: mixrt's own symbol JSON (``symbol_json.py``,
which ``Symbol.tojson`` and ``Symbol.save`` write) and MXNet 1.x's (no "format"; "nodes",
"arg_nodes" and "heads"), read by :mod:`mixrt.sym.mxnet_json`, whose nodes are rebuilt by
the MXNet-named symbol functions above the Symbol class.
"""

from __future__ import annotations

import os
import stat

from mixrt.base.errors import ModelLoadError
from mixrt.sym import mxnet_json, symbol_json
from mixrt.sym.symbol import Symbol


def from_json(text: str, source: str = "<string>") -> Symbol:
    """A Symbol from symbol JSON text, mixrt's or MXNet's (``source`` names it in errors)."""
    try:
        document = symbol_json.parsed(text, source)
        if mxnet_json.is_mxnet_document(document):
            return mxnet_json.symbol_from_document(document, source)
        if not symbol_json.is_mixrt_document(document):
            raise ModelLoadError(f"{source}: not a mixrt symbol file (expected \"format\": "
                                 f"\"{symbol_json.FORMAT}\") nor an MXNet one (\"nodes\", "
                                 f"\"arg_nodes\", \"heads\")")
        return Symbol(symbol_json.outputs_of(document, source))
    except RecursionError:
        raise symbol_json.too_deep(source) from None


def load_json(text: str) -> Symbol:
    """A Symbol from :meth:`Symbol.tojson` text."""
    return from_json(text)


def load(path) -> Symbol:
    """A Symbol from a file written by :meth:`Symbol.save`."""
    from pathlib import Path  # noqa: PLC0415
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO blocks, /dev/zero never ends
            raise ModelLoadError(f"{path}: not a regular file; expected a symbol JSON file")
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"{path}: cannot read symbol file: {error}") from None
    return from_json(text, str(path))

