"""A flatbuffers decoder that checks every offset before it follows it.

Input is distrusted, so unlike the flatbuffers Python runtime this walker:

* checks that every table, vtable, field and vector lies inside the buffer before reading it;
* rejects an enum value the schema does not declare;
* visits every table and vector at most once: a writer never shares them (only vtables), so
  a second reference is damage, and refusing it makes cycles and "billion laughs" sharing
  impossible; the work is therefore bounded by the buffer's size;
* limits how deep tables nest, so a deep chain cannot exhaust the Python stack.

A table decodes to a dict of its fields (absent fields take the schema default: 0, an empty
vector, an empty list of tables or ``None`` for a table). Vectors of scalars are read-only
NumPy views of the buffer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .schema import SCALAR, TABLE, TABLES, VECTOR, Schema

MAX_DEPTH = 128  # tables nested inside tables; a Graph attribute costs 4 levels

_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_VTABLE_HEAD = struct.Struct("<HH")


class DecodeError(Exception):
    """The buffer is not a well-formed flatbuffer of the schema; the message says where."""


@dataclass(frozen=True)
class _Slot:
    name: str
    kind: str
    inline: int  # bytes the field takes inside its table
    unpack: struct.Struct | None
    dtype: np.dtype | None
    target: str
    allowed: frozenset | None  # enum values
    top: int  # the largest enum value (vectors are checked against 0..top when that is all)
    dense: bool  # the enum's values are exactly 0..top


class _Layout:
    """One table's fields, prepared for decoding."""

    def __init__(self, schema: Schema, name: str):
        self.name = name
        self.slots = [_slot(schema, field) for field in schema.tables[name]]
        self.defaults = {}
        for field, slot in zip(schema.tables[name], self.slots):
            if field.kind == SCALAR:
                self.defaults[field.name] = field.default
            elif field.kind == VECTOR:
                self.defaults[field.name] = np.empty(0, slot.dtype)
            elif field.kind == TABLES:
                self.defaults[field.name] = ()
            else:
                self.defaults[field.name] = None


def _slot(schema: Schema, field) -> _Slot:
    allowed = frozenset(schema.enums[field.enum].values.values()) if field.enum else None
    top = max(allowed) if allowed else 0
    dense = allowed == frozenset(range(top + 1))
    if field.kind == SCALAR:
        unpack = struct.Struct("<" + field.fmt)
        return _Slot(field.name, field.kind, unpack.size, unpack, None, "", allowed, top,
                     dense)
    dtype = np.dtype("<" + field.fmt) if field.kind == VECTOR else None
    return _Slot(field.name, field.kind, 4, None, dtype, field.target, allowed, top, dense)


class Decoder:
    def __init__(self, schema: Schema, max_depth: int = MAX_DEPTH):
        self.schema = schema
        self.max_depth = max_depth
        self.layouts = {name: _Layout(schema, name) for name in schema.tables}

    def decode(self, buf: bytes, fields: tuple[str, ...] = ()) -> dict:
        """The root table of ``buf`` as a dict; DecodeError on any damage. ``fields`` names
        the only root fields to read (the rest keep their defaults): a cheap first look."""
        return _Walk(self, buf, frozenset(fields)).root()


class _Walk:
    def __init__(self, decoder: Decoder, buf: bytes, only: frozenset):
        self.layouts, self.max_depth = decoder.layouts, decoder.max_depth
        self.schema = decoder.schema
        self.buf, self.size = buf, len(buf)
        self.seen: set[int] = set()
        self.only = only

    def root(self) -> dict:
        if self.size < 8:
            raise DecodeError(f"the header is {self.size} bytes; a flatbuffer needs at least 8")
        if self.buf[4:8] != self.schema.identifier:
            raise DecodeError(f"the header's file identifier is {bytes(self.buf[4:8])!r}, "
                              f"expected {self.schema.identifier!r}")
        return self.table(_U32.unpack_from(self.buf, 0)[0], self.schema.root, 0)

    def claim(self, pos: int, what) -> None:
        """Mark ``pos`` visited; ``what()`` names it, only when there is an error to report."""
        if pos in self.seen:
            raise DecodeError(f"the {what()} at byte {pos} is referenced twice (a writer "
                              "never shares one); the header is damaged")
        self.seen.add(pos)

    def table(self, pos: int, name: str, depth: int) -> dict:
        if depth > self.max_depth:
            raise DecodeError(f"tables nest more than {self.max_depth} levels deep at byte "
                              f"{pos} (subgraphs nested too deeply, or a damaged header)")
        self.claim(pos, lambda: f"{name} table")
        buf, size = self.buf, self.size
        if pos + 4 > size:
            raise DecodeError(f"a {name} table at byte {pos} lies past the end ({size} bytes)")
        vtable = pos - _I32.unpack_from(buf, pos)[0]
        if vtable < 0 or vtable + 4 > size:
            raise DecodeError(f"the {name} table at byte {pos} has its vtable at {vtable}, "
                              f"outside the {size}-byte header")
        vt_size, t_size = _VTABLE_HEAD.unpack_from(buf, vtable)
        if vt_size < 4 or vt_size % 2 or vtable + vt_size > size or t_size < 4 \
                or pos + t_size > size:
            raise DecodeError(f"the {name} table at byte {pos} has a vtable of {vt_size} bytes"
                              f" and a size of {t_size} bytes that do not fit the header")
        layout = self.layouts[name]
        count = min((vt_size - 4) // 2, len(layout.slots))  # newer writers may add fields
        offsets = struct.unpack_from(f"<{count}H", buf, vtable + 4)
        out = dict(layout.defaults)
        only = self.only if depth == 0 else None
        for slot, offset in zip(layout.slots, offsets):
            if not offset or (only and slot.name not in only):
                continue
            if offset + slot.inline > t_size:
                raise DecodeError(f"field {name}.{slot.name} at byte {pos + offset} lies "
                                  f"outside its {t_size}-byte table")
            if slot.kind == SCALAR:  # inline: most fields are scalars
                value = slot.unpack.unpack_from(buf, pos + offset)[0]
                if slot.allowed is not None and value not in slot.allowed:
                    raise DecodeError(f"field {name}.{slot.name} holds {value}, which is not "
                                      f"one of its enum's values {sorted(slot.allowed)} (a "
                                      "damaged file, or one a newer mixrt wrote)")
                out[slot.name] = value
            else:
                out[slot.name] = self.reference(slot, name, pos + offset, depth)
        return out

    def reference(self, slot: _Slot, table: str, at: int, depth: int):
        """The table or vector an offset field points to."""
        target = at + _U32.unpack_from(self.buf, at)[0]
        if slot.kind == TABLE:
            return self.table(target, slot.target, depth + 1)
        if slot.kind == VECTOR:
            return self.scalars(slot, table, target)
        return self.tables(slot, table, target, depth)

    def vector_length(self, pos: int, item: int, table: str, slot: _Slot) -> int:
        self.claim(pos, lambda: f"vector {table}.{slot.name}")
        if pos + 4 > self.size:
            raise DecodeError(f"vector {table}.{slot.name} at byte {pos} lies past the end "
                              f"({self.size} bytes)")
        count = _U32.unpack_from(self.buf, pos)[0]
        if pos + 4 + count * item > self.size:
            raise DecodeError(f"vector {table}.{slot.name} at byte {pos} claims {count} items "
                              f"of {item} bytes, past the end of the {self.size}-byte header")
        return count

    def scalars(self, slot: _Slot, table: str, pos: int) -> np.ndarray:
        count = self.vector_length(pos, slot.dtype.itemsize, table, slot)
        values = np.frombuffer(self.buf, slot.dtype, count, pos + 4)
        if slot.allowed is not None and count and not _in_enum(values, slot):
            raise DecodeError(f"vector {table}.{slot.name} holds values outside its enum's "
                              f"{sorted(slot.allowed)}")
        return values

    def tables(self, slot: _Slot, table: str, pos: int, depth: int) -> list[dict]:
        count = self.vector_length(pos, 4, table, slot)
        relative = np.frombuffer(self.buf, "<u4", count, pos + 4).astype(np.int64)
        starts = relative + (pos + 4 + 4 * np.arange(count, dtype=np.int64))
        return [self.table(start, slot.target, depth + 1) for start in starts.tolist()]


def _in_enum(values: np.ndarray, slot: _Slot) -> bool:
    if slot.dense:  # the common case, and a cheap one: a range check
        return int(values.min()) >= 0 and int(values.max()) <= slot.top
    return set(values.tolist()) <= slot.allowed
