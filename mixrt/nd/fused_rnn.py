"""MXNet's fused recurrent operator on arrays: ``nd.RNN(data, parameters, state, state_cell,
state_size=..., num_layers=..., mode=...)``, the arrays and parameters of ``sym.RNN``.

The operator is written once for arrays and symbols (``mixrt/layers/fused_rnn.py``); here
its ops run at once through the imperative dispatcher (:class:`ArrayWriter`), so under
``autograd.record()`` each lands on the tape and the gradient reaches the data, the flat
parameters and the states, as through any op.
"""

from __future__ import annotations

from mixrt import dispatch
from mixrt.base.errors import InputError
from mixrt.layers import fused_rnn as layer
from mixrt.layers.fused_rnn import (INPUTS, PARAMETERS, input_names,  # noqa: F401
                                    is_mxnet_call, with_onnx_rnn)
from mixrt.nd.cached_op import write_into
from mixrt.nd.ndarray import NDArray


class ArrayWriter:
    """The fused RNN's ops run now, on the data's device; names mean nothing here."""

    def __init__(self, ctx):
        self.ctx = ctx

    @staticmethod
    def call(op_type, inputs, attributes, name, exact_name=False, num_outputs=None):
        del name, exact_name
        return dispatch.invoke("", op_type, list(inputs), dict(attributes),
                               num_outputs=num_outputs)

    def constant(self, array, name):
        del name
        with self.ctx.device.active():
            return NDArray(self.ctx.xp.asarray(array), self.ctx)

    @staticmethod
    def group(outputs):
        return list(outputs)

    @staticmethod
    def pieces(parameters, count):
        return None  # an array keeps no record of what it was concatenated from


def fused_rnn(*args, out=None, name=None, **kwargs):
    """MXNet's ``nd.RNN``: its outputs (the sequence; with ``state_outputs`` also the final
    states), into ``out`` when given."""
    arrays = _arrays(args, kwargs)
    unknown = sorted(set(kwargs) - set(PARAMETERS))
    if unknown:
        raise InputError(f"RNN: unknown arguments {unknown}; MXNet's RNN takes "
                         f"{list(INPUTS)} and {list(PARAMETERS)}")
    wanted = input_names(kwargs)
    missing = [key for key in wanted if arrays.get(key) is None]
    if missing:
        raise InputError(f"RNN: the arrays {missing} are needed (mode "
                         f"{kwargs.get('mode')!r}); got {sorted(arrays)}")
    inputs = [arrays[key] for key in wanted]
    outputs = layer.fused_rnn(ArrayWriter(inputs[0].ctx), name or "rnn", inputs, dict(kwargs))
    if out is not None:
        return write_into(out, outputs if isinstance(outputs, list) else [outputs], "RNN")
    return outputs


def _arrays(args, kwargs: dict) -> dict:
    """The input arrays by MXNet's names, given positionally or by name (taken out of
    ``kwargs``)."""
    if len(args) > len(INPUTS):
        raise InputError(f"RNN takes at most {len(INPUTS)} inputs, got {len(args)}")
    arrays = dict(zip(INPUTS, args))
    for key in INPUTS:
        if key in kwargs:
            if key in arrays:
                raise InputError(f"RNN: {key} given both positionally and by name")
            arrays[key] = kwargs.pop(key)
    return arrays
