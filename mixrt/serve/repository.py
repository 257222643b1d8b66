"""Where ``mixrt serve`` finds its models: one model file, or a repository laid out as
Triton's and KServe's are, ``REPO/NAME/VERSION/model.mxr`` (or ``model.onnx``).

Every version folder of a name is served at once, under its folder's name. A
``model-settings.json`` beside a model file (MLServer's) may set that version's own
``parameters.extra`` (its batch size, delay, device); the command line's are the default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlserver.errors import ModelNotFound
from mlserver.repository import ModelRepository
from mlserver.settings import ModelParameters, ModelSettings

from mixrt.base.errors import InputError

IMPLEMENTATION = "mixrt.serve.runtime.MixrtRuntime"
MODEL_FILES = ("model.mxr", "model.onnx")  # the first found is served


def model_settings(name: str, version: str | None, path: Path, extra: dict) -> ModelSettings:
    """MLServer's settings for one model file served by mixrt."""
    own = path.parent / "model-settings.json"
    if own.is_file() and version is not None:
        try:
            extra = {**extra, **json.loads(own.read_text()).get("parameters", {})
                     .get("extra", {})}
        except (ValueError, AttributeError) as exc:
            raise InputError(f"{own}: not a model-settings.json ({exc})") from None
    return ModelSettings(name=name, implementation=IMPLEMENTATION,
                         parameters=ModelParameters(uri=str(path.resolve()), version=version,
                                                    extra=extra))


def single_model(path: str, name: str, extra: dict) -> list[ModelSettings]:
    file = Path(path)
    if not file.is_file():
        raise InputError(f"{path}: no such model file")
    return [model_settings(name, None, file, extra)]


class MixrtModelRepository(ModelRepository):
    """MLServer's model repository over ``root/NAME/VERSION/model.{mxr,onnx}``: what the
    repository API (index, load, unload) and the start-up load see."""

    def __init__(self, root: str, extra: dict | None = None, single: dict | None = None):
        self._root = Path(root)
        self._extra = extra or {}
        # a served model file that is not in a repository: {"name": ..., "path": ...}
        self._single = single

    async def list(self) -> list[ModelSettings]:
        if self._single is not None:
            return single_model(self._single["path"], self._single["name"], self._extra)
        found = []
        for name_dir in sorted(p for p in self._root.iterdir() if p.is_dir()):
            for version_dir in sorted((p for p in name_dir.iterdir() if p.is_dir()),
                                      key=_version_order):
                file = next((version_dir / f for f in MODEL_FILES
                             if (version_dir / f).is_file()), None)
                if file is not None:
                    found.append(model_settings(name_dir.name, version_dir.name, file,
                                                self._extra))
        return found

    async def find(self, name: str) -> list[ModelSettings]:
        selected = [s for s in await self.list() if s.name == name]
        if not selected:
            raise ModelNotFound(name)
        return selected


def check_repository(root: str) -> None:
    """Refuse a repository with no model in it, naming the layout expected."""
    if not os.path.isdir(root):
        raise InputError(f"{root}: no such model file or repository folder")
    has_model = any((Path(root) / n / v / f).is_file()
                    for n in os.listdir(root) if (Path(root) / n).is_dir()
                    for v in os.listdir(Path(root) / n) if (Path(root) / n / v).is_dir()
                    for f in MODEL_FILES)
    if not has_model:
        raise InputError(f"{root}: no model found; a repository holds "
                         f"NAME/VERSION/model.mxr (or model.onnx)")


def _version_order(path: Path):
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)
