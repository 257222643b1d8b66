import io

import numpy as np
import pytest

from mixrt.ops.image.image_decode import image_decoder

PIL = pytest.importorskip("PIL.Image")


def _png(pixels: np.ndarray) -> np.ndarray:
    buffer = io.BytesIO()
    PIL.fromarray(pixels).save(buffer, format="PNG")
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8)


def test_png_round_trips_in_every_pixel_format():
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    stream = _png(pixels)
    np.testing.assert_array_equal(image_decoder(np, stream), pixels)
    np.testing.assert_array_equal(image_decoder(np, stream, pixel_format="BGR"),
                                  pixels[:, :, ::-1])
    gray = image_decoder(np, stream, pixel_format="Grayscale")
    assert gray.shape == (5, 7, 1) and gray.dtype == np.uint8


def test_corrupt_stream_gives_empty_image_as_the_spec_says():
    out = image_decoder(np, np.frombuffer(b"not an image at all", dtype=np.uint8))
    assert out.shape == (0, 0, 3) and out.dtype == np.uint8
