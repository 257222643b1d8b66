"""MXNet's ``mx.image``: decoding, resizing and cropping images held as NDArrays.

    img = mx.image.imread("cat.jpg")                 # uint8, (height, width, 3), RGB
    img = mx.image.resize_short(img, 256)            # shorter side 256, aspect kept
    img, _ = mx.image.center_crop(img, (224, 224))
    img = mx.image.color_normalize(img.astype("float32"), mean, std)

Images are (height, width, channels) arrays, as MXNet's. Decoding uses Pillow (the ``image``
extra; imported when an image is decoded) where MXNet uses OpenCV. Resizing is ONNX's
Resize op (area: two products with per-axis weights), so it records under autograd and runs
on the image's device. MXNet's (OpenCV's) interpolation codes: 0 nearest, 1 bilinear,
2 bicubic, 3 area (each output pixel the mean of the input it covers, when shrinking;
bilinear along an axis that grows), 4 Lanczos (bicubic with antialiasing here: ONNX has no
Lanczos filter), 9 auto (area to shrink, bicubic to enlarge, bilinear otherwise) and
10 random (one of 0-4 per call).
"""

from __future__ import annotations

import io
import numbers
import random as _random

import numpy as np

from mixrt import dispatch
from mixrt.base.errors import InputError, missing_dependency
from mixrt.nd.creation import array
from mixrt.nd.mxnet_args import _into
from mixrt.nd.ndarray import NDArray

NEAREST, BILINEAR, BICUBIC, AREA, LANCZOS, AUTO, RANDOM = 0, 1, 2, 3, 4, 9, 10
# MXNet's (OpenCV's) interpolation code -> ONNX Resize's mode and antialias (area: None)
_MODES = {NEAREST: ("nearest", 0), BILINEAR: ("linear", 0), BICUBIC: ("cubic", 0),
          AREA: None, LANCZOS: ("cubic", 1)}
_RESIZE_OPSET = 18  # the first Resize with antialias


# -- decoding ------------------------------------------------------------------------------------

def imdecode(buf, flag=1, to_rgb=1, out=None, ctx=None):
    """The image encoded in ``buf`` (bytes, or a uint8 NDArray/NumPy array of them) as a
    uint8 NDArray: (height, width, 3) in RGB (BGR if ``to_rgb`` is 0) for ``flag=1``,
    (height, width, 1) grayscale for ``flag=0``."""
    data = _encoded_bytes(buf)
    image = _pillow_image(data, "imdecode")
    pixels = np.asarray(image.convert("RGB" if flag else "L"))
    if flag:
        pixels = pixels if to_rgb else pixels[:, :, ::-1]
    else:
        pixels = pixels[:, :, None]
    result = array(np.ascontiguousarray(pixels), ctx=ctx, dtype=np.uint8)
    return _into("imdecode", out, result)


def imread(filename, flag=1, to_rgb=1, out=None, ctx=None):
    """The image in the file ``filename``, decoded as :func:`imdecode` does."""
    try:
        with open(filename, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise InputError(f"imread: cannot read {filename!r}: {exc}") from exc
    return imdecode(data, flag, to_rgb, out, ctx)


def _encoded_bytes(buf) -> bytes:
    if isinstance(buf, (bytes, bytearray, memoryview)):
        data = bytes(buf)
    elif isinstance(buf, (NDArray, np.ndarray)):
        values = buf.asnumpy() if isinstance(buf, NDArray) else buf
        if values.dtype != np.uint8 or values.ndim != 1:
            raise InputError(f"imdecode: buf must be bytes or a 1-d uint8 array, got "
                             f"{values.dtype} of shape {values.shape}")
        data = values.tobytes()
    else:
        raise InputError(f"imdecode: buf must be bytes or a 1-d uint8 array, got "
                         f"{type(buf).__name__}")
    if not data:
        raise InputError("imdecode: buf is empty")
    return data


def _pillow_image(data: bytes, fn: str):
    try:
        from PIL import Image, UnidentifiedImageError  # noqa: PLC0415  (the image extra)
    except ImportError as exc:
        raise missing_dependency(f"{fn} (decoding)", "Pillow", "image") from exc
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"{fn}: the data is not an image Pillow can decode: {exc}") from exc
    return image


# -- resizing ------------------------------------------------------------------------------------

def imresize(src, w, h, interp=BILINEAR, out=None):
    """``src`` (height, width, channels) resized to ``h`` x ``w`` with the interpolation
    ``interp`` (an OpenCV code, see the module's docstring)."""
    src = _image("imresize", src)
    w, h = _size("imresize", "w", w), _size("imresize", "h", h)
    method = _MODES[_interpolation("imresize", interp, src.shape[:2], (h, w))]
    if method is None:
        return _into("imresize", out, _area_resize(src, w, h))
    mode, antialias = method
    sizes = np.array([h, w, src.shape[2]], dtype=np.int64)
    result = dispatch.invoke("", "Resize", [src, None, None, sizes],
                             {"mode": mode, "antialias": antialias}, opset=_RESIZE_OPSET)
    return _into("imresize", out, result)


def _area_resize(src: NDArray, w: int, h: int) -> NDArray:
    """OpenCV's INTER_AREA: rows then columns mixed by weight matrices (float32)."""
    height, width, channels = src.shape
    values = dispatch.invoke("", "Cast", [src], {"to": 1}) if src.dtype != np.float32 \
        else src
    rows = array(_area_weights(height, h), ctx=src.ctx)          # (h, height)
    cols = array(_area_weights(width, w).T.copy(), ctx=src.ctx)  # (width, w)
    mixed = dispatch.invoke("", "MatMul", [rows, _reshaped(values, (height, width * channels))],
                            {})
    mixed = dispatch.invoke("", "Transpose", [_reshaped(mixed, (h, width, channels))],
                            {"perm": [0, 2, 1]})                         # (h, c, width)
    result = dispatch.invoke("", "Transpose", [dispatch.invoke("", "MatMul", [mixed, cols], {})],
                             {"perm": [0, 2, 1]})
    return result if src.dtype == np.float32 else _cast_back(result, src.dtype)


def _reshaped(x: NDArray, shape: tuple) -> NDArray:
    return dispatch.invoke("", "Reshape", [x, np.array(shape, dtype=np.int64)], {})


def _cast_back(result: NDArray, dtype) -> NDArray:
    if np.issubdtype(dtype, np.integer):  # OpenCV rounds to the nearest integer
        info = np.iinfo(dtype)
        result = dispatch.invoke("", "Clip", [dispatch.invoke("", "Round", [result], {}),
                                              np.float32(info.min), np.float32(info.max)], {})
    return result.astype(dtype)


def _area_weights(old: int, new: int) -> np.ndarray:
    """(new, old) weights: the share of each input pixel in each output pixel's span
    when shrinking; half-pixel linear interpolation when the axis grows or stays."""
    weights = np.zeros((new, old), dtype=np.float32)
    if new < old:
        scale = old / new
        for i in range(new):
            start, end = i * scale, (i + 1) * scale
            for j in range(int(np.floor(start)), min(int(np.ceil(end)), old)):
                weights[i, j] = (min(end, j + 1) - max(start, j)) / scale
        return weights
    centres = np.clip((np.arange(new) + 0.5) * old / new - 0.5, 0, old - 1)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, old - 1)
    frac = (centres - low).astype(np.float32)
    weights[np.arange(new), low] += 1 - frac
    weights[np.arange(new), high] += frac
    return weights


def _interpolation(fn: str, interp, old: tuple, new: tuple) -> int:
    if isinstance(interp, bool) or not isinstance(interp, numbers.Integral) or \
            int(interp) not in (*_MODES, AUTO, RANDOM):
        raise InputError(f"{fn}: interp must be one of {sorted((*_MODES, AUTO, RANDOM))} "
                         f"(OpenCV's codes: 0 nearest, 1 bilinear, 2 area, 3 bicubic, "
                         f"4 Lanczos, 9 auto, 10 random), got {interp!r}")
    interp = int(interp)
    if interp == RANDOM:
        return _random.randint(NEAREST, LANCZOS)
    if interp == AUTO:
        if all(n < o for n, o in zip(new, old)):
            return AREA
        return BICUBIC if all(n > o for n, o in zip(new, old)) else BILINEAR
    return interp


def scale_down(src_size, size):
    """``size`` (w, h) scaled down, aspect kept, to fit in ``src_size`` (w, h)."""
    width, height = size
    src_width, src_height = src_size
    if src_height < height:
        width, height = float(width * src_height) / height, src_height
    if src_width < width:
        width, height = src_width, float(height * src_width) / width
    return int(width), int(height)


def resize_short(src, size, interp=BICUBIC):
    """``src`` resized so that its shorter side is ``size``, its aspect ratio kept."""
    src = _image("resize_short", src)
    size = _size("resize_short", "size", size)
    height, width = src.shape[:2]
    if height > width:
        new_width, new_height = size, size * height // width
    else:
        new_width, new_height = size * width // height, size
    return imresize(src, new_width, new_height, interp=interp)


# -- cropping and normalizing -----------------------------------------------------------------

def fixed_crop(src, x0, y0, w, h, size=None, interp=BICUBIC):
    """The region of ``src`` at column ``x0``, row ``y0``, ``w`` wide and ``h`` high,
    resized to ``size`` (w, h) when given."""
    src = _image("fixed_crop", src)
    height, width = src.shape[:2]
    if x0 < 0 or y0 < 0 or w < 1 or h < 1 or x0 + w > width or y0 + h > height:
        raise InputError(f"fixed_crop: the region x0={x0}, y0={y0}, w={w}, h={h} is not "
                         f"inside the {width}x{height} image")
    cropped = src[int(y0):int(y0 + h), int(x0):int(x0 + w)].copy()
    if size is not None and (w, h) != tuple(size):
        cropped = imresize(cropped, size[0], size[1], interp=interp)
    return cropped


def center_crop(src, size, interp=BICUBIC):
    """The centre of ``src`` with the aspect ratio of ``size`` (w, h), as large as fits,
    resized to ``size``; returns it and its (x0, y0, w, h)."""
    src = _image("center_crop", src)
    height, width = src.shape[:2]
    new_w, new_h = scale_down((width, height), size)
    x0, y0 = (width - new_w) // 2, (height - new_h) // 2
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def random_crop(src, size, interp=BICUBIC):
    """A region of ``src`` at a random place with the aspect ratio of ``size`` (w, h),
    resized to ``size``; returns it and its (x0, y0, w, h)."""
    src = _image("random_crop", src)
    height, width = src.shape[:2]
    new_w, new_h = scale_down((width, height), size)
    x0 = _random.randint(0, width - new_w)
    y0 = _random.randint(0, height - new_h)
    return fixed_crop(src, x0, y0, new_w, new_h, size, interp), (x0, y0, new_w, new_h)


def color_normalize(src, mean, std=None):
    """``(src - mean) / std`` (``std`` optional), broadcast over the channels."""
    src = _image("color_normalize", src)
    if mean is not None:
        src = src - mean
    if std is not None:
        src = src / std
    return src


# -- checks --------------------------------------------------------------------------------------

def _image(fn: str, src) -> NDArray:
    if not isinstance(src, NDArray):
        raise InputError(f"{fn}: src must be an NDArray, got {type(src).__name__}")
    if src.ndim != 3:
        raise InputError(f"{fn}: src must be an image of shape (height, width, channels), "
                         f"got shape {src.shape}")
    return src


def _size(fn: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InputError(f"{fn}: {name} must be a positive int, got {value!r}")
    return int(value)


__all__ = ["imdecode", "imread", "imresize", "scale_down", "resize_short", "fixed_crop",
           "center_crop", "random_crop", "color_normalize"]
