"""REST inference (JSON and the binary-tensor extension, to a model or one of its versions)
and the request body cap, in front of KServe's REST app.

Triton's clients (``tritonclient.http``) send tensors as binary by default: the body starts
with a JSON header of ``Inference-Header-Content-Length`` bytes, and each input whose
``parameters`` carry a ``binary_data_size`` has that many raw bytes after it, in input
order. The answer is binary where the request asked (``binary_data_output``, or an output's
``binary_data``). Such a request is decoded here and its bytes go straight to the model
(``np.frombuffer``) and the outputs' bytes back, without KServe's round trip through
Python lists. JSON requests are answered here too: KServe's route refuses a version
(``/v2/models/NAME/versions/V/infer``), and reads a body without a JSON Content-Type, as
Triton's HTTP client sends its JSON, as binary. Every other path (health, metadata,
readiness, the repository) goes on to KServe's app.

Every request body is read here first and refused past ``max_body_bytes`` (413), before any
of it is parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from types import SimpleNamespace

from mixrt.serve import tensors
from mixrt.serve.model import client_deadline
from mixrt.serve.outcomes import BadRequest, ServeError

INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(/versions/(?P<version>[^/]+))?/infer$")
HEADER_LENGTH = b"inference-header-content-length"


class BinaryTensors:
    """ASGI middleware: ``BinaryTensors(app, repository, max_body_bytes)``, ``repository``
    a ``model.MixrtRepository``."""

    def __init__(self, app, repository, max_body_bytes: int):
        self.app = app
        self.repository = repository
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() \
                and int(declared) > self.max_body_bytes:
            return await error(send, 413, self._too_large(int(declared)))
        body = await self._read_body(receive)
        if body is None:
            return await error(send, 413, self._too_large(None))
        match = INFER_PATH.match(scope["path"])
        if match:
            return await self._infer(send, match, headers.get(HEADER_LENGTH), body)
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

    async def _infer(self, send, match, header_length: bytes | None, body: bytes):
        try:
            try:
                request, binary_out = _parse(header_length, body)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
            served = self.repository.served(match["name"], match["version"])
            items = [(i.name, i.datatype, i.shape, i.data) for i in request.inputs]
            asked = [o.name for o in request.outputs] if request.outputs else None
            request_id = request.id or str(uuid.uuid4())

            def encode(wanted, arrays):
                return _answer(served, request_id, wanted, arrays, binary_out)
            header, buffers = await served.infer_arrays(
                items, asked, request_id, client_deadline(request.parameters), encode)
        except ServeError as exc:
            return await error(send, exc.status, str(exc), exc.headers())
        return await _send_answer(send, header, buffers)


def _parse(header_length: bytes | None, body: bytes) -> tuple[SimpleNamespace, set]:
    """The request in a body (binary where ``header_length`` is given, else JSON), and the
    outputs to answer in binary (None: every one)."""
    if header_length is None:
        header_length = str(len(body)).encode()
    if not header_length.isdigit() or int(header_length) > len(body):
        told = header_length.decode(errors="replace")
        raise ValueError(f"Inference-Header-Content-Length {told!r} is not a length within "
                         f"the body's {len(body)} bytes")
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
            inputs.append(SimpleNamespace(
                name=str(item["name"]), datatype=str(item["datatype"]),
                shape=[int(d) for d in item["shape"]], data=data))
        if offset != len(body):
            raise ValueError(f"{len(body) - offset} bytes after the last binary input")
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
        raise ValueError(f"malformed binary inference request: {exc!r}") from None
    parameters = header.get("parameters") or {}
    outputs, binary_out = [], set()
    for item in header.get("outputs") or []:
        outputs.append(SimpleNamespace(name=str(item["name"])))
        if (item.get("parameters") or {}).get("binary_data", parameters.get(
                "binary_data_output", False)):
            binary_out.add(str(item["name"]))
    if not outputs and parameters.get("binary_data_output"):
        binary_out = None  # every output
    request = SimpleNamespace(id=header.get("id"), inputs=inputs, outputs=outputs or None,
                              parameters=parameters)
    return request, binary_out


async def _send_answer(send, header: dict, buffers: list) -> None:
    """The JSON header, then the binary outputs' bytes in order (announced by
    ``Inference-Header-Content-Length``), or JSON alone where none is binary."""
    encoded = json.dumps(header).encode()
    extra = [(b"inference-header-content-length", str(len(encoded)).encode())] if buffers \
        else []
    content_type = b"application/octet-stream" if buffers else b"application/json"
    await _send(send, 200, encoded + b"".join(buffers), content_type, extra)


def _answer(served, request_id, wanted, arrays, binary_out) -> tuple[dict, list]:
    """The answer's JSON header and its binary outputs' bytes, in order."""
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
    return {"id": request_id, "model_name": served.name,
            "model_version": served.version or "", "outputs": outputs}, buffers


def _replay(body: bytes):
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


async def error(send, status: int, message: str, headers: dict | None = None):
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await _send(send, status, json.dumps({"error": message}).encode(), b"application/json",
                extra)


async def _send(send, status: int, body: bytes, content_type: bytes, extra=()):
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
