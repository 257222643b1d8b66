"""Gradients of MXNet's samplers (``ops/random/samplers.py``), as MXNet 1.x defines them.

* The samplers pass no gradient to their parameters: MXNet 1.x's ``_sample_*`` operators
  give ``loc``, ``scale``, ``alpha``, ... a zero gradient (no reparameterisation), and so
  does a recorded ``nd.random.normal(loc, scale)`` here.
* SampleMultinomial's log-probability output, ``log(data[i])`` at each drawn class ``i``,
  sends ``dY / data[i]`` back to ``data[i]``, summed over the draws that picked it (the
  score-function gradient MXNet's ``get_prob`` is there for); the drawn indices carry none.
* Shuffle has no gradient, as in MXNet: its backward is a GradientError naming it.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.device import add_at
from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import same_as_input
from mixrt.ops.random import samplers


def _no_gradient(b, node, dy):
    return [None] * len(node.inputs)


for _handle in samplers.SAMPLERS:
    _handle.grad(_no_gradient)


@samplers.sample_multinomial.grad
def _(b, node, dy):
    log_probabilities = dy[1] if len(dy) > 1 else None
    if log_probabilities is None:
        return [None] * len(node.inputs)
    data = node.inputs[0]
    grad = b.emit("SampleMultinomialGrad", data, node.outputs[0], log_probabilities,
                  domain=MIXRT)
    return [grad] + [None] * (len(node.inputs) - 1)


@op("SampleMultinomialGrad", domain=MIXRT, dtypes=FLOATS)
def sample_multinomial_grad(xp, data, samples, dY):
    """The gradient of SampleMultinomial's log-probabilities with respect to its data."""
    classes = data.shape[-1]
    rows = data.reshape(-1, classes)
    picked = samples.reshape(rows.shape[0], -1).astype(np.int64)
    chosen = xp.take_along_axis(rows, picked, axis=1).astype(np.float64)
    contributions = dY.reshape(picked.shape).astype(np.float64) / chosen
    grad = xp.zeros(rows.shape, dtype=np.float64)
    row_index = xp.broadcast_to(xp.arange(rows.shape[0])[:, None], picked.shape)
    add_at(xp, grad, (row_index, picked), contributions)
    return grad.reshape(data.shape).astype(data.dtype, copy=False)


sample_multinomial_grad.infer(same_as_input)
