"""``Function``: a differentiable operation written in Python (MXNet's
``autograd.Function``), taped as one node whose backward is the Python ``backward``.
"""

from __future__ import annotations

import contextlib

from mixrt.tape import nodes
from mixrt.tape.recording import is_training, needs_tape, pause


class Function:
    """A differentiable operation written in Python (MXNet's ``autograd.Function``).

        class Sigmoid(autograd.Function):
            def forward(self, x):
                y = 1 / (1 + nd.exp(-x)); self.save_for_backward(y); return y
            def backward(self, dy):
                y, = self.saved_tensors; return dy * y * (1 - y)

    ``forward`` and ``backward`` take and return NDArrays and run unrecorded; an instance
    is used for one call.
    """

    def __init__(self):
        self.saved_tensors = ()

    def save_for_backward(self, *arrays) -> None:
        self.saved_tensors = arrays

    def forward(self, *inputs):
        raise NotImplementedError

    def backward(self, *output_grads):
        raise NotImplementedError

    def __call__(self, *inputs):
        recording = needs_tape(inputs)
        ctx = next((x.ctx for x in inputs if hasattr(x, "ctx")), None)
        with pause(train_mode=is_training()), \
                (ctx.device.active() if ctx is not None else contextlib.nullcontext()):
            outputs = self.forward(*inputs)
        single = not isinstance(outputs, (tuple, list))
        outputs = [outputs] if single else list(outputs)
        if recording:
            # an input returned as is must not become this node's output: it would stop
            # being a leaf (or move off its own node) for every later use
            outputs = [_fresh(o) if any(o is x for x in inputs) else o for o in outputs]
            meta = [(o.shape, o.dtype) for o in outputs]
            node = nodes.FunctionNode(self, inputs, outputs[0].ctx, meta)
            for index, output in enumerate(outputs):
                output._entry = (node, index)
        return outputs[0] if single else tuple(outputs)


def _fresh(array):
    return type(array)(array._read(), array.ctx)  # same memory, no autograd history
