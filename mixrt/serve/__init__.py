"""Serving models over the Open Inference Protocol (KServe's v2), on MLServer.

``MixrtRuntime`` is the MLServer runtime class a model-settings.json names
(``"implementation": "mixrt.serve.MixrtRuntime"``); ``mixrt serve`` (``server.py``) runs it
over a model file or a repository, with dynamic batching and worker processes that share
one copy of the weights. Needs ``pip install mixrt[serve]``.

The runtime is loaded on first use: importing ``mixrt.serve.tensors`` or ``.batcher`` does
not load MLServer, whose generated protobuf classes cannot share a process with
tritonclient's gRPC ones (both define ``inference.*``).
"""


def __getattr__(name: str):
    if name == "MixrtRuntime":
        from mixrt.serve.runtime import MixrtRuntime  # noqa: PLC0415 (mlserver)
        return MixrtRuntime
    raise AttributeError(f"module 'mixrt.serve' has no attribute {name!r}")
