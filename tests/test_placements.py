"""A form's kept placement (runtime/placements.py): new sizes placed from the stacking of
the first, never overlapping, as small as a fresh placement where sizes grow alike, and
placed afresh where the stacking would waste memory or the in-place pairs differ."""

import numpy as np
import pytest

import mixrt
from mixrt.runtime import placements
from mixrt.runtime.memory import TensorLife, check_plan, plan_memory
from mixrt.runtime.placements import restack, stacking_of


def _random_lives(rng, count: int, steps: int) -> list[TensorLife]:
    lives = []
    for index in range(count):
        first = int(rng.integers(-1, steps))
        last = first + int(rng.integers(0, 6))
        lives.append(TensorLife(f"t{index}", int(rng.integers(1, 50_000)), first, last))
    return lives


def _resized(lives, rng) -> list[TensorLife]:
    return [life._replace(size=int(life.size * rng.uniform(0.1, 4.0)) + 1) for life in lives]


@pytest.mark.parametrize("seed", range(40))
def test_restacked_plans_never_overlap_whatever_the_new_sizes(seed):
    rng = np.random.default_rng(seed)
    lives = _random_lives(rng, int(rng.integers(2, 60)), 30)
    kept = stacking_of(plan_memory(lives, "greedy", checked=True))
    assert kept is not None
    for _ in range(10):
        resized = _resized(lives, rng)
        memory = restack(kept, resized, [])
        if memory is None:  # more than SLACK over the kept margin: placed afresh instead
            continue
        check_plan(memory)  # aligned, inside the arena, no two live tensors share a byte
        assert memory.lower_bound_bytes == plan_memory(resized, "greedy",
                                                       checked=True).lower_bound_bytes


def test_sizes_that_grow_alike_keep_the_placement_scaled():
    rng = np.random.default_rng(7)
    lives = _random_lives(rng, 40, 25)
    memory = plan_memory(lives, "greedy", checked=True)
    kept = stacking_of(memory)
    doubled = [life._replace(size=memory.alignment * 2 * -(-life.size // memory.alignment))
               for life in lives]
    again = restack(kept, doubled, [])
    assert again is not None
    assert again.arena_bytes == 2 * memory.arena_bytes
    assert again.offsets == {name: 2 * offset for name, offset in memory.offsets.items()}


def test_a_stacking_that_would_waste_memory_is_not_used():
    # kept: t2 (steps 1-3) lowest, t0 and t3 above it; with t0 and t2 grown and t4 shrunk
    # the kept stacking comes out well above the most bytes alive at one step
    lives = [TensorLife("t0", 256, 3, 3), TensorLife("t1", 1088, 0, 0),
             TensorLife("t2", 704, 1, 3), TensorLife("t3", 640, 2, 2),
             TensorLife("t4", 1152, 3, 3)]
    kept = stacking_of(plan_memory(lives, "greedy", checked=True))
    resized = [life._replace(size=size) for life, size in zip(lives, (768, 256, 1216, 832, 320))]
    assert restack(kept, resized, []) is None
    # and what the session does then: places afresh, and keeps that placement instead
    stackings = {"none": kept}
    memory, _ = placements.smallest_plan(resized, "greedy", [], "none", None, stackings)
    check_plan(memory)
    assert memory.arena_bytes == plan_memory(resized, "greedy", checked=True).arena_bytes
    assert stackings["none"] is not kept


def test_other_in_place_pairs_are_placed_afresh():
    lives = [TensorLife("x", 6400, 0, 1), TensorLife("y", 6400, 1, 2),
             TensorLife("z", 640, 2, 3)]
    kept = stacking_of(plan_memory(lives, "greedy", [("x", "y")], checked=True))
    assert kept.pairs == [("x", "y")]
    bigger_output = [lives[0], lives[1]._replace(size=12800), lives[2]]  # y no longer fits x
    assert restack(kept, bigger_output, [("x", "y")]) is None
    same = restack(kept, lives, [("x", "y")])
    check_plan(same)
    assert same.offsets["x"] == same.offsets["y"]


def test_no_stacking_of_an_empty_group_or_another_strategy():
    lives = [TensorLife("a", 0, 0, 1), TensorLife("b", 640, 0, 1)]
    assert stacking_of(plan_memory(lives, "greedy", checked=True)) is None
    assert stacking_of(plan_memory(lives[1:], "sharing", checked=True)) is None


def _encoder(tmp_path):
    """A small attention-like graph with a dynamic length: products, a softmax, in-place
    elementwise ops, whose sizes grow as the length and its square."""
    from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "qt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "q"], ["o"]),
             helper.make_node("Relu", ["o"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "encoder.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_a_forms_new_lengths_are_placed_from_its_stacking(tmp_path, monkeypatch):
    import onnxruntime as ort  # noqa: PLC0415
    path = _encoder(tmp_path)
    session, reference = mixrt.Session(path), ort.InferenceSession(path)
    restacked = []
    real = placements.restack
    monkeypatch.setattr(placements, "restack",
                        lambda *args: restacked.append(real(*args)) or restacked[-1])
    rng = np.random.default_rng(1)
    for length in (5, 9, 33, 2, 70, 17, 128, 3):
        x = rng.standard_normal((1, length, 16)).astype(np.float32)
        (got,) = session.run(None, {"x": x})
        (want,) = reference.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    placed = [memory for memory in restacked if memory is not None]
    assert placed, "no new length was placed from the kept stacking"
    for memory in placed:
        check_plan(memory)


def test_the_plans_of_a_structure_share_their_call_templates(tmp_path):
    session = mixrt.Session(_encoder(tmp_path))
    rng = np.random.default_rng(2)
    for length in (4, 11, 23, 6):
        session.run(None, {"x": rng.standard_normal((1, length, 16)).astype(np.float32)})
    inferred = [plan for plan in session._plans.values() if plan.call_templates[0]]
    assert len(inferred) >= 2
    templates = {id(plan.call_templates) for plan in inferred[1:]}
    assert len(templates) == 1  # one structure's plans: one template list
