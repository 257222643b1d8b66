"""Optimizer operators of the ``ai.onnx.preview.training`` domain (opset 1).

Each takes the learning rate R and update count T, then its tensors grouped by role: all the
X's, then all the G's, then each optimizer state in turn (Momentum: V; Adagrad: H; Adam: V, H).
The outputs are grouped the same way: the new X's, then the new states. The update rule is
applied to each X independently.

R and T stay arrays (no host round trip); scalar coefficients derived from them are cast to
each X's dtype so a float32 model stays float32 (a float64 0-d array would promote it).
"""

from __future__ import annotations

from mixrt.ops.ir.dtypes import FLOATS
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType, fits, shape_text

TRAINING = "ai.onnx.preview.training"


def _groups(tensors, roles: int) -> list[tuple]:
    """Regroup [X1..Xn, G1..Gn, S1..Sn, ...] as one tuple (X, G, S, ...) per variable."""
    if len(tensors) % roles:
        raise ValueError(f"expected {roles} tensors per optimized variable, got "
                         f"{len(tensors)} in all")
    n = len(tensors) // roles
    return list(zip(*(tensors[i * n:(i + 1) * n] for i in range(roles))))


def _regroup_outputs(per_variable: list[tuple]) -> tuple:
    """[(X1', S1'), (X2', S2')] -> (X1', X2', S1', S2')."""
    return tuple(value for role in zip(*per_variable) for value in role)


def _as(xp, value, like):
    return xp.asarray(value).astype(like.dtype)


@op("Momentum", since=1, domain=TRAINING, dtypes=FLOATS)
def momentum(xp, R, T, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
    if None in (alpha, beta, mode, norm_coefficient):
        raise ValueError("Momentum needs the alpha, beta, mode and norm_coefficient attributes")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode must be 'standard' or 'nesterov', got {mode!r}")
    results = []
    for X, G, V in _groups(inputs, 3):
        r = _as(xp, R, X)
        beta_now = _as(xp, xp.where(xp.asarray(T) > 0, beta, 1.0), X)  # first step: beta=1
        g = X.dtype.type(norm_coefficient) * X + G
        v_new = X.dtype.type(alpha) * V + beta_now * g
        step = g + X.dtype.type(alpha) * v_new if mode == "nesterov" else v_new
        results.append((X - r * step, v_new))
    return _regroup_outputs(results)


@op("Adagrad", since=1, domain=TRAINING, dtypes=FLOATS)
def adagrad(xp, R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    results = []
    for X, G, H in _groups(inputs, 3):
        r = _as(xp, R / (1 + T * decay_factor), X)
        g = X.dtype.type(norm_coefficient) * X + G
        h_new = H + g * g
        results.append((X - r * g / (xp.sqrt(h_new) + X.dtype.type(epsilon)), h_new))
    return _regroup_outputs(results)


@op("Adam", since=1, domain=TRAINING, dtypes=FLOATS)
def adam(xp, R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    results = []
    T = xp.asarray(T)
    # bias correction from the second step on (T counts updates already done)
    corrected = R * xp.sqrt(1 - beta ** T) / (1 - alpha ** xp.where(T > 0, T, 1))
    for X, G, V, H in _groups(inputs, 4):
        kind = X.dtype.type
        r = _as(xp, xp.where(T > 0, corrected, R), X)
        g = kind(norm_coefficient) * X + G
        v_new = kind(alpha) * V + kind(1 - alpha) * g
        h_new = kind(beta) * H + kind(1 - beta) * g * g
        x_new = X - r * v_new / (xp.sqrt(h_new) + kind(epsilon))
        results.append((kind(1 - norm_coefficient_post) * x_new, v_new, h_new))
    return _regroup_outputs(results)


def _optimizer_infer(op_type: str, roles: int, names: tuple):
    """Outputs mirror the X's and the state tensors; the G's have no output. A variable's
    gradient and states must have its shape (a ValueError naming them otherwise)."""
    def infer(R, T, *tensors, **_):
        groups = _groups(tensors, roles)
        for index, group in enumerate(groups):
            shapes = [t.shape for t in group]
            if shapes[0] is not None and any(shape is not None and not fits(shape, shapes[0])
                                             for shape in shapes[1:]):
                described = ", ".join(f"{name} {shape_text(shape)}"
                                      for name, shape in zip(names, shapes))
                raise ValueError(f"{op_type}: variable {index + 1}'s {described} differ; "
                                 "each must have the variable's shape")
        per_variable = [tuple(TensorType(t.dtype, t.shape) for i, t in enumerate(g) if i != 1)
                        for g in groups]
        return list(_regroup_outputs(per_variable))
    return infer


momentum.infer(_optimizer_infer("Momentum", 3, ("X", "G", "V")))
adagrad.infer(_optimizer_infer("Adagrad", 3, ("X", "G", "H")))
adam.infer(_optimizer_infer("Adam", 4, ("X", "G", "V", "H")))
