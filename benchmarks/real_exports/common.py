"""What every builder shares: where models go, how they are saved with their feeds, seeds."""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "real_exports"
SEED = 0


@dataclass(frozen=True)
class Built:
    """A model on disk, the feeds it is measured with, and where it came from."""

    name: str
    family: str  # hf, vision, quantized, float16, classical
    exporter: str  # e.g. "torch.onnx (TorchScript)", "skl2onnx 1.20"
    model: Path
    feeds: Path  # .npz, no pickle: numeric and unicode arrays only

    def load_feeds(self) -> dict[str, np.ndarray]:
        with np.load(self.feeds, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}


@dataclass(frozen=True)
class Recipe:
    family: str
    exporter: str
    build: Callable[[Path], dict[str, np.ndarray]]  # writes the model there, returns feeds


def model_path(name: str) -> Path:
    return CACHE / f"{name}.onnx"


def ensure(name: str, recipe: Recipe) -> Built:
    """The model ``name``, built by ``recipe`` unless an earlier run left it in the cache.

    A build writes to a temporary name and renames at the end, so an interrupted build never
    leaves a model that looks finished."""
    path = model_path(name)
    feeds_path = path.with_suffix(".npz")
    meta_path = path.with_suffix(".json")
    if not (path.exists() and feeds_path.exists() and meta_path.exists()):
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{name}.partial.onnx")
        feeds = recipe.build(partial)
        np.savez(feeds_path, **feeds)
        partial.replace(path)
        meta_path.write_text(json.dumps({"family": recipe.family, "exporter": recipe.exporter}))
    meta = json.loads(meta_path.read_text())
    return Built(name, meta["family"], meta["exporter"], path, feeds_path)


def rng(offset: int = 0) -> np.random.Generator:
    return np.random.default_rng(SEED + offset)


def torch_seeded(seed: int = SEED):
    """torch with its global generator seeded (weights of a module built after this call)."""
    import torch  # noqa: PLC0415
    torch.manual_seed(seed)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    return torch


def version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version as _version  # noqa: PLC0415
    try:
        return _version(package)
    except PackageNotFoundError:
        return "?"


def describe(built: Built) -> dict:
    return {key: str(value) for key, value in asdict(built).items()}


def drawn_rng(seed: int, name: str):
    """A generator of its own for what ``name`` draws under a run's ``seed``: the same draws
    whichever others the run makes (a string seed hashes alike in every process)."""
    return random.Random(f"{seed}:{name}")


def log_uniform(rng, low: int, high: int) -> int:
    """An integer of low..high even on a log scale (as many of 8 to 64 as of 64 to 512): a
    service's mix of short requests and long ones, of small batches and large."""
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
