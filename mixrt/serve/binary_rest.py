"""REST's binary-tensor extension and the request body cap, in front of MLServer's REST app.

MLServer's REST front end reads JSON only; Triton's clients (``tritonclient.http``) send
tensors as binary by default: the body starts with a JSON header of
``Inference-Header-Content-Length`` bytes, and each input whose ``parameters`` carry a
``binary_data_size`` has that many raw bytes after it, in input order. The answer is
binary where the request asked (``binary_data_output``, or an output's ``binary_data``).
Such a request is decoded here; for a mixrt model its bytes go straight to the model and
the outputs' bytes back (``fast_paths.py``), for another runtime the request goes to
MLServer's data plane, the path its gRPC front end takes with raw contents.

Every request body is read here first and refused past ``max_body_bytes`` (413), before any
of it is parsed.
"""

from __future__ import annotations

import json
import re
import uuid

import numpy as np
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, Parameters, RequestInput, RequestOutput

from mixrt.serve import tensors
from mixrt.serve.fast_paths import mixrt_model

INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(/versions/(?P<version>[^/]+))?/infer$")
HEADER_LENGTH = b"inference-header-content-length"


class BinaryTensors:
    """ASGI middleware: ``BinaryTensors(app, data_plane, max_body_bytes)``."""

    def __init__(self, app, data_plane, max_body_bytes: int):
        self.app = app
        self.data_plane = data_plane
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() \
                and int(declared) > self.max_body_bytes:
            return await _error(send, 413, self._too_large(int(declared)))
        body = await self._read_body(receive)
        if body is None:
            return await _error(send, 413, self._too_large(None))
        match = INFER_PATH.match(scope["path"])
        if match and HEADER_LENGTH in headers:
            return await self._binary_infer(send, match, headers[HEADER_LENGTH], body)
        if scope["path"] == "/v2/repository/index" and not body.strip():
            body = b"{}"  # the protocol's body is optional (Triton's clients send none)
        return await self.app(scope, _replay(body), send)

    def _too_large(self, size) -> str:
        told = f"{size} bytes" if size is not None else "the body"
        return (f"request body too large: {told} over the cap of {self.max_body_bytes} bytes "
                f"(mixrt serve --max-body-mb)")

    async def _read_body(self, receive) -> bytes | None:
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body"):
                break
        return b"".join(parts)

    async def _binary_infer(self, send, match, header_length: bytes, body: bytes):
        try:
            request, binary_out = _parse(header_length, body)
            model = await mixrt_model(self.data_plane, match["name"], match["version"])
            if model is not None:  # the bytes straight to the model (fast_paths.py)
                items = [(i.name, i.datatype, i.shape, i.data) for i in request.inputs]
                asked = [o.name for o in request.outputs] if request.outputs else None
                request_id = request.id or str(uuid.uuid4())
                wanted, arrays = await model.infer_arrays(items, asked, request_id)
                return await _respond_arrays(send, model, request_id, wanted, arrays,
                                             binary_out)
            response = await self.data_plane.infer(request, match["name"], match["version"])
        except MLServerError as exc:
            return await _error(send, exc.status_code, str(exc))
        except ValueError as exc:
            return await _error(send, 400, str(exc))
        return await _respond(send, response, binary_out)


def _parse(header_length: bytes, body: bytes) -> tuple[InferenceRequest, set]:
    """The request in a binary body, and the outputs to answer in binary."""
    if not header_length.isdigit() or int(header_length) > len(body):
        raise ValueError(f"Inference-Header-Content-Length {header_length.decode(errors='replace')!r} "
                         f"is not a length within the body's {len(body)} bytes")
    split = int(header_length)
    try:
        header = json.loads(body[:split])
        inputs, offset = [], split
        for item in header["inputs"]:
            size = (item.get("parameters") or {}).get("binary_data_size")
            if size is None:
                data = item.get("data")
            else:
                if not isinstance(size, int) or size < 0 or offset + size > len(body):
                    raise ValueError(f"input '{item.get('name')}': binary_data_size {size} "
                                     f"runs past the body's end")
                data, offset = body[offset:offset + size], offset + size
            inputs.append(RequestInput.model_construct(
                name=str(item["name"]), datatype=str(item["datatype"]),
                shape=[int(d) for d in item["shape"]], data=data, parameters=None))
        if offset != len(body):
            raise ValueError(f"{len(body) - offset} bytes after the last binary input")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed binary inference request: {exc!r}") from None
    parameters = header.get("parameters") or {}
    outputs, binary_out = [], set()
    for item in header.get("outputs") or []:
        outputs.append(RequestOutput(name=str(item["name"])))
        if (item.get("parameters") or {}).get("binary_data", parameters.get(
                "binary_data_output", False)):
            binary_out.add(str(item["name"]))
    if not outputs and parameters.get("binary_data_output"):
        binary_out = None  # every output
    request = InferenceRequest.model_construct(id=header.get("id"), inputs=inputs,
                                               outputs=outputs or None,
                                               parameters=Parameters())
    return request, binary_out


async def _respond(send, response, binary_out):
    outputs, buffers = [], []
    for item in response.outputs:
        entry = {"name": item.name, "datatype": item.datatype, "shape": list(item.shape)}
        data = getattr(item.data, "root", item.data)
        if binary_out is None or item.name in binary_out:
            raw = _raw(item.datatype, item.shape, data)
            entry["parameters"] = {"binary_data_size": len(raw)}
            buffers.append(raw)
        else:
            entry["data"] = data
        outputs.append(entry)
    await _send_answer(send, {"id": response.id, "model_name": response.model_name,
                              "model_version": response.model_version, "outputs": outputs},
                       buffers)


async def _send_answer(send, header: dict, buffers: list) -> None:
    """The JSON header, then the binary outputs' bytes in order (announced by
    ``Inference-Header-Content-Length``), or JSON alone where none is binary."""
    encoded = json.dumps(header).encode()
    extra = [(b"inference-header-content-length", str(len(encoded)).encode())] if buffers \
        else []
    content_type = b"application/octet-stream" if buffers else b"application/json"
    await _send(send, 200, encoded + b"".join(buffers), content_type, extra)


async def _respond_arrays(send, model, request_id, wanted, arrays, binary_out):
    outputs, buffers = [], []
    for name, array in zip(wanted, arrays):
        if binary_out is None or name in binary_out:
            datatype, shape, raw = tensors.encode_binary(array)
            outputs.append({"name": name, "datatype": datatype, "shape": shape,
                            "parameters": {"binary_data_size": len(raw)}})
            buffers.append(raw)
        else:
            datatype, shape, data = tensors.encode(array)
            outputs.append({"name": name, "datatype": datatype, "shape": shape, "data": data})
    await _send_answer(send, {"id": request_id, "model_name": model.name,
                              "model_version": model.version, "outputs": outputs}, buffers)


def _raw(datatype: str, shape, data) -> bytes:
    array = np.asarray(data, dtype=object if datatype == "BYTES"
                       else tensors.DATATYPES[datatype]).reshape(shape)
    return tensors.encode_binary(array)[2]


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


async def _error(send, status: int, message: str):
    await _send(send, status, json.dumps({"error": message}).encode(), b"application/json")


async def _send(send, status: int, body: bytes, content_type: bytes, extra=()):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
