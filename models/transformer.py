"""A transformer encoder (Vaswani et al. 2017; BERT's post-norm layout), written with
mixrt.sym: token and position embeddings, then layers of multi-head self-attention and a GELU
feed-forward block, each added back to its input and layer-normalized; a classifier reads the
first token.
"""

from __future__ import annotations

import functools
import math

from mixrt import sym
from mixrt.initializer import Normal
from mixrt.models.layers import dense, dense_nd, layer_norm


def transformer_encoder(vocab: int = 1000, seq: int = 128, hidden: int = 256,
                        heads: int = 4, layers: int = 4, ffn: int | None = None,
                        classes: int = 2, *, data: str = "data", stash_type: int = 1):
    """data: int64 token ids (N, seq) -> logits (N, classes). ``stash_type``: the dtype of
    the layer norms' statistics (ONNX's attribute: 1 float32, 11 float64)."""
    if hidden % heads:
        raise ValueError(f"transformer_encoder: hidden {hidden} is not divisible by heads "
                         f"{heads}")
    ffn = ffn or 4 * hidden
    tokens = sym.Variable(data, shape=(None, seq), dtype="int64")
    norm = functools.partial(layer_norm, stash_type=stash_type)
    x = norm(_embeddings(tokens, vocab, seq, hidden), hidden, "embedding_norm")
    for index in range(layers):
        with sym.prefix(f"layer{index}_"):
            x = _encoder_layer(x, hidden, heads, ffn, norm)
    first = sym.Gather(x, sym.constant(0), axis=1, name="first_token")  # (N, hidden)
    pooled = sym.Tanh(dense(first, hidden, hidden, "pooler"), name="pooler_tanh")
    return dense(pooled, hidden, classes, "classifier")


def _embeddings(tokens, vocab, seq, hidden):
    table = sym.Variable("word_embedding_weight", shape=(vocab, hidden), init=Normal(0.02))
    position = sym.Variable("position_embedding_weight", shape=(1, seq, hidden),
                            init=Normal(0.02))
    return sym.Add(sym.Gather(table, tokens, axis=0, name="word_embedding"), position,
                   name="embeddings")


def _encoder_layer(x, hidden, heads, ffn, norm):
    attended = dense_nd(_self_attention(x, hidden, heads), hidden, hidden, "attention_out")
    x = norm(sym.Add(x, attended, name="attention_residual"), hidden, "attention_norm")
    inner = sym.Gelu(dense_nd(x, hidden, ffn, "ffn_in"), name="ffn_gelu")
    out = dense_nd(inner, ffn, hidden, "ffn_out")
    return norm(sym.Add(x, out, name="ffn_residual"), hidden, "ffn_norm")


def _self_attention(x, hidden, heads):
    head_dim = hidden // heads

    def split_heads(name):  # (N, S, hidden) -> (N, heads, S, head_dim)
        projected = dense_nd(x, hidden, hidden, name)
        shaped = sym.Reshape(projected, [0, 0, heads, head_dim], name=f"{name}_split")
        return sym.Transpose(shaped, perm=[0, 2, 1, 3], name=f"{name}_heads")

    query, key, value = split_heads("query"), split_heads("key"), split_heads("value")
    key_t = sym.Transpose(key, perm=[0, 1, 3, 2], name="key_t")
    scores = sym.MatMul(query, key_t, name="scores") * (1.0 / math.sqrt(head_dim))
    weights = sym.Softmax(scores, axis=-1, name="attention_weights")
    context = sym.Transpose(sym.MatMul(weights, value, name="context"), perm=[0, 2, 1, 3],
                            name="context_t")
    return sym.Reshape(context, [0, 0, hidden], name="context_merged")
