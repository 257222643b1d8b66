"""Classes found by name, as MXNet's factories find them: ``mx.init.create("xavier")``,
``mx.metric.create("acc")``, ``mx.optimizer.create("sgd")``.

Each of the three keeps one :class:`Registry`, which is the dict MXNet code may read
(``Optimizer.opt_registry``): lower-cased names (class names and aliases) to classes. What
differs between them is said when the registry is made: the base class a registered class
must extend, the error a bad registration or an unknown name raises, and whether replacing a
registered class warns (MXNet's optimizers do).
"""

from __future__ import annotations

import warnings
from typing import Callable

from mixrt.base.errors import MixrtError


class Registry(dict):
    """Lower-cased name -> class. ``base``: what a registered class must extend (None: any
    class), refused with ``error_type``; ``unknown(name, known)``: the error for a name
    nothing registered (``known``: the registered names, sorted)."""

    def __init__(self, base: type | None, unknown: Callable[[object, list], Exception], *,
                 error_type: type[MixrtError] = MixrtError, warn_on_override: bool = False):
        super().__init__()
        self.base, self.unknown = base, unknown
        self.error_type, self.warn_on_override = error_type, warn_on_override

    def register(self, klass):
        """Register ``klass`` under its lower-cased name; returns it (a decorator)."""
        if self.base is not None and not (isinstance(klass, type)
                                          and issubclass(klass, self.base)):
            raise self.error_type(f"register takes an {self.base.__name__} subclass, got "
                                  f"{klass!r}")
        name = klass.__name__.lower()
        if self.warn_on_override and name in self:
            old = self[name]
            warnings.warn(f"WARNING: New {self.base.__name__.lower()} {klass.__module__}."
                          f"{klass.__name__} is overriding existing "
                          f"{self.base.__name__.lower()} {old.__module__}.{old.__name__}",
                          stacklevel=3)
        self[name] = klass
        return klass

    def alias(self, *aliases):
        """A decorator registering a class under more names."""
        def add(klass):
            for name in aliases:
                self[name.lower()] = klass
            return klass
        return add

    def find(self, name) -> type:
        """The class registered as ``name`` (any case)."""
        if not isinstance(name, str) or name.lower() not in self:
            raise self.unknown(name, sorted(self))
        return self[name.lower()]
