"""NonMaxSuppression and RoiAlign: the compiled tier, the NumPy tier and onnxruntime agree."""

from __future__ import annotations

import numpy as np
import pytest

from mixrt.ops.compiled import jit_tier
from mixrt.ops.image import image, nms_cpu

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402


def _greedy_reference(boxes, scores, limit, iou_threshold, score_threshold, center):
    """The plain greedy walk, one box at a time (what both tiers must reproduce)."""
    corners = nms_cpu.corners(boxes, center)
    areas = nms_cpu.areas(corners)
    rows = []
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c].astype(np.float64)
            order = np.argsort(-s, kind="stable")
            if score_threshold is not None:
                order = order[s[order] >= score_threshold]
            kept = []
            for i in order:
                if len(kept) >= limit:
                    break
                iou = nms_cpu._iou_rows(corners[b], areas[b], np.full(len(kept), i),
                                        np.asarray(kept, dtype=np.int64))
                if np.all(iou <= iou_threshold):
                    kept.append(int(i))
            rows += [(b, c, i) for i in kept]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def _inputs(rng, batches, classes, count, center, grid=16):
    """Boxes on a coarse grid and scores from a few values: many ties, many exact overlaps."""
    boxes = rng.integers(0, grid, size=(batches, count, 4)).astype(np.float32)
    if center:
        boxes[..., 2:] = rng.integers(1, grid // 2, size=(batches, count, 2))
    scores = (rng.integers(0, 6, size=(batches, classes, count)) / 5).astype(np.float32)
    return boxes, scores


def _mixrt(boxes, scores, limit, iou, score_threshold, center, compiled):
    args = [boxes, scores, np.array([limit], np.int64), np.array([iou], np.float32)]
    if score_threshold is not None:
        args.append(np.array([score_threshold], np.float32))
    with jit_tier.using(compiled):
        return image.non_max_suppression(np, *args, center_point_box=center)


def _onnxruntime(boxes, scores, limit, iou, score_threshold, center):
    inputs = ["boxes", "scores", "limit", "iou"] + (["min_score"] if score_threshold is not None
                                                    else [])
    node = helper.make_node("NonMaxSuppression", inputs, ["selected"],
                            center_point_box=center)
    graph = helper.make_graph([node], "nms", [
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("limit", TensorProto.INT64, None),
        helper.make_tensor_value_info("iou", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("min_score", TensorProto.FLOAT, None),
    ][:len(inputs)], [helper.make_tensor_value_info("selected", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {"boxes": boxes, "scores": scores, "limit": np.array([limit], np.int64),
             "iou": np.array([iou], np.float32)}
    if score_threshold is not None:
        feeds["min_score"] = np.array([score_threshold], np.float32)
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("limit", [0, 1, 3, 1 << 62])
# onnxruntime's IoU is float32, mixrt's float64 (as before its kernels): thresholds that
# no IoU of grid boxes equals, so that rounding cannot decide
@pytest.mark.parametrize("iou,score_threshold", [(0.5, None), (0.0, None), (0.3333, 0.5),
                                                  (0.9137, 0.0), (1.0, None)])
def test_nms_tiers_match_onnxruntime(center, limit, iou, score_threshold):
    rng = np.random.default_rng(limit % 97 + 7 * center + int(10 * iou))
    boxes, scores = _inputs(rng, 2, 3, 400, center)
    # onnxruntime keeps scores > threshold, mixrt (and the ONNX reference) >= threshold:
    # keep scores off the threshold so the two agree
    if score_threshold is not None:
        scores[scores == np.float32(score_threshold)] += np.float32(0.05)
    expected = _greedy_reference(boxes, scores, limit, np.float32(iou), score_threshold, center)
    compiled = _mixrt(boxes, scores, limit, iou, score_threshold, center, True)
    numpy_tier = _mixrt(boxes, scores, limit, iou, score_threshold, center, False)
    np.testing.assert_array_equal(compiled, expected)
    np.testing.assert_array_equal(numpy_tier, expected)
    np.testing.assert_array_equal(compiled, _onnxruntime(boxes, scores, limit, iou,
                                                         score_threshold, center))


@pytest.mark.parametrize("compiled", [True, False])
def test_nms_thousands_of_boxes_one_class(compiled):
    """A detector's single NMS over every class's boxes, offset per class so that classes
    never overlap (torchvision's batched_nms), with float boxes."""
    rng = np.random.default_rng(3)
    classes, per_class = 40, 300
    corner = rng.uniform(0, 300, size=(classes * per_class, 2))
    size = rng.uniform(4, 120, size=(classes * per_class, 2))
    offsets = np.repeat(np.arange(classes) * 421.0, per_class)[:, None]
    boxes = (np.concatenate([corner, corner + size], axis=1) + offsets)[None]
    boxes = boxes.astype(np.float32)
    scores = rng.uniform(size=(1, 1, classes * per_class)).astype(np.float32)
    expected = _greedy_reference(boxes, scores, 1 << 62, np.float32(0.55), None, 0)
    got = _mixrt(boxes, scores, 1 << 62, 0.55, None, 0, compiled)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, _onnxruntime(boxes, scores, 1 << 62, 0.55, None, 0))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("iou", [-0.5, 0.5])
def test_nms_negative_threshold_and_nan_boxes(compiled, iou):
    rng = np.random.default_rng(5)
    boxes, scores = _inputs(rng, 2, 2, 60, 0)
    boxes[0, 3, 1] = np.nan
    boxes[1, 7] = np.inf
    expected = _greedy_reference(boxes, scores, 1 << 62, np.float32(iou), None, 0)
    got = _mixrt(boxes, scores, 1 << 62, iou, None, 0, compiled)
    np.testing.assert_array_equal(got, expected)


def test_nms_without_boxes_or_classes():
    for shape_boxes, shape_scores in [((1, 0, 4), (1, 3, 0)), ((2, 5, 4), (2, 0, 5))]:
        for compiled in (True, False):
            got = _mixrt(np.zeros(shape_boxes, np.float32), np.zeros(shape_scores, np.float32),
                         10, 0.5, None, 0, compiled)
            assert got.shape == (0, 3) and got.dtype == np.int64


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_compiled_matches_numpy_tier(mode, transform, sampling_ratio):
    from mixrt.ops.pool import pool
    rng = np.random.default_rng(11)
    X = rng.standard_normal((2, 6, 10, 12)).astype(np.float32)
    corner = rng.uniform(-3, 14, size=(20, 2))
    rois = np.concatenate([corner, corner + rng.uniform(-1, 9, size=(20, 2))], 1)
    batches = rng.integers(0, 2, 20).astype(np.int64)
    kwargs = dict(coordinate_transformation_mode=transform, mode=mode, output_height=3,
                  output_width=4, sampling_ratio=sampling_ratio, spatial_scale=0.5)
    with jit_tier.using(False):
        expected = pool.roi_align(np, X, rois.astype(np.float32), batches, **kwargs)
    with jit_tier.using(True):
        got = pool.roi_align(np, X, rois.astype(np.float32), batches, **kwargs)
    assert got.dtype == expected.dtype
    if mode == "max":  # each weighted corner is the same product: the same bits
        np.testing.assert_array_equal(got, expected)
    else:  # the samples' sum may be added in another order
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
