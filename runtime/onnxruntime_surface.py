"""What a Session shares with ``onnxruntime.InferenceSession``, so that a service switches
by changing one line: the keyword arguments it accepts (onnxruntime's own, taken and not
used; any other name refused with the closest right one), and :class:`NodeArg`, the
description ``get_inputs()`` and ``get_outputs()`` give of each input and output, with
onnxruntime's type strings (``tensor(float)``, ``seq(tensor(int64))``, ``map(string,...)``).
None of it runs anything: it describes and checks, apart from the session's run machinery.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from mixrt.base.errors import InputError
from mixrt.ops.device import parse_device
from mixrt.ops.ir.types import MapType, OptionalType, SequenceType, TensorType
from mixrt.runtime.feeds import type_name
from mixrt.runtime.providers import ProviderChoice, choose


@dataclass(frozen=True)
class NodeArg:
    """An input or output as ``get_inputs``/``get_outputs`` describe it (onnxruntime's shape)."""

    name: str
    type: str  # "tensor(float)", "seq(tensor(int64))", ...
    shape: list | None  # ints, symbolic names (str) or None for unknown dims


def node_arg(name: str, value_type) -> NodeArg:
    """onnxruntime's description: a tensor's dims (None where its rank is unknown), and
    an empty shape for a sequence, map or optional, as onnxruntime gives them."""
    if not isinstance(value_type, TensorType):
        return NodeArg(name, type_string(value_type), [])
    return NodeArg(name, type_string(value_type),
                   list(value_type.shape) if value_type.shape is not None else None)


def type_string(value_type) -> str:
    if isinstance(value_type, TensorType):
        if value_type.dtype is None:
            return "tensor(?)"
        return f"tensor({type_name(value_type.dtype)})"
    if isinstance(value_type, SequenceType):
        return f"seq({type_string(value_type.element)})"
    if isinstance(value_type, MapType):
        key = "?" if value_type.key is None else type_name(value_type.key)
        return f"map({key},{type_string(value_type.value)})"
    if isinstance(value_type, OptionalType):
        return f"optional({type_string(value_type.element)})"
    return "?"


# InferenceSession's keyword arguments a Session takes besides ``providers``
ONNXRUNTIME_OPTIONS = ("sess_options", "provider_options", "disabled_optimizers")
SESSION_OPTIONS = ("device", "opt_level", "strategy", "profile", "cuda_graph", "providers",
                   *ONNXRUNTIME_OPTIONS)


def check_option_names(options: dict) -> None:
    """Refuse a keyword no Session takes (a typo would otherwise be ignored) and an
    onnxruntime option a Session would have to drop: ``sess_options`` is read by
    ``mixrt.onnxruntime.InferenceSession``, which maps each of its fields."""
    for name in options:
        if name not in ONNXRUNTIME_OPTIONS:
            close = difflib.get_close_matches(name, SESSION_OPTIONS, 1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InputError(f"Session() takes no option {name!r}{hint} Its options are "
                             f"{', '.join(SESSION_OPTIONS)}")
    if options.get("sess_options") is not None:
        raise InputError("Session() does not read onnxruntime's SessionOptions: "
                         "mixrt.onnxruntime.InferenceSession(path, sess_options=...) maps "
                         "each of its fields to a mixrt setting, or says it cannot")
    if options.get("disabled_optimizers"):
        raise InputError(f"Session(disabled_optimizers={options['disabled_optimizers']!r}): "
                         f"mixrt's graph passes are not onnxruntime's; opt_level=0, 1 or 2 "
                         f"chooses them (runtime/passes)")


def device_choice(device, providers, provider_options) -> ProviderChoice:
    """The device a Session runs on: ``device`` where given ("cpu", "gpu:1"), else the one
    onnxruntime's ``providers`` choose (runtime/providers.py), else the CPU."""
    if device is not None:
        if providers is not None or provider_options is not None:
            raise InputError(f"Session(device={device!r}, providers=...): give one of the "
                             f"two; providers are onnxruntime's way to choose a device")
        name = "CUDAExecutionProvider" if parse_device(device).kind == "gpu" \
            else "CPUExecutionProvider"
        return ProviderChoice(device, [name], {name: {}})
    if providers is None and provider_options is not None:
        raise InputError("Session(provider_options=...) without providers: name the "
                         "providers the options are for")
    return choose(providers, provider_options)


def check_option(name: str, value, allowed) -> None:
    if value not in allowed:
        raise InputError(f"Session option {name}={value!r} is not one of {list(allowed)}")
