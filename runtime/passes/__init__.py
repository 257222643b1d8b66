"""Graph passes: shape/type inference (``infer``) and the optimizer, :func:`optimize`.

Optimization levels (``Session(opt_level=...)``, ``mixrt compile --opt-level``):

* 0 - the graph as imported;
* 1 - exact rewrites, which never change a bit of any output: constant folding (static
  Shape/Size included), removal of Identity, inference Dropout, no-op
  Reshape/Expand/Transpose/Cast and Mul/Div by ones, nodes that repeat an earlier one's
  work merged into it (``merge_duplicates``), dead nodes and unused initializers, a
  classifier's ArgMax -> ArrayFeatureExtractor -> Reshape -> Cast labels as one lookup
  (``class_labels``), a TF-mode TfIdfVectorizer's constant column weights folded into it
  (``tfidf_weights``), and a Tokenizer whose tokens only a TfIdfVectorizer counts made
  one node with it (``fuse_token_counts``);
* 2 - level 1, then rewrites that may change rounding: Conv+BatchNormalization (and
  per-channel Mul/Add) folded into the weights, remaining BatchNormalizations as
  ``x * s + t``, runs of constant affine ops collapsed, Conv taps that only ever read
  padding dropped (``dead_taps``), a Gemm between flattening and unflattening Reshapes
  made a MatMul over the unflattened input (``gemm_reshapes``), Conv/Gemm/MatMul fused with
  bias,
  residual add and activation, a transformer's self-attention (transposes, scores, scale,
  mask, softmax, weighted values) as one node, Llama's rotary embedding (rotate_half and
  its products) as one node, a squeeze-excite block (pool, two 1x1 convolutions, scaling)
  as one node (``fuse_squeeze_excite``), conv -> [LRN] -> pool chains computed in
  bands of rows (``bands``), and chains of elementwise ops fused into one kernel.

The passes work on a copy; the caller's graph is never touched.
"""

from __future__ import annotations

from mixrt.base.errors import GraphError, MixrtError
from mixrt.runtime.graph import Graph
from mixrt.runtime.passes.affine import (batchnorm_to_affine, combine_affine_chains,
                                         fold_conv_affine)
from mixrt.runtime.passes.bands import fuse_conv_pools
from mixrt.runtime.passes.class_labels import fold_class_labels
# registers the gradients of If, Scan and Loop on the control ops (they need autodiff)
from mixrt.runtime.passes import control_gradients  # noqa: F401
from mixrt.runtime.passes.dead_taps import drop_dead_conv_taps
from mixrt.runtime.passes.fold import fold_constants, fold_static_shapes
from mixrt.runtime.passes.fuse import fuse_products
from mixrt.runtime.passes.fuse_attention import fuse_attention
from mixrt.runtime.passes.gemm_reshapes import unflatten_dense_layers
from mixrt.runtime.passes.fuse_elementwise import fuse_elementwise
from mixrt.runtime.passes.fuse_quantized import fuse_dynamic_quantized_products
from mixrt.runtime.passes.fuse_rms_norm import fuse_rms_norms
from mixrt.runtime.passes.fuse_rotary import fuse_rotary
from mixrt.runtime.passes.fuse_scan_distances import fuse_scan_distances
from mixrt.runtime.passes.fuse_squeeze_excite import fuse_squeeze_excites
from mixrt.runtime.passes.fuse_token_counts import fuse_token_counts
from mixrt.runtime.passes.half_regions import compute_half_in_float
from mixrt.runtime.passes.tfidf_weights import fold_tfidf_weights
from mixrt.runtime.passes.transposed_operands import scale_before_transpose
from mixrt.runtime.passes.infer import after_pass, types_between_passes
from mixrt.runtime.passes.merge_duplicates import merge_duplicate_nodes
from mixrt.runtime.passes.rewrite import (copy_graph, eliminate_dead_nodes, ir_version_of,
                                          prune_initializers)
from mixrt.runtime.passes.simplify import remove_noops

OPT_LEVELS = (0, 1, 2)
_MAX_ROUNDS = 8  # exact passes feed each other (a fold exposes a no-op and back); bounded


def optimize(graph: Graph, level: int = 2, stats: dict | None = None) -> Graph:
    """A new, validated graph optimized at ``level``; ``stats`` (if given) receives how many
    rewrites each pass made."""
    if level not in OPT_LEVELS:
        raise GraphError(f"optimization level must be one of {OPT_LEVELS}, got {level!r}")
    stats = {} if stats is None else stats
    result = copy_graph(graph)
    result.validate()  # the passes walk nodes in topological order
    with types_between_passes(result):
        if level >= 1:
            _exact_passes(result, stats)
        if level >= 2:
            _rounding_passes(result, stats)
    result.validate()
    if level:
        result.plans = []  # a memory plan names the tensors of the graph it was made for
    result.metadata["opt_level"] = level
    return result


def _exact_passes(graph: Graph, stats: dict) -> None:
    ir_version = ir_version_of(graph)
    for _ in range(_MAX_ROUNDS):
        changed = _run(stats, "fold_constants", fold_constants, graph, ir_version)
        changed += _run(stats, "fold_static_shapes", fold_static_shapes, graph, ir_version)
        changed += _run(stats, "remove_noops", remove_noops, graph, ir_version)
        changed += _run(stats, "merge_duplicates", merge_duplicate_nodes, graph, ir_version)
        changed += _run(stats, "dead_nodes", eliminate_dead_nodes, graph)
        if not changed:
            break
    _run(stats, "class_labels", fold_class_labels, graph, ir_version)
    _run(stats, "tfidf_weights", fold_tfidf_weights, graph, ir_version)
    _run(stats, "token_counts", fuse_token_counts, graph, ir_version)
    _run(stats, "unused_initializers", prune_initializers, graph, ir_version)


def _rounding_passes(graph: Graph, stats: dict) -> None:
    ir_version = ir_version_of(graph)
    for name, rewrite in (("compute_half_in_float", compute_half_in_float),
                          ("fuse_dynamic_quantized", fuse_dynamic_quantized_products),
                          ("fold_conv_affine", fold_conv_affine),
                          ("drop_dead_conv_taps", drop_dead_conv_taps),
                          ("batchnorm_to_affine", batchnorm_to_affine),
                          ("combine_affine_chains", combine_affine_chains),
                          ("fuse_rms_norms", fuse_rms_norms),
                          ("fuse_rotary", fuse_rotary),
                          ("fuse_scan_distances", fuse_scan_distances),
                          ("fuse_attention", fuse_attention),
                          ("unflatten_dense_layers", unflatten_dense_layers),
                          ("scale_before_transpose", scale_before_transpose),
                          ("fuse_products", fuse_products),
                          ("fuse_squeeze_excites", fuse_squeeze_excites),
                          ("fuse_conv_pools", fuse_conv_pools),
                          ("fuse_elementwise", fuse_elementwise)):
        _run(stats, name, rewrite, graph, ir_version)
    _run(stats, "dead_nodes", eliminate_dead_nodes, graph)
    _run(stats, "unused_initializers", prune_initializers, graph, ir_version)


def _run(stats: dict, name: str, rewrite, *args) -> int:
    try:
        count = rewrite(*args)
    except MixrtError:
        raise
    except Exception as exc:  # a pass's own bug: say which pass, and how to step around it
        raise GraphError(f"the optimizer's {name} pass failed on this graph "
                         f"({type(exc).__name__}: {exc}); a lower opt_level skips it "
                         f"(opt_level=0 runs the graph as imported)") from exc
    after_pass(args[0], count)
    stats[name] = stats.get(name, 0) + count
    return count


__all__ = ["OPT_LEVELS", "optimize"]
