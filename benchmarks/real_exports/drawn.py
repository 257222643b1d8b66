"""The sweep's models and points drawn at random for each run, for
``benchmarks/real_exports_sweep.py``: no grid of shapes exists to tune kernels to.

``sweeps.MODELS`` is the fixed grid (batch {1, 2, 8} x image {96, 160, 224}, hidden {64,
256, 768} x sequence {8, 16, 128}, ...), which kernels were tuned on and which the kernel
corpus (``record_kernels.py``) and the cold-start benchmark still use. :func:`models` draws
instead, from one seed (printed by the sweep, so that a run can be repeated):

* ``vision``: each classifier at 4 points, batch 1-32 and height and width 64-512 px in
  steps of 8, at most 8 x 224 x 224 pixels a call (a larger batch is cut);
* ``hf``: BERT and GPT-2 at 3 hidden sizes each, 32-1024 in steps of 32 (heads of 64, or
  of 32 where the size is an odd multiple of 32), each at 4 points, batch 1-32 and sequence
  1-512, at most 4,096 tokens a call;
* ``kv``: GPT-2 decode steps at 2 hidden sizes (64-1024, steps of 64), past 1-512, 3 points;
* ``classical``: each estimator at 3 batches of 1-10,000 rows (its dataset's rows repeated);
  the tree ensembles with 10-1,000 trees, drawn per run;
* ``quantized``: the quantized and float16 models at 2 drawn shapes each.

Sizes and batches are drawn evenly on a log scale (as many of 1-32 rows as of 32-1,000),
image sides evenly. Each model draws from a generator of its own, seeded by the run's seed
and its name, so ``--models`` repeats the full run's points for the models it names. The
points a ``--quick`` run keeps are each model's smallest and largest, and only the
smallest and largest hidden size of each text architecture.
"""

from __future__ import annotations

import random
from dataclasses import replace


from . import classical, sweeps
from .common import Recipe, drawn_rng, log_uniform
from .sweeps import Point, SweepModel

IMAGE_PIXELS = 8 * 224 * 224  # the most pixels (batch x height x width) a point feeds
TOKENS = 4096  # the most tokens (batch x sequence) a point feeds
TREE_ESTIMATORS = ("sk_random_forest", "sk_gradient_boosting", "sk_extra_trees_regressor",
                   "lgbm_classifier", "lgbm_multiclass", "lgbm_regressor", "xgb_classifier",
                   "xgb_regressor")


def _marked(points: list[Point], size) -> tuple[Point, ...]:
    """``points`` in order of ``size`` (a point's axes -> a number), the smallest and the
    largest marked as the ones ``--quick`` keeps; repeated labels dropped."""
    unique = list({point.label: point for point in points}.values())
    unique.sort(key=lambda point: size(dict(point.axes)))
    ends = {unique[0].label, unique[-1].label}
    return tuple(replace(point, quick=point.label in ends) for point in unique)


# -- points ------------------------------------------------------------------------------------

def image_points(rng: random.Random, count: int) -> tuple[Point, ...]:
    points = []
    for _ in range(count):
        height, width = rng.randrange(64, 513, 8), rng.randrange(64, 513, 8)
        batch = max(1, min(log_uniform(rng, 1, 32), IMAGE_PIXELS // (height * width)))
        points.append(Point(f"b{batch}_{height}x{width}",
                            (("batch", batch), ("height", height), ("width", width))))
    return _marked(points, lambda a: a["batch"] * a["height"] * a["width"])


def text_points(rng: random.Random, count: int, longest: int = 512) -> tuple[Point, ...]:
    points = []
    for _ in range(count):
        sequence = log_uniform(rng, 1, longest)
        batch = max(1, min(log_uniform(rng, 1, 32), TOKENS // sequence))
        points.append(Point(f"b{batch}_s{sequence}", (("batch", batch), ("sequence", sequence))))
    return _marked(points, lambda a: a["batch"] * a["sequence"])


def past_points(rng: random.Random, count: int) -> tuple[Point, ...]:
    return _marked([Point(f"past{p}", (("past", p),))
                    for p in (log_uniform(rng, 1, 512) for _ in range(count))],
                   lambda a: a["past"])


def row_points(rng: random.Random, count: int) -> tuple[Point, ...]:
    return _marked([Point(f"b{b}", (("batch", b),))
                    for b in (log_uniform(rng, 1, 10_000) for _ in range(count))],
                   lambda a: a["batch"])


# -- models ------------------------------------------------------------------------------------

def _vision(seed: int, grid: dict) -> list[SweepModel]:
    return [replace(model, points=image_points(drawn_rng(seed, model.name), 4))
            for model in grid.values() if model.family == "vision"]


def _hidden_sizes(rng: random.Random, count: int, step: int) -> list[int]:
    drawn = {max(step, round(log_uniform(rng, step, 1024) / step) * step)
             for _ in range(count)}
    return sorted(drawn)


def _text(seed: int) -> list[SweepModel]:
    exporter = sweeps.text_exporter()
    models = []
    for kind, make, token_types in (("bert", sweeps._bert, True), ("gpt2", sweeps._gpt2, False)):
        sizes = _hidden_sizes(drawn_rng(seed, f"{kind} hidden"), 3, 32)
        for hidden in sizes:
            name = f"sweep_{kind}_h{hidden}"
            models.append(SweepModel(
                name, "hf", Recipe("hf", exporter, sweeps._text_recipe(make, hidden, token_types)),
                text_points(drawn_rng(seed, name), 4),
                lambda axes, t=token_types: sweeps._text(axes, t),
                quick=hidden in (sizes[0], sizes[-1])))
    return models


def _steps(seed: int) -> list[SweepModel]:
    exporter = sweeps.text_exporter()
    return [SweepModel(f"sweep_gpt2_kv_h{hidden}", "kv",
                       Recipe("hf", exporter, sweeps._step_recipe(hidden)),
                       past_points(drawn_rng(seed, f"kv {hidden}"), 3),
                       lambda axes, h=hidden: sweeps._past(axes, h))
            for hidden in _hidden_sizes(drawn_rng(seed, "kv hidden"), 2, 64)]


def _classical(seed: int, grid: dict) -> list[SweepModel]:
    models = []
    for name in classical._Lazy.NAMES:
        source, rng = grid[name], drawn_rng(seed, name)
        if name in TREE_ESTIMATORS:
            trees = log_uniform(rng, 10, 1000)
            recipe = _trees_recipe(name, trees)
            models.append(replace(source, name=f"{name}_t{trees}", recipe=recipe,
                                  points=row_points(rng, 3),
                                  make_feeds=sweeps._rows(name, f"{name}_t{trees}", recipe)))
        else:
            models.append(replace(source, points=row_points(rng, 3)))  # sweeps._rows feeds
    return models


def _trees_recipe(name: str, trees: int) -> Recipe:
    """``classical``'s recipe for ``name`` with ``trees`` estimators."""
    base = sweeps._classical_recipe(name)
    return Recipe(base.family, base.exporter, lambda path: classical.build_with_trees(
        name, trees, path))


def _quantized(seed: int, grid: dict) -> list[SweepModel]:
    models = []
    for model in grid.values():
        if model.family != "quantized":
            continue
        rng = drawn_rng(seed, model.name)
        # the quantized BERT is hf.py's, whose positions end at 128
        drawn = text_points(rng, 2, longest=128) if "sequence" in dict(model.points[0].axes) \
            else image_points(rng, 2)
        models.append(replace(model, points=drawn))
    return models


def models(seed: int) -> dict[str, SweepModel]:
    """Every model of the sweep, its points (and the text models' hidden sizes, the tree
    ensembles' tree counts) drawn under ``seed``."""
    grid = sweeps.MODELS
    every = [*_vision(seed, grid), *_text(seed), *_steps(seed), *_classical(seed, grid),
             *_quantized(seed, grid)]
    return {model.name: model for model in every}
