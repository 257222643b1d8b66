"""onnxruntime's exception classes, each also one of mixrt's typed errors.

A service written for onnxruntime catches ``Fail``, ``InvalidArgument``, ``NoSuchFile``... from
``onnxruntime.capi.onnxruntime_pybind11_state``; a service written for mixrt catches
``mixrt.errors.MixrtError`` and its kinds. Each class here is both, so either kind of caller
catches what ``mixrt.onnxruntime`` raises: an ``InvalidArgument`` is an ``InputError``, a
``NoSuchFile`` a ``ModelLoadError`` and a ``FileNotFoundError``. Their messages start as
onnxruntime's do (``[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ...``), the text after that
mixrt's own, which names the node, input or file.
"""

from __future__ import annotations

import contextlib

from mixrt.base.errors import (DeviceUnavailableError, ExecutionError, GraphError, InputError,
                               MixrtError, ModelLoadError, RunTerminated, ShapeError,
                               UnsupportedOperatorError)


class OnnxruntimeError(MixrtError):
    """The base of the classes below; ``code`` is onnxruntime's status code."""

    code = 1
    status = "FAIL"

    def __init__(self, message: str = ""):
        prefix = f"[ONNXRuntimeError] : {self.code} : {self.status} : "
        super().__init__(message if message.startswith("[ONNXRuntimeError]") else prefix + message)


class Fail(OnnxruntimeError, ExecutionError):
    code, status = 1, "FAIL"


class InvalidArgument(OnnxruntimeError, InputError, ValueError, RuntimeError):
    """A feed or argument refused. onnxruntime's Python layer raises a ValueError for some
    (inputs left out), its C layer a RuntimeError for others (a feed it cannot convert):
    this is both, so either ``except`` a service wrote catches it."""

    code, status = 2, "INVALID_ARGUMENT"


class NoSuchFile(OnnxruntimeError, ModelLoadError, FileNotFoundError):
    code, status = 3, "NO_SUCHFILE"


class NoModel(OnnxruntimeError, ModelLoadError):
    code, status = 4, "NO_MODEL"


class EngineError(OnnxruntimeError, ExecutionError):
    code, status = 5, "ENGINE_ERROR"


class RuntimeException(OnnxruntimeError, ExecutionError, RuntimeError):
    code, status = 6, "RUNTIME_EXCEPTION"


class InvalidProtobuf(OnnxruntimeError, ModelLoadError):
    code, status = 7, "INVALID_PROTOBUF"


class ModelLoaded(OnnxruntimeError):
    code, status = 8, "MODEL_LOADED"


class NotImplemented(OnnxruntimeError, UnsupportedOperatorError):  # noqa: A001 (onnxruntime's)
    code, status = 9, "NOT_IMPLEMENTED"


class InvalidGraph(OnnxruntimeError, GraphError):
    code, status = 10, "INVALID_GRAPH"


class EPFail(OnnxruntimeError, DeviceUnavailableError):
    code, status = 11, "EP_FAIL"


class Terminated(Fail, RunTerminated):
    """A run ended by ``RunOptions.terminate`` (onnxruntime answers FAIL) or by mixrt's
    ``timeout``: a ``Fail`` to onnxruntime's callers, a ``RunTerminated`` to mixrt's."""


# mixrt's error kinds, most specific first, and the onnxruntime class each becomes
_TRANSLATIONS = (
    (RunTerminated, Terminated),
    (FileNotFoundError, NoSuchFile),
    (ModelLoadError, InvalidProtobuf),
    (UnsupportedOperatorError, NotImplemented),
    (GraphError, InvalidGraph),
    (InputError, InvalidArgument),
    (ShapeError, InvalidArgument),
    (DeviceUnavailableError, EPFail),
    (ExecutionError, RuntimeException),
    (MixrtError, Fail),
)


def translated_class(error: BaseException) -> type[OnnxruntimeError] | None:
    for kind, translation in _TRANSLATIONS:
        if isinstance(error, kind):
            return translation
    return None


@contextlib.contextmanager
def as_onnxruntime_errors():
    """Raise mixrt's errors inside as onnxruntime's classes (the original as the cause);
    what is already one of them, or no error of mixrt's, passes through."""
    try:
        yield
    except OnnxruntimeError:
        raise
    except (MixrtError, FileNotFoundError) as error:
        translation = translated_class(error)
        if translation is None:
            raise
        raise translation(str(error)) from error


__all__ = ["OnnxruntimeError", "Fail", "InvalidArgument", "NoSuchFile", "NoModel",
           "EngineError", "RuntimeException", "InvalidProtobuf", "ModelLoaded",
           "NotImplemented", "InvalidGraph", "EPFail", "Terminated", "as_onnxruntime_errors"]
