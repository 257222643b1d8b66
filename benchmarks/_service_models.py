"""The models service_regimes.py measures, drawn afresh on every run from wide ranges, so no
grid of shapes exists to tune to; built with the exporters' own packages and the helpers of
``real_exports/`` (tracing, exporting, BatchNorm calibration, saving).

Every slot draws from its own generator, seeded by the run's seed and the slot's name: a
slot draws the same model and shapes whichever other slots a run takes, so ``--seed S
--models bert`` repeats the full run's BERT. Per slot: the architecture's sizes, the fixed
shape of the hot and paced regimes, the shape of the agreement check, and 200 shapes for the
new-shape regime (a request each). Builds are cached in ``.cache/service_regimes/<seed>/``
under a name that carries a digest of the drawn sizes.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from real_exports import classical, sweeps  # noqa: E402
from real_exports.common import drawn_rng, log_uniform, torch_seeded  # noqa: E402

CACHE = HERE / ".cache" / "service_regimes"
SLOTS = ("bert", "gpt2", "encoder2", "cnn1", "cnn2", "mlp", "trees", "boosted", "logreg")
QUICK_SLOTS = ("mlp", "logreg", "bert")
VISION = ("resnet18", "mobilenet_v3_small", "squeezenet1_1", "shufflenet_v2_x1_0",
          "mobilenet_v2", "efficientnet_b0", "regnet_y_400mf")
NEW_SHAPES = 200  # the most requests a regime makes
# what one request may cost, so the largest drawn model stays within seconds a request:
# tokens (batch x sequence) and pixels (batch x height x width) at most
HOT_TOKENS, NEW_TOKENS = 256, 512
HOT_PIXELS, NEW_PIXELS = 2 * 224 * 224, 4 * 224 * 224


@dataclass(frozen=True)
class Drawn:
    slot: str
    kind: str  # the architecture or estimator: bert, roberta, resnet18, xgboost, ...
    family: str  # text, image, rows
    config: dict  # the drawn sizes the build takes
    seed: int  # the slot's own: feeds and fitted data
    hot: dict  # axes of the hot and paced regimes' one shape
    compare: dict  # axes of the agreement check
    new_shapes: tuple  # axes of each new-shape request

    @property
    def label(self) -> str:
        return self.slot if self.slot == self.kind else f"{self.slot} ({self.kind})"

    def sizes(self) -> str:
        drawn = ", ".join(f"{k} {'-'.join(map(str, v)) if isinstance(v, list) else v}"
                          for k, v in self.config.items())
        return f"{drawn}; hot {shape(self.hot)}"

    def digest(self) -> str:
        key = json.dumps([self.kind, self.config, self.seed], sort_keys=True)
        return hashlib.sha1(key.encode()).hexdigest()[:10]


def shape(axes: dict) -> str:
    """b2 s64 (batch, sequence), b1 224x160 (batch, height x width), b16 (rows)."""
    text = f"b{axes['batch']}"
    if "sequence" in axes:
        return f"{text} s{axes['sequence']}"
    return f"{text} {axes['height']}x{axes['width']}" if "height" in axes else text


# -- drawing -----------------------------------------------------------------------------------

def _text_axes(rng: random.Random, longest: int, tokens: int) -> dict:
    sequence = log_uniform(rng, 8, longest)
    return {"batch": rng.randint(1, max(1, min(4, tokens // sequence))), "sequence": sequence}


def _image_axes(rng: random.Random, largest: int, batches: int, pixels: int) -> dict:
    height, width = (32 * rng.randint(2, largest // 32) for _ in range(2))
    return {"batch": rng.randint(1, max(1, min(batches, pixels // (height * width)))),
            "height": height, "width": width}


def _rows_axes(rng: random.Random, rows: int) -> dict:
    return {"batch": rng.randint(1, rows)}


def _text(slot: str, kind: str, rng: random.Random, quick: bool) -> Drawn:
    hidden = 128 if quick else rng.randrange(128, 769, 64)
    heads = rng.choice([h for h in (2, 4, 8, 12)  # heads 32 to 128 wide, as real models'
                        if hidden % h == 0 and 32 <= hidden // h <= 128])
    config = {"hidden": hidden, "heads": heads, "layers": 2 if quick else rng.randint(2, 6),
              "vocab": 1000 if quick else rng.randrange(1000, 8001, 500),
              "positions": 128 if quick else rng.choice((128, 256, 512))}
    longest = min(512, config["positions"])
    return Drawn(slot, kind, "text", config, rng.randrange(2 ** 31),
                 _text_axes(rng, min(longest, HOT_TOKENS), HOT_TOKENS),
                 _text_axes(rng, longest, NEW_TOKENS),
                 tuple(_text_axes(rng, longest, NEW_TOKENS) for _ in range(NEW_SHAPES)))


def _image(slot: str, kind: str, rng: random.Random) -> Drawn:
    config = {"classes": rng.randint(10, 1000)}
    return Drawn(slot, kind, "image", config, rng.randrange(2 ** 31),
                 _image_axes(rng, 320, 4, HOT_PIXELS), _image_axes(rng, 384, 16, NEW_PIXELS),
                 tuple(_image_axes(rng, 384, 16, NEW_PIXELS) for _ in range(NEW_SHAPES)))


def _rows(slot: str, kind: str, config: dict, rng: random.Random, rows: int) -> Drawn:
    return Drawn(slot, kind, "rows", config, rng.randrange(2 ** 31), _rows_axes(rng, 16),
                 _rows_axes(rng, rows), tuple(_rows_axes(rng, rows) for _ in range(NEW_SHAPES)))


def _mlp(slot: str, rng: random.Random, quick: bool) -> Drawn:
    widest = 512 if quick else 2048
    config = {"inputs": log_uniform(rng, 16, 1024),
              "widths": [log_uniform(rng, 32, widest) for _ in range(rng.randint(1, 4))],
              "outputs": rng.randint(2, 1000), "activation": rng.choice(("relu", "gelu"))}
    return _rows(slot, "mlp", config, rng, 16)


def _trees(slot: str, rng: random.Random) -> Drawn:
    kind = rng.choice(("random_forest", "decision_tree"))
    config = {"features": rng.randint(8, 64), "classes": rng.randint(2, 5),
              "depth": rng.randint(4, 12)}
    if kind == "random_forest":
        config["trees"] = rng.randint(10, 300)
    return _rows(slot, kind, config, rng, 64)


def _boosted(slot: str, rng: random.Random) -> Drawn:
    config = {"features": rng.randint(8, 64), "classes": rng.randint(2, 5),
              "trees": rng.randint(10, 300), "depth": rng.randint(3, 8)}
    return _rows(slot, rng.choice(("xgboost", "lightgbm")), config, rng, 64)


def _logreg(slot: str, rng: random.Random) -> Drawn:
    config = {"features": rng.randint(8, 256), "classes": rng.randint(2, 10)}
    return _rows(slot, "scaled_logreg", config, rng, 64)


def draw(slot: str, seed: int, quick: bool = False) -> Drawn:
    rng = drawn_rng(seed, slot)
    if slot in ("bert", "gpt2"):
        return _text(slot, slot, rng, quick)
    if slot == "encoder2":
        return _text(slot, rng.choice(("distilbert", "roberta")), rng, quick)
    if slot in ("cnn1", "cnn2"):  # two different architectures, from one shared draw
        pair = drawn_rng(seed, "cnn").sample(VISION, 2)
        return _image(slot, pair[int(slot[-1]) - 1], rng)
    if slot == "mlp":
        return _mlp(slot, rng, quick)
    draws = {"trees": _trees, "boosted": _boosted, "logreg": _logreg}
    if slot not in draws:
        raise SystemExit(f"unknown model {slot!r}; the models: {', '.join(SLOTS)}")
    return draws[slot](slot, rng)


# -- building ----------------------------------------------------------------------------------

def _bert(transformers, c):
    config = transformers.BertConfig(
        vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"], intermediate_size=4 * c["hidden"],
        max_position_embeddings=c["positions"])
    return transformers.BertModel(config), ("last_hidden_state", "pooler_output")


def _gpt2(transformers, c):
    config = transformers.GPT2Config(vocab_size=c["vocab"], n_embd=c["hidden"],
                                     n_layer=c["layers"], n_head=c["heads"],
                                     n_positions=c["positions"],
                                     # GPT-2's own 50256 is past a drawn vocabulary's end
                                     bos_token_id=c["vocab"] - 1, eos_token_id=c["vocab"] - 1)
    return transformers.GPT2LMHeadModel(config), ("logits",)


def _distilbert(transformers, c):
    config = transformers.DistilBertConfig(
        vocab_size=c["vocab"], dim=c["hidden"], n_layers=c["layers"], n_heads=c["heads"],
        hidden_dim=4 * c["hidden"], max_position_embeddings=c["positions"])
    return transformers.DistilBertModel(config), ("last_hidden_state",)


def _roberta(transformers, c):
    # RoBERTa's positions start after its padding index: two more for the same lengths
    config = transformers.RobertaConfig(
        vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"], intermediate_size=4 * c["hidden"],
        max_position_embeddings=c["positions"] + 2)
    return transformers.RobertaModel(config), ("last_hidden_state", "pooler_output")


TEXT = {"bert": _bert, "gpt2": _gpt2, "distilbert": _distilbert, "roberta": _roberta}


def _build_text(drawn: Drawn, path: Path) -> None:
    """The sweep's TorchScript export, opset 17, batch and sequence symbolic, traced at
    batch 2 x 16 tokens."""
    make = TEXT[drawn.kind]
    build = sweeps._text_recipe(lambda transformers, _: make(transformers, drawn.config),
                                drawn.config["hidden"], token_types=drawn.kind == "bert")
    build(path)


def _build_image(drawn: Drawn, path: Path) -> None:
    """The sweep's export: batch, height and width symbolic, BatchNorm statistics taken from
    random images so the activations do not vanish layer by layer."""
    torch = torch_seeded()
    import torchvision  # noqa: PLC0415
    model = torchvision.models.get_model(drawn.kind, weights=None,
                                         num_classes=drawn.config["classes"])
    sweeps._export_image_model(torch, sweeps._calibrated(torch, model), path)


def _build_mlp(drawn: Drawn, path: Path) -> None:
    torch = torch_seeded()
    c = drawn.config
    widths = [c["inputs"], *c["widths"], c["outputs"]]
    layers = []
    for width_in, width_out in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(width_in, width_out),
                   torch.nn.ReLU() if c["activation"] == "relu" else torch.nn.GELU()]
    model = torch.nn.Sequential(*layers[:-1]).eval()  # no activation after the last layer
    traced = torch.randn(2, c["inputs"])  # batch 2: no size-1 batch frozen into the graph
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (traced,), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})


def _fitted(drawn: Drawn):
    from sklearn.datasets import make_classification  # noqa: PLC0415
    c = drawn.config
    x, y = make_classification(n_samples=1000, n_features=c["features"],
                               n_informative=max(3, c["features"] // 2),
                               n_classes=c["classes"], random_state=drawn.seed % 2 ** 31)
    return x.astype("float32"), y, _estimator(drawn)


def _estimator(drawn: Drawn):
    c = drawn.config
    if drawn.kind == "xgboost":
        import xgboost  # noqa: PLC0415
        return xgboost.XGBClassifier(n_estimators=c["trees"], max_depth=c["depth"], n_jobs=1)
    if drawn.kind == "lightgbm":
        import lightgbm  # noqa: PLC0415
        return lightgbm.LGBMClassifier(n_estimators=c["trees"], max_depth=c["depth"],
                                       verbose=-1, n_jobs=1)
    from sklearn import ensemble, linear_model, pipeline, preprocessing, tree  # noqa: PLC0415
    if drawn.kind == "random_forest":
        return ensemble.RandomForestClassifier(n_estimators=c["trees"], max_depth=c["depth"],
                                               random_state=0, n_jobs=1)
    if drawn.kind == "decision_tree":
        return tree.DecisionTreeClassifier(max_depth=c["depth"], random_state=0)
    return pipeline.make_pipeline(preprocessing.StandardScaler(),
                                  linear_model.LogisticRegression(max_iter=500))


def _build_rows(drawn: Drawn, path: Path) -> None:
    """skl2onnx for scikit-learn (opset 17), onnxmltools for the boosters (opset 15, the
    most they convert at); probabilities as one tensor (no ZipMap), batch symbolic."""
    x, y, estimator = _fitted(drawn)
    estimator.fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if drawn.kind in ("xgboost", "lightgbm"):
            import onnxmltools  # noqa: PLC0415
            from onnxmltools.convert.common.data_types import FloatTensorType  # noqa: PLC0415
            convert = getattr(onnxmltools, f"convert_{drawn.kind}")
            extra = {"zipmap": False} if drawn.kind == "lightgbm" else {}
            model = convert(estimator, initial_types=[("input", FloatTensorType(
                [None, x.shape[1]]))], target_opset=15, **extra)
        else:
            from skl2onnx import to_onnx  # noqa: PLC0415
            model = to_onnx(estimator, x[:1], options={"zipmap": False}, target_opset=17)
    classical._save(model, path)


BUILD = {"text": _build_text, "image": _build_image, "rows": _build_rows}


def build(drawn: Drawn, seed: int) -> Path:
    """The model's .onnx file, built unless an earlier run with this seed left it; written
    under a temporary name first, so an interrupted build never looks finished."""
    path = CACHE / str(seed) / f"{drawn.slot}-{drawn.digest()}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}.partial.onnx")
        builder = _build_mlp if drawn.kind == "mlp" else BUILD[drawn.family]
        builder(drawn, partial)
        partial.replace(path)
    return path


# -- what the child needs to feed it -----------------------------------------------------------

ROLES = {"text": ("batch", "sequence"), "image": ("batch", None, "height", "width"),
         "rows": ("batch", None)}
KINDS = {"input_ids": "tokens", "attention_mask": "mask", "token_type_ids": "types"}


def spec(drawn: Drawn, path: Path) -> dict:
    """The child's description of the model (see ``_service_children``), its inputs read
    from the file as the exporter wrote them."""
    import onnx  # noqa: PLC0415
    graph = onnx.load(str(path), load_external_data=False).graph
    constants = {initializer.name for initializer in graph.initializer}
    inputs = [_input(drawn, value, onnx) for value in graph.input if value.name not in constants]
    return {"name": drawn.label, "path": str(path), "inputs": inputs, "seed": drawn.seed,
            "hot": drawn.hot, "compare": drawn.compare, "new_shapes": list(drawn.new_shapes)}


def _input(drawn: Drawn, value, onnx) -> dict:
    tensor = value.type.tensor_type
    axes = []
    for index, dim in enumerate(tensor.shape.dim):
        role = ROLES[drawn.family][index] if index < len(ROLES[drawn.family]) else None
        if dim.dim_value <= 0 and role is None:
            raise SystemExit(f"{drawn.label}: input {value.name} has a symbolic axis {index} "
                             "no drawn size fills")
        axes.append(dim.dim_value if dim.dim_value > 0 else role)
    kind = KINDS.get(value.name, "uniform" if drawn.family == "image" else "normal")
    found = {"name": value.name, "kind": kind, "axes": axes,
             "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name}
    if kind == "tokens":
        found["high"] = drawn.config["vocab"]
    return found
