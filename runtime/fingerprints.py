"""What a warm marker of the kernel tiers (``runtime/kernel_tiers.py``) stands for: a hash
of what decides which kernels a graph calls, and a stamp of what else decides the compiled
kernels (the kernel sources, numba, Python, the CPU, the settings)."""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from pathlib import Path

import numpy as np

import mixrt.ops as ops_package

# integer initializers up to this many elements enter a graph's fingerprint with their values
# (shapes, axes, pads: values that choose kernels); others by dtype and shape only, so a
# model whose weights changed (a training run's evaluation copy each epoch) keeps its key
_FINGERPRINT_VALUES = 64


def graph_fingerprint(graph) -> str:
    """A hash of what decides which kernels a graph calls: its nodes, their attributes, the
    types of its values and the dtypes and shapes of its initializers, with the values of
    small integer ones (not the weights' values, which only the arithmetic reads)."""
    digest = hashlib.sha256()
    _hash_graph(graph, digest)
    return digest.hexdigest()


def _hash_graph(graph, digest) -> None:
    for value in (*graph.inputs, *graph.outputs):
        digest.update(f"{value.name}:{value.type}".encode())
    for name in sorted(graph.initializers):
        array = graph.initializers[name]
        digest.update(f"{name}:{getattr(array, 'dtype', type(array))}:"
                      f"{getattr(array, 'shape', '')}".encode())
        if isinstance(array, np.ndarray) and array.size <= _FINGERPRINT_VALUES \
                and array.dtype.kind in "iub":
            digest.update(np.ascontiguousarray(array).tobytes())
    for node in graph.nodes:
        digest.update(f"{node.domain}::{node.op_type}:{node.opset}:{node.inputs}:"
                      f"{node.outputs}".encode())
        for key in sorted(node.attributes):
            value = node.attributes[key]
            subgraphs = value if isinstance(value, list) else [value]
            if subgraphs and all(hasattr(g, "nodes") for g in subgraphs):
                for sub in subgraphs:
                    _hash_graph(sub, digest)
            elif isinstance(value, np.ndarray) and value.size > _FINGERPRINT_VALUES:
                digest.update(f"{key}:{value.dtype}:{value.shape}".encode())
            else:
                digest.update(f"{key}={value!r}".encode())


_stamp: list = []


def environment_stamp() -> tuple:
    """What else decides the compiled kernels: the kernel sources (path, size, mtime), numba,
    Python, the CPU and the settings that choose among kernels."""
    if not _stamp:
        root = Path(ops_package.__file__).parent
        sources = []
        # the kernels' Python and compiled sources, every family's: a change to any of
        # them changes what a warm marker stands for (the dispatch code decides which
        # kernels a model calls)
        for path in sorted(root.rglob("*.py")):
            stat = path.stat()
            sources.append((str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns))
        _stamp.append((tuple(sources), _numba_version(), sys.version, platform.machine(),
                       _cpu_name()))
    settings = tuple(sorted((k, v) for k, v in os.environ.items()
                            if k.startswith(("MIXRT_", "OPENBLAS_", "NUMBA_", "OMP_"))
                            and k not in ("MIXRT_COMPILE", "MIXRT_PROFILE", "MIXRT_COMPILE_PARENT")))
    return _stamp[0] + (settings, os.cpu_count())


def _numba_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415
    try:
        return version("numba")
    except PackageNotFoundError:
        return "none"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line
    except OSError:
        pass
    return platform.processor()
