"""The wire format of the parameter server: a small typed header frame, then at most one
payload frame (raw array bytes, sent and received without copies, or JSON). Never pickle.

Header (little-endian, 48 bytes, then the key's UTF-8 bytes):

    magic "MXKV" | version u8 | type u8 | flags u8 | dtype u8 | rank i32 | request u64
    offset i64 | count i64 | total i64 | key_length u16 | pad u16 | key bytes

An array message carries ``count`` elements starting at element ``offset`` of a flat array
of ``total`` elements (a part of a key that is split over the servers). A push or a pull
reply bigger than the job's message size travels as several such messages in a row, each a
piece of its part (``pieces``): a message of 32 MiB or more is received into freshly mapped
pages (glibc's largest mmap threshold), which fault in on every message, while buffers of a
few MiB come back from the heap warm; and the server sums the first pieces while the later
ones are still on the wire. ``decode`` checks
every field against the frame sizes before anything is read, so a malformed, truncated or
oversized message is a ``ProtocolError`` that the receiver logs and drops.

No frame a server or the scheduler receives is bigger than a piece: ZeroMQ closes the
connection of a peer that sends more (``ZMQ_MAXMSGSIZE``, checked before the frame is
buffered), so one frame cannot make a process allocate more than that. An initial value
therefore travels as an INIT naming the part (no payload) and, from worker 0, the part's
pieces as VALUE messages; optimizer states as a LOAD_STATES naming the arrays, then their
pieces. JSON bodies are bounded in size and depth (``json``), and every field a receiver
reads is checked for type and range (``text``, ``integer``).
"""

from __future__ import annotations

import json
import reprlib
import struct
from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import KVStoreError

MAGIC = b"MXKV"
VERSION = 1
HEADER = struct.Struct("<4sBBBBiQqqqHH")

# message types
TYPE_NAMES = dict(enumerate((
    "REGISTER", "WELCOME", "HEARTBEAT", "HEARTBEAT_ACK", "BARRIER", "BARRIER_DONE",
    "PEER_LOST", "ABORT", "BYE", "SHUTDOWN", "HELLO", "INIT", "PUSH", "PULL", "VALUE", "ACK",
    "ERROR", "SET_OPTIMIZER", "SET_COMPRESSION", "GET_STATES", "STATES", "LOAD_STATES",
    "STATUS"), start=1))
REGISTER, WELCOME, HEARTBEAT, HEARTBEAT_ACK, BARRIER, BARRIER_DONE, PEER_LOST, ABORT, BYE, \
    SHUTDOWN, HELLO, INIT, PUSH, PULL, VALUE, ACK, ERROR, SET_OPTIMIZER, SET_COMPRESSION, \
    GET_STATES, STATES, LOAD_STATES, STATUS = TYPE_NAMES
# messages that name a part of an array without carrying it
HEADER_ONLY = ("PULL", "GET_STATES", "INIT")

# flags
COMPRESSED = 1
# a dist_async PULL answered once every worker has pushed the key as often as the puller
# (what a pull after a barrier wants: the value every worker's last push went into)
SETTLED = 2

# bounds: control messages' JSON is small; a frame is at most a piece (the job's message
# size) plus this much for a header frame (48 bytes and a key of up to 64 KiB) or a blob's JSON
CONTROL_JSON_BYTES = 64 << 10
JSON_DEPTH = 6
FRAME_SLACK = 128 << 10

# payload kinds (the header's dtype field)
NONE, JSON, BLOB = 0, 1, 2
_ARRAY_DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bfloat16"]
DTYPE_CODES = {name: 10 + i for i, name in enumerate(_ARRAY_DTYPES)}
CODE_DTYPES = {code: name for name, code in DTYPE_CODES.items()}


class ProtocolError(KVStoreError):
    """A message that does not follow this format; receivers log and drop it."""


@dataclass
class Message:
    type: int
    rank: int = -1
    request: int = 0
    key: str = ""
    flags: int = 0
    dtype: int = NONE
    offset: int = 0
    count: int = 0
    total: int = 0
    payload: object = None  # bytes, a zmq.Frame or an array (sending)

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, str(self.type))

    def json(self, max_bytes: int = CONTROL_JSON_BYTES):
        """The JSON payload (a dict), at most ``max_bytes`` long and ``JSON_DEPTH`` deep."""
        if self.dtype != JSON:
            raise ProtocolError(f"{self.type_name} message carries no JSON")
        raw = _buffer(self.payload)
        if len(raw) > max_bytes:
            raise ProtocolError(f"{self.type_name} message: JSON payload of {len(raw)} bytes; "
                                f"at most {max_bytes} expected")
        try:
            value = json.loads(bytes(raw).decode())
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ProtocolError(f"{self.type_name} message: bad JSON payload: "
                                f"{str(exc)[:200]}") from None
        if not isinstance(value, dict):
            raise ProtocolError(f"{self.type_name} message: JSON payload is not an object")
        if _depth(value) > JSON_DEPTH:
            raise ProtocolError(f"{self.type_name} message: JSON nested deeper than "
                                f"{JSON_DEPTH} levels")
        return value

    def array(self) -> np.ndarray:
        """The payload as a read-only flat array viewing the received bytes (no copy)."""
        return np.frombuffer(_buffer(self.payload), dtype=array_dtype(self.dtype))

    def blob(self) -> tuple[dict, memoryview]:
        """A BLOB payload: a JSON object followed by raw bytes."""
        data = memoryview(_buffer(self.payload))
        if self.dtype != BLOB or len(data) < 4:
            raise ProtocolError(f"{self.type_name} message: not a blob")
        length = int.from_bytes(data[:4], "little")
        if 4 + length > len(data):
            raise ProtocolError(f"{self.type_name} message: blob header overruns its frame")
        meta = Message(self.type, dtype=JSON, payload=bytes(data[4:4 + length])).json()
        return meta, data[4 + length:]


def _depth(value) -> int:
    """How deep lists and objects nest in a parsed JSON value (1 for a flat object)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= JSON_DEPTH:
                stack += [(child, depth + 1) for child in
                          (item.values() if isinstance(item, dict) else item)]
    return deepest


def text(body: dict, name: str, what: str, *, max_length: int = 256,
         choices: tuple | None = None) -> str:
    """``body[name]``, checked to be a string (of ``choices``, when given)."""
    value = body.get(name)
    if not isinstance(value, str) or len(value) > max_length or \
            (choices is not None and value not in choices):
        expected = f"one of {choices}" if choices else f"a string of at most {max_length}"
        raise ProtocolError(f"{what}: field {name!r} is {reprlib.repr(value)}; expected "
                            f"{expected}")
    return value


def integer(body: dict, name: str, what: str, low: int, high: int, *,
            default: int | None = None) -> int:
    """``body[name]``, checked to be an int in [low, high] (``default`` when absent)."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(f"{what}: field {name!r} is {reprlib.repr(value)}; expected an "
                            f"integer in [{low}, {high}]")
    return value


def json_message(type_: int, body: dict | None = None, **fields) -> Message:
    return Message(type_, dtype=JSON, payload=json.dumps(body or {}).encode(), **fields)


def blob_message(type_: int, meta: dict, arrays: list[np.ndarray], **fields) -> Message:
    head = json.dumps(meta).encode()
    parts = [len(head).to_bytes(4, "little"), head] + [np.ascontiguousarray(a).tobytes()
                                                      for a in arrays]
    return Message(type_, dtype=BLOB, payload=b"".join(parts), **fields)


def array_message(type_: int, key: str, payload: np.ndarray, *, dtype=None, offset: int = 0,
                  total: int | None = None, count: int | None = None, flags: int = 0,
                  **fields) -> Message:
    """``payload`` must be C-contiguous; it is sent without a copy. ``dtype`` and ``count``
    describe the values it stands for (a compressed payload is packed bytes)."""
    count = payload.size if count is None else count
    return Message(type_, key=key, dtype=dtype_code(payload.dtype if dtype is None else dtype),
                   offset=offset, count=count, total=count if total is None else total,
                   flags=flags, payload=payload, **fields)


def encode(message: Message) -> list:
    key = message.key.encode()
    if len(key) > 0xFFFF:
        raise ProtocolError(f"key {message.key[:40]!r}... is too long")
    header = HEADER.pack(MAGIC, VERSION, message.type, message.flags, message.dtype,
                         message.rank, message.request, message.offset, message.count,
                         message.total, len(key), 0) + key
    if message.payload is None:
        return [header]
    payload = message.payload
    if isinstance(payload, np.ndarray):
        payload = memoryview(payload.reshape(-1).view(np.uint8))
    return [header, payload]


def decode(frames: list, max_message: int) -> Message:
    """Check and parse ``[header, payload?]``; anything off is a ProtocolError."""
    if not 1 <= len(frames) <= 2:
        raise ProtocolError(f"expected 1 or 2 frames, got {len(frames)}")
    header = bytes(_buffer(frames[0])[:HEADER.size + 0xFFFF + 1])
    if len(header) < HEADER.size:
        raise ProtocolError(f"header of {len(header)} bytes; expected at least {HEADER.size}")
    magic, version, type_, flags, dtype, rank, request, offset, count, total, key_length, _ = \
        HEADER.unpack_from(header)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"bad magic {magic!r} or version {version}")
    if len(header) != HEADER.size + key_length:
        raise ProtocolError(f"header is {len(header)} bytes; its key length says "
                            f"{HEADER.size + key_length}")
    if type_ not in TYPE_NAMES or not (dtype in (NONE, JSON, BLOB) or dtype in CODE_DTYPES):
        raise ProtocolError(f"unknown message type {type_} or payload kind {dtype}")
    try:
        key = header[HEADER.size:].decode()
    except UnicodeDecodeError:
        raise ProtocolError("key is not UTF-8") from None
    payload = frames[1] if len(frames) == 2 else None
    size = 0 if payload is None else len(_buffer(payload))
    if size > max_message:
        raise ProtocolError(f"payload of {size} bytes is over the {max_message}-byte limit")
    message = Message(type_, rank, request, key, flags, dtype, offset, count, total, payload)
    if dtype in CODE_DTYPES:
        _check_array_fields(message, size, max_message)
    elif payload is None and dtype != NONE:
        raise ProtocolError(f"{message.type_name}: payload kind {dtype} but no payload frame")
    return message


def _check_array_fields(message: Message, size: int, max_message: int) -> None:
    itemsize = array_dtype(message.dtype).itemsize
    if not (0 <= message.offset and 0 <= message.count
            and message.offset + message.count <= message.total
            and message.total * itemsize <= max_message):
        raise ProtocolError(f"{message.type_name} key {message.key!r}: part "
                            f"[{message.offset}, +{message.count}) of {message.total} "
                            f"elements is inconsistent or over the size limit")
    if message.type_name in HEADER_ONLY:
        if size:
            raise ProtocolError(f"{message.type_name} key {message.key!r} carries no "
                                f"payload; got {size} bytes")
        return
    expected = packed_size(message.count) if message.flags & COMPRESSED \
        else message.count * itemsize
    if size != expected:
        raise ProtocolError(f"{message.type_name} key {message.key!r}: payload of {size} "
                            f"bytes; {message.count} elements need {expected}")


def pieces(count: int, itemsize: int, message_bytes: int) -> list[tuple[int, int]]:
    """[(start, size)] cutting ``count`` elements into messages of at most
    ``message_bytes``; every piece but the last holds a multiple of 4 elements, so a 2-bit
    compressed part (4 values a byte) splits at byte boundaries."""
    step = max(4, message_bytes // itemsize // 4 * 4)
    return [(start, min(step, count - start)) for start in range(0, count, step)] or [(0, 0)]


def packed_size(count: int) -> int:
    """Bytes of a 2-bit compressed part (kvstore/compression.py: 4 values a byte)."""
    return (count + 3) // 4


def dtype_code(dtype) -> int:
    name = np.dtype(dtype).name
    if name not in DTYPE_CODES:
        raise KVStoreError(f"the KVStore carries {_ARRAY_DTYPES}, not {name}")
    return DTYPE_CODES[name]


def array_dtype(code: int) -> np.dtype:
    name = CODE_DTYPES.get(code)
    if name is None:
        raise ProtocolError(f"payload kind {code} is not an array")
    if name == "bfloat16":
        import ml_dtypes  # noqa: PLC0415
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _buffer(frame):
    """The bytes of a zmq.Frame (its buffer, no copy), bytes or memoryview."""
    return frame.buffer if hasattr(frame, "buffer") else frame
