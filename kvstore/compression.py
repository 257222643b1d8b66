"""2-bit gradient compression with error feedback, as MXNet's KVStore does it.

``kv.set_gradient_compression({"type": "2bit", "threshold": t})`` makes each worker (or each
device, for the ``device`` kind) send every gradient value as one of three states, +t, 0 or
-t, in 2 bits instead of 32. What quantization drops is not thrown away: each key keeps a
*residual* r on the sender, and each push first adds the new gradient to it::

    r += grad
    r >= +t  ->  send +t, r -= t
    r <= -t  ->  send -t, r += t
    else     ->  send  0  (r keeps the value for the next push)

This is error feedback: small updates are delayed until they add up to a threshold rather
than lost, so the sum of what was sent plus the residual always equals the sum of the
gradients, and training converges close to the uncompressed run. As in MXNet only one
threshold is sent per step, so a value that is larger than 2t leaves more than t behind.

Bit layout of the packed form (MXNet's, byte for byte): a uint8 array of ceil(n / 4) bytes
on the gradient's device. Value ``i`` of the flattened (C order) gradient lives in byte
``i // 4``, in bits ``7 - 2*(i % 4)`` (high) and ``6 - 2*(i % 4)`` (low), so the first value
of each group of four takes the two most significant bits. Codes: ``0b11`` = +t, ``0b10`` =
-t, ``0b00`` = 0 (``0b01`` is never written and decodes as 0). The unused pairs of the last
byte are zero. MXNet packs into a float32 buffer padded to 16 values; its bytes are these
bytes followed by that padding.

Gradients may be float16, float32 or float64 and live on the CPU (NumPy) or a GPU (CuPy);
the residual has the gradient's shape, dtype and device, and the quantum is the threshold
rounded to the gradient's dtype. Every step is a whole-array operation through the array
module of the gradient, so one code path serves both devices.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import numpy as np

from mixrt.base.errors import KVStoreError
from mixrt.ops.device import array_module

DEFAULT_THRESHOLD = 0.5  # MXNet's default for "2bit"
VALID_TYPES = ("2bit", "none")
VALID_KEYS = {"2bit": ("type", "threshold"), "none": ("type",)}
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

_CODE_POSITIVE = 0b11
_CODE_NEGATIVE = 0b10
_VALUES_PER_BYTE = 4
# the left shift that puts value j (0..3) of a group of four into its bit pair
_SHIFTS = (6, 4, 2, 0)


# -- parameters -------------------------------------------------------------------------

def check_params(params: dict) -> dict:
    """What ``kv.set_gradient_compression(params)`` accepts, as a normalized, JSON-ready
    dict: ``{"type": "2bit", "threshold": t}`` (t defaults to 0.5) or
    ``{"type": "none"}``."""
    if not isinstance(params, dict):
        raise KVStoreError(f"gradient compression params must be a dict such as "
                           f"{{'type': '2bit', 'threshold': 0.5}}, got "
                           f"{type(params).__name__} {params!r}")
    kind = _check_type(params)
    unknown = sorted(str(k) for k in params if k not in VALID_KEYS[kind])
    if unknown:
        raise KVStoreError(f"gradient compression type {kind!r}: unknown key(s) "
                           f"{unknown}; valid keys for {kind!r}: {list(VALID_KEYS[kind])}")
    if kind == "none":
        return {"type": "none"}
    return {"type": "2bit",
            "threshold": _check_threshold(params.get("threshold", DEFAULT_THRESHOLD))}


def _check_type(params: dict) -> str:
    if "type" not in params:
        raise KVStoreError(f"gradient compression params {params!r} have no 'type'; valid "
                           f"types: {list(VALID_TYPES)}")
    kind = params["type"]
    if not isinstance(kind, str) or kind.strip().lower() not in VALID_TYPES:
        raise KVStoreError(f"gradient compression 'type' {kind!r} is not supported; valid "
                           f"types: {list(VALID_TYPES)}")
    return kind.strip().lower()


def _check_threshold(threshold) -> float:
    # bool is an int to Python, but True as a threshold is a mistake, not 1.0
    is_number = (isinstance(threshold, numbers.Real)
                 and not isinstance(threshold, (bool, np.bool_)))
    if not is_number or not math.isfinite(float(threshold)) or float(threshold) <= 0:
        raise KVStoreError(f"gradient compression 'threshold' must be a finite number > 0, "
                           f"got {threshold!r}")
    return float(threshold)


def create_compressor(params: dict) -> "TwoBitCompressor | None":
    """The compressor ``params`` ask for; None when they say ``{"type": "none"}``."""
    params = check_params(params)
    if params["type"] == "none":
        return None
    return TwoBitCompressor(params["threshold"])


# -- the compressor ---------------------------------------------------------------------

class TwoBitCompressor:
    """Quantizes gradients to {-t, 0, +t}, 2 bits each, keeping one residual per key."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD):
        self.threshold = _check_threshold(threshold)
        self._residuals: dict = {}
        self._decode_tables: dict = {}

    def spec(self) -> dict:
        return {"type": "2bit", "threshold": self.threshold}

    def reset(self, key=None) -> None:
        """Forget ``key``'s residual (every key's when None); unknown keys are fine."""
        if key is None:
            self._residuals.clear()
        else:
            self._residuals.pop(key, None)

    @staticmethod
    def packed_nbytes(size: int) -> int:
        if size < 0:
            raise KVStoreError(f"packed_nbytes: size must be >= 0, got {size}")
        return (size + _VALUES_PER_BYTE - 1) // _VALUES_PER_BYTE

    def compress(self, key, grad):
        """Add ``grad`` to ``key``'s residual, quantize, and return the packed uint8 bytes
        (on ``grad``'s device); the residual keeps what was not sent."""
        xp = array_module(grad)
        with _on_device_of(grad):
            residual = self._residual_for(key, grad, xp)
            quantum = self._quantum(grad.dtype, f"compress key {key!r}")
            flat = residual.reshape(-1)  # a view: the residual is C-contiguous
            flat += grad.reshape(-1)
            positive = flat >= quantum
            negative = flat <= -quantum
            _take_sent_values_out(flat, positive, negative, quantum)
            return _pack(positive, negative, xp)

    def decompress(self, packed, size: int, dtype):
        """The ``size`` values {-t, 0, +t} that ``packed`` holds, as a flat ``dtype`` array
        on ``packed``'s device."""
        dtype = _check_dtype(dtype, "decompress")
        xp = array_module(packed)
        _check_packed(packed, size, self.packed_nbytes(size))
        with _on_device_of(packed):
            table = self._decode_table(dtype, xp, packed)
            # one gather of 4 values per byte: cheaper than decoding bit pairs one by one
            return xp.take(table, packed, axis=0).reshape(-1)[:size]

    def roundtrip(self, key, grad):
        """``decompress(compress(key, grad))`` shaped like ``grad``: what the receiver
        sums."""
        packed = self.compress(key, grad)
        return self.decompress(packed, grad.size, grad.dtype).reshape(grad.shape)

    # -- helpers ------------------------------------------------------------------------

    def _residual_for(self, key, grad, xp):
        dtype = _check_dtype(grad.dtype, f"compress key {key!r}")
        residual = self._residuals.get(key)
        if residual is None:
            # zero at first: nothing has been held back yet
            residual = xp.zeros(grad.shape, dtype=dtype)
            self._residuals[key] = residual
            return residual
        if tuple(residual.shape) != tuple(grad.shape) or residual.dtype != dtype:
            raise KVStoreError(f"compress key {key!r}: gradient {tuple(grad.shape)} "
                               f"{dtype} does not match the residual kept for this key, "
                               f"{tuple(residual.shape)} {residual.dtype} (call "
                               f"reset({key!r}) if the change is intended)")
        if _device_name(residual) != _device_name(grad):
            raise KVStoreError(f"compress key {key!r}: gradient on {_device_name(grad)} "
                               f"but its residual is on {_device_name(residual)} (call "
                               f"reset({key!r}) if the move is intended)")
        return residual

    def _quantum(self, dtype, where: str):
        """The threshold in ``dtype``: what is sent and what leaves the residual, so that
        both sides agree to the last bit."""
        with np.errstate(over="ignore"):  # overflow is reported below, with the key
            quantum = np.dtype(dtype).type(self.threshold)
        if not np.isfinite(quantum) or quantum == 0:
            raise KVStoreError(f"{where}: threshold {self.threshold} is not representable "
                               f"in {np.dtype(dtype)} (it rounds to {quantum}); pick a "
                               f"threshold within that dtype's range")
        return quantum

    def _decode_table(self, dtype, xp, packed):
        """A (256, 4) table: the four values each possible byte stands for."""
        where = _device_name(packed)
        if (where, dtype) not in self._decode_tables:
            quantum = self._quantum(dtype, "decompress")
            by_code = np.array([0, 0, -quantum, quantum], dtype=dtype)  # index = 2-bit code
            byte_values = np.arange(256, dtype=np.uint8)[:, None]
            codes = (byte_values >> np.array(_SHIFTS, dtype=np.uint8)) & 0b11
            self._decode_tables[(where, dtype)] = xp.asarray(by_code[codes])
        return self._decode_tables[(where, dtype)]


def _take_sent_values_out(flat, positive, negative, quantum) -> None:
    """``flat -= sent`` where sent is +quantum, -quantum or 0 (exact: no rounding but
    that of the subtraction itself, as in MXNet's per-element loop)."""
    sent = positive.astype(flat.dtype)
    sent -= negative
    sent *= quantum
    flat -= sent


def _pack(positive, negative, xp):
    """Four 2-bit codes per byte, the first value in the most significant pair."""
    size = positive.size
    nbytes = TwoBitCompressor.packed_nbytes(size)
    # codes padded with zeros to whole bytes: 0b11 where positive, 0b10 where negative
    codes = xp.zeros(nbytes * _VALUES_PER_BYTE, dtype=xp.uint8)
    body = codes[:size]
    xp.multiply(positive.view(xp.uint8), xp.uint8(_CODE_POSITIVE), out=body)
    body |= negative.view(xp.uint8) * xp.uint8(_CODE_NEGATIVE)
    groups = codes.reshape(nbytes, _VALUES_PER_BYTE)
    packed = groups[:, 0] << xp.uint8(_SHIFTS[0])
    for j in range(1, _VALUES_PER_BYTE):
        packed |= groups[:, j] << xp.uint8(_SHIFTS[j])
    return packed


def _check_dtype(dtype, where: str) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError as exc:
        raise KVStoreError(f"{where}: {dtype!r} is not a dtype") from exc
    if dtype not in SUPPORTED_DTYPES:
        raise KVStoreError(f"{where}: 2-bit compression takes float16, float32 or float64 "
                           f"gradients, got {dtype}")
    return dtype


def _check_packed(packed, size: int, nbytes: int) -> None:
    if packed.dtype != np.uint8 or packed.ndim != 1 or packed.size != nbytes:
        raise KVStoreError(f"decompress: {size} values need a 1-D uint8 array of {nbytes} "
                           f"bytes, got {packed.ndim}-D {packed.dtype} of {packed.size}")


def _device_name(array) -> str:
    return "cpu" if isinstance(array, np.ndarray) else f"gpu:{array.device.id}"


def _on_device_of(array):
    """Allocate on ``array``'s GPU (CuPy allocates on the current device otherwise)."""
    return contextlib.nullcontext() if isinstance(array, np.ndarray) else array.device
