"""onnxruntime's ``InferenceSession`` over ``mixrt.Session``.

The session's options are read once (``settings.py``), the model edited where they say
(``model_source.py``), the device chosen from the providers (``runtime/providers.py``), and a
``mixrt.Session`` made with the rest. Runs go to it; mixrt's errors come out as onnxruntime's
classes (``errors.py``), each still the mixrt error it was.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from mixrt.base import run_options as run_limits
from mixrt.base.errors import DeviceUnavailableError, MixrtError, OnnxruntimeOptionWarning
from mixrt.onnxruntime import log
from mixrt.onnxruntime.errors import (Fail, InvalidArgument, OnnxruntimeError,
                                      RuntimeException, Terminated, as_onnxruntime_errors,
                                      translated_class)
from mixrt.onnxruntime.iobinding import IOBinding
from mixrt.onnxruntime.model_source import ModelMetadata, ModelSource
from mixrt.onnxruntime.optimized_model import write_optimized_model
from mixrt.onnxruntime.options import RunOptions, SessionOptions
from mixrt.onnxruntime.settings import session_settings, warn
from mixrt.onnxruntime.values import OrtMemoryInfo, OrtValue, OrtValueVector
from mixrt.ops.ir.types import SequenceType, TensorType
from mixrt.runtime.onnxruntime_surface import node_arg
from mixrt.runtime.passes.rewrite import overridable_initializers
from mixrt.runtime.providers import CPU_PROVIDER, UnknownProviderError, choose, normalized
from mixrt.runtime.session import Session


@dataclass(frozen=True)
class OrtEpDevice:
    """The provider and device an input is read on (``get_input_epdevices``)."""

    ep_name: str
    device_type: str
    device_id: int


@dataclass(frozen=True)
class OrtEpAssignedNode:
    domain: str
    op_type: str
    name: str


@dataclass(frozen=True)
class OrtEpAssignedSubgraph:
    ep_name: str
    nodes: tuple

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        return list(self.nodes)


class InferenceSession:
    """``InferenceSession(path_or_bytes, sess_options=None, providers=None,
    provider_options=None, **kwargs)``, as onnxruntime's."""

    def __init__(self, path_or_bytes, sess_options: SessionOptions | None = None,
                 providers=None, provider_options=None, **kwargs):
        disabled = kwargs.pop("disabled_optimizers", None)
        if kwargs:
            raise TypeError(f"InferenceSession() got unexpected keyword argument(s) "
                            f"{sorted(kwargs)}")
        with as_onnxruntime_errors():
            self._source = ModelSource(path_or_bytes)
            self._options = self._source.options_from_model(sess_options)
            self._settings = session_settings(self._options)
        if disabled:
            warn(self._settings, f"disabled_optimizers={sorted(disabled)}: mixrt's graph "
                                 f"passes are not onnxruntime's; graph_optimization_level "
                                 f"chooses them")
        self._fallback = True
        self._profiling_start_ns = time.time_ns()
        self._session: Session | None = None
        self._make(providers, provider_options)
        if self._settings.optimized_model_path:
            with as_onnxruntime_errors():
                write_optimized_model(self._session.graph, self._settings, warn)

    # -- making and remaking the mixrt session ---------------------------------------------

    def _make(self, providers, provider_options) -> None:
        added = self._options.providers if self._options is not None else []
        if providers is None and provider_options is None and added:
            providers = list(added)  # SessionOptions.add_provider's, as onnxruntime takes them
        elif providers is not None and added:
            warn(self._settings, "providers given to InferenceSession() and added to its "
                                 "SessionOptions: the InferenceSession()'s are used, as in "
                                 "onnxruntime")
        with as_onnxruntime_errors():
            choice = self._choice(providers, provider_options)
            model = self._source.loadable(self._options or SessionOptions())
            try:
                self._session = self._mixrt_session(model, choice)
            except DeviceUnavailableError as error:
                if choice.device == "cpu" or not self._fallback:
                    raise
                warn(self._settings, f"the session could not be made on {choice.device} "
                                     f"({error}); it falls back to {CPU_PROVIDER}")
                self._session = self._mixrt_session(model, choose([CPU_PROVIDER]))
        log.log(log.INFO, self._logid, f"session of {self._source.path or 'model bytes'} "
                f"on {self._session.device}, providers {self._session.get_providers()}",
                session_severity=self._severity)

    def _choice(self, providers, provider_options):
        try:
            if self._settings.quiet:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", OnnxruntimeOptionWarning)
                    return choose(providers, provider_options)
            return choose(providers, provider_options)
        except UnknownProviderError as error:
            raise RuntimeException(str(error)) from error

    def _mixrt_session(self, model, choice) -> Session:
        settings = self._settings
        profile = False
        if settings.profile_prefix is not None:
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
            profile = f"{settings.profile_prefix}{stamp}.json"
        session = Session(model, providers=[(name, options) for name, options
                                            in choice.options.items()],
                          opt_level=settings.opt_level, strategy=settings.strategy,
                          profile=profile)
        return session

    @property
    def _logid(self) -> str:
        return self._options.logid if self._options is not None else ""

    @property
    def _severity(self) -> int:
        return self._options.log_severity_level if self._options is not None else -1

    def set_providers(self, providers=None, provider_options=None) -> None:
        self._make(providers, provider_options)

    @property
    def _sess(self) -> _SessionCore:
        # made on each use: held as an attribute it would tie a reference cycle through
        # the session, which then waits for the cycle collector to free its weights
        return _SessionCore(self)

    def disable_fallback(self) -> None:
        self._fallback = False

    def enable_fallback(self) -> None:
        self._fallback = True

    # -- what the model and the session are ------------------------------------------------

    def get_session_options(self) -> SessionOptions:
        return self._options if self._options is not None else SessionOptions()

    def get_inputs(self):
        return self._session.get_inputs()

    def get_outputs(self):
        return self._session.get_outputs()

    def get_overridable_initializers(self):
        """The initializers the model also lists as inputs (from IR 4 on): a feed may
        replace them, as in onnxruntime."""
        graph = self._session.graph
        overridable = overridable_initializers(graph, graph.metadata.get("ir_version"))
        return [node_arg(value.name, value.type) for value in graph.inputs
                if value.name in overridable]

    def get_modelmeta(self) -> ModelMetadata:
        with as_onnxruntime_errors():
            return self._source.metadata()

    def get_providers(self) -> list[str]:
        return self._session.get_providers()

    def get_provider_options(self) -> dict:
        return self._session.get_provider_options()

    def get_input_memory_infos(self) -> list[OrtMemoryInfo]:
        return [OrtMemoryInfo.for_device(self._session.device) for _ in self.get_inputs()]

    def get_output_memory_infos(self) -> list[OrtMemoryInfo]:
        return [OrtMemoryInfo.for_device(self._session.device) for _ in self.get_outputs()]

    def get_input_epdevices(self) -> list[OrtEpDevice]:
        device = self._session.device
        ep = self.get_providers()[0]
        return [OrtEpDevice(ep, device.kind, device.index or 0) for _ in self.get_inputs()]

    def get_provider_graph_assignment_info(self) -> list[OrtEpAssignedSubgraph]:
        """Each node of the model with the provider that runs it, one subgraph a node as
        onnxruntime's CPU and CUDA providers claim them: a mixrt session runs every node on
        its one device (fused with its neighbours or not)."""
        if not self._settings.record_assignment:
            raise Fail("Session configuration entry 'session.record_ep_graph_assignment_info' "
                       "must be set to \"1\" to retrieve EP graph assignment information.")
        ep = self.get_providers()[0]
        with as_onnxruntime_errors():
            nodes = self._source.proto().graph.node
        return [OrtEpAssignedSubgraph(ep, (OrtEpAssignedNode(node.domain, node.op_type,
                                                             node.name),))
                for node in nodes]

    # -- runs ------------------------------------------------------------------------------

    def run(self, output_names, input_feed: dict, run_options: RunOptions | None = None):
        # NumPy feeds go to mixrt as they are: the drop-in adds ~1 us to a run, which is
        # ~6 us for a small model; anything else is converted first
        feeds = input_feed if _all_arrays(input_feed) else self._feeds(input_feed)
        try:
            return self._session.run(output_names or None, feeds, _limits(run_options))
        except MixrtError as error:
            self._feeds(input_feed)  # inputs left out: onnxruntime's message
            raise _translated(error) from error

    def run_async(self, output_names, input_feed, callback, user_data,
                  run_options: RunOptions | None = None) -> None:
        """Run on a thread of its own; ``callback(outputs, user_data, error_text)`` is called
        there with the outputs (and "") or with None and the error's text."""
        def work():
            try:
                outputs = self.run(output_names, input_feed, run_options)
            except Exception as error:  # the caller hears of it through the callback
                callback(None, user_data, f"{type(error).__name__}: {error}")
                return
            callback(outputs, user_data, "")
        _async_runner().submit(work)

    def run_with_ort_values(self, output_names, input_dict_ort_values,
                            run_options: RunOptions | None = None) -> OrtValueVector:
        outputs = self._on_device(output_names or None, input_dict_ort_values, run_options)
        return OrtValueVector(OrtValue(value) for value in outputs)

    def io_binding(self) -> IOBinding:
        return IOBinding(self)

    def run_with_iobinding(self, iobinding: IOBinding,
                           run_options: RunOptions | None = None) -> None:
        if iobinding._session is not self:
            raise ValueError("IOBinding must be used with the session that created it.")
        with as_onnxruntime_errors():
            iobinding.run(self._on_device, [arg.name for arg in self.get_outputs()],
                          run_options)

    def _on_device(self, output_names, feeds, run_options) -> list:
        feeds = self._feeds(feeds)
        with as_onnxruntime_errors():
            if run_options is None:
                return self._session.run_on_device(output_names, feeds)
            try:
                with run_limits.limited(_limits(run_options)):
                    return self._session.run_on_device(output_names, feeds)
            except run_limits.Expired as expired:  # before its first node
                raise Terminated(f"the run ended before its first node: {expired}") from None

    def _feeds(self, input_feed: dict) -> dict:
        """onnxruntime's feeds as mixrt takes them: OrtValues as their arrays, lists as
        arrays of the input's type, text of any NumPy string kind; and onnxruntime's
        message for inputs left out."""
        if not isinstance(input_feed, dict):
            raise InvalidArgument(f"input_feed is a {type(input_feed).__name__}; expected a "
                                  f"dict of input name -> value")
        declared = {value.name: value.type for value in self._session.graph.inputs}
        missing = [arg.name for arg in self.get_inputs() if arg.name not in input_feed]
        if missing:
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed "
                                  f"({list(input_feed)}).")
        return {name: _feed(value, declared.get(name)) for name, value in input_feed.items()}

    # -- profiling -------------------------------------------------------------------------

    def end_profiling(self) -> str:
        """Write the trace in onnxruntime's layout (a JSON array, one event a line) and
        start a new one; "" where profiling is off."""
        profiler = self._session.profiler
        if profiler is None:
            return ""
        with profiler._lock:
            events = list(profiler.events)
            profiler.events.clear()
        path = str(profiler.path)
        lines = [json.dumps(_trace_event(event, profiler._pid)) for event in events
                 if event.get("ph") == "X"]
        with open(path, "w") as trace:
            trace.write("[\n" + ",\n".join(lines) + ("\n" if lines else "") + "]\n")
        return path

    def get_profiling_start_time_ns(self) -> int:
        return self._profiling_start_ns


class _SessionCore:
    """``InferenceSession._sess``: the calls onnxruntime's Python class makes on its C
    session, which tools and tests reach for."""

    def __init__(self, owner: InferenceSession):
        self._owner = owner

    def run_with_ort_values(self, feeds: dict, output_names, run_options=None):
        return self._owner.run_with_ort_values(output_names, feeds, run_options)

    def run(self, output_names, feeds: dict, run_options=None):
        return self._owner.run(output_names, feeds, run_options)


@functools.cache
def _async_runner() -> ThreadPoolExecutor:
    """The threads ``run_async`` runs on, one per core at the most (as onnxruntime runs
    them on its pool, not a thread per call)."""
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                              thread_name_prefix="mixrt-run-async")


def _all_arrays(feeds) -> bool:
    if feeds.__class__ is not dict:
        return False
    for value in feeds.values():
        if value.__class__ is not np.ndarray or value.dtype.kind == "V":
            return False
    return True


def _translated(error: MixrtError) -> Exception:
    """``error`` as onnxruntime's class (itself where it is one already)."""
    if isinstance(error, OnnxruntimeError):
        return error
    return translated_class(error)(str(error))


def _limits(run_options):
    if run_options is None:
        return None
    if not hasattr(run_options, "terminate"):
        raise InvalidArgument(f"run_options is a {type(run_options).__name__}; expected "
                              f"mixrt.onnxruntime.RunOptions")
    return run_options


def _feed(value, declared):
    if isinstance(value, OrtValue):
        return value.value()
    if isinstance(value, list) and isinstance(declared, TensorType):
        value = np.asarray(value, dtype=declared.dtype if declared.dtype is not None
                           and np.dtype(declared.dtype).kind not in "OUS" else None)
    if isinstance(value, list) and isinstance(declared, SequenceType):
        return [_feed(item, declared.element) for item in value]
    if isinstance(value, np.ndarray) and value.dtype.kind == "V":
        return np.vectorize(lambda item: bytes(item).decode("utf-8"), otypes=[object])(value)
    return value


def _trace_event(event: dict, pid: int) -> dict:
    """One mixrt trace event as onnxruntime writes its own: cat, pid, tid, dur, ts, ph,
    name and args (the op and the node's inputs, where mixrt recorded them)."""
    return {"cat": "Node" if event.get("cat") == "kernel" else "Session",
            "pid": event.get("pid", pid), "tid": event.get("tid", 0),
            "dur": int(event.get("dur", 0)), "ts": int(event.get("ts", 0)), "ph": "X",
            "name": event.get("name", ""), "args": event.get("args", {})}


def check_and_normalize_provider_args(providers, provider_options,
                                      available_provider_names) -> tuple[list, list]:
    """onnxruntime's helper of that name: ``providers`` and ``provider_options`` as
    (names, option dicts of strings), warning of a name not among those available."""
    names, options = normalized(providers, provider_options)
    for name in names:
        if name not in available_provider_names:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                          f"Available providers: '{', '.join(available_provider_names)}'",
                          stacklevel=2)
    return names, options
