"""One call of an MXNet layer: its name, its argument checks, and the few operations by which
a layer's definition reaches a front end.

A layer (``mixrt/layers/convolution.py``, ...) is written once against :class:`LayerCall`.
Each front end subclasses it: ``mixrt.nd.array_layers.ArrayCall`` runs every op at once on
NDArrays (shapes known, so it also checks parameters' shapes), and
``mixrt.sym.symbol_layers.SymbolCall`` adds the ops to a Symbol's graph under MXNet's node
names and makes the parameters the caller left out as Variables whose shapes follow from the
data's. Gluon's layers call the same functions through ``F`` (``F.Convolution``, ...), so
they run on NDArrays or hybridize into symbols with one definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mixrt.base.errors import MixrtError

# performance hints MXNet takes and mixrt has no use for
IGNORED = ("workspace", "cudnn_tune", "cudnn_off")


@dataclass(frozen=True)
class ShapeRule:
    """Where a parameter's shape comes from: input 0 of the layer's node ``reader`` (a role,
    None for the layer's output node), whose value is ``of``. Each entry of ``dims`` is a
    whole number, ``["axis", a]`` or ``["axis", a, divisor]`` (dimension a of that value),
    or ``["axes", start, stop]`` (its dimensions start:stop). The symbol front end records
    it for shape inference; the array front end checks the given parameter against it."""

    reader: str | None
    of: object
    dims: tuple
    min_float_bits: int = 0

    def shape(self, source: tuple) -> tuple:
        """The shape the rule gives for a value of shape ``source``."""
        shape = []
        for item in self.dims:
            if isinstance(item, int):
                shape.append(item)
            elif item[0] == "axis":
                shape.append(source[item[1]] // (item[2] if len(item) > 2 else 1))
            else:
                shape.extend(source[slice(item[1], item[2])])
        return tuple(shape)


class LayerCall:
    """A layer being called: ``kind`` (``"Convolution"``), its name (given or MXNet's
    automatic one), and argument checks whose errors name the layer and the argument."""

    # the error type this front end raises for bad arguments
    error_type: type[MixrtError] = MixrtError

    def __init__(self, kind: str, name, unknown: dict | None = None):
        if name is not None and (not isinstance(name, str) or not name):
            raise self.error_type(f"{kind}: name must be a non-empty string, got {name!r}")
        self.kind = kind
        self.name = self.full_name(kind, name)
        unknown = {k: v for k, v in (unknown or {}).items() if k not in IGNORED}
        if unknown:
            raise self.error(f"unknown argument(s) {sorted(unknown)}")

    def error(self, message: str) -> MixrtError:
        where = self.kind if self.name is None else f"{self.kind} {self.name!r}"
        return self.error_type(f"{where}: {message}")

    # -- what each front end provides ---------------------------------------------------

    def full_name(self, kind: str, given: str | None) -> str | None:
        """The name errors and nodes use (the symbol front end: MXNet's automatic one when
        none is given, with the current prefix)."""
        return given

    def data(self, value, argument: str = "data"):
        """The layer's data input, checked (the symbol front end makes a Variable
        ``<layer>_data`` for one left out)."""
        raise NotImplementedError

    def parameter(self, role: str, given, *, rule: ShapeRule | None = None, shape=None,
                  aux: bool = False, init=None, dtype=None, single_ok: bool = False):
        """A weight, bias or statistic: ``given``, checked against ``rule`` and ``shape``
        (None entries unknown) where they can be (``single_ok``: shape (1,) too, one value
        for all); or, left out, what the front end makes of it (the symbol front end: a
        Variable ``<layer>_<role>``)."""
        raise NotImplementedError

    def node(self, op_type: str, inputs: list, role: str | None = None, **attributes):
        """One op of the layer: its output node (``role`` None) or ``<layer>_<role>``."""
        raise NotImplementedError

    def scalar(self, value: float, like, role: str):
        """A number in ``like``'s dtype."""
        raise NotImplementedError

    def ints(self, values):
        """int64 constants: a vector from a list (a shape, pads, axes), a scalar from an
        int."""
        raise NotImplementedError

    def known_shape(self, value) -> tuple | None:
        """``value``'s shape where the front end knows it now (arrays), else None."""
        return None

    def known_dtype(self, value) -> np.dtype | None:
        return None

    def in_training(self) -> bool | None:
        """Whether the layer runs in training, where that is decided at the call (NDArrays);
        None where it is decided later (a symbol is bound for training or not)."""
        return None

    def softmax_output(self, data, label, options):
        """SoftmaxOutput's forward (the softmax over ``options.axis``, of the data
        flattened to (batch, rest) where ``options.flattened``) and the training signal
        the front end gives it."""
        raise NotImplementedError

    def batch_normalization(self, x, scale, beta, mean, var, eps: float, momentum: float,
                            output_mean_var: bool, role: str | None):
        """BatchNormalization on (batch, channels, ...) data, its running statistics
        ``mean`` and ``var`` used and updated as the front end's training says; returns the
        normalized data and, with ``output_mean_var``, ``[mean, 1 / sqrt(var + eps)]``
        (else ``[]``)."""
        raise NotImplementedError

    # -- argument checks ----------------------------------------------------------------

    def count(self, argument: str, value, minimum: int = 1) -> int:
        if value is None:
            raise self.error(f"{argument} is required")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
                or value < minimum:
            raise self.error(f"{argument} must be an int >= {minimum}, got {value!r}")
        return int(value)

    def number(self, argument: str, value, *, positive: bool = False) -> float:
        if isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)) or not math.isfinite(value) \
                or (positive and value <= 0):
            kind = "a positive" if positive else "a finite"
            raise self.error(f"{argument} must be {kind} number, got {value!r}")
        return float(value)

    def flag(self, argument: str, value) -> bool:
        if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
            raise self.error(f"{argument} must be True or False, got {value!r}")
        return bool(value)

    def choice(self, argument: str, value, allowed) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise self.error(f"{argument}={value!r} is not one of {list(allowed)}")
        return value

    def integer(self, argument: str, value) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise self.error(f"{argument} must be an int, got {value!r}")
        return int(value)

    def shape(self, argument: str, value, *, length=None, default=None,
              minimum: int = 0) -> tuple:
        """A tuple of ints (an int is a 1-tuple, as MXNet reads it); ``()`` or None means
        ``default`` repeated ``length`` times."""
        if value is None or (isinstance(value, (tuple, list)) and not value):
            if default is None:
                raise self.error(f"{argument} is required")
            return (default,) * length
        items = (value,) if isinstance(value, (int, np.integer)) else value
        if not isinstance(items, (tuple, list)) or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                and v >= minimum for v in items):
            raise self.error(f"{argument} must be a tuple of ints >= {minimum}, got "
                             f"{value!r}")
        if length is not None and len(items) != length:
            raise self.error(f"{argument}={tuple(items)} has {len(items)} dimensions; the "
                             f"kernel has {length}")
        return tuple(int(v) for v in items)

    def layout(self, value, spatial: int) -> None:
        wanted = "NC" + "DHW"[3 - spatial:]
        if value is not None and value != wanted:
            raise self.error(f"layout={value!r} is not supported; only {wanted!r} (channels "
                             f"first) for a {spatial}-d kernel")

    def kernel(self, value) -> tuple:
        kernel = self.shape("kernel", value, minimum=1)
        if not 1 <= len(kernel) <= 3:
            raise self.error(f"kernel must have 1 to 3 dimensions, got {kernel}")
        return kernel

    def spatial_data(self, data, spatial: int) -> tuple | None:
        """The data's spatial shape where it is known, checked to be (batch, channels) and
        ``spatial`` axes."""
        shape = self.known_shape(data)
        if shape is not None and len(shape) != spatial + 2:
            raise self.error(f"data must be {spatial + 2}-D (batch, channel and {spatial} "
                             f"spatial axes, as the kernel has), got shape {shape}")
        return None if shape is None else shape[2:]
