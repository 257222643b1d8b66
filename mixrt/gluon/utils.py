"""MXNet's ``gluon.utils``: splitting a batch across devices, clipping gradients by their
global norm, and fetching files (model weights, datasets) with a SHA-1 check.

    parts = gluon.utils.split_and_load(batch, [mx.gpu(0), mx.gpu(1)])
    norm = gluon.utils.clip_global_norm([p.grad() for p in params.values()], 1.0)
    path = gluon.utils.download(url, path="weights/", sha1_hash=expected)
"""

from __future__ import annotations

import hashlib
import math
import os
import uuid
import warnings
from urllib.parse import unquote, urlparse

from mixrt import nd
from mixrt.base.errors import ExecutionError, InputError
from mixrt.nd.ndarray import NDArray

_DEFAULT_REPO = "https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/"
_CHUNK = 1 << 20


# -- batches across devices ------------------------------------------------------------------

class UnevenSplitError(InputError, ValueError):
    """A batch does not split evenly into the parts asked for (MXNet raises ValueError)."""


def split_data(data, num_slice: int, batch_axis: int = 0, even_split: bool = True) -> list:
    """``data`` cut into ``num_slice`` parts along ``batch_axis``. With ``even_split=False``
    the sizes are NumPy's ``array_split``'s, as in MXNet 1.9: the first ``size % num_slice``
    parts hold one more row, and with fewer rows than parts the last parts are empty."""
    size = data.shape[batch_axis]
    if even_split and size % num_slice != 0:
        raise UnevenSplitError(f"split_data: data of shape {tuple(data.shape)} cannot be "
                               f"evenly split into {num_slice} slices along axis "
                               f"{batch_axis}; use a batch size that is a multiple of "
                               f"{num_slice} or even_split=False")
    each, extras = divmod(size, num_slice)
    starts = [i * each + min(i, extras) for i in range(num_slice + 1)]
    bounds = list(zip(starts[:-1], starts[1:]))
    if batch_axis == 0:
        return [data[begin:end] for begin, end in bounds]
    return [nd.slice_axis(data, axis=batch_axis, begin=begin, end=end)
            for begin, end in bounds]


def split_and_load(data, ctx_list, batch_axis: int = 0, even_split: bool = True) -> list:
    """``data`` split along ``batch_axis`` into one part per context, each part copied to
    its context (NumPy data becomes an NDArray on the first context first)."""
    ctx_list = list(ctx_list)
    if not ctx_list:
        raise InputError("split_and_load: ctx_list is empty; give at least one context")
    if not isinstance(data, NDArray):
        data = nd.array(data, ctx=ctx_list[0])
    if len(ctx_list) == 1:
        return [data.as_in_context(ctx_list[0])]
    parts = split_data(data, len(ctx_list), batch_axis, even_split)
    return [part.as_in_context(ctx) for part, ctx in zip(parts, ctx_list)]


# -- gradients -------------------------------------------------------------------------------

def clip_global_norm(arrays, max_norm: float, check_isfinite: bool = True):
    """Scales ``arrays`` in place so that the L2 norm of all of them together is at most
    ``max_norm``; returns that norm before scaling: a float, or with
    ``check_isfinite=False`` a one-element NDArray (reading it would wait for the work)."""
    arrays = list(arrays)
    if not arrays:
        raise InputError("clip_global_norm: arrays is empty; give the gradients to clip")
    ctx = arrays[0].ctx
    squares = [(array.as_in_context(ctx).astype("float32") ** 2).sum() for array in arrays]
    total_norm = nd.sqrt(nd.add_n(*squares)) if len(squares) > 1 else nd.sqrt(squares[0])
    if check_isfinite:
        total = float(total_norm.asscalar())
        if not math.isfinite(total):
            warnings.warn(UserWarning("nan or inf is detected. Clipping results will be "
                                      "undefined."), stacklevel=2)
    scale = nd.minimum(max_norm / (total_norm + 1e-8), 1.0)
    for array in arrays:
        array *= scale.as_in_context(array.ctx).astype(array.dtype)
    return total if check_isfinite else total_norm


def shape_is_known(shape) -> bool:
    """Whether every dimension of ``shape`` is known (MXNet's legacy shapes mark an
    unknown one 0; None and () are unknown)."""
    if shape is None or len(shape) == 0:
        return False
    for size in shape:
        if size == 0:
            return False
        if size < 0:
            raise InputError(f"shape_is_known: a dimension cannot be negative, got {shape}")
    return True


# -- files -----------------------------------------------------------------------------------

def replace_file(src: str, dst: str) -> None:
    """Move ``src`` over ``dst`` in one step (MXNet's helper for downloads)."""
    os.replace(src, dst)


def check_sha1(filename: str, sha1_hash: str) -> bool:
    """Whether the file's SHA-1 digest (hexadecimal) is ``sha1_hash``."""
    sha1 = hashlib.sha1()
    with open(filename, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            sha1.update(chunk)
    return sha1.hexdigest() == sha1_hash


def download(url: str, path: str | None = None, overwrite: bool = False,
             sha1_hash: str | None = None, retries: int = 5, verify_ssl: bool = True) -> str:
    """Fetches ``url`` to ``path`` (a file, a folder, or None: the URL's file name in the
    current folder) unless a file with the right SHA-1 is there already; returns the file's
    path. ``http(s)://`` goes through ``requests``; ``file://`` is copied. Each try writes a
    uniquely named file and renames it into place, so processes downloading the same file
    at once leave one whole file. A failure after ``retries`` more tries is an
    ExecutionError naming the URL."""
    fname = _target_file(url, path)
    if urlparse(url).scheme not in ("http", "https", "file"):
        raise InputError(f"download: {url!r} is not an http(s):// or file:// URL")
    if retries < 0:
        raise InputError(f"download: retries must be >= 0, got {retries}")
    if not verify_ssl:
        warnings.warn("Unverified HTTPS request is being made (verify_ssl=False). Adding "
                      "certificate verification is strongly advised.", stacklevel=2)
    if not overwrite and os.path.exists(fname) and \
            (not sha1_hash or check_sha1(fname, sha1_hash)):
        return fname
    os.makedirs(os.path.dirname(os.path.abspath(fname)), exist_ok=True)
    for attempt in range(retries + 1):
        try:
            _fetch_into_place(url, fname, verify_ssl, overwrite)
            break
        except Exception as failure:  # noqa: BLE001 - any failure is retried, then reported
            if attempt == retries:
                raise ExecutionError(f"download: fetching {url} failed after "
                                     f"{retries + 1} tries: {failure!r}") from failure
            print(f"download of {url} failed ({failure!r}), retrying: "
                  f"{retries - attempt} tries left")
    if sha1_hash and not check_sha1(fname, sha1_hash):
        raise ExecutionError(f"download: {fname} from {url} does not have the SHA-1 "
                             f"{sha1_hash}; the file on the server may have changed, or the "
                             "transfer was damaged")
    return fname


def _target_file(url: str, path: str | None) -> str:
    name = url.split("/")[-1]
    if path is None:
        if not name:
            raise InputError(f"download: no file name in the URL {url!r}; give path=")
        return name
    path = os.path.expanduser(path)
    return os.path.join(path, name) if os.path.isdir(path) else path


def _fetch_into_place(url: str, fname: str, verify_ssl: bool, overwrite: bool) -> None:
    partial = f"{fname}.{uuid.uuid4()}"
    try:
        with open(partial, "wb") as file:
            for chunk in _chunks(url, verify_ssl):
                file.write(chunk)
        if overwrite or not os.path.exists(fname):
            os.replace(partial, fname)
    finally:
        if os.path.exists(partial):  # another process's copy is in place already
            os.remove(partial)


def _chunks(url: str, verify_ssl: bool):
    scheme = urlparse(url).scheme
    if scheme == "file":
        with open(unquote(urlparse(url).path), "rb") as source:
            yield from iter(lambda: source.read(_CHUNK), b"")
        return
    try:  # an optional dependency: only downloads need it
        import requests  # noqa: PLC0415
    except ImportError as missing:
        raise ExecutionError("download: http(s) URLs need the 'requests' package "
                             "(pip install requests)") from missing
    response = requests.get(url, stream=True, verify=verify_ssl)
    if response.status_code != 200:
        raise ExecutionError(f"download: {url} answered HTTP {response.status_code}")
    yield from (chunk for chunk in response.iter_content(chunk_size=_CHUNK) if chunk)


# -- the model repository --------------------------------------------------------------------

def _get_repo_url() -> str:
    """The model repository's base URL: ``MXNET_GLUON_REPO`` or MXNet's, ending in '/'."""
    repo = os.environ.get("MXNET_GLUON_REPO", _DEFAULT_REPO)
    return repo if repo.endswith("/") else repo + "/"


def _get_repo_file_url(namespace: str, filename: str) -> str:
    return f"{_get_repo_url()}{namespace}/{filename}"


def _brief_print_list(items, limit: int = 7) -> str:
    """``'a', 'b', ..., 'z'``: at most about ``limit`` quoted items of a long list."""
    items = list(items)
    if len(items) > limit:
        return _brief_print_list(items[:limit // 2], limit) + ", ..., " + \
            _brief_print_list(items[-limit // 2:], limit)
    return ", ".join(f"'{item}'" for item in items)


__all__ = ["split_data", "split_and_load", "clip_global_norm", "check_sha1", "download",
           "shape_is_known", "replace_file"]
