"""Writes the two ONNX tables mixrt reads when it loads a model, so that loading never imports
the ``onnx`` package (~45 ms of CPU, most of a small model's load):

* ``importers/onnx-ml.desc``: onnx-ml.proto's compiled descriptor (a serialized
  FileDescriptorProto, 6 KB); ``importers/proto.py`` builds ModelProto and its parts from it
  with protobuf alone;
* ``ops/ir/onnx_schemas.json``: every operator schema's typing rules (its formal inputs and
  type constraints, per domain, name and since-version), which the load-time type check
  (``runtime/passes/typecheck.py``) reads through ``ops/ir/onnx_schemas.py``.

Both come from the installed onnx; run this after moving the onnx pin (tests/test_onnx_tables.py
fails until then):

    python tools/onnx_tables.py
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import defs, onnx_ml_pb2

ROOT = Path(__file__).resolve().parent.parent
DESCRIPTOR = ROOT / "importers" / "onnx-ml.desc"
SCHEMAS = ROOT / "ops" / "ir" / "onnx_schemas.json"


def descriptor_bytes() -> bytes:
    return onnx_ml_pb2.DESCRIPTOR.serialized_pb


def schema_table() -> dict:
    """{"onnx": version, "types": [allowed-type lists, each once], "schemas": {"domain:name":
    [[since_version, [[input name, type_str, option, homogeneous]...], {param: type list
    index}]...]}} with each op's versions in ascending order."""
    type_lists: dict[tuple, int] = {}
    schemas: dict[str, list] = {}
    for schema in sorted(defs.get_all_schemas_with_history(),
                         key=lambda s: (s.domain, s.name, s.since_version)):
        inputs = [[p.name, p.type_str, int(p.option), bool(p.is_homogeneous)]
                  for p in schema.inputs]
        constraints = {}
        for constraint in schema.type_constraints:
            allowed = tuple(sorted(constraint.allowed_type_strs))
            constraints[constraint.type_param_str] = type_lists.setdefault(allowed,
                                                                           len(type_lists))
        schemas.setdefault(f"{schema.domain}:{schema.name}", []).append(
            [schema.since_version, inputs, constraints])
    return {"onnx": onnx.__version__, "types": [list(t) for t in type_lists],
            "schemas": schemas}


def schema_text() -> str:
    return json.dumps(schema_table(), separators=(",", ":"), sort_keys=True) + "\n"


def main() -> None:
    DESCRIPTOR.write_bytes(descriptor_bytes())
    SCHEMAS.write_text(schema_text())
    print(f"wrote {DESCRIPTOR.relative_to(ROOT)} and {SCHEMAS.relative_to(ROOT)} "
          f"from onnx {onnx.__version__}")


if __name__ == "__main__":
    main()
