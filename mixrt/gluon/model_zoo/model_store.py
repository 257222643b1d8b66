"""Where a model zoo network's pretrained weights come from: a file already under ``root``.

MXNet 1.x downloads ``<name>-<hash>.params`` into ``$MXNET_HOME/models``; mixrt downloads
nothing, so ``pretrained=True`` loads such a file if it is there (with or without the
hash in its name) and otherwise says where it looked.
"""

from __future__ import annotations

import glob
import os

from mixrt.base.errors import ModelLoadError


def default_root() -> str:
    """``$MXNET_HOME/models``, MXNET_HOME defaulting to ``~/.mxnet`` as in MXNet."""
    home = os.environ.get("MXNET_HOME", os.path.join("~", ".mxnet"))
    return os.path.join(os.path.expanduser(home), "models")


def get_model_file(name: str, root: str | None = None) -> str:
    """The path of ``name``'s parameter file under ``root``: ``<name>.params`` or MXNet's
    ``<name>-<hash>.params``."""
    root = os.path.expanduser(root) if root is not None else default_root()
    exact = os.path.join(root, f"{name}.params")
    if os.path.isfile(exact):
        return exact
    hashed = sorted(glob.glob(os.path.join(glob.escape(root), f"{glob.escape(name)}-*.params")))
    if hashed:
        return hashed[0]
    raise ModelLoadError(f"pretrained {name!r}: no {name}.params or {name}-<hash>.params in "
                         f"{root!r}, and mixrt downloads nothing; put MXNet's file there, or "
                         f"pass pretrained=False")


def load_pretrained(net, name: str, ctx=None, root: str | None = None):
    """``net`` with ``name``'s weights from ``root`` loaded on ``ctx``."""
    net.load_parameters(get_model_file(name, root), ctx=ctx)
    return net
