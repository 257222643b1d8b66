"""A form's shape programs made while ``Session.wait_compiled`` waits
(runtime/prepared_forms.py): a service's first new sizes are planned by arithmetic, with
the answers onnxruntime gives; the programs are made from shapes, then the session runs
once at the first sizes of each set of guards, on zeros, to load their kernels."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest

import mixrt
from mixrt.runtime import prepared_forms
from mixrt.runtime.feeds import feed_signature, signature_form
from test_inferred_plans import attention_feeds, attention_model
from test_shape_programs import (concrete_inferences,  # noqa: F401  (a fixture)
                                 positions_feeds, positions_model)


@pytest.mark.parametrize("model, feeds", [(attention_model, attention_feeds),
                                          (positions_model, positions_feeds)])
def test_after_wait_compiled_new_sizes_run_no_concrete_inference(model, feeds, monkeypatch,
                                                                 concrete_inferences):
    data = model()
    session = mixrt.Session(data)
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    session.run(None, feeds(2, 9))
    runs = []
    real_run = session.run
    with monkeypatch.context() as patched:
        patched.setattr(session, "run", lambda names, fed: runs.append(fed) or
                        real_run(names, fed))
        session.wait_compiled(600)
    # once at the first sizes of each set of guards (both axes one larger; a batch of
    # one; a length of one), on zeros
    assert 1 <= len(runs) <= 3
    assert all(not value.any() for fed in runs for value in fed.values())
    assert {fed["x"].shape[:2] for fed in runs} <= {(3, 10), (1, 10), (3, 1)}
    (form,) = session._trusted_forms.values()
    assert form.prepared[0] and form.programs and all(p.confirmed for p in form.programs)
    prepared = len(concrete_inferences)
    assert prepared >= 2
    # lengths and batches the session never ran, a batch of one among them
    for batch, length in ((2, 13), (1, 21), (3, 5), (1, 40), (4, 17)):
        fed = feeds(batch, length)
        np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                                   rtol=1e-4, atol=1e-5)
    assert len(concrete_inferences) == prepared  # each planned by a prepared program


def test_a_form_is_prepared_once(concrete_inferences):
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(2, 9))
    session.wait_compiled(600)
    once = len(concrete_inferences)
    session.wait_compiled(600)
    assert len(concrete_inferences) == once


def test_sizes_past_what_the_model_takes_are_tried_smaller(monkeypatch):
    """Positions past the table (the discovered length at the model's largest) refuse the
    larger sizes; the smaller ones give the program."""
    data = positions_model()
    session = mixrt.Session(data)
    table = 64  # positions_model's table rows
    session.run(None, positions_feeds(2, table))
    session.wait_compiled(600)
    (form,) = session._trusted_forms.values()
    assert form.programs and form.programs[0].confirmed
    reference = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    fed = positions_feeds(2, 50)
    np.testing.assert_allclose(session.run(None, fed)[0], reference.run(None, fed)[0],
                               rtol=1e-4, atol=1e-5)


def test_variants_move_every_free_axis_then_each_to_one():
    sizes = {"batch": 2, "sequence": 9}
    variants = prepared_forms._variants(sizes)
    assert variants[0] == [{"batch": 3, "sequence": 10}, {"batch": 4, "sequence": 11}]
    assert [{"batch": 1, "sequence": 10}, {"batch": 1, "sequence": 11}] in variants
    assert [{"batch": 3, "sequence": 1}, {"batch": 4, "sequence": 1}] in variants
    assert len(variants) == 3  # no smaller sizes: a batch of 2 has none past one
    larger = prepared_forms._variants({"batch": 8, "sequence": 64})
    assert [{"batch": 7, "sequence": 63}, {"batch": 6, "sequence": 62}] in larger


def test_no_programs_made_where_programs_are_off(monkeypatch, concrete_inferences):
    monkeypatch.setenv("MIXRT_SHAPE_PROGRAMS", "0")
    session = mixrt.Session(attention_model())
    session.run(None, attention_feeds(2, 9))
    session.wait_compiled(600)
    (form,) = session._trusted_forms.values()
    assert not form.programs and concrete_inferences == []
    signature = feed_signature(attention_feeds(2, 9))
    assert signature_form(signature) in session._trusted_forms
