"""The real exports across shapes, for ``benchmarks/real_exports_sweep.py``: which models, at
which points, with which feeds.

``real_exports_bench.py`` times each model at the one shape it was tuned on (batch 1,
224x224 images, 64 tokens). Here every model is exported once with its batch axis (and,
where the exporter allows, its spatial or sequence axes) symbolic and timed at a grid of
points, so a kernel tuned for one shape shows up at the others:

* ``vision``: torchvision classifiers (and one timm ConvNeXt) at batch {1, 2, 8} x image
  {96, 160, 224}, one TorchScript export per model with batch, height and width symbolic;
* ``hf``: a BERT encoder and a GPT-2 decoder (2 layers, 64-wide heads, random seeded
  weights) per hidden size {64, 256, 768}, at batch {1, 2} x sequence {8, 16, 128};
* ``kv``: GPT-2 decode steps (one new token, the past keys/values as inputs) at hidden
  {256, 768} x past {16, 128, 512}, the past axis symbolic;
* ``classical``: the scikit-learn, LightGBM and XGBoost models of ``classical`` (converted
  with a symbolic batch already) at batch {1, 2, 64};
* ``quantized``: onnxruntime's dynamic quantization of BERT, static QDQ and QOperator
  quantization and a float16 conversion of the vision exports above, at two shapes each.

A model is a :class:`SweepModel`: its build recipe (cached by ``common.ensure`` like every
other export), its points, and a function that makes a point's feeds from the point's axes,
deterministically, so every process that measures the point feeds the same values.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import classical, hf, quantized
from .common import Recipe, ensure, rng, torch_seeded, version

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Point:
    label: str  # "b8_224", "b2_s128", "past512", "b64": what a row and --points name
    axes: tuple[tuple[str, int], ...]  # (("batch", 8), ("image", 224))
    quick: bool = False  # one of the extremes --quick keeps


@dataclass(frozen=True)
class SweepModel:
    name: str  # the cache name (benchmarks/.cache/real_exports/NAME.onnx)
    family: str  # vision, hf, kv, classical, quantized
    recipe: Recipe
    points: tuple[Point, ...]
    make_feeds: Callable[[dict[str, int]], Feeds]
    quick: bool = True  # whether --quick measures this model at all
    # "unoptimized": compare with onnxruntime without its graph optimizations (QDQ models:
    # its fusions replace dequantize-compute-quantize by integer kernels that round
    # differently); the timing is still against onnxruntime's defaults
    reference: str = "default"

    def feeds(self, point: Point) -> Feeds:
        return self.make_feeds(dict(point.axes))

    def point(self, label: str) -> Point:
        for point in self.points:
            if point.label == label:
                return point
        raise KeyError(f"{self.name} has no point {label!r}; its points: "
                       + ", ".join(p.label for p in self.points))


def _grid(first: tuple[str, tuple[int, ...]], second: tuple[str, tuple[int, ...]],
          label: Callable[[int, int], str]) -> tuple[Point, ...]:
    """Every (a, b) of two axes; the two corners (smallest, largest) are the quick ones."""
    (name_a, values_a), (name_b, values_b) = first, second
    corners = {(values_a[0], values_b[0]), (values_a[-1], values_b[-1])}
    return tuple(Point(label(a, b), ((name_a, a), (name_b, b)), (a, b) in corners)
                 for a in values_a for b in values_b)


def _axis(name: str, values: tuple[int, ...], label: Callable[[int], str]) -> tuple[Point, ...]:
    ends = {values[0], values[-1]}
    return tuple(Point(label(v), ((name, v),), v in ends) for v in values)


# -- vision ------------------------------------------------------------------------------------

VISION = ("mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_400mf",
          "shufflenet_v2_x1_0", "resnet18", "mobilenet_v2")
TIMM = ("convnext_atto",)
BATCHES = (1, 2, 8)
IMAGES = (96, 160, 224)


def _images(axes: dict[str, int]) -> Feeds:
    """Square images of side ``image`` (the grid's), or ``height`` x ``width`` (drawn.py's)."""
    height, width = axes.get("height", axes.get("image")), axes.get("width", axes.get("image"))
    return {"image": rng(5).random((axes["batch"], 3, height, width), dtype=np.float32)}


def _image_points() -> tuple[Point, ...]:
    return _grid(("batch", BATCHES), ("image", IMAGES), lambda b, s: f"b{b}_{s}")


def _export_image_model(torch, model, path: Path) -> None:
    """TorchScript exporter, opset 17, batch/height/width symbolic; traced at batch 2 so no
    size-1 batch is taken for a broadcast and frozen into the graph."""
    image = torch.from_numpy(_images({"batch": 2, "image": 224})["image"])
    axes = {"image": {0: "batch", 2: "height", 3: "width"}, "logits": {0: "batch"}}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (image,), str(path), dynamo=False, opset_version=17,
                          input_names=["image"], output_names=["logits"], dynamic_axes=axes)


def _calibrated(torch, model):
    """``model`` with its BatchNorm statistics taken from a few random images, as training
    leaves them. With the initial statistics (mean 0, variance 1) the activations of most
    of these networks shrink layer by layer: MobileNet's logits came out ~1e-10 and
    EfficientNet's ~1e-14, which any comparison with onnxruntime passes, and which leave
    static quantization nothing to calibrate on."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for offset in range(3):
            model(torch.from_numpy(rng(40 + offset).random((4, 3, 224, 224), dtype=np.float32)))
    return model.eval()


def _torchvision(name: str):
    def build(path: Path) -> Feeds:
        torch = torch_seeded()
        import torchvision  # noqa: PLC0415
        model = torchvision.models.get_model(name, weights=None)
        _export_image_model(torch, _calibrated(torch, model), path)
        return _images({"batch": 1, "image": 224})
    return build


def _timm(name: str):
    def build(path: Path) -> Feeds:
        torch = torch_seeded()
        import timm  # noqa: PLC0415
        model = timm.create_model(name, pretrained=False)
        _export_image_model(torch, _calibrated(torch, model), path)
        return _images({"batch": 1, "image": 224})
    return build


def _vision_models() -> list[SweepModel]:
    tv = f"torch.onnx TorchScript (torch {version('torch')}, torchvision {version('torchvision')})"
    tm = f"torch.onnx TorchScript (torch {version('torch')}, timm {version('timm')})"
    models = [SweepModel(f"sweep_tv_{name}", "vision", Recipe("vision", tv, _torchvision(name)),
                         _image_points(), _images) for name in VISION]
    models += [SweepModel(f"sweep_timm_{name}", "vision", Recipe("vision", tm, _timm(name)),
                          _image_points(), _images) for name in TIMM]
    return models


# -- transformers ------------------------------------------------------------------------------

HIDDEN = (64, 256, 768)
SEQUENCES = (8, 16, 128)
TEXT_BATCHES = (1, 2)
LAYERS = 2
HEAD_DIM = 64
VOCAB = 1000
POSITIONS = 1024  # the decode steps' 512 past tokens and one more


def _text(axes: dict[str, int], token_types: bool) -> Feeds:
    batch, seq = axes["batch"], axes["sequence"]
    mask = np.ones((batch, seq), np.int64)
    if seq > 1:
        mask[-1, seq - max(1, seq // 8):] = 0  # a padded tail in the last row
    feeds = {"input_ids": rng(1).integers(3, VOCAB, size=(batch, seq), dtype=np.int64),
             "attention_mask": mask}
    if token_types:
        types = (np.arange(seq) >= seq // 2).astype(np.int64)
        feeds["token_type_ids"] = np.broadcast_to(types, (batch, seq)).copy()
    return feeds


def _heads(hidden: int) -> int:
    """Heads of HEAD_DIM, or of 32 where ``hidden`` is an odd multiple of 32 (drawn.py)."""
    return hidden // HEAD_DIM if hidden % HEAD_DIM == 0 else hidden // 32


def text_exporter() -> str:
    return (f"torch.onnx TorchScript (torch {version('torch')}, "
            f"transformers {version('transformers')})")


def _bert(transformers, hidden: int):
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=LAYERS,
        num_attention_heads=_heads(hidden), intermediate_size=4 * hidden,
        max_position_embeddings=POSITIONS)
    return transformers.BertModel(config), ("last_hidden_state", "pooler_output")


def _gpt2_config(transformers, hidden: int):
    return transformers.GPT2Config(vocab_size=VOCAB, n_embd=hidden, n_layer=LAYERS,
                                   n_head=_heads(hidden), n_positions=POSITIONS)


def _gpt2(transformers, hidden: int):
    return transformers.GPT2LMHeadModel(_gpt2_config(transformers, hidden)), ("logits",)


def _text_recipe(make, hidden: int, token_types: bool):
    def build(path: Path) -> Feeds:
        import transformers  # noqa: PLC0415
        torch = torch_seeded()
        model, outputs = make(transformers, hidden)
        traced = _text({"batch": 2, "sequence": 16}, token_types)
        module = hf._plain(torch, model.eval(), outputs, list(traced))
        hf._export(torch, module, traced, path, outputs, dynamo=False,
                   dynamic={0: "batch", 1: "sequence"})
        return _text({"batch": 1, "sequence": 16}, token_types)
    return build


def _text_models() -> list[SweepModel]:
    exporter = text_exporter()
    points = _grid(("batch", TEXT_BATCHES), ("sequence", SEQUENCES), lambda b, s: f"b{b}_s{s}")
    models = []
    for hidden in HIDDEN:
        for kind, make, token_types in (("bert", _bert, True), ("gpt2", _gpt2, False)):
            models.append(SweepModel(
                f"sweep_{kind}_h{hidden}", "hf",
                Recipe("hf", exporter, _text_recipe(make, hidden, token_types)), points,
                lambda axes, t=token_types: _text(axes, t),
                quick=hidden in (HIDDEN[0], HIDDEN[-1])))
    return models


# -- decode steps with a KV cache --------------------------------------------------------------

KV_HIDDEN = (256, 768)
PASTS = (16, 128, 512)


def _past(axes: dict[str, int], hidden: int) -> Feeds:
    feeds = {"input_ids": rng(3).integers(3, VOCAB, size=(1, 1), dtype=np.int64)}
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng(10 + layer).standard_normal(
                (1, hidden // HEAD_DIM, axes["past"], HEAD_DIM)).astype(np.float32)
    return feeds


def _step_recipe(hidden: int):
    """``hf``'s decode step (flat past keys/values in, logits and presents out), exported
    with the batch and past axes symbolic (``hf``'s own is static: one past length)."""
    def build(path: Path) -> Feeds:
        import transformers  # noqa: PLC0415
        torch = torch_seeded()
        model = transformers.GPT2LMHeadModel(_gpt2_config(transformers, hidden)).eval()
        module = hf._with_cache(torch, transformers, model, LAYERS)
        traced = _past({"past": 32}, hidden)
        presents = [f"present_{kind}_{layer}" for layer in range(LAYERS)
                    for kind in ("key", "value")]
        axes = {"input_ids": {0: "batch"}, "logits": {0: "batch"}}
        axes.update({name: {0: "batch", 2: "past"} for name in traced if name != "input_ids"})
        axes.update({name: {0: "batch", 2: "total"} for name in presents})
        args = tuple(torch.from_numpy(value) for value in traced.values())
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                              input_names=list(traced), output_names=["logits", *presents],
                              dynamic_axes=axes)
        return _past({"past": 16}, hidden)
    return build


def _step_models() -> list[SweepModel]:
    exporter = text_exporter()
    points = _axis("past", PASTS, lambda p: f"past{p}")
    return [SweepModel(f"sweep_gpt2_kv_h{hidden}", "kv",
                       Recipe("hf", exporter, _step_recipe(hidden)), points,
                       lambda axes, h=hidden: _past(axes, h)) for hidden in KV_HIDDEN]


# -- classical ---------------------------------------------------------------------------------

CLASSICAL_BATCHES = (1, 2, 64)


def _rows(name: str, built_as: str | None = None, recipe: Recipe | None = None):
    """Feeds of ``batch`` rows of the model's own dataset, repeated past its end (its
    converter gave the input a symbolic batch axis), under the input name of the cached
    feeds of the model built as ``built_as`` by ``recipe`` (by default ``name``'s own)."""
    def make(axes: dict[str, int]) -> Feeds:
        batch = axes["batch"]
        built = ensure(built_as or name, recipe or _classical_recipe(name))
        input_name = next(iter(built.load_feeds()))
        if name == "sk_tfidf_logreg":
            return {input_name: classical._sentences(batch, 31).reshape(batch, 1)}
        x = classical.dataset_of(name)
        return {input_name: np.resize(x, (batch, x.shape[1]))}
    return make


def _classical_recipe(name: str) -> Recipe:
    """``classical``'s recipe, looked up only when it is built: listing it imports neither
    scikit-learn nor LightGBM nor XGBoost (``classical.BUILDERS`` would import all three)."""
    library = {"lgbm": "lightgbm", "xgb": "xgboost"}.get(name.split("_")[0])
    exporter = (f"onnxmltools {version('onnxmltools')} ({library} {version(library)})"
                if library else
                f"skl2onnx {version('skl2onnx')} (scikit-learn {version('scikit-learn')})")
    return Recipe("classical", exporter, lambda path: classical.BUILDERS[name].build(path))


def _classical_models() -> list[SweepModel]:
    points = _axis("batch", CLASSICAL_BATCHES, lambda b: f"b{b}")
    return [SweepModel(name, "classical", _classical_recipe(name), points, _rows(name))
            for name in classical._Lazy.NAMES]


# -- quantized and float16 ---------------------------------------------------------------------

def _static_recipe(source: SweepModel, qdq: bool):
    """``quantized._static`` over a sweep export: calibrated on four 224x224 images, the
    symbolic axes kept."""
    def build(path: Path) -> Feeds:
        from onnxruntime.quantization import QuantFormat, quantize_static  # noqa: PLC0415
        from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: PLC0415
        quantized._quiet()
        built = ensure(source.name, source.recipe)
        with tempfile.TemporaryDirectory() as scratch:
            prepared = Path(scratch) / "prepared.onnx"
            quant_pre_process(str(built.model), str(prepared))
            quantize_static(str(prepared), str(path), quantized._Images("image", (1, 3, 224, 224)),
                            quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator)
        return built.load_feeds()
    return build


def _float16_recipe(source: SweepModel):
    def build(path: Path) -> Feeds:
        import onnx  # noqa: PLC0415
        from onnxconverter_common import float16  # noqa: PLC0415
        built = ensure(source.name, source.recipe)
        model = float16.convert_float_to_float16(onnx.load(str(built.model)),
                                                 keep_io_types=True)
        onnx.save(model, str(path))
        return built.load_feeds()
    return build


def _quantized_models(vision: dict[str, SweepModel]) -> list[SweepModel]:
    quantizer = f"onnxruntime.quantization {version('onnxruntime')}"
    converter = f"onnxconverter-common {version('onnxconverter-common')} float16"
    images = (Point("b1_224", (("batch", 1), ("image", 224)), True),
              Point("b8_160", (("batch", 8), ("image", 160)), True))
    texts = (Point("b1_s16", (("batch", 1), ("sequence", 16)), True),
             Point("b2_s128", (("batch", 2), ("sequence", 128)), True))
    mobilenet, resnet = vision["mobilenet_v3_large"], vision["resnet18"]
    return [
        # quantized.py's own: its source (hf_bert_ts) has symbolic batch and sequence axes
        SweepModel("q_bert_dynamic", "quantized", quantized.BUILDERS["q_bert_dynamic"], texts,
                   lambda axes: _text(axes, token_types=True)),
        SweepModel("sweep_q_mobilenet_v3_large_qdq", "quantized",
                   Recipe("quantized", quantizer, _static_recipe(mobilenet, qdq=True)),
                   images, _images, reference="unoptimized"),
        SweepModel("sweep_q_mobilenet_v3_large_qop", "quantized",
                   Recipe("quantized", quantizer, _static_recipe(mobilenet, qdq=False)),
                   images, _images),
        SweepModel("sweep_q_resnet18_qop", "quantized",
                   Recipe("quantized", quantizer, _static_recipe(resnet, qdq=False)),
                   images, _images),
        SweepModel("sweep_fp16_efficientnet_b0", "quantized",
                   Recipe("float16", converter, _float16_recipe(vision["efficientnet_b0"])),
                   images, _images),
    ]


# -- all of them -------------------------------------------------------------------------------

def _models() -> dict[str, SweepModel]:
    vision = _vision_models()
    by_source = {model.name.removeprefix("sweep_tv_"): model for model in vision}
    every = [*vision, *_text_models(), *_step_models(), *_classical_models(),
             *_quantized_models(by_source)]
    return {model.name: model for model in every}


MODELS = _models()
FAMILIES = ("vision", "hf", "kv", "classical", "quantized")


def select(families=FAMILIES, names=None, quick: bool = False, seed: int | None = None
           ) -> list[tuple[SweepModel, list[Point]]]:
    """The models of ``families`` (or exactly ``names``) with the points a run measures:
    the grid's (``seed`` None) or those ``drawn.models(seed)`` draws."""
    from . import drawn  # noqa: PLC0415
    every = MODELS if seed is None else drawn.models(seed)
    chosen = []
    for model in every.values():
        if names:
            if model.name not in names:
                continue
        elif model.family not in families or (quick and not model.quick):
            continue
        points = [p for p in model.points if p.quick or not quick]
        chosen.append((model, points))
    unknown = set(names or ()) - set(every)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; the sweep's models: "
                         + ", ".join(every))
    return chosen
