"""Hugging Face transformers, small random-init configs, through both PyTorch exporters.

Each architecture is exported twice: by the TorchScript exporter (``dynamo=False``, opset
17, batch and sequence axes symbolic, as the Hugging Face export guides set them) and by the
``torch.export`` exporter (``dynamo=True``, its default opset, static shapes). The configs
are small (hidden 256, 4 layers) so the set builds in minutes on 2 cores, but keep each
architecture's own blocks: GPT-2's Conv1D projections, Llama's RMSNorm, rotary embeddings,
SiLU MLP and grouped-query heads, T5's relative position bias, BART's learned positions,
CLIP's two towers. The decoders come with and without a KV cache: the cached form takes
one new token and the past keys/values of 63 tokens, as a generation loop's later steps do.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .common import Recipe, rng, torch_seeded, version

SEQ = 64
PAST = 63
VOCAB = 1000
LAYERS = 4
HIDDEN = 256
HEADS = 4
FFN = 1024


# -- the models --------------------------------------------------------------------------------

def _bert(transformers):
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                     num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                     intermediate_size=FFN, max_position_embeddings=128)
    return transformers.BertModel(config), ("last_hidden_state", "pooler_output")


def _distilbert(transformers):
    config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=LAYERS,
                                           n_heads=HEADS, hidden_dim=FFN,
                                           max_position_embeddings=128)
    return transformers.DistilBertModel(config), ("last_hidden_state",)


def _roberta(transformers):
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                        num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                        intermediate_size=FFN, max_position_embeddings=130)
    return transformers.RobertaModel(config), ("last_hidden_state", "pooler_output")


def _gpt2(transformers):
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS,
                                     n_head=HEADS, n_positions=128)
    return transformers.GPT2LMHeadModel(config), ("logits",)


def _llama(transformers):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN,
                                      intermediate_size=688, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=2,
                                      max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config), ("logits",)


def _t5(transformers):
    config = transformers.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=64, d_ff=FFN,
                                   num_layers=LAYERS, num_heads=HEADS,
                                   decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config), ("logits",)


def _bart(transformers):
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=LAYERS,
                                     decoder_layers=LAYERS, encoder_attention_heads=HEADS,
                                     decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                                     decoder_ffn_dim=FFN, max_position_embeddings=128)
    return transformers.BartForConditionalGeneration(config), ("logits",)


def _vit(transformers):
    config = transformers.ViTConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, intermediate_size=FFN,
                                    image_size=224, patch_size=16, num_labels=10)
    return transformers.ViTForImageClassification(config), ("logits",)


def _clip(transformers):
    tower = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                 intermediate_size=FFN)
    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, max_position_embeddings=77, **tower),
        vision_config=dict(image_size=224, patch_size=32, **tower), projection_dim=128)
    return transformers.CLIPModel(config), ("logits_per_image", "text_embeds", "image_embeds")


# -- their inputs ------------------------------------------------------------------------------

def _token_ids(seq: int, offset: int) -> np.ndarray:
    return rng(offset).integers(3, VOCAB, size=(1, seq), dtype=np.int64)


def _text_feeds(seq: int = SEQ, token_types: bool = False) -> dict[str, np.ndarray]:
    mask = np.ones((1, seq), np.int64)
    mask[0, seq - 5:] = 0  # a padded tail, so the masks are exercised
    feeds = {"input_ids": _token_ids(seq, 1), "attention_mask": mask}
    if token_types:
        feeds["token_type_ids"] = (np.arange(seq) >= seq // 2).astype(np.int64)[None]
    return feeds


def _image(offset: int = 2) -> np.ndarray:
    return rng(offset).standard_normal((1, 3, 224, 224)).astype(np.float32)


# -- wrappers that give each model plain tensor inputs and outputs -----------------------------

def _plain(torch, model, outputs, names):
    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            result = self.model(**dict(zip(names, tensors)), return_dict=True)
            return tuple(getattr(result, name) for name in outputs)

    return Plain().eval()


def _with_cache(torch, transformers, model, layers):
    """A decoder step: one new token and the flat past keys/values of every layer in, logits
    and the flat present keys/values out."""

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            cache = transformers.DynamicCache()
            for layer in range(layers):
                cache.update(past[2 * layer], past[2 * layer + 1], layer)
            result = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
            present = []
            for layer in result.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (result.logits, *present)

    return Step().eval()


def _cache_feeds(kv_heads: int, head_dim: int) -> dict[str, np.ndarray]:
    feeds = {"input_ids": _token_ids(1, 3)}
    for layer in range(LAYERS):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng(10 + layer).standard_normal(
                (1, kv_heads, PAST, head_dim)).astype(np.float32)
    return feeds


# -- exporting ---------------------------------------------------------------------------------

def _export(torch, module, feeds, path: Path, output_names, dynamo: bool, dynamic=()):
    args = tuple(torch.from_numpy(value) for value in feeds.values())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, args, str(path), dynamo=True, external_data=False,
                              input_names=list(feeds), output_names=list(output_names))
            return
        # the decoder's tokens are a sequence of their own: one shared name would tell the
        # runtimes that both lengths are equal
        axes = {name: {axis: f"decoder_{label}" if name.startswith("decoder") and axis
                       else label for axis, label in dict(dynamic).items()}
                for name in feeds if name in _DYNAMIC_INPUTS}
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                          input_names=list(feeds), output_names=list(output_names),
                          dynamic_axes=axes or None)


_DYNAMIC_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids",
                   "decoder_attention_mask")


def _for_exporter(model, dynamo: bool):
    """The TorchScript exporter cannot convert PyTorch's attention with grouped key/value heads
    (``enable_gqa``); Llama's eager attention (repeated heads, explicit softmax) is what users
    of that exporter switch to."""
    config = model.config
    # a composite config (CLIP's) names no heads of its own: no grouped heads either
    kv_heads = getattr(config, "num_key_value_heads", None)
    grouped = kv_heads is not None and kv_heads != config.num_attention_heads
    if grouped and not dynamo:
        model.set_attn_implementation("eager")
    return model.eval()


def _encoder_recipe(make, feeds_of, dynamo: bool):
    def build(path: Path) -> dict[str, np.ndarray]:
        import transformers  # noqa: PLC0415
        torch = torch_seeded()
        model, outputs = make(transformers)
        model = _for_exporter(model, dynamo)
        feeds = feeds_of()
        module = _plain(torch, model, outputs, list(feeds))
        _export(torch, module, feeds, path, outputs, dynamo, {0: "batch", 1: "sequence"})
        return feeds
    return build


def _step_recipe(make, kv_heads: int, head_dim: int, dynamo: bool):
    def build(path: Path) -> dict[str, np.ndarray]:
        import transformers  # noqa: PLC0415
        torch = torch_seeded()
        model, _ = make(transformers)
        model = _for_exporter(model, dynamo)
        feeds = _cache_feeds(kv_heads, head_dim)
        module = _with_cache(torch, transformers, model, LAYERS)
        outputs = ["logits"] + [f"present_{kind}_{layer}" for layer in range(LAYERS)
                                for kind in ("key", "value")]
        _export(torch, module, feeds, path, outputs, dynamo)
        return feeds
    return build


def _seq2seq_feeds():
    feeds = _text_feeds()
    feeds["decoder_input_ids"] = _token_ids(16, 4)
    return feeds


def _clip_feeds():
    feeds = _text_feeds(seq=16)
    feeds["pixel_values"] = _image()
    return feeds


_ENCODERS = {
    "bert": (_bert, lambda: _text_feeds(token_types=True)),
    "distilbert": (_distilbert, _text_feeds),
    "roberta": (_roberta, _text_feeds),
    "gpt2": (_gpt2, lambda: {"input_ids": _token_ids(SEQ, 1)}),
    "llama": (_llama, lambda: {"input_ids": _token_ids(SEQ, 1)}),
    "t5": (_t5, _seq2seq_feeds),
    "bart": (_bart, _seq2seq_feeds),
    "vit": (_vit, lambda: {"pixel_values": _image()}),
    "clip": (_clip, _clip_feeds),
}
_STEPS = {"gpt2_kv": (_gpt2, HEADS, HIDDEN // HEADS), "llama_kv": (_llama, 2, HIDDEN // HEADS)}


def _recipes() -> dict[str, Recipe]:
    recipes = {}
    for dynamo, tag in ((False, "ts"), (True, "dynamo")):
        exporter = (f"torch.onnx {'dynamo' if dynamo else 'TorchScript'} "
                    f"(torch {version('torch')}, transformers {version('transformers')})")
        for name, (make, feeds_of) in _ENCODERS.items():
            recipes[f"hf_{name}_{tag}"] = Recipe("hf", exporter,
                                                 _encoder_recipe(make, feeds_of, dynamo))
        for name, (make, kv_heads, head_dim) in _STEPS.items():
            recipes[f"hf_{name}_{tag}"] = Recipe("hf", exporter,
                                                 _step_recipe(make, kv_heads, head_dim, dynamo))
    return recipes


BUILDERS = _recipes()
