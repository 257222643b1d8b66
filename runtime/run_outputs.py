"""A run's outputs as a session hands them back: on the host or kept on its device, copied
where they may be arena memory the next run writes or a frozen value every run returns."""

from __future__ import annotations

import numpy as np

from mixrt.ops.device import Device, to_host


def host_value(value):
    """to_host for a run's output; maps (dicts) live on the host already and pass as they
    are (to_host would take a dict's ``get`` for CuPy's)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list):
        return [host_value(v) for v in value]
    return to_host(value)


def held_value(device: Device, value):
    """device.put for a run's output kept on the device; maps stay host dicts."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return [held_value(device, v) for v in value]
    return device.put(value)


def host_outputs(wanted: list[str], shared: frozenset, env: dict) -> list:
    """A planned CPU run's outputs as Session.run returns them (Session._collect's host
    case, for :class:`SteadyRun`, whose plan produced every one before)."""
    if not shared:
        values = [env[name] for name in wanted]
        for value in values:  # a loop, not all() over a generator: ~0.2 us a run
            if value.__class__ is not np.ndarray:
                break
        else:
            return values
    values = []
    for name in wanted:  # NumPy outputs without the generic conversions: ~0.3 us a run
        value = env[name]
        if value.__class__ is np.ndarray:
            values.append(value.copy() if name in shared else value)
        else:
            values.append(host_value(copied(value) if name in shared else value))
    return values


def copied(value):
    return [copied(v) for v in value] if isinstance(value, list) else value.copy()
