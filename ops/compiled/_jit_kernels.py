"""The numba-compiled loops behind ``ops/compiled/jit_cpu.py`` (imported by it on first use, so that
``import mixrt`` does not pay for numba), as one namespace: ``jit_cpu._kernels().<name>``.
The loops live in modules of their own, by what they compute:

* ``ops/conv/_jit_depthwise_pool.py``: depthwise convolution and 2-D pools over stride-phase planes;
* ``ops/pool/_jit_max_pool_grad.py``: a 2-D MaxPool's dX;
* ``ops/nn/_jit_row_reductions.py``: LayerNormalization (and RMS), softmax's row passes,
  whole-plane pools;
* ``ops/nn/_jit_few_rows.py``: products with a few rows;
* ``ops/conv/_jit_winograd.py``: the transforms of Winograd F(2x2, 3x3);
* ``ops/rnn/_jit_rnn_steps.py``: a standard LSTM's and GRU's steps.

Every array is passed flat (1-D) and indexed as ``array[uint64(offset + i)]``. With a signed
index numba wraps negative values on every access, and that alone kept LLVM from vectorizing
(314 against 38 microseconds for the same multiply-adds); slicing a view per run avoids the
wrap but costs ~20-30 ns a view (reference counts), more than a short run's arithmetic.
Copies and padding stay in NumPy (``jit_cpu._phase_planes``), one strided copy per phase.
"""

from __future__ import annotations

from mixrt.ops.conv._jit_depthwise_pool import depthwise, pool  # noqa: F401
from mixrt.ops.nn._jit_few_rows import eight_rows  # noqa: F401
from mixrt.ops.pool._jit_max_pool_grad import max_pool_grad  # noqa: F401
from mixrt.ops.rnn._jit_rnn_steps import (  # noqa: F401
    gru_candidate, gru_gates, gru_output, gru_reset, gru_reset_grad_candidate, gru_reset_grad_gates,
    gru_step_grad, hold_rows, lstm_output, lstm_step, lstm_step_grad)
from mixrt.ops.nn._jit_row_reductions import (  # noqa: F401
    layer_norm, rms_norm, row_maxima, row_means, softmax_scale, softmax_shift)
from mixrt.ops.conv._jit_winograd import winograd_input, winograd_output  # noqa: F401
