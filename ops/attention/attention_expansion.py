"""Gradients of the transformer ops in attention.py: Attention (23, 24, 25) and FlexAttention
through expansions, RotaryEmbedding through its adjoint.

Attention has no fused backward. Its ``@op.expansion`` writes the forward of
``attention.scaled_dot_product_attention`` again in default-domain ops that have gradients,
and autodiff differentiates that (first order, and again for second order). The expansion
follows the forward stage by stage, so each qk_matmul_output_mode reads the same stage:

* 3D inputs are split into heads with Reshape/Transpose and Y is merged back;
* past_key/past_value are joined with Concat (present_key/present_value carry gradients);
* Q and K are each scaled by sqrt(scale) (default scale 1/sqrt(head_size), from a Shape
  node when the head size is not static);
* grouped-query attention repeats each kv head with Unsqueeze/Expand/Reshape (its gradient
  sums the copies back);
* softcap is ``cap * tanh(scores / cap)``;
* a float attn_mask is added (its key axis padded with -inf when short, and it receives a
  gradient); a boolean attn_mask and the structural constraints (is_causal, the kv padding
  of nonpad_kv_seqlen, the windows of opset 25) become one boolean ``allowed`` tensor built
  from Range and comparisons at run time, applied with ``Where(allowed, scores, -inf)``;
* the softmax is ONNX Softmax, guarded for rows in which every key is masked: ONNX's
  Softmax gives NaN there while the forward gives a zero row, so such rows are replaced by
  zeros before the Softmax and their probabilities by zeros after it (``Where`` on a
  per-row "any key allowed" flag), which keeps NaN out of the values and the gradients.
  The flag is a comparison, so no gradient flows through it.

Not expanded: qk_matmul_output_mode values other than 0-3 (the expansion returns None, so
autodiff raises a GradientError naming the node). Raised as GradientError naming the node:
an input rank that inference lost, 3D inputs without q_num_heads/kv_num_heads, head counts
that are not static where grouped-query attention has to repeat kv heads, and
nonpad_kv_seqlen together with a past_key of unknown length (the forward then chooses the
query offset from the past length). softmax_precision is honoured as the forward honours
it: the scores are cast to that type for the Softmax and the probabilities cast back, so a
float16 layer with softmax_precision=FLOAT has the forward's float32 softmax and its gradient.

FlexAttention (ai.onnx.preview) expands the same way: the two products at the softmax
precision, its score_mod and prob_mod subgraphs written into the graph in place of the calls
(``_inlined``). Their reads of enclosing values stay reads of those names, and autodiff gives
such captured values gradients (``gradient_targets``), so a learned bias a score_mod adds
trains. The softmax is the guarded one whenever a score_mod may mask a whole row.

RotaryEmbedding is linear in X and each feature pair is turned by a rotation; the adjoint of
a rotation is the rotation by the negative angle, i.e. the same op with the sin cache
negated. dX is therefore one RotaryEmbedding node, whose own gradient is again this one, so
the second order needs nothing more. cos_cache, sin_cache and position_ids get no gradient.
"""

from __future__ import annotations

import math

import numpy as np

from mixrt.base.errors import GradientError
from mixrt.ops.attention import attention
from mixrt.ops.conv.conv_grad import optional_input
from mixrt.ops.ir.dtypes import to_numpy_dtype, to_onnx_type

# (batch, seq, heads, size) <-> (batch, heads, seq, size); the permutation is its own inverse
SWAP_SEQ_HEADS = [0, 2, 1, 3]
EXPANDED_MODES = (0, 1, 2, 3)
_INT64 = to_onnx_type(np.dtype(np.int64))


def _fail(node, why: str) -> GradientError:
    return GradientError(f"node {node.label!r}: the gradient of {node.op_type} {why}",
                         node=node.label, op_type=node.op_type)


# -- shapes as tensors: constants when inference knows them, Shape nodes when it does not --

def _static_dim(b, name: str, axis: int) -> int | None:
    """Dim ``axis`` of ``name`` when inference knows it as a number."""
    value_type = b.type(name)
    if value_type is None or value_type.shape is None:
        return None
    dim = value_type.shape[axis]
    return dim if isinstance(dim, int) else None


def _dims(b, name: str, start: int, end: int | None = None) -> str:
    """Dims ``start:end`` of ``name`` as a 1-D int64 tensor."""
    static = b.shape(name)
    if static is not None:
        return b.ints(list(static[start:end]))
    if end is None:
        return b.emit("Shape", name, start=start)
    return b.emit("Shape", name, start=start, end=end)


def _scalar_dim(b, name: str, axis: int) -> str:
    """Dim ``axis`` of ``name`` as a 0-d int64 tensor (what Range takes)."""
    static = _static_dim(b, name, axis)
    if static is not None:
        return b.ints(static)
    return b.emit("Reshape", _dims(b, name, axis, axis + 1), b.ints([]))


# -- heads -------------------------------------------------------------------------------

def _head_count(b, node, name: str, attribute: str):
    """The number of heads of Q, K or V: the attribute for 3D inputs, dim 1 for 4D ones
    (an int or a symbolic name)."""
    if b.known_rank(node, name) == 3:
        heads = node.attributes.get(attribute)
        if not heads:
            raise _fail(node, "needs q_num_heads and kv_num_heads for 3D inputs")
        return int(heads)
    return b.type(name).shape[1]  # known_rank found the shape


def _heads_first(b, node, name: str, heads) -> str:
    """(batch, seq, heads*size) -> (batch, heads, seq, size); a 4D input as it is."""
    if b.known_rank(node, name) == 4:
        return name
    split = b.emit("Reshape", name, b.ints([0, 0, heads, -1]))
    return b.emit("Transpose", split, perm=SWAP_SEQ_HEADS)


def _heads_merged(b, name: str) -> str:
    """(batch, heads, seq, size) -> (batch, seq, heads*size)."""
    swapped = b.emit("Transpose", name, perm=SWAP_SEQ_HEADS)
    return b.emit("Reshape", swapped, b.ints([0, 0, -1]))


def _kv_groups(node, q_heads, kv_heads) -> int:
    """How many query heads read each kv head (grouped-query attention)."""
    if q_heads == kv_heads:
        return 1  # equal, even when both are the same symbolic dim
    if not (isinstance(q_heads, int) and isinstance(kv_heads, int)):
        raise _fail(node, f"needs static head counts for grouped-query attention (query "
                          f"heads {q_heads}, kv heads {kv_heads})")
    if q_heads % kv_heads:
        raise _fail(node, f"needs q_num_heads ({q_heads}) to be a multiple of kv_num_heads "
                          f"({kv_heads})")
    return q_heads // kv_heads


def _repeated_heads(b, name: str, groups: int, q_heads) -> str:
    """kv head h copied to query heads h*groups .. h*groups + groups - 1 (the forward's
    xp.repeat along axis 1); Expand's gradient adds the copies' gradients back up."""
    if groups == 1:
        return name
    grouped = b.emit("Unsqueeze", name, b.ints([2]))
    copies = b.emit("Expand", grouped, b.ints([1, 1, groups, 1, 1]))
    static = b.shape(name)
    if static is not None:
        target = b.ints([static[0], q_heads, *static[2:]])
    else:
        target = b.emit("Concat", _dims(b, name, 0, 1), b.ints([q_heads]),
                        _dims(b, name, 2), axis=0)
    return b.emit("Reshape", copies, target)


# -- scores --------------------------------------------------------------------------------

def _root_scale(b, node, q: str) -> str:
    """sqrt(scale), which the forward multiplies Q and K by each; the default scale is
    1/sqrt(head_size), read from a Shape node when the head size is not static."""
    scale = node.attributes.get("scale")
    if scale is not None:
        return b.constant(math.sqrt(float(scale)), like=q)
    size = _static_dim(b, q, 3)
    if size is not None:
        return b.constant(math.sqrt(1.0 / math.sqrt(size)), like=q)
    size = b.emit("CastLike", b.emit("Shape", q, start=3), q)
    return b.emit("Reciprocal", b.emit("Sqrt", b.emit("Sqrt", size)))


def _softcapped(b, node, scores: str) -> str:
    cap = float(node.attributes.get("softcap", 0.0))
    if not cap:
        return scores
    cap = b.constant(cap, like=scores)
    return b.mul(cap, b.emit("Tanh", b.emit("Div", scores, cap)))


# -- masks ---------------------------------------------------------------------------------

def _padded_keys(b, mask: str, keys: str, fill) -> str:
    """A mask whose key axis is shorter than the keys' sequence, padded with ``fill``."""
    mask_len, total = _static_dim(b, mask, -1), _static_dim(b, keys, 2)
    if mask_len is not None and total is not None:
        if mask_len >= total:
            return mask
        short = b.ints([total - mask_len])
    else:  # a run-time length, never negative (a longer mask is left to the forward's add)
        missing = b.emit("Sub", _dims(b, keys, 2, 3), b.emit("Shape", mask, start=-1))
        short = b.emit("Max", missing, b.ints([0]))
    filler_shape = b.emit("Concat", _dims(b, mask, 0, -1), short, axis=0)
    filler = b.emit("Expand", b.constant(fill, like=mask), filler_shape)
    return b.emit("Concat", mask, filler, axis=-1)


def _past_length(b, past_key: str | None):
    """The past length as a Python int when known (0 without a past), else a 0-d tensor."""
    if past_key is None:
        return 0
    static = _static_dim(b, past_key, 2)
    return static if static is not None else _scalar_dim(b, past_key, 2)


def _structural_allowed(b, node, q: str, keys: str, past_key: str | None,
                        nonpad: str | None) -> str | None:
    """attention.structural_mask as nodes: which keys each query may see from is_causal,
    the kv padding and the windows, as a boolean tensor broadcasting to the scores."""
    causal = int(node.attributes.get("is_causal", 0))
    left = int(node.attributes.get("left_window_size", -1))
    right = int(node.attributes.get("right_window_size", -1))
    if not (causal or nonpad is not None or left >= 0 or right >= 0):
        return None
    zero, one = b.ints(0), b.ints(1)
    key_at = b.emit("Range", zero, _scalar_dim(b, keys, 2), one)  # (total,)
    q_len = _scalar_dim(b, q, 2)
    query_at = b.emit("Unsqueeze", b.emit("Range", zero, q_len, one), b.ints([1]))
    past_len = _past_length(b, past_key)
    if nonpad is not None and not isinstance(past_len, int):
        # the forward reads nonpad_kv_seqlen only when the past is empty
        raise _fail(node, "needs the static length of past_key when nonpad_kv_seqlen is "
                          "given")
    conditions = []
    if nonpad is not None and past_len == 0:
        # an external cache: each batch's queries end where its valid keys end
        valid = b.emit("Reshape", b.emit("Cast", nonpad, to=_INT64), b.ints([-1, 1, 1, 1]))
        position = b.emit("Add", query_at, b.emit("Sub", valid, q_len))
        conditions.append(b.emit("Less", key_at, valid))
    elif isinstance(past_len, int):  # queries follow a past of known length (maybe none)
        position = b.emit("Add", query_at, b.ints(past_len)) if past_len else query_at
    else:
        position = b.emit("Add", query_at, past_len)
    if causal:
        conditions.append(b.emit("LessOrEqual", key_at, position))
    if left >= 0:
        conditions.append(b.emit("GreaterOrEqual", key_at,
                                 b.emit("Sub", position, b.ints(left))))
    if right >= 0:
        conditions.append(b.emit("LessOrEqual", key_at,
                                 b.emit("Add", position, b.ints(right))))
    allowed = conditions[0]
    for condition in conditions[1:]:
        allowed = b.emit("And", allowed, condition)
    return allowed


def _masked(b, node, scores: str, q: str, keys: str, past_key, mask, nonpad):
    """Scores plus a float mask and with blocked keys at -inf (attention.attention_bias),
    and whether anything can be masked at all."""
    allowed = _structural_allowed(b, node, q, keys, past_key, nonpad)
    if mask is not None:
        dtype = b.dtype(mask)
        if dtype is None:
            raise _fail(node, f"needs the dtype of attn_mask {mask!r}")
        if dtype == np.bool_:
            padded = _padded_keys(b, mask, keys, False)
            allowed = padded if allowed is None else b.emit("And", allowed, padded)
        else:
            if b.dtype(scores) is not None and dtype != b.dtype(scores):
                mask = b.emit("CastLike", mask, scores)
            scores = b.emit("Add", scores, _padded_keys(b, mask, keys, -np.inf))
    if allowed is not None:
        scores = b.emit("Where", allowed, scores, b.constant(-np.inf, like=scores))
    return scores, allowed is not None or mask is not None


def _guarded_softmax(b, scores: str, masked: bool) -> str:
    """Softmax over keys, with the forward's zero row where every key is masked (see the
    module docstring)."""
    if not masked:
        return b.emit("Softmax", scores, axis=-1)
    top = b.emit("ReduceMax", scores, axes=[-1], keepdims=1)
    alive = b.emit("Greater", top, b.constant(-np.inf, like=scores))
    zero = b.constant(0.0, like=scores)
    probs = b.emit("Softmax", b.emit("Where", alive, scores, zero), axis=-1)
    return b.emit("Where", alive, probs, zero)


def _softmax_in_precision(b, node, scores: str, masked: bool) -> str:
    """The guarded softmax at the node's softmax_precision, its result in the scores' type."""
    precision = node.attributes.get("softmax_precision")
    if not precision:
        return _guarded_softmax(b, scores, masked)
    probs = _guarded_softmax(b, b.emit("Cast", scores, to=int(precision)), masked)
    return b.emit("CastLike", probs, scores)


# -- Attention -----------------------------------------------------------------------------

def _expand_attention(b, node):
    """Attention's outputs (Y, present_key, present_value, qk_matmul_output) written with
    the builder ``b``, or None for a qk_matmul_output_mode the forward has no stage for."""
    mode = int(node.attributes.get("qk_matmul_output_mode", 0))
    if mode not in EXPANDED_MODES:
        return None
    Q, K, V = node.inputs[:3]
    mask, past_key, past_value, nonpad = (optional_input(node, i) for i in range(3, 7))
    q_heads = _head_count(b, node, Q, "q_num_heads")
    kv_heads = _head_count(b, node, K, "kv_num_heads")
    q = _heads_first(b, node, Q, q_heads)
    k = _heads_first(b, node, K, kv_heads)
    v = _heads_first(b, node, V, kv_heads)
    if past_key is not None:
        k = b.emit("Concat", past_key, k, axis=2)
        v = b.emit("Concat", past_value, v, axis=2)
    groups = _kv_groups(node, q_heads, kv_heads)

    root = _root_scale(b, node, q)
    keys = _repeated_heads(b, b.mul(k, root), groups, q_heads)
    scores = b.emit("MatMul", b.mul(q, root), b.emit("Transpose", keys, perm=[0, 1, 3, 2]))
    capped = _softcapped(b, node, scores)
    biased, masked = _masked(b, node, capped, q, k, past_key, mask, nonpad)
    probs = _softmax_in_precision(b, node, biased, masked)
    y = b.emit("MatMul", probs, _repeated_heads(b, v, groups, q_heads))
    if b.known_rank(node, Q) == 3:
        y = _heads_merged(b, y)
    qk_output = (scores, capped, biased, probs)[mode]
    return [y, k, v, qk_output][:len(node.outputs)]


for _version in (attention.attention_23, attention.attention_24, attention.attention_25):
    _version.expansion(_expand_attention)


# -- FlexAttention -------------------------------------------------------------------------

def _expand_flex_attention(b, node):
    """FlexAttention's forward: everything between the two products at the softmax
    precision, the score_mod and prob_mod subgraphs written into the graph in place of the
    calls (their reads of enclosing values stay reads, so those values get gradients)."""
    Q, K, V = node.inputs[:3]
    precision = _flex_precision(b, node, Q)
    q, k, v = (name if b.dtype(name) == precision else
               b.emit("Cast", name, to=to_onnx_type(precision)) for name in (Q, K, V))
    q_heads, kv_heads = (_static_dim(b, name, 1) for name in (Q, K))
    groups = _kv_groups(node, q_heads, kv_heads)
    keys = _repeated_heads(b, k, groups, q_heads)
    scores = b.emit("MatMul", q, b.emit("Transpose", keys, perm=[0, 1, 3, 2]))
    scores = b.mul(scores, _flex_scale(b, node, q))
    score_mod, prob_mod = node.attributes.get("score_mod"), node.attributes.get("prob_mod")
    if score_mod is not None:
        scores = _inlined(b, node, score_mod, scores)
    probs = _guarded_softmax(b, scores, masked=score_mod is not None)
    if prob_mod is not None:
        probs = _inlined(b, node, prob_mod, probs)
    y = b.emit("MatMul", probs, _repeated_heads(b, v, groups, q_heads))
    return [y if precision == b.dtype(Q) else b.emit("CastLike", y, Q)]


def _flex_precision(b, node, Q: str) -> np.dtype:
    precision = node.attributes.get("softmax_precision")
    if precision:
        return to_numpy_dtype(int(precision))
    return np.dtype(np.float64 if b.dtype(Q) == np.float64 else np.float32)


def _flex_scale(b, node, q: str) -> str:
    """The scale attribute, or 1/sqrt(head size) (from a Shape node when not static)."""
    scale = node.attributes.get("scale")
    if scale is None:
        size = _static_dim(b, q, 3)
        if size is None:
            size = b.emit("CastLike", b.emit("Shape", q, start=3), q)
            return b.emit("Reciprocal", b.emit("Sqrt", size))
        scale = 1.0 / math.sqrt(size)
    return b.constant(float(scale), like=q)


def _inlined(b, node, body, argument: str) -> str:
    """``body`` (one input, one output) written into the graph reading ``argument``: its
    nodes copied under fresh names, its initializers as constants."""
    if len(body.inputs) != 1 or len(body.outputs) != 1:
        raise _fail(node, f"needs its subgraph {body.name!r} to take one input and give "
                          f"one output")
    if any(inner.subgraphs() for inner in body.nodes):
        raise _fail(node, f"cannot inline subgraph {body.name!r}: a node in it has "
                          f"subgraphs of its own")
    renamed = {body.inputs[0].name: argument}
    renamed.update({name: b.array(value) for name, value in body.initializers.items()})
    for inner in body.nodes:
        inputs = [renamed.get(name, name) if name else None for name in inner.inputs]
        written = b.emit(inner.op_type, *inputs, domain=inner.domain,
                         outputs=len(inner.outputs), opset=inner.opset, **inner.attributes)
        written = (written,) if isinstance(written, str) else written
        renamed.update((old, new) for old, new in zip(inner.outputs, written) if old)
    name = body.outputs[0].name
    return renamed.get(name, name)


attention.flex_attention.expansion(_expand_flex_attention)


# -- RotaryEmbedding -----------------------------------------------------------------------

@attention.rotary_embedding.grad
def _(b, node, dy):
    cos_cache, sin_cache = node.inputs[1:3]
    back = b.emit("RotaryEmbedding", dy[0], cos_cache, b.neg(sin_cache),
                  optional_input(node, 3), opset=node.opset, **node.attributes)
    return [back, None, None, None]
