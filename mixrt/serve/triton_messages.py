"""Triton's gRPC messages that KServe's protocol lacks or numbers differently: the model
statistics, the repository index, the load/unload request and the model configuration,
built from Triton's field numbers (its ``grpc_service.proto`` and ``model_config.proto``)
in a descriptor pool of their own, so that they never meet KServe's generated
``inference.*`` classes in the default pool (the two would clash, as KServe's and
tritonclient's do). Only the fields mixrt fills or reads are declared: a client's parser
skips what it does not know, and so does ours.
"""

from __future__ import annotations

from functools import lru_cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from mixrt.serve.statistics import BATCH_STAGES

SCALAR = descriptor_pb2.FieldDescriptorProto
ONE, MANY = SCALAR.LABEL_OPTIONAL, SCALAR.LABEL_REPEATED
TEXT, U64, FLAG, MESSAGE = SCALAR.TYPE_STRING, SCALAR.TYPE_UINT64, SCALAR.TYPE_BOOL, \
    SCALAR.TYPE_MESSAGE
I32, I64 = SCALAR.TYPE_INT32, SCALAR.TYPE_INT64  # an enum's value is an int32 on the wire
DURATION = ".inference.StatisticDuration"
STAGES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
          "cache_hit", "cache_miss")
# the classes a server makes and reads
SERVED = ("ModelStatisticsRequest", "ModelStatisticsResponse", "RepositoryIndexRequest",
          "RepositoryIndexResponse", "RepositoryModelRequest", "ModelConfigRequest",
          "ModelConfigResponse")


@lru_cache(maxsize=None)
def classes() -> dict:
    """{message name: its class}, for the names in SERVED."""
    proto = descriptor_pb2.FileDescriptorProto(name="mixrt_triton_extensions.proto",
                                               package="inference", syntax="proto3")
    proto.message_type.extend(_declared())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"inference.{name}")) for name in SERVED}


def _declared() -> list:
    return [
        _in_order("StatisticDuration", [("count", U64, ONE, None), ("ns", U64, ONE, None)]),
        _in_order("InferStatistics", [(stage, MESSAGE, ONE, DURATION) for stage in STAGES]),
        _in_order("InferBatchStatistics", [("batch_size", U64, ONE, None)] + [
            (stage, MESSAGE, ONE, DURATION) for stage in BATCH_STAGES]),
        _in_order("ModelStatistics", [
            ("name", TEXT, ONE, None), ("version", TEXT, ONE, None),
            ("last_inference", U64, ONE, None), ("inference_count", U64, ONE, None),
            ("execution_count", U64, ONE, None),
            ("inference_stats", MESSAGE, ONE, ".inference.InferStatistics"),
            ("batch_stats", MESSAGE, MANY, ".inference.InferBatchStatistics")]),
        _in_order("ModelStatisticsRequest", [("name", TEXT, ONE, None),
                                             ("version", TEXT, ONE, None)]),
        _in_order("ModelStatisticsResponse", [
            ("model_stats", MESSAGE, MANY, ".inference.ModelStatistics")]),
        _in_order("RepositoryIndexRequest", [("repository_name", TEXT, ONE, None),
                                             ("ready", FLAG, ONE, None)]),
        _in_order("RepositoryIndexResponse", [
            ("models", MESSAGE, MANY, ".inference.RepositoryIndexResponse.ModelIndex")],
            [_in_order("ModelIndex", [(f, TEXT, ONE, None)
                                      for f in ("name", "version", "state", "reason")])]),
        _in_order("RepositoryModelRequest", [("repository_name", TEXT, ONE, None),
                                             ("model_name", TEXT, ONE, None)]),
        _in_order("ModelConfigRequest", [("name", TEXT, ONE, None),
                                         ("version", TEXT, ONE, None)]),
        _numbered("ModelInput", [("name", 1, TEXT, ONE, None), ("data_type", 2, I32, ONE, None),
                                 ("dims", 4, I64, MANY, None)]),
        _numbered("ModelOutput", [("name", 1, TEXT, ONE, None), ("data_type", 2, I32, ONE, None),
                                  ("dims", 3, I64, MANY, None)]),
        _numbered("ModelConfig", [("name", 1, TEXT, ONE, None), ("platform", 2, TEXT, ONE, None),
                                  ("max_batch_size", 4, I32, ONE, None),
                                  ("input", 5, MESSAGE, MANY, ".inference.ModelInput"),
                                  ("output", 6, MESSAGE, MANY, ".inference.ModelOutput"),
                                  ("backend", 17, TEXT, ONE, None)]),
        _in_order("ModelConfigResponse", [("config", MESSAGE, ONE, ".inference.ModelConfig")]),
    ]


def _in_order(name: str, fields: list, nested=()) -> descriptor_pb2.DescriptorProto:
    """A message whose fields are numbered 1, 2, 3... in the order given: (name, type,
    label, message type name or None)."""
    return _numbered(name, [(field, number, *rest)
                            for number, (field, *rest) in enumerate(fields, 1)], nested)


def _numbered(name: str, fields: list, nested=()) -> descriptor_pb2.DescriptorProto:
    """A message of ``fields``: (name, number, type, label, message type name or None)."""
    kind = descriptor_pb2.DescriptorProto(name=name)
    for field, number, type_, label, type_name in fields:
        added = kind.field.add(name=field, number=number, type=type_, label=label)
        if type_name:
            added.type_name = type_name
    kind.nested_type.extend(nested)
    return kind
