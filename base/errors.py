"""The typed errors mixrt raises (public name: ``mixrt.errors``).

Every error derives from :class:`MixrtError` so a service can catch one type. Each message
names the thing at fault (node, input, tensor, file, key or peer), what was found and what was
expected, because the person reading it usually cannot see our code.
"""

from __future__ import annotations


class MixrtError(Exception):
    """Base class of every error mixrt raises on purpose."""


class ModelLoadError(MixrtError):
    """A model file or byte string could not be read: damaged, hostile or not a model."""


class GraphError(MixrtError):
    """A graph is structurally invalid: a dangling input, a duplicate output, a cycle."""


class UnsupportedOperatorError(MixrtError):
    """No kernel exists for a node's (domain, op, opset, dtype, device).

    The message names the node and lists what *is* implemented, so a user can tell whether
    re-exporting at another opset or dtype would help.
    """

    def __init__(self, message: str, *, node: str | None = None, domain: str = "",
                 op_type: str = "", opset: int | None = None, dtype: str | None = None,
                 device: str | None = None):
        super().__init__(message)
        self.node = node
        self.domain = domain
        self.op_type = op_type
        self.opset = opset
        self.dtype = dtype
        self.device = device


class ShapeError(MixrtError):
    """A tensor's rank or shape is not what an input signature or an operator requires."""


class InputError(MixrtError):
    """A feed passed to ``Session.run`` has the wrong name, dtype, rank or shape."""


class ExecutionError(MixrtError):
    """A kernel failed while running; the message names the node and its op."""


class RunTerminated(ExecutionError):
    """A run ended before its last node because its ``RunOptions`` said so: its timeout
    passed, or another thread set ``terminate``. The message names the node it stopped in;
    the session stays usable."""


class MissingDependencyError(MixrtError, ImportError):
    """A feature's library is not installed: one that only it uses, which pyproject.toml
    lists in an extra rather than among mixrt's dependencies. The message names the feature,
    the library and the ``pip install 'mixrt[EXTRA]'`` that brings it; ``extra`` is that
    extra's name. An ``ImportError`` too, as the failed import it stands for."""

    def __init__(self, message: str, *, extra: str = ""):
        super().__init__(message)
        self.extra = extra


def missing_dependency(feature: str, library: str, extra: str) -> MissingDependencyError:
    """The error for ``feature`` run without ``library``, which ``extra`` installs; raise
    it ``from`` the ImportError so that the traceback keeps why the import failed."""
    return MissingDependencyError(f"{feature} needs {library}: pip install 'mixrt[{extra}]'",
                                  extra=extra)


class DeviceMismatchError(MixrtError):
    """Arrays on different devices met in one operation."""


class DeviceUnavailableError(MixrtError):
    """A device was requested that this machine does not have (or CuPy is not installed),
    or asked to hold what it cannot (a dtype CuPy lacks)."""


class GradientError(MixrtError):
    """A gradient cannot be built: an op without a gradient definition, a loss or parameter
    that is not in the graph, or a non-float tensor asked to carry a gradient."""

    def __init__(self, message: str, *, node: str | None = None, op_type: str = ""):
        super().__init__(message)
        self.node = node
        self.op_type = op_type


class OptimizerError(MixrtError):
    """An optimizer or learning-rate scheduler was asked for by a name, a hyper-parameter or
    a value it does not have, or given a checkpoint that does not fit it; the message names
    the bad value and lists the valid choices."""


class ExportError(MixrtError):
    """A graph cannot be written as ONNX: an op the target opset cannot express, or a
    mixrt-internal op with no standard decomposition. The message names the node."""


class KVStoreError(MixrtError):
    """Base class of the KVStore's errors."""


class PeerLostError(KVStoreError):
    """A KVStore peer died or stopped answering; the message names it."""


class KVTimeoutError(KVStoreError):
    """A KVStore wait (barrier, pull, init) passed its timeout."""


class EngineError(MixrtError):
    """Work pushed to the dependency engine raised; re-raised at the next wait on an array
    it wrote. ``op_name`` names the op, ``pushed_at`` the Python line that pushed it, and the
    original exception is the ``__cause__``."""

    def __init__(self, message: str, *, op_name: str = "", pushed_at: str = ""):
        super().__init__(message)
        self.op_name = op_name
        self.pushed_at = pushed_at


class HybridizeError(GraphError):
    """A HybridBlock cannot be traced into a graph: Python control flow that depends on a
    tensor's value, a NumPy call on a traced symbol, ...; the message names the block, the
    line and the fix."""


class BlasPolicyWarning(UserWarning):
    """Not an error: mixrt was imported after NumPy and could not re-tune NumPy's OpenBLAS
    in place, which then runs without the settings mixrt's CPU kernels are tuned with (see
    ``runtime/blas_policy.py``)."""


class LenientLoadWarning(UserWarning):
    """Not an error: the model breaks the spec in a way onnxruntime tolerates; mixrt loads
    it as onnxruntime does, and the message names the node and what was assumed
    (``importers/onnxruntime_leniency.py`` has the cases; ``mixrt check --json`` lists them)."""


class OnnxruntimeOptionWarning(UserWarning):
    """Not an error: an onnxruntime option or provider a session was given that mixrt
    cannot honour as asked (a provider this machine lacks, a provider option with no mixrt
    counterpart); the message names it and says what mixrt does instead
    (``runtime/providers.py``, ``mixrt/onnxruntime/settings.py``)."""


# MXNet's one error type (``mxnet.base.MXNetError``): code written against MXNet catches it
# around any call, and every error mixrt raises on purpose is one
MXNetError = MixrtError


__all__ = [
    "BlasPolicyWarning", "LenientLoadWarning", "OnnxruntimeOptionWarning", "MixrtError", "MXNetError", "ModelLoadError", "GraphError", "UnsupportedOperatorError", "ShapeError",
    "InputError", "ExecutionError", "RunTerminated", "MissingDependencyError",
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "ExportError", "KVStoreError", "PeerLostError", "KVTimeoutError", "GradientError",
    "OptimizerError", "EngineError", "HybridizeError",
]


# the classes' public home: tracebacks and reprs say ``mixrt.errors.InputError``, the name
# users import and catch (``mixrt/errors.py`` re-exports this module)
for _name in __all__:
    globals()[_name].__module__ = "mixrt.errors"
del _name
