"""NVIDIA's libraries that mixrt calls through ctypes, found where CUDA's pip wheels or the
system put them, loaded and started once a process: cuDNN for the GPU's convolutions
(``ops/conv/cudnn.py``). Standard library only, since MXNet's feature query
(``runtime/features.py``) asks whether cuDNN is here before NumPy loads.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os


def _wheel_paths(package: str, soname: str) -> list[str]:
    """``soname`` inside NVIDIA's pip wheels: ``nvidia/<package>/lib`` (the -cu12 wheels and
    cuDNN's) or ``nvidia/cu*/lib`` (CUDA 13's)."""
    try:
        import nvidia  # noqa: PLC0415  (a namespace package of CUDA's pip wheels)
    except ImportError:
        return []
    found = []
    for root in nvidia.__path__:
        for folder in (package, "cu*"):  # "cu*" matches "cudnn" too: each path once
            found += sorted(glob.glob(os.path.join(root, folder, "lib", soname)))
    return list(dict.fromkeys(found))


@functools.lru_cache(maxsize=1)
def cudnn():
    """(libcudnn as a ctypes library, None) once it loads and a handle can be made with it
    on the current device, else (None, why not). ``MIXRT_CUDNN=0`` turns it off."""
    if os.environ.get("MIXRT_CUDNN") == "0":
        return None, "MIXRT_CUDNN=0 turns cuDNN off"
    names = ["libcudnn.so.9", *_wheel_paths("cudnn", "libcudnn.so.9"), "libcudnn.so"]
    for name in names:
        try:
            library = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
        return _started(library, name)
    return None, (f"cannot load cuDNN 9 (tried {', '.join(names)}); install the gpu extra's "
                  f"nvidia-cudnn wheel for your CUDA version")


def _started(library, name: str):
    """A machine may carry the library without a GPU it can start on."""
    library.cudnnGetErrorString.argtypes = [ctypes.c_int]
    library.cudnnGetErrorString.restype = ctypes.c_char_p
    library.cudnnCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    library.cudnnDestroy.argtypes = [ctypes.c_void_p]
    handle = ctypes.c_void_p()
    status = library.cudnnCreate(ctypes.byref(handle))
    if status != 0:
        return None, (f"{name} loads but cannot start (cudnnCreate returned status {status}: "
                      f"{library.cudnnGetErrorString(status).decode()})")
    library.cudnnDestroy(handle)
    return library, None
