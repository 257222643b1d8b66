"""cupy.cuda.runtime on the fake: ``FAKE_CUPY_DEVICES`` devices (default 1) of 80 GiB."""

import os


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount():  # noqa: N802  (CuPy's name)
    return int(os.environ.get("FAKE_CUPY_DEVICES", "1"))


def memGetInfo():  # noqa: N802
    return (80 << 30, 80 << 30)


def deviceSynchronize():  # noqa: N802
    pass


def getDevice():  # noqa: N802
    from cupy._core import current_device  # noqa: PLC0415
    return current_device()


def runtimeGetVersion():  # noqa: N802
    return 12080


def getDeviceProperties(device):  # noqa: N802
    return {"name": b"fake CuPy device (NumPy)", "totalGlobalMem": 80 << 30}
