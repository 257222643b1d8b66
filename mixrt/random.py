"""MXNet's ``mx.random``: one seed for every random stream mixrt uses, and the samplers.

    mixrt.random.seed(42)                       # NumPy, mixrt, the random ops, every GPU
    mixrt.random.seed(7, ctx=mixrt.gpu(0))      # only GPU 0's stream
    x = mixrt.random.uniform(0, 1, shape=(2, 3))

:func:`seed` reseeds NumPy's global generator, mixrt's own (:func:`generator`: parameter
initializers, data shuffling), the stream random ops without a ``seed`` attribute draw from
on the CPU (Dropout's masks, RandomNormal, the samplers below) and CuPy's generator of each
GPU (``mixrt/random_streams.py``). The samplers (``uniform``, ``normal``, ``randn``,
``randint``, ``poisson``, ``exponential``, ``gamma``, ``negative_binomial``,
``generalized_negative_binomial``, ``multinomial``, ``shuffle``) are ``mixrt.nd.random``'s:
this module stands on the array frontend's floor, and loads them on first use (PEP 562) so
that seeding alone does not load the array frontend.
"""

from __future__ import annotations

import importlib

import numpy as np

from mixrt.base.errors import DeviceUnavailableError, InputError
from mixrt.context import Context
from mixrt.ops.device import Device, device_named
from mixrt.random_streams import generator, reseed, spawn  # noqa: F401


def seed(seed_state, ctx="all") -> None:
    """Reseed the random streams of every device (``ctx='all'``), of the host
    (``ctx=mixrt.cpu()``: NumPy's, mixrt's and the random ops' on the CPU) or of one GPU
    (``ctx=mixrt.gpu(i)``). The same seed then gives the same draws again; seeding a GPU
    this machine lacks does nothing, as in MXNet."""
    if not isinstance(seed_state, (int, np.integer)) or isinstance(seed_state, bool):
        raise InputError(f"seed: seed_state must be an int, got {seed_state!r}")
    value = int(seed_state) % (2 ** 64)  # any int, as MXNet takes; the generators want >= 0
    if isinstance(ctx, str) and ctx == "all":
        reseed(value)
        return
    device = _device_of(ctx)
    reseed(value, device.kind, device.index)


def _device_of(ctx) -> Device:
    """The device ``ctx`` names, whether this machine has it or not."""
    if isinstance(ctx, Context):
        return ctx.device
    if isinstance(ctx, str):
        try:
            return device_named(ctx)
        except DeviceUnavailableError:  # a name that is no device: said below
            pass
    raise InputError(f"seed: ctx must be 'all' or a context (mixrt.cpu(), mixrt.gpu(i), "
                     f"'gpu:1'), got {ctx!r}")


SAMPLERS = ("uniform", "normal", "randn", "randint", "poisson", "exponential", "gamma",
            "negative_binomial", "generalized_negative_binomial", "multinomial", "shuffle")


def __getattr__(name: str):
    if name in SAMPLERS:
        return getattr(importlib.import_module("mixrt.nd.random"), name)
    raise AttributeError(f"module 'mixrt.random' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(SAMPLERS))


__all__ = ["seed", "generator", "spawn", "uniform", "normal", "randn", "randint", "poisson",
           "exponential", "gamma", "negative_binomial", "generalized_negative_binomial",
           "multinomial", "shuffle"]
