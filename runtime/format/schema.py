"""The layout of mixrt.fbs, read from the schema file itself.

The flatbuffers Python runtime trusts the buffer: a vtable offset that points before the
start silently wraps to the end, a string length past the end silently truncates, a cycle of
tables recurses forever. So the reader decodes with its own bounds-checked walker
(:mod:`.decode`), which needs to know, for every table, which vtable slot holds what. Parsing
the same ``mixrt.fbs`` that flatc compiles keeps one description of the layout instead of
two that could drift apart.

Only the subset of the schema language the file uses is understood: enums with an integer
underlying type, tables whose fields are scalars, enums, vectors of scalars, vectors of tables
or tables. Anything else (structs, unions, strings, field ids) is refused when the schema is
parsed, so a schema edit outside the subset fails every test at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SCHEMA_PATH = Path(__file__).with_name("mixrt.fbs")

# flatbuffers scalar type -> struct format character (little endian is applied by the caller)
SCALARS = {
    "bool": "?", "byte": "b", "ubyte": "B", "short": "h", "ushort": "H", "int": "i",
    "uint": "I", "long": "q", "ulong": "Q", "float": "f", "double": "d",
    "int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I",
    "int64": "q", "uint64": "Q", "float32": "f", "float64": "d",
}

SCALAR, VECTOR, TABLE, TABLES = "scalar", "vector", "table", "tables"


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # SCALAR, VECTOR (of scalars), TABLE or TABLES (vector of tables)
    fmt: str = ""  # struct character of the scalar or of the vector's elements
    target: str = ""  # table name for TABLE / TABLES
    enum: str = ""  # enum name when the scalar is an enum
    default: int | float = 0


@dataclass(frozen=True)
class Enum:
    name: str
    fmt: str
    values: dict  # name -> int

    @property
    def names(self) -> dict:
        return {value: name for name, value in self.values.items()}


@dataclass(frozen=True)
class Schema:
    tables: dict  # name -> tuple[Field, ...] in slot order
    enums: dict  # name -> Enum
    root: str
    identifier: bytes


class SchemaError(Exception):
    """mixrt.fbs uses something outside the subset this module understands (a bug in the
    schema, never in a model file)."""


@cache
def load_schema(path: Path = SCHEMA_PATH) -> Schema:
    return parse_schema(Path(path).read_text(encoding="utf-8"))


def parse_schema(text: str) -> Schema:
    text = re.sub(r"//[^\n]*", "", text)
    for word in ("struct", "union", "rpc_service", "include"):
        if re.search(rf"\b{word}\b", text):
            raise SchemaError(f"mixrt.fbs uses {word!r}, which the checked reader does not "
                              "support")
    enums = {m[1]: _parse_enum(m[1], m[2], m[3])
             for m in re.finditer(r"\benum\s+(\w+)\s*:\s*(\w+)\s*\{([^}]*)\}", text)}
    bodies = {m[1]: m[2] for m in re.finditer(r"\btable\s+(\w+)\s*\{([^}]*)\}", text)}
    tables = {name: _parse_fields(name, body, enums, bodies) for name, body in bodies.items()}
    root = re.search(r"\broot_type\s+(\w+)\s*;", text)
    ident = re.search(r'\bfile_identifier\s+"([^"]{4})"\s*;', text)
    if not root or root[1] not in tables or not ident:
        raise SchemaError("mixrt.fbs needs a root_type naming a table and a 4-character "
                          "file_identifier")
    return Schema(tables, enums, root[1], ident[1].encode("ascii"))


def _parse_enum(name: str, base: str, body: str) -> Enum:
    if base not in SCALARS or SCALARS[base] in "?fd":
        raise SchemaError(f"enum {name} has underlying type {base}; expected an integer type")
    values, next_value = {}, 0
    for entry in filter(None, (e.strip() for e in body.split(","))):
        m = re.fullmatch(r"(\w+)\s*(?:=\s*(-?\d+))?", entry)
        if not m:
            raise SchemaError(f"enum {name}: cannot read {entry!r}")
        next_value = int(m[2]) if m[2] is not None else next_value
        values[m[1]] = next_value
        next_value += 1
    if 0 not in values.values():
        raise SchemaError(f"enum {name} has no 0 value; an absent field would be invalid")
    return Enum(name, SCALARS[base], values)


def _parse_fields(table: str, body: str, enums: dict, tables: dict) -> tuple[Field, ...]:
    fields = []
    for entry in filter(None, (e.strip() for e in body.split(";"))):
        m = re.fullmatch(r"(\w+)\s*:\s*(\[?\s*\w+\s*\]?)\s*(?:=\s*([-\w.]+))?", entry)
        if not m:
            raise SchemaError(f"table {table}: cannot read field {entry!r} (attributes and "
                              "ids are not supported)")
        fields.append(_field(table, m[1], m[2].replace(" ", ""), m[3], enums, tables))
    return tuple(fields)


def _field(table, name, type_text, default, enums, tables) -> Field:
    vector = type_text.startswith("[")
    base = type_text.strip("[]")
    if base in tables:
        if default is not None:
            raise SchemaError(f"{table}.{name}: a table field cannot have a default")
        return Field(name, TABLES if vector else TABLE, target=base)
    if base in enums:
        fmt, enum = enums[base].fmt, base
        value = enums[base].values.get(default, 0) if default else 0
    elif base in SCALARS:
        fmt, enum = SCALARS[base], ""
        value = _number(default, fmt) if default else 0
    else:
        raise SchemaError(f"{table}.{name} has type {type_text}; expected a scalar, an enum, "
                          "a table or a vector of one (strings live in the string table)")
    if vector:
        return Field(name, VECTOR, fmt=fmt, enum=enum)
    return Field(name, SCALAR, fmt=fmt, enum=enum, default=value)


def _number(text: str, fmt: str):
    if fmt == "?":
        return text == "true"
    return float(text) if fmt in "fd" else int(text)
