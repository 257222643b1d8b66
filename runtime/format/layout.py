"""Byte layout of a .mxr file outside the flatbuffer: the preamble, alignment, checksums.

::

    0            preamble: magic "MXR1", format version, header length, header CRC-32,
                 CRC-32 of those 20 bytes; zeros up to byte 64
    64           header: the mixrt.fbs flatbuffer (its own file identifier is "MXR1" too)
    ...          zeros up to the next multiple of 64
    data_offset  weight data: each numeric tensor at a multiple of 64 from here, zeros
                 between them; CRC-32 per chunk of ``checksum_chunk`` bytes, the list in
                 the header
    end          = data_offset + data_length exactly
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"MXR1"
FORMAT_VERSION = 1
ALIGNMENT = 64  # weight offsets and the data section's start; a cache line, and enough for SIMD
PREAMBLE_SIZE = 64
MAX_OPT_LEVEL = 2  # Session's opt_level range
CHECKSUM_CHUNK = 16 << 20  # per-chunk CRCs let large files be verified by several threads

# ONNX element type codes a map's keys may have (onnx.proto, MapProto): the integer types
# and string. A .mxr stores such a code in ValueType.key_type; anything else is refused.
MAP_KEY_TYPES = frozenset({2, 3, 4, 5, 6, 7, 8, 12, 13})

_PREAMBLE = struct.Struct("<4sIQI")  # magic, version, header length, header CRC
_PREAMBLE_CRC = struct.Struct("<I")


def align(size: int, alignment: int = ALIGNMENT) -> int:
    return -(-size // alignment) * alignment


def pack_preamble(header: bytes) -> bytes:
    head = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header), zlib.crc32(header))
    head += _PREAMBLE_CRC.pack(zlib.crc32(head))
    return head.ljust(PREAMBLE_SIZE, b"\0")


def unpack_preamble(preamble) -> tuple[int, int, int]:
    """(format version, header length, header CRC) of a 64-byte preamble; ValueError says
    what is wrong."""
    if len(preamble) < PREAMBLE_SIZE:
        raise ValueError(f"the file is {len(preamble)} bytes, shorter than the "
                         f"{PREAMBLE_SIZE}-byte preamble")
    magic, version, header_length, header_crc = _PREAMBLE.unpack_from(preamble, 0)
    if magic != MAGIC:
        raise ValueError(f"it starts with {bytes(magic)!r}, not the .mxr magic {MAGIC!r}")
    (stored,) = _PREAMBLE_CRC.unpack_from(preamble, _PREAMBLE.size)
    if stored != zlib.crc32(preamble[:_PREAMBLE.size]):
        raise ValueError("the preamble fails its checksum (the first 24 bytes are damaged)")
    if version != FORMAT_VERSION:
        raise ValueError(f"it is format version {version}; this mixrt reads version "
                         f"{FORMAT_VERSION}")
    if any(preamble[_PREAMBLE.size + _PREAMBLE_CRC.size:PREAMBLE_SIZE]):
        raise ValueError("the preamble's reserved bytes 24..63 are not zero")
    return version, header_length, header_crc


def data_offset(header_length: int) -> int:
    return align(PREAMBLE_SIZE + header_length)


def chunk_count(data_length: int, chunk: int) -> int:
    return -(-data_length // chunk)


class ChunkedCrc:
    """CRC-32 of each ``chunk``-byte piece of a stream fed in arbitrary pieces (the writer
    feeds padding and arrays; the chunks cut across them)."""

    def __init__(self, chunk: int = CHECKSUM_CHUNK):
        self.chunk, self.crcs, self._crc, self._filled = chunk, [], 0, 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.chunk - self._filled)
            self._crc = zlib.crc32(view[:take], self._crc)
            self._filled += take
            view = view[take:]
            if self._filled == self.chunk:
                self.crcs.append(self._crc)
                self._crc, self._filled = 0, 0

    def finish(self) -> list[int]:
        if self._filled:
            self.crcs.append(self._crc)
            self._crc, self._filled = 0, 0
        return self.crcs
