"""ImageDecoder: encoded image bytes in, an (H, W, C) uint8 image out.

Decoding is Pillow's (the library ONNX's own test data was made with), loaded only when a
model uses this op. Pillow is the ``image`` extra; without it the kernel says how to get it.
As the spec asks, a stream that cannot be decoded gives an empty array, not an error.
"""

from __future__ import annotations

import io

import numpy as np

from mixrt.base.errors import ExecutionError
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

_CHANNELS = {"RGB": 3, "BGR": 3, "Grayscale": 1}


@op("ImageDecoder", since=20, dtypes=frozenset({"uint8"}))
def image_decoder(xp, encoded_stream, *, pixel_format="RGB"):
    if pixel_format not in _CHANNELS:
        raise ValueError(f"pixel_format must be one of {sorted(_CHANNELS)}, "
                         f"got {pixel_format!r}")
    data = encoded_stream.get() if hasattr(encoded_stream, "get") else encoded_stream
    image = _decode(np.asarray(data, dtype=np.uint8).tobytes(), pixel_format)
    return xp.asarray(image)


def _decode(raw: bytes, pixel_format: str) -> np.ndarray:
    try:
        from PIL import Image  # noqa: PLC0415  (optional dependency, imported on use)
    except ImportError as exc:
        raise ExecutionError("ImageDecoder needs Pillow: pip install 'mixrt[image]'") from exc
    try:
        with Image.open(io.BytesIO(raw)) as image:
            converted = image.convert("L" if pixel_format == "Grayscale" else "RGB")
            pixels = np.asarray(converted, dtype=np.uint8)
    except Exception:  # Pillow raises many types for corrupt or unknown streams
        return np.zeros((0, 0, _CHANNELS[pixel_format]), dtype=np.uint8)
    if pixel_format == "Grayscale":
        return pixels[:, :, None]
    return pixels[:, :, ::-1].copy() if pixel_format == "BGR" else pixels


@image_decoder.infer
def _(encoded_stream, *, pixel_format="RGB", **_):
    return [TensorType(np.dtype(np.uint8), (None, None, _CHANNELS.get(pixel_format)))]
