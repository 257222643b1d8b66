"""The walk a forest's batch takes, chosen by the clock (ops/ml/walk_choice.py): the fastest
of the four after SAMPLES timed calls of each, timed again every RETUNE_CALLS calls; and
every walk, kept or being timed, gives the NumPy tier's sums bit for bit."""

import numpy as np
import pytest

from mixrt.ops.compiled import jit_tier, parallel
from mixrt.ops.ml import ml_trees, walk_choice
from test_tree_stepped_walk import FEATURES, _forest, _rows


def _timed_round(choice, times):
    """Calls until the choice keeps a walk, walk i taking ``times[i]``; the walks tried."""
    tried = []
    while choice.kept is None:
        index, timing = choice.next()
        assert timing
        tried.append(index)
        choice.timed(index, times[index])
    return tried


@pytest.mark.parametrize("times, kept", [((100, 300, 200, 400), 0), ((300, 100, 200, 400), 1),
                                         ((300, 200, 100, 400), 2), ((300, 200, 400, 100), 3),
                                         ((200, 200, 200, 200), 0)])
def test_the_fastest_walk_is_kept_after_each_is_timed(times, kept):
    choice = walk_choice.WalkChoice(4)
    tried = _timed_round(choice, times)
    assert all(tried.count(i) == walk_choice.SAMPLES for i in range(4))
    # one walk's calls after another, so a branching walk's later ones have its branches learnt
    assert tried == sorted(tried)
    assert choice.kept == kept
    assert choice.next() == (kept, False)  # kept: no more timing


def test_one_slow_sample_does_not_decide():
    """The fastest call of each walk counts: another process's interruption of one call
    says nothing about the walk."""
    choice = walk_choice.WalkChoice(2)
    times = {0: [100, 5000, 100, 100], 1: [150, 150, 150, 150]}
    while choice.kept is None:
        index, _ = choice.next()
        choice.timed(index, times[index].pop(0))
    assert choice.kept == 0


def test_the_walks_are_timed_again_as_traffic_changes():
    choice = walk_choice.WalkChoice(2)
    _timed_round(choice, (100, 300))
    calls = walk_choice.SAMPLES * 2
    while (calls + 1) % walk_choice.RETUNE_CALLS:
        assert choice.next() == (0, False)
        calls += 1
    index, timing = choice.next()  # the next round begins
    assert timing and choice.kept is None
    choice.timed(index, 300)
    _timed_round(choice, (300, 100))
    assert choice.kept == 1


def test_batch_sizes_of_one_power_of_two_share_a_choice(monkeypatch):
    choices = walk_choice.WalkChoices()
    assert choices.for_rows(4) is choices.for_rows(7) is not choices.for_rows(8)
    assert choices.for_rows(2490) is choices.for_rows(4095) is choices.for_rows(2048)
    assert choices.for_rows(1) is not choices.for_rows(2)
    monkeypatch.setattr(walk_choice, "MOST_SIZES", 3)  # a bounded number of classes
    bounded = walk_choice.WalkChoices()
    assert all(bounded.for_rows(rows) is not None for rows in (4, 8, 2048))
    assert bounded.for_rows(1) is None and bounded.for_rows(5) is bounded.for_rows(4)


def test_a_new_class_times_only_the_walks_its_neighbour_found_near_the_fastest():
    """A service's batches each of their own size meet each class's first round: the walks
    twice as slow or worse in the class below (or above) sit that round out."""
    choices = walk_choice.WalkChoices()
    _timed_round(choices.for_rows(40), (100, 300, 250, 150))
    tried = _timed_round(choices.for_rows(80), (90, 10, 10, 200))
    assert sorted(set(tried)) == [0, 3]  # 1 and 2 were 2.5x and 3x the fastest at 32-63 rows
    assert choices.for_rows(80).kept == 0
    # and from above: 16-31 rows learn from 32-63
    assert sorted(set(_timed_round(choices.for_rows(20), (100, 100, 100, 100)))) == [0, 3]
    # a class two powers of two away learns nothing
    assert sorted(set(_timed_round(choices.for_rows(4), (100, 100, 100, 100)))) == [0, 1, 2, 3]


def test_a_class_with_no_neighbour_kept_and_every_later_round_time_every_walk():
    choices = walk_choice.WalkChoices()
    first = choices.for_rows(40)
    assert sorted(set(_timed_round(first, (100, 300, 250, 150)))) == [0, 1, 2, 3]
    neighbour = choices.for_rows(64)
    tried = _timed_round(neighbour, (100, 300, 250, 150))
    assert sorted(set(tried)) == [0, 3]  # its first round learnt from 32-63 rows
    calls = len(tried)
    while (calls + 1) % walk_choice.RETUNE_CALLS:  # on to the next round
        assert neighbour.next() == (0, False)
        calls += 1
    index, timing = neighbour.next()
    assert timing
    neighbour.timed(index, 300)
    assert sorted(set(_timed_round(neighbour, (300, 100, 100, 100)))) == [0, 1, 2, 3]
    assert neighbour.kept == 1


def test_a_long_call_times_its_walk_twice():
    """Each more sample of a slow walk costs the request that takes it; a call of
    LONG_CALL_NS or more is long against the clock's noise, but its walk's first call
    after another walk's is still learning its branches: the second is the one that
    counts."""
    choice = walk_choice.WalkChoice(3)
    long = walk_choice.LONG_CALL_NS
    tried = _timed_round(choice, (long * 3, long * 2, 100))
    assert tried == [0, 0, 1, 1] + [2] * walk_choice.SAMPLES and choice.kept == 2


def test_a_long_walk_is_kept_by_its_learnt_call_not_its_first():
    """The branching walk's first call (the core not yet taught its branches) is slower
    than the stepped walk's, its second faster: the branching walk is kept."""
    choice = walk_choice.WalkChoice(2)
    long = walk_choice.LONG_CALL_NS
    calls = {0: iter([long * 27 // 20, long * 27 // 20]), 1: iter([long * 3, long])}
    while choice.kept is None:
        index, timing = choice.next()
        assert timing
        choice.timed(index, next(calls[index]))
    assert choice.kept == 1


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT"])
@pytest.mark.parametrize("rows", [8, 64, 200])  # fewer take the request path
def test_every_call_while_timing_and_after_gives_the_numpy_tiers_sums(mode, rows):
    rng = np.random.default_rng(rows + 11)
    attrs = _forest(rng, 16, 3, mode, "target_")
    attrs.update(n_targets=3, aggregate_function="SUM", base_values=[0.5, -1.0, 2.0])
    x = _rows(rng, rows)
    with jit_tier.using(False):
        expected = ml_trees.tree_ensemble_regressor(np, x, **attrs, _node={})
    state: dict = {}
    with jit_tier.using(True), parallel.pinned():
        for _ in range(4 * walk_choice.SAMPLES + 3):
            got = ml_trees.tree_ensemble_regressor(np, x, **attrs, _node=state)
            np.testing.assert_array_equal(got, expected)
    forest = next(v.forest for v in state.values() if hasattr(v, "forest"))
    assert forest._choices.for_rows(rows).kept is not None


@pytest.mark.parametrize("mode", ["BRANCH_LEQ", "BRANCH_LT"])
@pytest.mark.parametrize("index", [0, 1, 2, 3])
@pytest.mark.parametrize("rows", [1, 2, 4, 64, 130])
def test_every_kept_walk_gives_the_numpy_tiers_scores(monkeypatch, mode, index, rows):
    """Each walk (the stepped one, the one in step, the branching ones over depth-first
    tables row by row and tree by tree), split over threads or not, with missing values on
    both sides of a split."""
    monkeypatch.setattr(walk_choice.WalkChoice, "next", lambda self: (index, False))
    rng = np.random.default_rng(3 + rows)
    attrs = _forest(rng, 20, 4, mode, "class_")
    attrs.update(classlabels_int64s=[0, 1, 2, 3], post_transform="NONE")
    x = _rows(rng, rows)
    with jit_tier.using(False):
        expected = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
    with jit_tier.using(True), parallel.pinned():
        got = ml_trees.tree_ensemble_classifier(np, x, **attrs, _node={})
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_a_forest_whose_trees_share_a_node_has_no_depth_first_tables():
    """A node two parents lead to cannot sit right after both: such a forest keeps the walks
    over its own tables (the stepped walk needs trees too, so it has one walk)."""
    from mixrt.ops.ml.forest import _Forest  # noqa: PLC0415
    shared = _Forest(roots=[0], features=[0, 0, 0], splits=[0.0, 0.5, 0.0],
                     modes=[0, 0, 7], true_next=[1, 2, 0], false_next=[2, 2, 0],
                     tracks_true=[False] * 3, members=np.zeros((3, 0)),
                     weights=np.ones((3, 1)), hit=np.ones((3, 1), bool))
    assert shared._depth_first() is None and shared.walk_choices() is None


def test_runs_on_made_up_feeds_take_the_kept_walk_untimed():
    """base/made_up_feeds.py: a session's warm-up on zeros teaches no choice."""
    from mixrt.base import made_up_feeds  # noqa: PLC0415
    choice, ran = walk_choice.WalkChoice(4), []
    with made_up_feeds.made_up():
        for _ in range(4 * walk_choice.SAMPLES + 1):
            walk_choice.walk(choice, ran.append)
    assert ran == [0] * (4 * walk_choice.SAMPLES + 1) and choice.kept is None
    _timed_round(choice, (300, 100, 200, 400))
    with made_up_feeds.made_up():
        walk_choice.walk(choice, ran.append)
    assert ran[-1] == 1


def test_a_sessions_warm_up_on_zeros_leaves_its_forests_choices_to_real_rows(tmp_path):
    """Session.wait_compiled runs other batch sizes on zeros (runtime/prepared_forms.py):
    none of their size classes has a walk kept or timed from those rows."""
    import onnx  # noqa: PLC0415
    from onnx import TensorProto, helper  # noqa: PLC0415
    import mixrt  # noqa: PLC0415
    from mixrt.ops.ml.forest import _Forest  # noqa: PLC0415
    rng = np.random.default_rng(5)
    attrs = _forest(rng, 20, 3, "BRANCH_LEQ", "class_")
    attrs.update(classlabels_int64s=[0, 1, 2], post_transform="NONE")
    node = helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"],
                            domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph(
        [node], "forest", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    session = mixrt.Session(model.SerializeToString())
    rows = _rows(rng, 40)
    session.run(None, {"x": rows})
    session.wait_compiled(600)
    forests = [v.forest for v in _node_states(session) if isinstance(
        getattr(v, "forest", None), _Forest)]
    assert forests
    for found in forests:
        choices = found._choices
        for size_class, choice in ({} if choices is None else choices._by_rows).items():
            if size_class != rows.shape[0].bit_length():  # the one real batch's class
                assert choice.kept is None and not any(choice._samples), size_class


def _node_states(session):
    """The prepared objects the session's nodes keep (ops/ir/node_state.py)."""
    for bound in session._bound.nodes:
        yield from bound.attributes.get("_node", {}).values()


def _kernels_one_compiled():
    """Two numba kernels of one body: ``loaded`` compiled for an int64 vector, ``missing``
    compiled for nothing (in no cache: a ``njit`` without ``cache``)."""
    import numba  # noqa: PLC0415
    from mixrt.ops.compiled import jit_cpu  # noqa: F401,PLC0415  (guards numba's caches)

    def body(values):
        values[0] += 1

    loaded, missing = numba.njit(body), numba.njit(body)
    loaded(np.zeros(1, np.int64))
    return loaded, missing


def test_a_walk_whose_kernel_would_compile_is_left_out(monkeypatch):
    """A request never compiles a walk (a row bucket's bound call timed XGBoost's branching
    walk at its first real rows and compiled it there, 2.3 s): walk 1's signature is in no
    cache, so the choice times the others, keeps one of them, and nothing compiles; a kept
    walk that is not loaded for this kernel (kept by another kernel's timing) gives way to
    the first loaded one."""
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    loaded, missing = _kernels_one_compiled()
    values = np.zeros(1, np.int64)
    kernels = {0: loaded, 1: missing, 2: loaded}
    choices = walk_choice.WalkChoices(3)
    walks = tuple(_loads_here(kernels[index], values) for index in range(3))
    assert walks == (True, False, True)
    choice, ran = choices.for_rows(8), []

    def run(index):
        ran.append(index)
        kernels[index](values)
    while choice.kept is None:
        walk_choice.walk(choice, run, walks)
    assert 1 not in ran and set(ran) == {0, 2} and choice.kept in (0, 2)
    other = walk_choice.WalkChoice(3)
    _timed_round(other, (300, 100, 200))
    walk_choice.walk(other, run, walks)
    assert ran[-1] == 0 and not missing.overloads


def _loads_here(kernel, values) -> bool:
    """WalkChoices.loaded's verdict on one walk whose kernel is ``kernel``."""
    return walk_choice.WalkChoices(1).loaded(kernel, "int64", lambda index: (values,))[0]


def test_which_walks_load_is_kept_and_asked_again_after_a_while(monkeypatch):
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    loaded, missing = _kernels_one_compiled()
    values = np.zeros(1, np.int64)
    choices, asked = walk_choice.WalkChoices(2), []

    def arguments(index):
        asked.append(index)
        return (values,)
    assert choices.loaded(missing, "int64", arguments) == (False, False)
    assert choices.loaded(missing, "int64", arguments) == (False, False)
    assert asked == [0, 1]  # kept
    now = walk_choice.clock()
    monkeypatch.setattr(walk_choice, "clock", lambda: now + walk_choice.RECHECK_NS + 1)
    missing(values)  # compiled meanwhile (as a child's cache entry would be loaded)
    assert choices.loaded(missing, "int64", arguments) == (True, True)
    assert choices.loaded(loaded, "int64", arguments) == (True, True)


def test_a_foreground_compile_compiles_every_walks_signature(monkeypatch):
    """The background compiler's child compiles in the foreground: asked which walks load,
    it compiles every walk's signature, so the cache its session loads from holds them."""
    monkeypatch.setenv("MIXRT_COMPILE", "foreground")
    _, missing = _kernels_one_compiled()
    arrays = (np.zeros(1, np.int64), np.zeros(1, np.float64))
    assert walk_choice.WalkChoices(2).loaded(missing, None, lambda index: (arrays[index],)) \
        is None
    assert len(missing.overloads) == 2


def test_inside_a_loading_run_a_walks_miss_is_the_runs_to_note(monkeypatch):
    """In a loading run (jit_tier.loading_only) every walk may be taken: a kernel in no
    cache raises there, and the run's misses name it, as for any kernel."""
    monkeypatch.setenv("MIXRT_COMPILE", "background")
    _, missing = _kernels_one_compiled()
    values = np.zeros(1, np.int64)
    choices = walk_choice.WalkChoices(2)
    with jit_tier.loading_only() as misses:
        walks = choices.loaded(missing, "int64", lambda index: (values,))
        with pytest.raises(jit_tier.CompileForbidden):
            walk_choice.walk(choices.for_rows(4), lambda index: missing(values), walks)
    assert walks is None and len(misses) == 1 and not missing.overloads
    assert choices.loaded(missing, "int64", lambda index: (values,)) == (False, False)
