"""The gradient of ``mixrt::RandomPdf`` (``ops/random/pdf.py``): one backward kernel,
``mixrt::RandomPdfGrad``, gives the sample's and each parameter's (summed over the samples the
parameter scores), from the log-density's derivatives: times the density, or as they are
with ``is_log``. The discrete distributions give their samples none, as MXNet does.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import MIXRT, op
from mixrt.ops.ir.types import TensorType
from mixrt.ops.random.pdf import aligned_inputs, density_of, random_pdf


@random_pdf.grad
def _(b, node, dy):
    if dy[0] is None:
        return [None] * len(node.inputs)
    present = [name for name in node.inputs if name]  # an absent second parameter is last
    grads = b.emit("RandomPdfGrad", *present, dy[0], domain=MIXRT, outputs=len(present),
                   **node.attributes)
    grads = list(grads) if len(present) > 1 else [grads]
    return grads + [None] * (len(node.inputs) - len(present))


@op("RandomPdfGrad", domain=MIXRT, dtypes=FLOATS)
def random_pdf_grad(xp, sample, first, second, dY=None, *, distribution="normal", is_log=0):
    """The gradients of RandomPdf's output with respect to its sample and parameters (the
    incoming gradient is the last input: ``second``'s place for a one-parameter density)."""
    if dY is None:
        second, dY = None, second
    params = [p for p in (first, second) if p is not None]
    x, aligned = aligned_inputs(xp, sample, params, distribution)
    log_f, derivatives = density_of(distribution)(xp, x, *aligned)
    scale = xp.asarray(dY, dtype=np.float64) * (1.0 if is_log else xp.exp(log_f))
    if distribution == "dirichlet":
        scale = scale[..., None]  # the categories' axis the density summed over
    grads = [xp.broadcast_to(scale * derivatives[0], x.shape)]
    for param, aligned_param, derivative in zip(params, aligned, derivatives[1:]):
        full = xp.broadcast_to(scale * derivative, x.shape)
        summed = full.sum(axis=_extra_axes(aligned_param, x), keepdims=True)
        grads.append(summed.reshape(param.shape))
    return tuple(g.astype(sample.dtype) for g in grads)


def _extra_axes(aligned_param, x) -> tuple:
    """The axes a parameter was broadcast along to meet the samples."""
    return tuple(i for i, (p, s) in enumerate(zip(aligned_param.shape, x.shape))
                 if p == 1 and s != 1)


@random_pdf_grad.infer
def _(sample, first, second, dY=None, **_):
    types = [TensorType(sample.dtype, sample.shape), TensorType(first.dtype, first.shape)]
    if dY is not None:
        types.append(TensorType(second.dtype, second.shape))
    return types
