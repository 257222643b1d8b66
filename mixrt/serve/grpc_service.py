"""The gRPC front end of a ``mixrt serve`` worker: KServe's ``GRPCInferenceService``
servicer, with what mixrt adds.

* Versions: ModelReady and ModelMetadata answer for the version asked (KServe's ignore it),
  and ModelInfer runs it.
* Raw contents straight to the model: where every input came as raw bytes (Triton's clients
  send them so), the bytes go to the version's ``infer_arrays`` as they are
  (``np.frombuffer``) and the outputs' bytes into the answer, without KServe's conversion
  through ``InferRequest``; typed contents take KServe's path (``model.MixrtModel.predict``).
* A client's deadline: the call's own, where it set one, limits the request (with
  ``--request-timeout-s``).
* Triton's RepositoryIndex, ModelStatistics and ModelConfig, which KServe's protocol
  lacks, and its
  RepositoryModelLoad and Unload, whose requests KServe's protocol numbers differently;
  their messages are built from Triton's field numbers (``triton_messages.py``).
  Load and unload reach every worker before they answer.
* Each outcome of ``outcomes.py`` as its status code (503's ``UNAVAILABLE`` for an
  overload, ``DEADLINE_EXCEEDED`` for a timeout, ...).
"""

from __future__ import annotations

import uuid

import grpc
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.model_repository_extension import ModelRepositoryExtension

from mixrt.serve import statistics, tensors, triton_messages
from mixrt.serve.model import client_deadline
from mixrt.serve.outcomes import NotFound, Overloaded, ServeError

SERVICE = "inference.GRPCInferenceService"
# the methods whose messages KServe's protocol shares with Triton's, served by KServe's
# servicer (or mixrt's overrides of it)
KSERVE_METHODS = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
}


class MixrtServicer(InferenceServicer):
    def __init__(self, data_plane, repository):
        super().__init__(data_plane, ModelRepositoryExtension(model_registry=repository))
        self.repository = repository

    async def ModelReady(self, request, context) -> pb.ModelReadyResponse:
        try:
            self.repository.served(request.name, request.version)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request, context) -> pb.ModelMetadataResponse:
        try:
            metadata = self.repository.served(request.name, request.version).metadata()
        except ServeError as exc:
            await abort(context, exc)
        return pb.ModelMetadataResponse(
            name=metadata["name"], versions=metadata["versions"],
            platform=metadata["platform"],
            inputs=[_tensor_metadata(t) for t in metadata["inputs"]],
            outputs=[_tensor_metadata(t) for t in metadata["outputs"]])

    async def ModelInfer(self, request, context) -> pb.ModelInferResponse:
        try:
            if request.raw_input_contents \
                    and len(request.raw_input_contents) == len(request.inputs):
                return await self._raw_infer(request, context)
            self.repository.served(request.model_name, request.model_version)
            return await super().ModelInfer(request, context)
        except ServeError as exc:
            await abort(context, exc)
        except ValueError as exc:  # KServe's InvalidInput: a malformed request
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def _raw_infer(self, request, context) -> pb.ModelInferResponse:
        served = self.repository.served(request.model_name, request.model_version)
        request_id = request.id or str(uuid.uuid4())
        items = [(tensor.name, tensor.datatype, list(tensor.shape), raw)
                 for tensor, raw in zip(request.inputs, request.raw_input_contents)]
        asked = [output.name for output in request.outputs] or None

        def encode(wanted, arrays) -> pb.ModelInferResponse:
            response = pb.ModelInferResponse(model_name=served.name,
                                             model_version=served.version or "",
                                             id=request_id)
            for name, array in zip(wanted, arrays):
                datatype, shape, raw = tensors.encode_binary(array)
                response.outputs.add(name=name, datatype=datatype, shape=shape)
                response.raw_output_contents.append(raw)
            return response
        return await served.infer_arrays(items, asked, request_id,
                                         _deadline(request, context), encode)


async def abort(context, exc: ServeError) -> None:
    """End the call with ``exc``'s status code and message; an overload also says when to
    retry, as ``retry-after`` (seconds, as REST's header) and gRPC's own
    ``grpc-retry-pushback-ms``, which a client's retry policy obeys."""
    trailers = ()
    if isinstance(exc, Overloaded):
        trailers = (("retry-after", exc.headers()["Retry-After"]),
                    ("grpc-retry-pushback-ms", str(max(1, round(exc.retry_after * 1e3)))))
    await context.abort(exc.code, str(exc), trailing_metadata=trailers)


def _tensor_metadata(tensor: dict):
    return pb.ModelMetadataResponse.TensorMetadata(
        name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])


def _deadline(request, context) -> float | None:
    """The shorter of the call's own deadline and the request's ``timeout`` parameter."""
    found = [d for d in (context.time_remaining(), client_deadline(request.parameters))
             if d is not None]
    return min(found) if found else None


# -- Triton's extensions ------------------------------------------------------------------------

def extension_handlers(repository, operations) -> dict:
    """Triton's RepositoryIndex, ModelStatistics, RepositoryModelLoad and Unload. KServe's
    own load and unload messages put the model's name in field 1, where Triton's put the
    repository's (the name is field 2): read with Triton's layout, a request from either
    client finds its name; the answer is KServe's, whose fields Triton's client skips."""
    messages = triton_messages.classes()

    def load_or_unload(op: str, answer):
        async def call(request, context):
            name = request.model_name or request.repository_name
            try:
                await getattr(operations, op)(name)
            except ServeError as exc:
                await abort(context, exc)
            return answer(name)
        return call

    async def model_statistics(request, context):
        try:
            stats = statistics.model_stats(repository.pairs(request.name or None,
                                                             request.version or None))
        except ServeError as exc:
            await abort(context, exc)
        for entry in stats:
            del entry["memory_usage"]  # not a field of this message (Triton's MemoryUsage)
        return messages["ModelStatisticsResponse"](model_stats=stats)

    async def model_config(request, context):
        try:
            config = repository.served(request.name, request.version).config()
        except ServeError as exc:
            await abort(context, exc)
        config.pop("dynamic_batching", None)  # not among this message's fields
        for tensor in config["input"] + config["output"]:
            tensor["data_type"] = tensors.CONFIG_TYPES[
                "BYTES" if tensor["data_type"] == "TYPE_STRING" else tensor["data_type"][5:]]
        return messages["ModelConfigResponse"](config=config)

    async def repository_index(request, context):
        listed = repository.index()
        if request.ready:
            listed = [m for m in listed if m["state"] == "READY"]
        return messages["RepositoryIndexResponse"](models=listed)

    def unary(handler, request_type, response_type):
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=messages[request_type].FromString,
            response_serializer=(response_type.SerializeToString
                                 if not isinstance(response_type, str)
                                 else messages[response_type].SerializeToString))
    loaded = load_or_unload("load", lambda name: pb.RepositoryModelLoadResponse(
        model_name=name, isLoaded=True))
    unloaded = load_or_unload("unload", lambda name: pb.RepositoryModelUnloadResponse(
        model_name=name, isUnloaded=True))
    return {
        "ModelStatistics": unary(model_statistics, "ModelStatisticsRequest",
                                 "ModelStatisticsResponse"),
        "RepositoryIndex": unary(repository_index, "RepositoryIndexRequest",
                                 "RepositoryIndexResponse"),
        "ModelConfig": unary(model_config, "ModelConfigRequest", "ModelConfigResponse"),
        "RepositoryModelLoad": unary(loaded, "RepositoryModelRequest",
                                     pb.RepositoryModelLoadResponse),
        "RepositoryModelUnload": unary(unloaded, "RepositoryModelRequest",
                                       pb.RepositoryModelUnloadResponse)}


def server(repository, data_plane, operations, address: str,
           max_message_bytes: int) -> grpc.aio.Server:
    """A gRPC server on ``address`` (gRPC sets SO_REUSEPORT, so every worker binds it)."""
    options = [("grpc.max_send_message_length", max_message_bytes),
               ("grpc.max_receive_message_length", max_message_bytes)]
    grpc_server = grpc.aio.server(options=options)
    servicer = MixrtServicer(data_plane, repository)
    handlers = {name: grpc.unary_unary_rpc_method_handler(
        getattr(servicer, name), request_deserializer=request.FromString,
        response_serializer=response.SerializeToString)
        for name, (request, response) in KSERVE_METHODS.items()}
    handlers.update(extension_handlers(repository, operations))
    grpc_server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, handlers),))
    grpc_server.add_insecure_port(address)
    return grpc_server
