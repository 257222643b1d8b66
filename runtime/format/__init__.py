"""The .mxr file: a compiled model that loads in milliseconds and maps its weights.

A .mxr file holds one Graph as mixrt runs it (after the passes), its weights, its memory
plans and its provenance. ``mixrt.fbs`` beside this file is the schema; ``mixrt_generated.py``
is what flatc makes of it (``tools/regen_format.sh``); ``writer.py`` uses the generated
builders and ``reader.py`` reads through the bounds-checked ``decode.py``.

Layout (``layout.py`` has the details)::

    preamble (64 B) | flatbuffer header | pad to 64 | weights, each 64-aligned | end

Weights are not copied at load: the file is memory-mapped read-only and every numeric tensor
is an ``np.ndarray`` over the map (``.base`` is the mmap, ``.flags.writeable`` is False). String
tensors and onnx TypeProto attributes live inside the header. The narrow ml_dtypes types
(bfloat16, float8, int4, ...) are stored as their raw bytes, one element per NumPy item, and
come back under the same dtype, so they map too.

Integrity: every byte of the file is covered.

* The preamble carries its own CRC-32 and the header's; the reserved bytes and all padding
  must be zero; the file must end exactly where the header says the weights end.
* The weights carry a CRC-32 per 16 MiB chunk, and ``load_mxr`` checks all of them before it
  returns. We measured the alternatives on 100 MB here: zlib.crc32 14 ms, adler32 25 ms,
  sha1 47 ms, sha256 50 ms, blake2b 72 ms. CRC-32 detects every single-byte error and
  every burst up to 32 bits, which is the damage storage and transfers do; it is not a
  defence against someone who edits the file on purpose (they can recompute it), which is
  why the reader also checks every offset, index, length and enum itself. Verifying
  eagerly fits the budget (ResNet-50 with its 102 MB of weights folded in loads in ~20 ms
  on this 2-core box, ~8 ms of it checksums on two threads; 50 ms is the target), and it is
  simpler and stronger than verifying lazily on first use: a damaged file never produces a
  Graph at all, so no run can see a bad weight. Chunks let several threads share the work
  on big files (zlib releases the GIL), and name the damaged region in the error.

Hostile files: the reader decodes the flatbuffer with its own walker that checks every
offset before following it, visits each table or vector at most once (so cycles and shared
subtrees cannot loop or blow up) and limits nesting; lengths are checked against the bytes
that back them before anything is allocated, so a count of 2**60 elements fails rather than
allocates. Every failure is a ``ModelLoadError`` naming the file and the part at fault.

A file mapped by a running session must not be rewritten in place (the OS would hand the
session the new bytes, or SIGBUS if it shrinks); ``save_mxr`` writes a new file and renames
it over the old one, which leaves existing maps intact. Files are little-endian.
"""

from __future__ import annotations

import os
import stat

from .layout import FORMAT_VERSION, MAGIC

SUFFIX = ".mxr"


# The reader and writer import flatbuffers, NumPy's friends and ~2k lines of generated code;
# `import mixrt` registers the loader, so it only pays for them when a .mxr is touched.

def load_mxr(source):
    """The Graph stored in a .mxr file (a path) or in its bytes; ModelLoadError if the file
    is damaged, hostile or not a .mxr file. Weights are read-only views of the file's map."""
    from mixrt.runtime.format.reader import load_mxr as load  # noqa: PLC0415 (flatbuffers)
    return load(source)


def save_mxr(graph, path, *, producer: str = "mixrt", opt_level: int = 0,
             producer_version: str | None = None) -> None:
    """Write ``graph`` with its initializers, plans and metadata to ``path`` (atomically)."""
    from mixrt.runtime.format.writer import save_mxr as save  # noqa: PLC0415 (flatbuffers)
    save(graph, path, producer=producer, opt_level=opt_level,
         producer_version=producer_version)


def is_mxr(source) -> bool:
    """True for a path ending in .mxr, or bytes or a file that start with the .mxr magic."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:len(MAGIC)]) == MAGIC
    if not isinstance(source, (str, os.PathLike)):
        return False
    path = os.fspath(source)
    if isinstance(path, bytes):
        return False
    if path.lower().endswith(SUFFIX):
        return True
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # a FIFO or a device would block the read (the loader says why)
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


__all__ = ["save_mxr", "load_mxr", "is_mxr", "FORMAT_VERSION", "MAGIC", "SUFFIX"]
