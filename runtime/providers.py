"""onnxruntime's execution providers, as the mixrt devices that run them.

``Session(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])`` is how
onnxruntime's callers choose a device. The first provider of the list that this machine has
decides: ``CUDAExecutionProvider`` runs on ``gpu:N`` (N its ``device_id`` option, 0 unless
given), ``CPUExecutionProvider`` on the CPU. A provider onnxruntime knows and this machine
lacks (no GPU, or one of onnxruntime's other providers: TensorRT, OpenVINO, ...) is passed
over with an :class:`~mixrt.errors.OnnxruntimeOptionWarning` naming it, as onnxruntime
passes over a provider its build lacks, and the CPU is the last resort as in onnxruntime. A
name onnxruntime does not know is refused. A provider option mixrt has no counterpart for
is named in a warning, once.
"""

from __future__ import annotations

import collections.abc
import warnings
from dataclasses import dataclass, field

from mixrt.base.errors import InputError, OnnxruntimeOptionWarning
from mixrt.ops.device import gpu_count

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
# every provider onnxruntime 1.31 names, in its order of precedence (CPU last)
ALL_PROVIDERS = (
    "NvTensorRTRTXExecutionProvider", "TensorrtExecutionProvider", CUDA_PROVIDER,
    "MIGraphXExecutionProvider", "OpenVINOExecutionProvider", "DnnlExecutionProvider",
    "VitisAIExecutionProvider", "QNNExecutionProvider", "NnapiExecutionProvider",
    "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider",
    "ACLExecutionProvider", "DmlExecutionProvider", "RknpuExecutionProvider",
    "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
    "CANNExecutionProvider", "AzureExecutionProvider", CPU_PROVIDER,
)
# the provider options mixrt honours, by provider
HONOURED_OPTIONS = {CUDA_PROVIDER: ("device_id",), CPU_PROVIDER: ()}


class UnknownProviderError(InputError, RuntimeError):
    """A provider name onnxruntime does not know (onnxruntime raises a RuntimeError)."""


def available_providers() -> list[str]:
    """The providers this machine runs, in onnxruntime's order: CUDA where CuPy finds a GPU."""
    return [CUDA_PROVIDER, CPU_PROVIDER] if gpu_count() > 0 else [CPU_PROVIDER]


@dataclass
class ProviderChoice:
    """What a session runs on: its mixrt device, the providers it reports, and each
    provider's options as onnxruntime reports them (strings)."""

    device: object  # "cpu", "gpu:1", or a mixrt.Context
    providers: list[str]
    options: dict[str, dict[str, str]] = field(default_factory=dict)


def normalized(providers, provider_options=None) -> tuple[list[str], list[dict[str, str]]]:
    """onnxruntime's accepted forms of ``providers`` (names, or (name, options) pairs) and
    ``provider_options`` as (names, option dicts of strings); a repeated name keeps its first
    options, with a warning; malformed arguments are a ValueError, as in onnxruntime."""
    if providers is None:
        return [], []
    if not isinstance(providers, collections.abc.Sequence) or isinstance(providers, str):
        raise ValueError("'providers' should be a sequence.")
    pairs = _pairs(providers, provider_options)
    chosen: dict[str, dict[str, str]] = {}
    for name, options in pairs:
        if name in chosen:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=3)
            continue
        chosen[name] = {str(key): str(value) for key, value in options.items()}
    return list(chosen), list(chosen.values())


def _pairs(providers, provider_options) -> list[tuple[str, dict]]:
    if provider_options is None:
        pairs = []
        for provider in providers:
            if isinstance(provider, str):
                pairs.append((provider, {}))
            elif (isinstance(provider, tuple) and len(provider) == 2
                  and isinstance(provider[0], str) and isinstance(provider[1], dict)):
                pairs.append(provider)
            else:
                raise ValueError("'providers' values must be either strings or "
                                 "(string, dict) tuples.")
        return pairs
    if not isinstance(provider_options, collections.abc.Sequence):
        raise ValueError("'provider_options' should be a sequence.")
    if len(providers) != len(provider_options):
        raise ValueError("'providers' and 'provider_options' should be the same length if "
                         "both are given.")
    if not all(isinstance(provider, str) for provider in providers):
        raise ValueError("Only string values for 'providers' are supported if "
                         "'provider_options' is given.")
    if not all(isinstance(options, dict) for options in provider_options):
        raise ValueError("'provider_options' values must be dicts.")
    return list(zip(providers, provider_options))


def choose(providers, provider_options=None) -> ProviderChoice:
    """The device ``providers`` (onnxruntime's argument) asks for on this machine."""
    names, options = normalized(providers, provider_options)
    for name in names:
        if name not in ALL_PROVIDERS:
            raise UnknownProviderError(
                f"Unknown Provider Type: {name}; onnxruntime's providers are "
                f"{', '.join(ALL_PROVIDERS)}, and this machine runs "
                f"{', '.join(available_providers())}")
    for name, provider_options_ in zip(names, options):
        device = _device_for(name, provider_options_)
        if device is not None:
            _warn_unhonoured(name, provider_options_)
            return ProviderChoice(device, _reported(device), {name: provider_options_})
    return ProviderChoice("cpu", [CPU_PROVIDER], {CPU_PROVIDER: {}})


def _device_for(name: str, options: dict[str, str]) -> str | None:
    """The device ``name`` runs on here, or None (with a warning) where this machine lacks
    it and the next provider of the list is tried."""
    if name == CPU_PROVIDER:
        return "cpu"
    if name == CUDA_PROVIDER:
        index = _device_id(options)
        count = gpu_count()
        if index < count:
            return f"gpu:{index}"
        where = "no GPU that CuPy finds" if count == 0 else f"{count} GPU(s)"
        _fall_back(name, f"this machine has {where}; CUDAExecutionProvider's device_id is "
                         f"{index}")
        return None
    _fall_back(name, "mixrt runs models on the CPU and on CUDA GPUs only")
    return None


def _device_id(options: dict[str, str]) -> int:
    text = options.get("device_id", "0")
    try:
        index = int(text)
    except ValueError:
        raise InputError(f"CUDAExecutionProvider option device_id={text!r}; expected a GPU "
                         f"number") from None
    if index < 0:
        raise InputError(f"CUDAExecutionProvider option device_id={index}; expected 0 or more")
    return index


def _fall_back(name: str, why: str) -> None:
    warnings.warn(f"Specified provider '{name}' is not available here ({why}); the next "
                  f"provider of the list runs the model, the CPU last",
                  OnnxruntimeOptionWarning, stacklevel=4)


def _warn_unhonoured(name: str, options: dict[str, str]) -> None:
    ignored = sorted(set(options) - set(HONOURED_OPTIONS[name]))
    if ignored:
        warnings.warn(f"{name} options {', '.join(ignored)} have no mixrt counterpart and are "
                      f"not applied (mixrt honours: "
                      f"{', '.join(HONOURED_OPTIONS[name]) or 'none'})",
                      OnnxruntimeOptionWarning, stacklevel=4)


def _reported(device: str) -> list[str]:
    return [CUDA_PROVIDER] if device.startswith("gpu") else [CPU_PROVIDER]
