"""cupy.cuda.runtime on the fake: one device with 80 GiB."""


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount():  # noqa: N802  (CuPy's name)
    return 1


def memGetInfo():  # noqa: N802
    return (80 << 30, 80 << 30)


def deviceSynchronize():  # noqa: N802
    pass


def getDevice():  # noqa: N802
    return 0


def runtimeGetVersion():  # noqa: N802
    return 12080


def getDeviceProperties(device):  # noqa: N802
    return {"name": b"fake CuPy device (NumPy)", "totalGlobalMem": 80 << 30}
