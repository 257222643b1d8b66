"""Operands of the wrong shape, fed where the model's shapes are not declared: every ONNX
backend node case with one input grown by one along its last axis. Whatever happens, the
caller gets a mixrt error naming the node; and where the kernel's failure is NumPy's
("operands could not be broadcast", "cannot reshape array"), the op's own shape rule says
what was expected first (runtime/run_loop._failed), except for the ops listed here."""

from __future__ import annotations

import re
import warnings
from collections import defaultdict

import numpy as np
import onnx
import pytest
from onnx.backend.test.case import node as node_cases

import mixrt
from mixrt.errors import MixrtError

# NumPy's and Python's own words, as a failure reads when no shape rule explained it
NUMPY_WORDS = re.compile(
    r"could not be broadcast|cannot reshape|gufunc signature|is out of bounds|"
    r"index out of range|too many indices|not aligned|all the input array dimensions")

# ops whose failures may still read as NumPy's words alone, and why
UNEXPLAINED = {
    "FlexAttention": "a node with subgraphs is not shown to its infer function",
    # index errors: the words say which index and which axis, which is what was wrong
    "NonMaxSuppression": "an index past the boxes, named by NumPy",
    "ScatterElements": "indices and updates of different shapes, named by NumPy",
    "Scatter": "indices and updates of different shapes, named by NumPy",
    "ScatterND": "updates of the wrong shape, named by NumPy",
    "TensorScatter": "an index past the cache, named by NumPy",
    "GatherElements": "an index past the axis, named by NumPy",
    "GatherND": "indices deeper than the data, named by Python",
}


def _grown_cases():
    """(case name, op type, model with input k's shape cleared, feeds with input k grown)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases(None)
    for case in cases:
        graph = case.model.graph
        if len(graph.node) != 1 or not case.data_sets or any(
                a.type == onnx.AttributeProto.GRAPH for a in graph.node[0].attribute):
            continue
        fed = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
        tensors = list(case.data_sets[0][0])
        if len(fed) != len(tensors):
            continue
        for k, array in enumerate(tensors):
            if not isinstance(array, np.ndarray) or array.ndim == 0 or array.dtype == object \
                    or array.shape[-1] == 0:
                continue
            model = onnx.ModelProto()
            model.CopyFrom(case.model)
            for value in model.graph.input:
                if value.name == fed[k] and value.type.HasField("tensor_type"):
                    value.type.tensor_type.ClearField("shape")
            feeds = dict(zip(fed, tensors))
            feeds[fed[k]] = np.concatenate([array, array[..., :1]], axis=-1)
            yield case.name, graph.node[0].op_type, model, feeds


@pytest.fixture(scope="module")
def outcomes():
    """op type -> [(case, message or None when it ran)], over every grown case."""
    found = defaultdict(list)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, op_type, model, feeds in _grown_cases():
            try:
                mixrt.Session(model.SerializeToString()).run(None, feeds)
                found[op_type].append((name, None))
            except MixrtError as error:
                found[op_type].append((name, str(error)))
    return found


def test_the_sweep_covers_the_common_ops(outcomes):
    cases = sum(len(v) for v in outcomes.values())
    assert cases > 2000
    for op_type in ("MatMul", "Gemm", "Conv", "Add", "Concat", "LayerNormalization",
                    "Attention", "LSTM", "GRU", "RNN", "Reshape", "BatchNormalization"):
        assert any(message for _, message in outcomes.get(op_type, ())), op_type


def test_a_failure_says_what_the_op_expected(outcomes):
    """Every failure is a mixrt error (anything else would have escaped the fixture); a
    failure in NumPy's words alone is an op of UNEXPLAINED."""
    unexplained = {
        f"{op_type}: {name}: {message[:160]}"
        for op_type, results in outcomes.items() if op_type not in UNEXPLAINED
        for name, message in results
        if message and NUMPY_WORDS.search(message) and "[the kernel raised" not in message
        and " expected " not in message}
    assert not unexplained, "\n".join(sorted(unexplained)[:20])


def test_the_explanations_name_the_operands(outcomes):
    messages = defaultdict(str)
    for name, message in outcomes["MatMul"] + outcomes["Attention"]:
        messages[name] += f"{message}\n"
    assert "failed: MatMul operands (3, 5) and (4, 3) do not share an inner dim (5 against " \
           "4) (operands: 'a' float32[3x5], 'b' float32[4x3]) [the kernel raised ValueError: " \
           "matmul" in messages["test_matmul_2d"]
    # Q grown, then K grown (a grown V is a valid value head size: it runs)
    assert "Attention: K has shape (2, 3, 6, 8): head size 8, Q's is 9" in \
        messages["test_attention_4d"]
    assert "Attention: K has shape (2, 3, 6, 9): head size 9, Q's is 8" in \
        messages["test_attention_4d"]
    assert "None" in messages["test_attention_4d"]
