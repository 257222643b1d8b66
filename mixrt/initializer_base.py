"""What MXNet's initializers share (``mixrt.initializer`` is the public module, with the
kinds): ``InitDesc``, the ``Initializer`` base class and its name rules, the registry.

Two ways to call one:

* MXNet's, ``init(desc, arr)``: fills ``arr`` (an NDArray or a NumPy array) in place. With an
  ``InitDesc`` the variable's own initializer (its ``__init__`` attribute) wins, else the
  name picks the rule as in MXNet: ``*weight`` the initializer's own rule, ``*bias`` and
  ``*beta`` zero, ``*gamma`` one, ``*min`` zero, ``*max`` one; any other name is an error.
  A plain string name takes MXNet's older rules (``moving_mean`` zero, ``moving_var`` one,
  ``upsampling*`` bilinear, ...).
* mixrt's, ``init(name, shape, dtype)``: returns a new NumPy array. Zero, One and Constant
  fill every parameter; the others give biases, shifts and running means zeros, scales and
  running variances ones (read from the name's suffix) and weights their own rule. Gluon's
  Parameters and ``sym``'s executors call this form.

Random rules draw from ``mixrt.random.generator()``, so ``mixrt.random.seed`` fixes them;
the numbers are not MXNet's (its generator is its own), their distributions are.
"""

from __future__ import annotations

import json
import logging
import math
import warnings

import numpy as np

from mixrt.base.errors import InputError, ShapeError
from mixrt.ops.device import array_module, to_host
from mixrt.registry import Registry


class InitializerError(InputError, ValueError):
    """A name no rule covers, or a bad initializer argument (MXNet raises ValueError)."""


class InitDesc(str):
    """A parameter's name with its attributes (``__init__``: its own initializer's
    ``dumps()``) and the global initializer."""

    def __new__(cls, name, attrs=None, global_init=None):
        desc = super().__new__(cls, name)
        desc.attrs = attrs or {}
        desc.global_init = global_init
        return desc


# -- filling arrays -----------------------------------------------------------------------------

def _fill(arr, values) -> None:
    """``arr[:] = values`` for an NDArray (on any device) or a NumPy array."""
    host = np.broadcast_to(np.asarray(values), tuple(arr.shape))
    if hasattr(arr, "_write") and hasattr(arr, "ctx"):  # an NDArray (duck-typed: mixrt.nd
        raw = arr._write()                               # imports this module)
        if array_module(raw) is np:
            raw[...] = host
        else:
            raw[...] = arr.ctx.device.put(np.ascontiguousarray(host, dtype=raw.dtype))
    else:
        arr[...] = host


def _shape_of(arr) -> tuple:
    return tuple(int(d) for d in arr.shape)


_ROLE_BY_SUFFIX = {"bias": "zero", "beta": "zero", "mean": "zero",
                   "gamma": "one", "scale": "one", "var": "one"}


def role_of(name: str) -> str:
    """"zero", "one" or "weight", from the parameter name's suffix (mixrt's call form)."""
    lowered = name.lower()
    for suffix in sorted(_ROLE_BY_SUFFIX, key=len, reverse=True):
        if lowered.endswith(suffix):
            return _ROLE_BY_SUFFIX[suffix]
    return "weight"


# the older MXNet rules for a plain string name, in MXNet's order
_LEGACY_RULES = (
    (lambda n: n.startswith("upsampling"), "_init_bilinear"),
    (lambda n: n.startswith("stn_loc") and n.endswith("weight"), "_init_zero"),
    (lambda n: n.startswith("stn_loc") and n.endswith("bias"), "_init_loc_bias"),
    (lambda n: n.endswith("bias"), "_init_bias"),
    (lambda n: n.endswith("gamma"), "_init_gamma"),
    (lambda n: n.endswith("beta"), "_init_beta"),
    (lambda n: n.endswith("weight"), "_init_weight"),
    (lambda n: n.endswith("moving_mean"), "_init_zero"),
    (lambda n: n.endswith("moving_var"), "_init_one"),
    (lambda n: n.endswith("moving_inv_var"), "_init_zero"),
    (lambda n: n.endswith("moving_avg"), "_init_zero"),
    (lambda n: n.endswith("min"), "_init_zero"),
    (lambda n: n.endswith("max"), "_init_one"),
)

# the rules for an InitDesc, in MXNet's order
_DESC_RULES = (("weight", "_init_weight"), ("bias", "_init_bias"), ("gamma", "_init_gamma"),
               ("beta", "_init_beta"), ("min", "_init_zero"), ("max", "_init_one"))


class Initializer:
    """Base class. A kind defines ``_init_weight(name, arr)``; the others have MXNet's
    defaults (biases and betas 0, gammas 1)."""

    fills_every_role = False  # Zero, One, Constant: mixrt's call form fills every name

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        self._verbose = False
        self._print_func = None

    # -- the two call forms --------------------------------------------------------------

    def __call__(self, desc, arr=None, dtype="float32"):
        if arr is None or _is_shape(arr):
            return self._new_array(str(desc), arr, dtype)
        if isinstance(desc, InitDesc):
            self._init_described(desc, arr)
        else:
            warnings.warn("Calling initializer with init(str, NDArray) has been deprecated. "
                          "please use init(mx.init.InitDesc(...), NDArray) instead.",
                          DeprecationWarning, stacklevel=2)
            self._legacy_init(desc, arr)
        return None

    def _new_array(self, name: str, shape, dtype) -> np.ndarray:
        if shape is None:
            raise InitializerError(f"initializer {type(self).__name__}: give the parameter "
                                   f"{name!r} an array to fill or a shape")
        arr = np.zeros(tuple(int(d) for d in shape), np.dtype(dtype))
        role = "weight" if self.fills_every_role else role_of(name)
        getattr(self, {"zero": "_init_zero", "one": "_init_one",
                       "weight": "_init_weight"}[role])(name, arr)
        return arr

    def _init_described(self, desc: InitDesc, arr) -> None:
        if desc.global_init is None:
            desc.global_init = self
        own = desc.attrs.get("__init__", "")
        if own:
            create(own)._init_weight(desc, arr)
            self._verbose_print(desc, own, arr)
            return
        for suffix, rule in _DESC_RULES:
            if desc.endswith(suffix):
                getattr(self, rule)(desc, arr)
                self._verbose_print(desc, suffix, arr)
                return
        self._init_default(desc, arr)

    def fill_by_name(self, name: str, arr) -> None:
        """Fill ``arr`` as MXNet's global initializer fills the parameter ``name`` (the
        InitDesc rules, no own ``__init__``); a name those rules do not cover gets this
        initializer's weight rule, where MXNet would refuse it."""
        rule = next((rule for suffix, rule in _DESC_RULES if name.endswith(suffix)),
                    "_init_weight")
        getattr(self, rule)(name, arr)

    def _legacy_init(self, name, arr) -> None:
        if not isinstance(name, str):
            raise InitializerError(f"name must be string, got {type(name).__name__}")
        rule = next((rule for matches, rule in _LEGACY_RULES if matches(name)),
                    "_init_default")
        getattr(self, rule)(name, arr)

    # -- the rules -----------------------------------------------------------------------

    def _init_weight(self, name, arr):
        raise NotImplementedError("Must override it")

    def _init_zero(self, _, arr):
        _fill(arr, 0.0)

    def _init_one(self, _, arr):
        _fill(arr, 1.0)

    def _init_bias(self, _, arr):
        _fill(arr, 0.0)

    def _init_gamma(self, _, arr):
        _fill(arr, 1.0)

    def _init_beta(self, _, arr):
        _fill(arr, 0.0)

    def _init_bilinear(self, _, arr):
        _fill(arr, bilinear_kernel(_shape_of(arr)))

    def _init_loc_bias(self, _, arr):
        if _shape_of(arr)[0] != 6:
            raise ShapeError(f"an stn_loc bias has 6 entries, got shape {_shape_of(arr)}")
        _fill(arr, np.array([1.0, 0, 0, 0, 1.0, 0]))

    def _init_default(self, name, _):
        raise InitializerError(
            f"Unknown initialization pattern for {name}. Default initialization is now "
            f"limited to \"weight\", \"bias\", \"gamma\" (1.0), and \"beta\" (0.0). Please use "
            f"mx.sym.Variable(init=mx.init.*) to set initialization pattern")

    # -- description ---------------------------------------------------------------------

    def set_verbosity(self, verbose=False, print_func=None):
        """Log each initialized array with ``print_func(arr)`` (default: its norm over the
        square root of its size)."""
        self._verbose = verbose
        self._print_func = print_func or (lambda x: str(float(
            np.linalg.norm(_host(x)) / math.sqrt(max(_host(x).size, 1)))))
        return self

    def _verbose_print(self, desc, init, arr) -> None:
        if self._verbose and self._print_func:
            logging.info("Initialized %s as %s: %s", desc, init, self._print_func(arr))

    def dumps(self) -> str:
        """``'["name", {arguments}]'``: what a symbol's ``__init__`` attribute holds."""
        return json.dumps([type(self).__name__.lower(), self._kwargs])

    def spec(self) -> dict:
        """The initializer as JSON-able data, ``{"type": ClassName, **arguments}``."""
        return {"type": type(self).__name__, **json.loads(self.dumps())[1]}

    def __eq__(self, other):
        if not isinstance(other, Initializer):
            return NotImplemented
        return type(self) is type(other) and self._kwargs == other._kwargs

    def __hash__(self):
        return hash((type(self), self.dumps()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._kwargs})"


def _is_shape(value) -> bool:
    return isinstance(value, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) for d in value)


def _host(arr) -> np.ndarray:
    return arr.asnumpy() if hasattr(arr, "asnumpy") else np.asarray(to_host(arr))


def bilinear_kernel(shape: tuple) -> np.ndarray:
    """MXNet's bilinear upsampling filter over the last two axes of ``shape`` (the width's
    half-size ``f`` sets both axes' scale, as in MXNet)."""
    if len(shape) != 4:
        raise ShapeError(f"Bilinear initializes 4-D (deconvolution) weights, got {shape}")
    f = math.ceil(shape[3] / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    across = 1 - np.abs(np.arange(shape[3]) / f - c)
    down = 1 - np.abs(np.arange(shape[2]) / f - c)
    return np.broadcast_to(np.outer(down, across), shape).astype(np.float32)


# -- the registry ---------------------------------------------------------------------------

_REGISTRY = Registry(Initializer, lambda name, known: InitializerError(
    f"unknown initializer {name!r}; registered: {known}"), error_type=InitializerError)
register = _REGISTRY.register  # an initializer class under its lower-cased name
alias = _REGISTRY.alias  # ... and under more names


def create(init, /, **kwargs) -> Initializer:
    """An initializer from an instance, a registered name or alias (case-insensitive),
    ``dumps()``' JSON, or a ``spec()`` dict."""
    if isinstance(init, Initializer) or (callable(init) and not isinstance(init, type)):
        return init  # an initializer, or a Load / Mixed
    if isinstance(init, str) and init.lstrip().startswith("["):
        name, arguments = json.loads(init)
        return create(name, **arguments, **kwargs)
    if isinstance(init, dict) and isinstance(init.get("type"), str):
        options = {k: v for k, v in init.items() if k != "type"}
        return create(init["type"], **options, **kwargs)
    return _REGISTRY.find(init)(**kwargs)



def starting_value(name: str, declared, auxiliary: bool):
    """MXNet's ``Module.init_params`` rule for one parameter, before the module's own
    initializer: the Initializer its Variable declares (``init=``: it fills the parameter
    whole, whatever its name), else for an auxiliary state the number it starts at (running
    means 0, variances 1), else None (the module's initializer fills it by name)."""
    if declared is not None:
        return create(declared)
    if auxiliary:
        return 1.0 if role_of(name) == "one" else 0.0
    return None

__all__ = ["InitDesc", "Initializer", "InitializerError", "register", "alias", "create",
           "role_of", "bilinear_kernel", "starting_value"]
