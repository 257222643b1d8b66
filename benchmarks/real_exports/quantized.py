"""onnxruntime's own tools applied to the exports above: its quantizers (dynamic, static QDQ
and QOperator, 4-bit weight-only), its transformer optimizer (fused com.microsoft ops), and a
float16 conversion by onnxconverter-common. Each starts from a model of ``hf`` or ``vision``
(built first if missing) and is kept as its tool writes it."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np

from . import hf, vision
from .common import Recipe, ensure, rng, torch_seeded, version


def _source(name: str):
    recipes = {**hf.BUILDERS, **vision.BUILDERS}
    return ensure(name, recipes[name])


def _quiet():
    # the quantizer logs every node it cannot quantize; that is its normal operation
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)


def _dynamic(source: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415
        _quiet()
        built = _source(source)
        quantize_dynamic(str(built.model), str(path), weight_type=QuantType.QInt8)
        return built.load_feeds()
    return build


class _Images:
    """The calibration reader onnxruntime's static quantizer asks for: a few random images."""

    def __init__(self, name: str, shape, count: int = 4):
        self._feeds = iter([{name: rng(20 + i).random(shape, dtype=np.float32)}
                            for i in range(count)])

    def get_next(self):
        return next(self._feeds, None)


def _static(source: str, qdq: bool):
    def build(path: Path) -> dict[str, np.ndarray]:
        from onnxruntime.quantization import QuantFormat, quantize_static  # noqa: PLC0415
        from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: PLC0415
        _quiet()
        built = _source(source)
        feeds = built.load_feeds()
        (name, image), = feeds.items()
        with tempfile.TemporaryDirectory() as scratch:
            prepared = Path(scratch) / "prepared.onnx"
            quant_pre_process(str(built.model), str(prepared))  # what its docs ask first
            quantize_static(str(prepared), str(path), _Images(name, image.shape),
                            quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator)
        return feeds
    return build


def _four_bit(source: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        import onnx  # noqa: PLC0415
        from onnxruntime.quantization.matmul_nbits_quantizer import (  # noqa: PLC0415
            MatMulNBitsQuantizer)
        _quiet()
        built = _source(source)
        quantizer = MatMulNBitsQuantizer(onnx.load(str(built.model)), block_size=32,
                                         is_symmetric=False)
        quantizer.process()
        quantizer.model.save_model_to_file(str(path), use_external_data_format=False)
        return built.load_feeds()
    return build


def _optimized(source: str, model_type: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        from onnxruntime.transformers.optimizer import optimize_model  # noqa: PLC0415
        _quiet()
        built = _source(source)
        model = optimize_model(str(built.model), model_type=model_type, num_heads=hf.HEADS,
                               hidden_size=hf.HIDDEN, opt_level=0)
        model.save_model_to_file(str(path))
        return built.load_feeds()
    return build


def _eager_bert(path: Path) -> dict[str, np.ndarray]:
    """BERT exported with transformers' eager attention (explicit MatMul, Softmax): the graph
    onnxruntime's optimizer fuses into Attention and EmbedLayerNormalization, which it does
    not recognize in the scaled-dot-product form transformers exports by default."""
    def make(transformers):
        model, outputs = hf._bert(transformers)
        model.set_attn_implementation("eager")
        return model, outputs
    return hf._encoder_recipe(make, lambda: hf._text_feeds(token_types=True), False)(path)


def _fused_bert(path: Path, **fusion) -> dict[str, np.ndarray]:
    """The eager BERT through optimize_model, with FusionOptions set from ``fusion``."""
    from onnxruntime.transformers.fusion_options import FusionOptions  # noqa: PLC0415
    from onnxruntime.transformers.optimizer import optimize_model  # noqa: PLC0415
    _quiet()
    options = FusionOptions("bert")
    for name, value in fusion.items():
        setattr(options, name, value)
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "bert_eager.onnx"
        feeds = _eager_bert(source)
        model = optimize_model(str(source), model_type="bert", num_heads=hf.HEADS,
                               hidden_size=hf.HIDDEN, optimization_options=options,
                               opt_level=0)
        model.save_model_to_file(str(path))
    return feeds


def _fused_bert_recipe(**fusion):
    return lambda path: _fused_bert(path, **fusion)


def _fused_bert_dynamic(path: Path) -> dict[str, np.ndarray]:
    """The fused BERT through quantize_dynamic: QAttention and QEmbedLayerNormalization."""
    import onnx  # noqa: PLC0415
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415
    with tempfile.TemporaryDirectory() as scratch:
        fused = Path(scratch) / "bert_fused.onnx"
        feeds = _fused_bert(fused)
        # the fused ops' outputs have no inferred type, so the quantizer is told float32
        quantize_dynamic(str(fused), str(path), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return feeds


def _four_bit_with_gather(source: str):
    """4-bit weights for the products and the token embedding (GatherBlockQuantized)."""
    def build(path: Path) -> dict[str, np.ndarray]:
        import onnx  # noqa: PLC0415
        from onnxruntime.quantization.matmul_nbits_quantizer import (  # noqa: PLC0415
            DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer)
        _quiet()
        built = _source(source)
        config = DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=False, op_types_to_quantize=("MatMul", "Gather"),
            quant_axes=(("MatMul", 0), ("Gather", 1)))
        quantizer = MatMulNBitsQuantizer(onnx.load(str(built.model)), algo_config=config)
        quantizer.process()
        quantizer.model.save_model_to_file(str(path), use_external_data_format=False)
        return built.load_feeds()
    return build


def _lstm_dynamic(path: Path) -> dict[str, np.ndarray]:
    """A two-layer bidirectional PyTorch LSTM (a sequence tagger's encoder: 64 features, 128
    hidden, 32 steps, batch 2) through quantize_dynamic, which writes DynamicQuantizeLSTM for
    each LSTM node."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415
    _quiet()
    torch = torch_seeded()
    lstm = torch.nn.LSTM(64, 128, num_layers=2, bidirectional=True).eval()
    feeds = {"x": rng(30).standard_normal((32, 2, 64)).astype(np.float32)}
    with tempfile.TemporaryDirectory() as scratch, torch.no_grad():
        source = Path(scratch) / "lstm.onnx"
        torch.onnx.export(lstm, (torch.from_numpy(feeds["x"]),), str(source), dynamo=False,
                          opset_version=17, input_names=["x"], output_names=["y", "h", "c"])
        quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8)
    return feeds


def _float16(source: str):
    def build(path: Path) -> dict[str, np.ndarray]:
        import onnx  # noqa: PLC0415
        from onnxconverter_common import float16  # noqa: PLC0415
        built = _source(source)
        model = float16.convert_float_to_float16(onnx.load(str(built.model)),
                                                 keep_io_types=True)
        onnx.save(model, str(path))
        return built.load_feeds()
    return build


def _recipes() -> dict[str, Recipe]:
    quantizer = f"onnxruntime.quantization {version('onnxruntime')}"
    optimizer = f"onnxruntime.transformers.optimizer {version('onnxruntime')}"
    converter = f"onnxconverter-common {version('onnxconverter-common')} float16"
    return {
        "q_bert_dynamic": Recipe("quantized", quantizer, _dynamic("hf_bert_ts")),
        "q_gpt2_dynamic": Recipe("quantized", quantizer, _dynamic("hf_gpt2_ts")),
        "q_mobilenet_v3_qdq": Recipe("quantized", quantizer,
                                     _static("tv_mobilenet_v3_large", qdq=True)),
        "q_mobilenet_v3_qop": Recipe("quantized", quantizer,
                                     _static("tv_mobilenet_v3_large", qdq=False)),
        "q_resnet18_qop": Recipe("quantized", quantizer, _static("tv_resnet18", qdq=False)),
        "q_llama_4bit": Recipe("quantized", quantizer, _four_bit("hf_llama_ts")),
        "ortopt_bert": Recipe("fused", optimizer, _optimized("hf_bert_ts", "bert")),
        "ortopt_gpt2": Recipe("fused", optimizer, _optimized("hf_gpt2_ts", "gpt2")),
        "ortopt_t5": Recipe("fused", optimizer, _optimized("hf_t5_ts", "t5")),
        "ortopt_vit": Recipe("fused", optimizer, _optimized("hf_vit_ts", "vit")),
        "ortopt_bert_attention": Recipe("fused", optimizer, _fused_bert_recipe()),
        "ortopt_bert_mha": Recipe("fused", optimizer, _fused_bert_recipe(
            use_multi_head_attention=True)),
        "q_bert_fused_dynamic": Recipe("quantized", quantizer, _fused_bert_dynamic),
        "q_gpt2_4bit_gather": Recipe("quantized", quantizer,
                                     _four_bit_with_gather("hf_gpt2_ts")),
        "q_lstm_dynamic": Recipe("quantized", quantizer, _lstm_dynamic),
        "fp16_efficientnet_b0": Recipe("float16", converter, _float16("tv_efficientnet_b0")),
    }


BUILDERS = _recipes()
