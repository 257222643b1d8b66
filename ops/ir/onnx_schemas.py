"""The ONNX operator schemas' typing rules, from the table ``tools/onnx_tables.py`` writes
(``onnx_schemas.json``, next to this file), so that checking a model's types at load does not
import ``onnx`` (whose import and schema registry cost a small model most of its load time).

``get_schema(op_type, version, domain)`` answers as ``onnx.defs.get_schema`` does: the schema
in force at ``version`` (the newest whose since-version is not above it), or None where ONNX
has none. A schema here holds what the type check reads: the formal inputs and the type
constraints.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

TABLE = Path(__file__).resolve().parent / "onnx_schemas.json"

# onnx.defs.OpSchema.FormalParameterOption's values
SINGLE, OPTIONAL, VARIADIC = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Formal:
    """One formal input: its name, its type (a type parameter such as ``T``, or a type
    string such as ``tensor(int64)``), single/optional/variadic, and whether a variadic
    input's elements share one type."""
    name: str
    type_str: str
    option: int
    is_homogeneous: bool


@dataclasses.dataclass(frozen=True)
class Schema:
    domain: str
    name: str
    since_version: int
    inputs: tuple[Formal, ...]
    type_constraints: dict[str, frozenset[str]]  # type parameter -> the type strings allowed


@functools.cache
def _table() -> dict:
    return json.loads(TABLE.read_text())


def onnx_version() -> str:
    """The onnx release the table was written from."""
    return _table()["onnx"]


def get_schema(op_type: str, version: int, domain: str = "") -> Schema | None:
    """The schema of ``domain``'s ``op_type`` in force at opset ``version``, or None."""
    versions = _table()["schemas"].get(f"{domain}:{op_type}")
    if not versions:
        return None
    found = None
    for since, inputs, constraints in versions:  # ascending since-versions
        if since > version:
            break
        found = (since, inputs, constraints)
    return None if found is None else _schema(domain, op_type, found[0])


@functools.lru_cache(maxsize=4096)
def _schema(domain: str, op_type: str, since: int) -> Schema:
    table = _table()
    for version, inputs, constraints in table["schemas"][f"{domain}:{op_type}"]:
        if version == since:
            types = table["types"]
            return Schema(domain, op_type, since,
                          tuple(Formal(*formal) for formal in inputs),
                          {param: frozenset(types[index])
                           for param, index in constraints.items()})
    raise KeyError(f"{domain}:{op_type}-{since}")
