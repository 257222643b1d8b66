"""MXNet's ``mx.image`` (``mixrt/image.py``): decoding with Pillow, resizing with OpenCV's
interpolation codes, cropping (values from MXNet 1.9.1 for the same calls, 2026-11-24)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mixrt import image, nd
from mixrt.errors import InputError, MXNetError

PIL = pytest.importorskip("PIL.Image")
PIXELS = np.random.RandomState(0).randint(0, 255, (6, 8, 3)).astype(np.uint8)


def _png(pixels) -> bytes:
    buffer = io.BytesIO()
    PIL.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_imdecode_gives_rgb_bgr_and_gray_uint8(tmp_path):
    data = _png(PIXELS)
    rgb = image.imdecode(data)
    assert rgb.shape == (6, 8, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(rgb.asnumpy(), PIXELS)
    np.testing.assert_array_equal(image.imdecode(data, to_rgb=0).asnumpy(), PIXELS[:, :, ::-1])
    assert image.imdecode(data, flag=0).shape == (6, 8, 1)
    path = tmp_path / "img.png"
    path.write_bytes(data)
    np.testing.assert_array_equal(image.imread(str(path)).asnumpy(), PIXELS)
    as_array = nd.array(np.frombuffer(data, dtype=np.uint8), dtype="uint8")
    np.testing.assert_array_equal(image.imdecode(as_array).asnumpy(), PIXELS)


def test_bad_data_is_an_mxnet_error():
    with pytest.raises(MXNetError, match="not an image"):
        image.imdecode(b"not an image at all")
    with pytest.raises(InputError, match="empty"):
        image.imdecode(b"")


# MXNet 1.9.1: imresize(float32 PIXELS, 4, 3, interp) [:2, :2, 0]
@pytest.mark.parametrize("interp, expected", [
    (0, [[172.0, 195.0], [142.0, 127.0]]),
    (1, [[119.25, 155.75], [97.5, 116.25]]),
    (3, [[119.25, 155.75], [97.5, 116.25]])])
def test_imresize_interpolations_as_mxnet(interp, expected):
    resized = image.imresize(nd.array(PIXELS.astype(np.float32)), 4, 3, interp=interp)
    assert resized.shape == (3, 4, 3)
    np.testing.assert_allclose(resized.asnumpy()[:2, :2, 0], expected, rtol=1e-5)


def test_area_shrink_averages_the_covered_pixels_as_mxnet():
    resized = image.imresize(nd.array(PIXELS, dtype="uint8"), 3, 4, interp=3)
    assert resized.dtype == np.uint8
    np.testing.assert_array_equal(resized.asnumpy()[:, :, 0],
                                  [[138, 162, 107], [120, 177, 115], [74, 66, 124],
                                   [85, 132, 157]])


def test_crops_and_resize_short():
    src = nd.array(PIXELS.astype(np.float32))
    assert image.resize_short(src, 3).shape == (3, 4, 3)
    cropped, rect = image.center_crop(src, (4, 4))
    assert cropped.shape == (4, 4, 3) and rect == (2, 1, 4, 4)
    np.testing.assert_array_equal(image.fixed_crop(src, 1, 2, 3, 2).asnumpy(),
                                  PIXELS[2:4, 1:4].astype(np.float32))
    with pytest.raises(InputError, match="not inside"):
        image.fixed_crop(src, 6, 0, 4, 2)


@pytest.mark.parametrize("interp", [-1, 5, 1.5])
def test_unknown_interpolations_are_refused(interp):
    with pytest.raises(MXNetError, match="interp"):
        image.imresize(nd.ones((12, 16, 3)), 4, 4, interp=interp)
