"""Where ``mixrt serve`` finds its models: one model file; a folder that holds one
(``model.mxr`` or ``model.onnx``, as KServe's storage initializer lays out ``/mnt/models``);
or a repository laid out as Triton's and KServe's are, ``REPO/NAME/VERSION/model.mxr``.

Every version folder of a name is served at once, under its folder's name. A
``model-settings.json`` beside a model file may set that version's own
``parameters.extra`` (its batch size, delay, queue, device); the command line's are the
default. Nothing here knows the server framework: ``model.py`` loads what this finds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from mixrt.base.errors import InputError

MODEL_FILES = ("model.mxr", "model.onnx")  # the first found is served


@dataclass(frozen=True)
class Entry:
    """One model file to serve: its name, version (None for a lone file) and settings."""

    name: str
    version: str | None
    path: str
    extra: dict


def entries(root: str, extra: dict, single: dict | None = None) -> list[Entry]:
    """What ``root`` serves, a name's versions in order; ``single`` ({"name", "path"}): a
    model file served on its own instead."""
    if single is not None:
        return [lone_entry(single["path"], single["name"], extra)]
    found = []
    for name_dir in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        for version_dir in sorted((p for p in name_dir.iterdir() if p.is_dir()),
                                  key=_version_order):
            file = model_file(version_dir)
            if file is not None:
                found.append(Entry(name_dir.name, version_dir.name, str(file.resolve()),
                                   _own_settings(file, extra)))
    return found


def lone_entry(path: str, name: str, extra: dict) -> Entry:
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{path}: no such model file")
    return Entry(name, None, str(file.resolve()), extra)


def model_file(folder: Path) -> Path | None:
    return next((folder / f for f in MODEL_FILES if (folder / f).is_file()), None)


def _own_settings(file: Path, extra: dict) -> dict:
    own = file.parent / "model-settings.json"
    if not own.is_file():
        return extra
    try:
        return {**extra, **json.loads(own.read_text()).get("parameters", {})
                .get("extra", {})}
    except (ValueError, AttributeError) as exc:
        raise InputError(f"{own}: not a model-settings.json ({exc})") from None


def check_repository(root: str) -> None:
    """Refuse a repository with no model in it, naming the layouts expected."""
    if not os.path.isdir(root):
        raise InputError(f"{root}: no such model file or repository folder")
    has_model = any((Path(root) / n / v / f).is_file()
                    for n in os.listdir(root) if (Path(root) / n).is_dir()
                    for v in os.listdir(Path(root) / n) if (Path(root) / n / v).is_dir()
                    for f in MODEL_FILES)
    if not has_model:
        raise InputError(f"{root}: no model found; a folder holds model.mxr (or "
                         f"model.onnx), a repository NAME/VERSION/model.mxr")


def _version_order(path: Path):
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)
