"""The model an InferenceSession loads, with what its options change in it first.

onnxruntime takes a path or the model's bytes. Several of its session options edit the model
before it runs, and mixrt does the same edits on the ONNX model before ``mixrt.Session``
loads it: free dimensions fixed by name or by denotation (the inputs' shapes then say the
size), initializers replaced by the caller's values, initializers the model keeps outside
itself given as arrays or as files in memory. ``ORT_LOAD_CONFIG_FROM_MODEL=1`` reads the
session options a model carries in its ``ort_config`` metadata, as onnxruntime does.
Without any of these the path or bytes go to ``mixrt.Session`` as they are.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import external_data_helper, numpy_helper

from mixrt.onnxruntime.errors import InvalidArgument, InvalidProtobuf, NoSuchFile
from mixrt.onnxruntime.options import SessionOptions

CONFIG_FROM_MODEL = "ORT_LOAD_CONFIG_FROM_MODEL"


@dataclass
class ModelMetadata:
    """onnxruntime's ``get_modelmeta()``: the model's producer, names and custom metadata."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelMetadata:
        return cls(model.producer_name, model.graph.name, model.domain, model.doc_string,
                   model.graph.doc_string, int(model.model_version),
                   {prop.key: prop.value for prop in model.metadata_props})


class ModelSource:
    """A path or bytes, read once as an ONNX model where its options or its metadata need."""

    def __init__(self, path_or_bytes):
        if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
            self.path, self.data = None, bytes(path_or_bytes)
            if not self.data:
                raise InvalidArgument("the model's bytes are empty")
        elif isinstance(path_or_bytes, (str, os.PathLike)):
            self.path, self.data = Path(os.fspath(path_or_bytes)), None
            if not self.path.is_file():
                raise NoSuchFile(f"Load model from {self.path} failed: the file does not "
                                 f"exist")
        else:
            raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")
        self._proto: onnx.ModelProto | None = None

    @property
    def base_dir(self) -> str:
        return str(self.path.parent) if self.path is not None else os.getcwd()

    def proto(self) -> onnx.ModelProto:
        """The model without its external data (read once, shared: do not edit it)."""
        if self._proto is None:
            try:
                if self.path is not None:
                    self._proto = onnx.load(str(self.path), load_external_data=False)
                else:
                    self._proto = onnx.load_from_string(self.data)
            except Exception as error:  # protobuf's DecodeError, or an OS error reading it
                where = self.path or "the bytes given"
                raise InvalidProtobuf(f"Load model from {where} failed: {error}") from error
        return self._proto

    def metadata(self) -> ModelMetadata:
        return ModelMetadata.of(self.proto())

    def options_from_model(self, options: SessionOptions | None) -> SessionOptions | None:
        """``options`` with the model's ``ort_config`` session options laid over them, where
        ORT_LOAD_CONFIG_FROM_MODEL=1 asks for it (onnxruntime's rule)."""
        if os.environ.get(CONFIG_FROM_MODEL, "0") != "1":
            return options
        props = {prop.key: prop.value for prop in self.proto().metadata_props}
        if "ort_config" not in props:
            return options
        try:
            values = json.loads(props["ort_config"]).get("session_options", {})
        except (ValueError, AttributeError) as error:
            raise InvalidArgument(f"the model's ort_config metadata is not the JSON object "
                                  f"onnxruntime reads: {error}") from error
        # the caller's options stay as they were; the session reads a copy
        merged = copy.copy(options) if options is not None else SessionOptions()
        for name, value in values.items():
            if not hasattr(merged, name):
                raise InvalidArgument(f"the model's ort_config sets {name!r}, which "
                                      f"SessionOptions does not have")
            current = getattr(merged, name)
            setattr(merged, name, type(current)(value))
        return merged

    def loadable(self, options: SessionOptions):
        """What mixrt.Session loads: the path or bytes, or the model edited as
        ``options`` say (its external data read in)."""
        if not _edits(options):
            return str(self.path) if self.path is not None else self.data
        model = onnx.ModelProto()
        model.CopyFrom(self.proto())
        _fix_free_dimensions(model, options)
        _give_initializers(model, options)
        external_data_helper.load_external_data_for_model(model, self.base_dir)
        return model


def _edits(options: SessionOptions) -> bool:
    return bool(options.free_dimensions_by_name or options.free_dimensions_by_denotation
                or options.initializers or options.external_initializers
                or options.external_files)


def _fix_free_dimensions(model: onnx.ModelProto, options: SessionOptions) -> None:
    for value in model.graph.input:
        if not value.type.HasField("tensor_type"):
            continue
        for dim in value.type.tensor_type.shape.dim:
            size = options.free_dimensions_by_denotation.get(dim.denotation) \
                if dim.denotation else None
            if size is None and dim.HasField("dim_param"):
                size = options.free_dimensions_by_name.get(dim.dim_param)
            if size is not None:
                dim.dim_value = size  # clears dim_param: the field is a oneof


def _give_initializers(model: onnx.ModelProto, options: SessionOptions) -> None:
    tensors = {tensor.name: tensor for tensor in model.graph.initializer}
    for name, array in {**options.initializers, **options.external_initializers}.items():
        if name not in tensors:
            raise InvalidArgument(f"initializer {name!r} given in the session options is not "
                                  f"an initializer of the model (it has "
                                  f"{', '.join(sorted(tensors)) or 'none'})")
        tensors[name].CopyFrom(numpy_helper.from_array(array, name))
    for tensor in tensors.values():
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _from_file_in_memory(tensor, options.external_files)


def _from_file_in_memory(tensor: onnx.TensorProto, files: dict[str, bytes]) -> None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    data = files.get(info.get("location", ""))
    if data is None:
        return  # read from disk beside the model
    offset = int(info.get("offset", 0))
    length = int(info.get("length", len(data) - offset))
    if offset + length > len(data):
        raise InvalidArgument(f"initializer {tensor.name!r} lies at bytes {offset}.."
                              f"{offset + length} of {info['location']!r}, which holds "
                              f"{len(data)}")
    tensor.raw_data = data[offset:offset + length]
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]
