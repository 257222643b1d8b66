"""Progress of long work, as a terminal and a log each want it: a bar per training epoch on a
terminal, one line per epoch in a pipe or a CI log (a bar's redraws, ``\\r`` and all, would
pile up there).
"""

from __future__ import annotations

import sys


def on_terminal() -> bool:
    return sys.stderr.isatty()


def epoch_bar(total: int, description: str, enabled: bool):
    """A bar over one epoch's batches on a terminal. In a pipe or a CI log a bar's redraws
    pile up (``\\r`` and all), so there the epoch gets one line instead (:func:`epoch_line`)."""
    if not enabled or not on_terminal():
        return None
    from tqdm import tqdm  # noqa: PLC0415  (only when a bar is drawn)
    return tqdm(total=total, desc=description, unit="batch", leave=True)


def epoch_line(record: dict, epochs: int, enabled: bool) -> None:
    """The epoch's one line where no bar was drawn: ``epoch 3/12: loss 0.1234, train_acc
    0.9500, eval_acc 0.9400 (1.2 s)``."""
    if not enabled or on_terminal():
        return
    figures = ", ".join(f"{key} {value:.4f}" for key, value in record.items()
                        if key not in ("epoch", "seconds") and isinstance(value, float))
    print(f"epoch {record['epoch']}/{epochs}: {figures} ({record['seconds']:.1f} s)",
          file=sys.stderr, flush=True)
