"""The ground floor every layer may import: mixrt's error types (``errors.py``) and the
finding of NVIDIA's libraries called through ctypes (``cuda_libraries.py``), the switches a
run reads (``settings.py``) and where worker threads may run (``placement.py``).

It imports nothing of mixrt's and loads nothing heavy, so ``runtime/blas_policy.py`` can use
it before NumPy loads, and the kvstore, the runtime and the operators share one set of
errors without reaching up into the frontends' folder. Users import the same classes as
:mod:`mixrt.errors`.
"""

# MXNet's ``mxnet.base.MXNetError`` under MXNet's dotted path, for code written against MXNet
from mixrt.base.errors import MXNetError  # noqa: E402,F401


class NotImplementedForSymbol(MXNetError):
    """MXNet's error for an NDArray-only function called on a Symbol."""

    def __init__(self, function, alias=None, *args):
        super().__init__(f"Function {getattr(function, '__name__', function)}"
                         f"{f' (namely operator {alias!r})' if alias else ''} is not "
                         f"implemented for Symbol and only available in NDArray.")
        self.function, self.alias, self.args = function, alias, args


# MXNet's storage types and their ids (``mxnet.ndarray.ndarray._STORAGE_TYPE_STR_TO_ID``):
# the ground's, so that a symbol's ``__storage_type__`` and an NDArray's stype share them
STORAGE_TYPE_IDS = {"undefined": -1, "default": 0, "row_sparse": 1, "csr": 2}
# MXNet's dtype codes (mshadow's TypeFlag): the ground's, so that an NDArray file's dtype field
# (``mixrt/nd/serialization.py``) and a symbol variable's ``__dtype__`` share them
MXNET_DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "uint8": 3, "int32": 4,
                     "int8": 5, "int64": 6, "bool": 7, "int16": 8, "uint16": 9, "uint32": 10,
                     "uint64": 11}


def py_str(raw: bytes) -> str:
    """MXNet's ``mxnet.base.py_str``: bytes from the library as a str."""
    return raw.decode("utf-8")


def _as_list(obj):
    """MXNet's ``mxnet.base._as_list``: a list or tuple as it is, anything else as a
    one-element list (MXNet's own tests import it from here)."""
    if isinstance(obj, (list, tuple)):
        return obj
    return [obj]


def __getattr__(name: str):
    """MXNet's ``mxnet.base`` type tuples and ``mx_real_t``, made on first use: NumPy is
    loaded only then, as this package must not load it (``runtime/blas_policy.py`` imports
    it first)."""
    if name not in ("integer_types", "numeric_types", "string_types", "mx_real_t"):
        raise AttributeError(f"module 'mixrt.base' has no attribute {name!r}")
    import numpy  # noqa: PLC0415  (deferred on purpose: see the docstring)
    return {"integer_types": (int, numpy.int32, numpy.int64),
            "numeric_types": (float, int, numpy.generic),
            "string_types": (str,),
            # MXNet's default real type: what a parameter is unless data says otherwise
            "mx_real_t": numpy.float32}[name]
