"""Binary tensors straight to the model and back: gRPC's raw contents and REST's binary
extension, without MLServer's round trip through Python lists.

MLServer turns a gRPC request's raw bytes into a list of Python numbers (``struct.unpack``),
validates it into its pydantic types, and packs the answer's list back into bytes; for a
ResNet-50 image that is 150,528 numbers each way, ~8 ms of the worker's one event loop per
request. Where the model is mixrt's and every input came as raw bytes, the bytes go to
:meth:`MixrtRuntime.infer_arrays` as they are (``np.frombuffer``) and the output arrays'
bytes into the answer. Everything else (JSON inputs, another runtime, an unknown model)
takes MLServer's own path, which also gives its errors.
"""

from __future__ import annotations

import uuid

import grpc
from mlserver.errors import MLServerError
from mlserver.grpc import dataplane_pb2 as pb
from mlserver.grpc.servicers import InferenceServicer
from mlserver.grpc.utils import STATUS_CODE_MAPPING

from mixrt.serve import tensors
from mixrt.serve.runtime import MixrtRuntime


async def mixrt_model(data_plane, name: str, version: str | None):
    """The ready mixrt model ``name`` (``version``), or None where MLServer's own path must
    answer (another runtime, or an error of MLServer's to give)."""
    try:
        model = await data_plane._model_registry.get_model(name, version or None)
    except MLServerError:
        return None
    return model if isinstance(model, MixrtRuntime) and model.ready else None


def install_grpc(data_plane) -> None:
    """Route ModelInfer with raw contents through :func:`_raw_infer` in this process (a
    worker of ``mixrt serve``; MLServer's class is patched, every server of the process
    shares it)."""
    general = InferenceServicer.ModelInfer

    async def model_infer(servicer, request, context):
        model = None
        if request.raw_input_contents \
                and len(request.raw_input_contents) == len(request.inputs):
            model = await mixrt_model(data_plane, request.model_name, request.model_version)
        if model is None:
            return await general(servicer, request, context)
        return await _raw_infer(model, request, context)

    InferenceServicer.ModelInfer = model_infer


async def _raw_infer(model, request, context) -> pb.ModelInferResponse:
    request_id = request.id or str(uuid.uuid4())
    items = [(tensor.name, tensor.datatype, list(tensor.shape), raw)
             for tensor, raw in zip(request.inputs, request.raw_input_contents)]
    asked = [output.name for output in request.outputs] or None
    try:
        wanted, outputs = await model.infer_arrays(items, asked, request_id)
    except MLServerError as exc:
        await context.abort(STATUS_CODE_MAPPING.get(exc.status_code, grpc.StatusCode.UNKNOWN),
                            str(exc))
    response = pb.ModelInferResponse(model_name=model.name, model_version=model.version or "",
                                     id=request_id)
    for name, array in zip(wanted, outputs):
        datatype, shape, raw = tensors.encode_binary(array)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    return response
