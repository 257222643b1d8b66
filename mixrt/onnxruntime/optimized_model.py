"""``SessionOptions.optimized_model_filepath``: the graph mixrt runs, after its passes,
written as an ONNX model (mixrt's fused nodes decomposed into ONNX operators by the
exporter, ``exporters/onnx.py``), with onnxruntime's config entries for external data: the
initializers of at least ``..._min_size_in_bytes`` bytes go to the file
``..._file_name`` beside the model. A model onnx's checker refuses (its own declared
shapes contradicting its operators, which onnxruntime and mixrt both run past) is written
as it is, with a warning that quotes the checker.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from mixrt.base.errors import ExportError
from mixrt.exporters.onnx import export_model
from mixrt.runtime.graph import Graph


def write_optimized_model(graph: Graph, settings, warn) -> Path:
    path = Path(os.fspath(settings.optimized_model_path))
    try:
        model = export_model(graph)
    except ExportError as error:
        if "onnx's checker" not in str(error):
            raise
        warn(settings, f"optimized_model_filepath {str(path)!r}: written although {error}")
        model = export_model(graph, check=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    if settings.external_file:
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=settings.external_file,
                        size_threshold=settings.external_min_bytes, convert_attribute=False)
    else:
        onnx.save_model(model, str(path))
    return path
