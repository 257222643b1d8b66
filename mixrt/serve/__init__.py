"""Serving models over the Open Inference Protocol (KServe's v2), on KServe's Python model
server.

``mixrt serve`` (``server.py``) serves a model file, a folder holding one, or a repository,
over REST and gRPC, with dynamic batching, a bounded queue per model, per-request
deadlines, Triton's statistics and worker processes that share one copy of the weights.
Needs ``pip install mixrt[serve]``.

``MixrtModel`` (``model.py``) is the ``kserve.Model`` a name's versions are served by; it
loads KServe, which this package's other modules (``tensors``, ``batcher``) do not, so
that a client process can use them beside tritonclient's gRPC classes.
"""


def __getattr__(name: str):
    if name == "MixrtModel":
        from mixrt.serve.model import MixrtModel  # noqa: PLC0415 (kserve)
        return MixrtModel
    raise AttributeError(f"module 'mixrt.serve' has no attribute {name!r}")
