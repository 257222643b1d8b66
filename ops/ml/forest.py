"""The tree ensembles' shared form: every encoding (TreeEnsemble of ``ai.onnx.ml`` opset 5
here, TreeEnsembleClassifier/Regressor in ``ml_trees.py``) is turned once, at load, into one
flat node table (:class:`_Forest`) that the compiled walks of ``_jit_trees.py`` read.

This module holds the encodings into that table and the TreeEnsemble op; the table and the
tables the compiled walks read are laid out in ``forest_tables.py``, and the forest is walked
(compiled, split between threads, or by the NumPy tier) in ``forest_walks.py``.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.node_state import cached as _cached
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.ml.ml import ML, _rows, post_transform_scores
from mixrt.ops.ml.forest_tables import _LEAF, _MEMBER, _MODES
from mixrt.ops.ml.forest_walks import _AGGREGATES, _Forest
# not used here: ml_trees.py and tree_requests.py import them from this module
from mixrt.ops.ml.forest_walks import CHOSEN_FROM_ROWS, _aggregate_name  # noqa: F401


def _member_table(modes, membership_values):
    """One NaN-padded row of members per node; the sets, NaN-separated in
    membership_values, belong to the BRANCH_MEMBER nodes in order."""
    sets, current = [], []
    for v in (np.asarray(membership_values, dtype=np.float64).tolist()
              if membership_values is not None else []):
        if v != v:
            sets.append(current)
            current = []
        else:
            current.append(v)
    if current:
        sets.append(current)
    table = np.full((len(modes), max([len(s) for s in sets] + [1])), np.nan)
    member_nodes = [i for i, m in enumerate(modes) if m == _MEMBER]
    for node, members in zip(member_nodes, sets):
        table[node, :len(members)] = members
    return table


def _forest_v5(*, leaf_targetids, leaf_weights, membership_values, n_targets, nodes_falseleafs,
               nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true,
               nodes_modes, nodes_splits, nodes_trueleafs, nodes_truenodeids, tree_roots):
    n_nodes, n_leaves = len(nodes_featureids), len(leaf_targetids)
    targets = int(n_targets) if n_targets is not None else int(max(leaf_targetids)) + 1
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64).tolist() + [_LEAF] * n_leaves

    def next_positions(ids, to_leaf):  # leaves are numbered after the interior nodes
        return [n_nodes + i if leaf else i for i, leaf in zip(ids, to_leaf)] + [0] * n_leaves

    weights = np.zeros((n_nodes + n_leaves, targets))
    hit = np.zeros(weights.shape, dtype=bool)
    leaf_rows = n_nodes + np.arange(n_leaves)
    np.add.at(weights, (leaf_rows, np.asarray(leaf_targetids)),
              np.asarray(leaf_weights, dtype=np.float64).reshape(-1))
    hit[leaf_rows, np.asarray(leaf_targetids)] = True
    tracks = list(nodes_missing_value_tracks_true or [0] * n_nodes) + [0] * n_leaves
    return _Forest(
        roots=tree_roots, features=list(nodes_featureids) + [0] * n_leaves,
        splits=np.asarray(nodes_splits, dtype=np.float64).reshape(-1).tolist() + [0] * n_leaves,
        modes=modes, true_next=next_positions(nodes_truenodeids, nodes_trueleafs),
        false_next=next_positions(nodes_falsenodeids, nodes_falseleafs), tracks_true=tracks,
        members=_member_table(modes, membership_values), weights=weights, hit=hit)


@op("TreeEnsemble", since=5, domain=ML, dtypes=frozenset({"float16", "float32", "float64"}))
def tree_ensemble(xp, X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                  membership_values=None, n_targets=None, nodes_falseleafs=None,
                  nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0,
                  tree_roots=None, _node=None):
    forest = _cached(_node, lambda: _forest_v5(
        leaf_targetids=leaf_targetids, leaf_weights=leaf_weights,
        membership_values=membership_values, n_targets=n_targets,
        nodes_falseleafs=nodes_falseleafs, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_splits=nodes_splits, nodes_trueleafs=nodes_trueleafs,
        nodes_truenodeids=nodes_truenodeids, tree_roots=tree_roots))
    scores = forest.aggregate_rows(xp, _rows(X), _AGGREGATES[aggregate_function])
    return post_transform_scores(xp, scores, post_transform).astype(X.dtype)


@tree_ensemble.infer
def _(X, *, n_targets=None, leaf_targetids=None, **_):
    if n_targets is None and leaf_targetids is not None:
        n_targets = int(max(leaf_targetids)) + 1
    batch = X.shape[0] if X.shape is not None and len(X.shape) > 1 else None
    return [TensorType(X.dtype, (batch, n_targets))]


def _forest_from_node_ids(*, treeids, nodeids, featureids, modes, values, truenodeids,
                          falsenodeids, missing_tracks_true, leaf_treeids, leaf_nodeids,
                          leaf_ids, leaf_weights, n_outputs, leaf_prefix="target_"):
    """The (tree id, node id) encoding of TreeEnsembleRegressor/Classifier: node ids restart
    at 0 (the root) in every tree, and a leaf may feed several targets/classes (its weights
    are the ``leaf_prefix`` attributes: target_* or class_*). Inconsistent attributes raise a
    ValueError naming the attribute."""
    _same_lengths("nodes_", treeids=treeids, nodeids=nodeids, featureids=featureids,
                  modes=modes, values=values, truenodeids=truenodeids,
                  falsenodeids=falsenodeids)
    if missing_tracks_true:
        _same_lengths("nodes_", treeids=treeids, missing_value_tracks_true=missing_tracks_true)
    _same_lengths(leaf_prefix, treeids=leaf_treeids, nodeids=leaf_nodeids, ids=leaf_ids,
                  weights=leaf_weights)
    position = {}
    for i, key in enumerate(zip(treeids, nodeids)):
        if position.setdefault(key, i) != i:
            raise ValueError(f"nodes_nodeids: node {key[1]} appears twice in tree {key[0]}")
    codes = _mode_codes(modes)

    def at(tree, node, attribute):
        if (tree, node) not in position:
            raise ValueError(f"{attribute}: tree {tree} has no node {node}")
        return position[tree, node]

    def next_positions(children, attribute):
        return [at(t, c, attribute) if code != _LEAF else i
                for i, (t, c, code) in enumerate(zip(treeids, children, codes))]

    ids = np.asarray(leaf_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= n_outputs):
        raise ValueError(f"{leaf_prefix}ids: {int(ids.min() if ids.min() < 0 else ids.max())} "
                         f"is out of range for {n_outputs} output(s)")
    weights = np.zeros((len(codes), n_outputs))
    hit = np.zeros(weights.shape, dtype=bool)
    rows = [at(t, n, f"{leaf_prefix}nodeids") for t, n in zip(leaf_treeids, leaf_nodeids)]
    values_at_leaves = np.asarray([] if leaf_weights is None else leaf_weights, np.float64)
    np.add.at(weights, (rows, ids), values_at_leaves.reshape(-1))
    hit[rows, ids] = True
    return _Forest(
        roots=[at(t, 0, "nodes_nodeids") for t in dict.fromkeys(treeids)],
        features=featureids, splits=np.asarray(values, dtype=np.float64).reshape(-1),
        modes=codes, true_next=next_positions(truenodeids, "nodes_truenodeids"),
        false_next=next_positions(falsenodeids, "nodes_falsenodeids"),
        tracks_true=missing_tracks_true or [0] * len(codes),
        members=np.full((len(codes), 1), np.nan), weights=weights, hit=hit)


def _same_lengths(prefix: str, **lists) -> None:
    """Parallel attribute lists (``nodes_*``, ``class_*``, ...) must have one length."""
    lengths = {f"{prefix}{name}": len(np.asarray(v).reshape(-1)) if v is not None else 0
               for name, v in lists.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise ValueError(f"{prefix}* attributes must have one length: {listed}")


def _mode_codes(modes) -> list[int]:
    """nodes_modes as codes; BRANCH_MEMBER exists only in TreeEnsemble-5."""
    codes = []
    for mode in modes:
        name = mode.decode() if isinstance(mode, bytes) else mode
        if name not in _MODES or name == "BRANCH_MEMBER":
            allowed = ", ".join(m for m in _MODES if m != "BRANCH_MEMBER")
            raise ValueError(f"nodes_modes: unknown mode {name!r}; expected one of {allowed}")
        codes.append(_MODES.index(name))
    return codes


def _either(listed, as_tensor):
    return as_tensor if as_tensor is not None else listed
