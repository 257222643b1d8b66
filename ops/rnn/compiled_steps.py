"""Where the recurrent layers' compiled kernels are loaded from: a standard LSTM's and GRU's
step arithmetic (``_jit_rnn_steps.py``) and a direction's whole sequence in one call
(``_jit_recurrent.py``), both through ``jit_cpu.load`` on first use."""

from __future__ import annotations

from mixrt.ops.compiled import jit_cpu
from mixrt.ops.compiled.jit_tier import compiled_allowed

STEPS = "mixrt.ops.rnn._jit_rnn_steps"
SEQUENCES = "mixrt.ops.rnn._jit_recurrent"


def recurrent_kernels():
    """``_jit_recurrent`` (a recurrent layer's whole sequence in one call), or None without
    numba or on a thread running the NumPy tier."""
    return jit_cpu.load(SEQUENCES) if compiled_allowed() else None
