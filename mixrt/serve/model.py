"""mixrt's models on KServe's Python model server: a ``kserve.Model`` per name, holding its
versions, and the ``kserve.ModelRepository`` the repository API loads and unloads them in.

KServe keys its models by name alone (its v2 endpoints answer a version with "not
supported"); a name here holds every version its folder has (``runtime.ServedVersion``),
answers a request that names none with the highest, and one that names another with a
404 that lists the versions there are. ``predict`` is KServe's entry for JSON over REST and
for gRPC tensors sent as typed contents; the binary paths (REST's binary extension, gRPC's
raw contents) reach the versions' ``infer_arrays`` directly (``rest.py``,
``grpc_service.py``), skipping KServe's copies through Python lists.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelRepository
from kserve.errors import InferenceError, InvalidInput, ModelNotFound, ServerNotReady

from mixrt.serve import repository, tensors
from mixrt.serve.outcomes import BadRequest, NotFound, Overloaded, ServeError
from mixrt.serve.runtime import ServedVersion, no_such_version

logger = logging.getLogger("mixrt.serve")


class MixrtModel(Model):
    """The versions of one model name, served by mixrt sessions. Under KServe's own
    ``ModelServer``: ``MixrtModel.from_file(name, path, max_batch_size=8, ...)``."""

    def __init__(self, name: str, versions: list[ServedVersion]):
        super().__init__(name)
        self.versions = {v.version or "": v for v in versions}
        self.latest = versions[-1]  # repository.entries lists a name's versions in order
        # raise KServe's error types, which its own server turns into statuses, rather
        # than mixrt's (which `mixrt serve` answers with Retry-After and 504s)
        self.kserve_errors = False

    @classmethod
    def from_file(cls, name: str, path: str, **extra) -> "MixrtModel":
        """A model file (a folder holding model.mxr or model.onnx, as KServe's
        ``/mnt/models``) prepared and ready for ``kserve.ModelServer().start([model])``;
        ``extra``: its settings (``runtime.py``: max_batch_size, max_delay_ms, max_queue,
        device, request_timeout_s)."""
        folder = Path(path)
        if folder.is_dir() and repository.model_file(folder) is not None:
            path = str(repository.model_file(folder))
        entry = repository.lone_entry(path, name, extra)
        model = cls(name, [ServedVersion(entry.name, None, entry.path, entry.extra)])
        model.kserve_errors = True
        # a loop of its own, closed after, leaving none set: KServe's start makes its own
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(model.load_versions())
        finally:
            loop.close()
        return model

    async def load_versions(self) -> None:
        for served in self.versions.values():
            await served.load()
        self.ready = True

    def load(self) -> bool:  # KServe's synchronous hook: loading is load_versions
        return self.ready

    def stop(self) -> None:
        """KServe's unload hook: each version stops taking requests and finishes those it
        holds (in the background: KServe calls this synchronously)."""
        self.ready = False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop runs (a process on its way out): nothing to finish
            return
        for served in self.versions.values():
            loop.create_task(served.unload())

    def version(self, version: str | None) -> ServedVersion:
        """The version a request names ("" or None: the latest)."""
        if not version:
            return self.latest
        served = self.versions.get(version)
        if served is None or not served.ready:
            raise no_such_version(self.name, version, [v for v, s in self.versions.items()
                                                       if s.ready])
        return served

    def get_input_types(self) -> list[dict]:
        return [spec.metadata() for spec in self.latest.prepared.inputs]

    def get_output_types(self) -> list[dict]:
        return [spec.metadata() for spec in self.latest.prepared.outputs]

    async def predict(self, payload: InferRequest, headers=None) -> InferResponse:
        try:
            return await self._predict(payload)
        except ServeError as exc:
            if not self.kserve_errors:
                raise
            raise _as_kserve_error(exc, self.name) from None

    async def _predict(self, payload: InferRequest) -> InferResponse:
        served = self.version(payload.model_version)
        items = [(i.name, i.datatype, list(i.shape), _data_of(i)) for i in payload.inputs]
        asked = [o.name for o in payload.request_outputs or []] or None
        request_id = payload.id or str(uuid.uuid4())

        def encode(wanted, arrays) -> InferResponse:
            outputs = []
            for name, array in zip(wanted, arrays):
                array = np.asarray(array)
                datatype = "BYTES" if array.dtype == object or array.dtype.kind in "US" \
                    else tensors.datatype_of(array.dtype.newbyteorder("="))
                output = InferOutput(name, list(array.shape), datatype)
                # encoded here: KServe's to_grpc cannot take an array as the data
                output.set_data_from_numpy(array, binary_data=payload.use_binary_outputs)
                outputs.append(output)
            return InferResponse(request_id, self.name, outputs,
                                 model_version=served.version or "",
                                 use_binary_outputs=payload.use_binary_outputs,
                                 requested_outputs=payload.request_outputs)
        return await served.infer_arrays(items, asked, request_id,
                                         client_deadline(payload.parameters), encode)


def _data_of(item):
    """An input's values: JSON's list, or (raw bytes that KServe decoded) an array."""
    if item.data is not None and len(item.data):
        return item.data
    try:
        return item.as_numpy()
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"input '{item.name}': its binary data does not fit shape "
                         f"{list(item.shape)} of {item.datatype} ({exc})") from None


def _as_kserve_error(exc: ServeError, name: str) -> Exception:
    if isinstance(exc, BadRequest):
        return InvalidInput(str(exc))
    if isinstance(exc, NotFound):
        return ModelNotFound(name)
    if isinstance(exc, Overloaded):
        return ServerNotReady(str(exc))  # KServe's 503
    return InferenceError(str(exc))


def client_deadline(parameters) -> float | None:
    """The request's own deadline, seconds from now: the protocol's ``timeout`` parameter
    (microseconds, as Triton's clients send it), or None."""
    if not parameters or "timeout" not in parameters:
        return None
    value = parameters["timeout"]
    value = getattr(value, "int64_param", value)  # gRPC's InferParameter
    try:
        micros = int(value)
    except (TypeError, ValueError):
        return None
    return micros / 1e6 if micros > 0 else None


class MixrtRepository(ModelRepository):
    """KServe's model repository over what ``repository.entries`` finds: ``load(name)``
    makes and prepares every version of ``name``; ``index()`` lists each version with its
    state, as Triton's repository API does."""

    def __init__(self, root: str, extra: dict, single: dict | None = None):
        super().__init__(models_dir=root)
        self.root = root
        self.extra = extra
        self.single = single

    def found(self) -> list[repository.Entry]:
        return repository.entries(self.root, self.extra, self.single)

    async def load(self, name: str) -> bool:
        entries = [e for e in self.found() if e.name == name]
        if not entries:
            raise NotFound(f"no model {name} in the repository {self.root}")
        model = MixrtModel(name, [ServedVersion(e.name, e.version, e.path, e.extra)
                                  for e in entries])
        await model.load_versions()
        old = self.get_model(name)
        self.update(model)
        if old is not None:
            old.stop()
        return True

    async def load_all(self) -> None:
        for name in dict.fromkeys(e.name for e in self.found()):
            await self.load(name)

    def served(self, name: str, version: str | None) -> ServedVersion:
        """The ready version a request names, or a NotFound naming what is missing."""
        model = self.get_model(name)
        if not isinstance(model, MixrtModel) or not model.ready:
            raise NotFound(f"model {name} not found")
        return model.version(version)

    def index(self) -> list[dict]:
        loaded = self.get_models()
        listed = []
        for entry in self.found():
            model = loaded.get(entry.name)
            ready = isinstance(model, MixrtModel) and model.ready \
                and (entry.version or "") in model.versions
            listed.append({"name": entry.name, "version": entry.version or "",
                           "state": "READY" if ready else "UNAVAILABLE",
                           "reason": "" if ready else "unloaded"})
        return listed

    def pairs(self, name: str | None = None, version: str | None = None) -> list[tuple]:
        """(name, version) of the loaded versions, of ``name`` (and ``version``) alone
        where given."""
        pairs = [(n, v) for n, m in self.get_models().items() if isinstance(m, MixrtModel)
                 for v in m.versions]
        if name is not None:
            if not any(n == name for n, _ in pairs):
                raise NotFound(f"model {name} not found")
            pairs = [(n, v) for n, v in pairs if n == name and version in (None, "", v)]
            if version and not pairs:
                raise no_such_version(name, version, [v for n, v in self.pairs(name)])
        return pairs
