"""MXNet's fused recurrent operator on arrays: ``nd.RNN(data, parameters, state, state_cell,
state_size=..., num_layers=..., mode=...)``, the arrays and parameters of ``sym.RNN``
(``mixrt.sym.fused_rnn``).

The symbol ``sym.RNN`` builds for the given parameters runs as one ``nd.CachedOp`` (so it
records for autograd as any CachedOp does); one symbol is kept per parameter set. The symbol
frontend is built on ``mixrt.nd``, so it is loaded on first use.
"""

from __future__ import annotations

import importlib

from mixrt.base.errors import InputError
from mixrt.nd.cached_op import CachedOp
from mixrt.runtime.lru import LruCache

# the inputs of MXNet's RNN, in its order (state_cell only for an LSTM, sequence_length only
# with use_sequence_length)
INPUTS = ("data", "parameters", "state", "state_cell", "sequence_length")
# MXNet's RNN parameters; any of them given means MXNet's operator rather than ONNX's
PARAMETERS = ("state_size", "num_layers", "bidirectional", "mode", "p", "state_outputs",
              "projection_size", "lstm_state_clip_min", "lstm_state_clip_max",
              "lstm_state_clip_nan", "use_sequence_length", "cudnn_off")
# parameter sets whose CachedOp is kept
MAX_KEPT = 16
_kept = LruCache(MAX_KEPT)


def is_mxnet_call(kwargs: dict) -> bool:
    """Whether an ``RNN`` call is MXNet's: it names one of MXNet's parameters, or an input
    ONNX's RNN does not have."""
    return any(key in kwargs for key in (*PARAMETERS, "data", "parameters", "state",
                                         "state_cell"))


def fused_rnn(*args, out=None, name=None, **kwargs):
    """MXNet's ``nd.RNN``: its outputs (the sequence; with ``state_outputs`` also the final
    states), into ``out`` when given."""
    arrays = dict(zip(INPUTS, args))
    for key in INPUTS:
        if key in kwargs:
            if key in arrays:
                raise InputError(f"RNN: {key} given both positionally and by name")
            arrays[key] = kwargs.pop(key)
    op = _cached_op(kwargs)
    missing = [key for key in op.input_names if arrays.get(key) is None]
    if missing:
        raise InputError(f"RNN: the arrays {missing} are needed (mode "
                         f"{kwargs.get('mode')!r}); got {sorted(arrays)}")
    return op(*[arrays[key] for key in op.input_names], out=out)


def _cached_op(params: dict) -> CachedOp:
    key = tuple(sorted((k, repr(v)) for k, v in params.items()))
    op = _kept.get(key)
    if op is None:
        sym = importlib.import_module("mixrt.sym")
        symbols = {key: sym.var(key) for key in INPUTS}
        op = _kept.put(key, CachedOp(sym.RNN(**symbols_for(params, symbols), name="rnn",
                                             **params)))
    return op


def symbols_for(params: dict, symbols: dict) -> dict:
    """The input symbols the mode reads (state_cell for an LSTM, sequence_length with
    use_sequence_length)."""
    wanted = ["data", "parameters", "state"]
    if params.get("mode") == "lstm":
        wanted.append("state_cell")
    if params.get("use_sequence_length"):
        wanted.append("sequence_length")
    return {key: symbols[key] for key in wanted}
