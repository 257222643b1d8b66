"""onnxruntime's ``SessionOptions`` and ``RunOptions``, and the enumerations they take.

Every field onnxruntime's classes have is here with onnxruntime's default, so code that sets
them runs unchanged. What each field does in mixrt is decided where a session is made
(``settings.py``): honoured, or named in a warning (or refused) when mixrt has nothing that
does what the field asks. Nothing set here is dropped without a word.
"""

from __future__ import annotations

import enum

import numpy as np

from mixrt.base.run_options import RunOptions as _MixrtRunOptions
from mixrt.onnxruntime.errors import InvalidArgument, NotImplemented as NotSupported


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class SessionOptions:
    """onnxruntime's session options; ``settings.session_settings`` reads them."""

    def __init__(self):
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.inter_op_num_threads = 0
        self.intra_op_num_threads = 0
        self.log_severity_level = -1  # -1: the process default (warnings and worse)
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self.config_entries: dict[str, str] = {}
        self.free_dimensions_by_name: dict[str, int] = {}
        self.free_dimensions_by_denotation: dict[str, int] = {}
        self.initializers: dict[str, np.ndarray] = {}  # replace the model's own
        self.external_initializers: dict[str, np.ndarray] = {}  # data the model keeps out
        self.external_files: dict[str, bytes] = {}  # external data files, given in memory
        self.providers: list[tuple[str, dict]] = []  # add_provider's, in order

    # -- configuration entries -------------------------------------------------------------

    def add_session_config_entry(self, key: str, value: str) -> None:
        self.config_entries[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self.config_entries:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}")
        return self.config_entries[key]

    # -- the model's inputs and initializers -----------------------------------------------

    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        self.free_dimensions_by_name[dim_name] = _dimension(dim_name, dim_value)

    def add_free_dimension_override_by_denotation(self, dim_denotation: str,
                                                  dim_value: int) -> None:
        self.free_dimensions_by_denotation[dim_denotation] = _dimension(dim_denotation,
                                                                        dim_value)

    def add_initializer(self, name: str, ort_value) -> None:
        self.initializers[name] = _host_array(name, ort_value)

    def add_external_initializers(self, names, ort_values) -> None:
        if len(names) != len(ort_values):
            raise InvalidArgument(f"add_external_initializers: {len(names)} names and "
                                  f"{len(ort_values)} values; expected one value per name")
        for name, value in zip(names, ort_values):
            self.external_initializers[name] = _host_array(name, value)

    def add_external_initializers_from_files_in_memory(self, names, buffers, lengths) -> None:
        if not len(names) == len(buffers) == len(lengths):
            raise InvalidArgument("add_external_initializers_from_files_in_memory: expected "
                                  "as many buffers and lengths as file names")
        for name, buffer, length in zip(names, buffers, lengths):
            self.external_files[str(name)] = bytes(memoryview(buffer).cast("B")[:int(length)])

    # -- providers and libraries -----------------------------------------------------------

    def add_provider(self, provider_name: str, provider_options: dict | None = None) -> None:
        self.providers.append((provider_name, dict(provider_options or {})))

    def has_providers(self) -> bool:
        return bool(self.providers)

    def register_custom_ops_library(self, library_path: str) -> None:
        raise NotSupported(f"register_custom_ops_library({library_path!r}): mixrt runs no "
                             f"compiled onnxruntime custom-op library; its operators are "
                             f"written in Python (docs/onnxruntime-api.md)")

    def __repr__(self):
        return f"SessionOptions({', '.join(f'{k}={v!r}' for k, v in vars(self).items() if v)})"


def _dimension(name: str, value) -> int:
    if int(value) < 0:
        raise InvalidArgument(f"free dimension {name!r} overridden to {value}; expected a "
                              f"size of 0 or more")
    return int(value)


def _host_array(name: str, value) -> np.ndarray:
    array = value.numpy() if hasattr(value, "numpy") else value
    if not isinstance(array, np.ndarray):
        raise InvalidArgument(f"initializer {name!r}: expected an OrtValue or a NumPy array, "
                              f"got {type(value).__name__}")
    return array


class RunOptions(_MixrtRunOptions):
    """onnxruntime's run options over mixrt's (``mixrt.RunOptions``): ``terminate`` set from
    another thread ends the run at its next node (a ``Fail``, as onnxruntime raises; also a
    ``mixrt.errors.RunTerminated``), and ``timeout`` (mixrt's own) is there too."""

    def __init__(self, timeout: float | None = None):
        super().__init__(timeout=timeout)
        self.log_severity_level = -1
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self.synchronize_execution_providers = True
        self.config_entries: dict[str, str] = {}

    def add_run_config_entry(self, key: str, value: str) -> None:
        self.config_entries[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self.config_entries:
            raise RuntimeError(f"RunOptions does not have configuration with key: {key}")
        return self.config_entries[key]

    def add_active_adapter(self, adapter) -> None:
        raise NotSupported("RunOptions.add_active_adapter: mixrt does not apply LoRA "
                             "adapters at run time")


__all__ = ["GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "SessionOptions",
           "RunOptions"]
