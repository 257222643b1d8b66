"""MXNet 1.x's symbolic recurrent cells (``mx.rnn``): one time step built from ``mx.sym``
operators, and ``unroll`` that repeats it over a sequence.

A cell owns its weights as Variables (``RNNParams``: ``<prefix>i2h_weight`` ...), shared by
every step of an unroll; step ``t``'s nodes are named ``<prefix>t<t>_...`` as MXNet names
them (``lstm_t3_out`` is the fourth output). Gates are MXNet's: an LSTM's rows are the
input, forget, cell and output gates, a GRU's the reset, update and new gates.

An unroll given no ``begin_state`` starts from zeros whose batch size is read from the
first step's input when the graph runs, so the same symbol binds at any batch size
(MXNet's ``zeros(shape=(0, H))`` leaves it to shape inference to the same effect).
"""

from __future__ import annotations

import numpy as np

from mixrt import init as initializers, nd, sym
from mixrt.base.errors import InputError

_LAYOUTS = ("NTC", "TNC")


class RNNParams:
    """The Variables of one cell (or of cells sharing weights), made once per name.

    ``get('i2h_weight')`` is the Variable ``<prefix>i2h_weight``; a second call gives the
    same Variable, which is how the steps of an unroll share one weight."""

    def __init__(self, prefix: str = ""):
        self._prefix = prefix
        self._params: dict = {}

    def get(self, name: str, **kwargs):
        """The Variable ``<prefix><name>``; ``kwargs`` (init, shape, ...) apply when it is
        made."""
        name = self._prefix + name
        if name not in self._params:
            self._params[name] = sym.Variable(name, **kwargs)
        return self._params[name]


class BaseRNNCell:
    """A recurrent cell: ``cell(inputs, states)`` is one step, giving (output, states).

    Subclasses define ``state_info`` (one dict per state: its shape with 0 for the batch,
    and its layout), ``_gate_names`` (the suffixes of the gates packed in one weight) and
    ``__call__``."""

    def __init__(self, prefix: str = "", params: RNNParams | None = None):
        self._own_params = params is None
        self._prefix = prefix
        self._params = RNNParams(prefix) if params is None else params
        self._modified = False
        self.reset()

    def reset(self) -> None:
        """Restart step and state numbering (call before building a new unroll)."""
        self._init_counter = -1
        self._counter = -1
        for cell in getattr(self, "_cells", ()):
            cell.reset()

    def __call__(self, inputs, states):
        raise NotImplementedError(f"{type(self).__name__} has no single-step form")

    @property
    def params(self) -> RNNParams:
        self._own_params = False  # handed out: another cell may now share them
        return self._params

    @property
    def state_info(self) -> list:
        raise NotImplementedError(f"{type(self).__name__} must define state_info")

    @property
    def state_shape(self) -> list:
        return [info["shape"] for info in self.state_info]

    @property
    def _gate_names(self) -> tuple:
        return ()

    def begin_state(self, func=None, **kwargs) -> list:
        """One symbol per state, ``func(name=<prefix>begin_state_<i>, shape=..., ...)``
        (MXNet's default ``func`` is ``sym.zeros``; ``sym.Variable`` makes states that are
        inputs of the graph). The shape has 0 for the unknown batch size."""
        if self._modified:
            raise InputError(f"{type(self).__name__}.begin_state: after the cell was "
                             f"wrapped by a modifier, call begin_state on the modifier")
        func = _default_state_func() if func is None else func
        states = []
        for info in self.state_info:
            self._init_counter += 1
            options = _state_options(info, kwargs)
            states.append(func(name=f"{self._prefix}begin_state_{self._init_counter}",
                               **options))
        return states

    def unpack_weights(self, args: dict) -> dict:
        """``args`` with each packed i2h/h2h weight and bias split into one array per gate
        (``<prefix>i2h_f_weight``...), the form MXNet saves RNN checkpoints in."""
        args = dict(args)
        if not self._gate_names:
            return args
        hidden = self._num_hidden
        for group in ("i2h", "h2h"):
            weight = args.pop(f"{self._prefix}{group}_weight")
            bias = args.pop(f"{self._prefix}{group}_bias")
            for j, gate in enumerate(self._gate_names):
                rows = slice(j * hidden, (j + 1) * hidden)
                args[f"{self._prefix}{group}{gate}_weight"] = weight[rows].copy()
                args[f"{self._prefix}{group}{gate}_bias"] = bias[rows].copy()
        return args

    def pack_weights(self, args: dict) -> dict:
        """The inverse of :meth:`unpack_weights`."""
        args = dict(args)
        if not self._gate_names:
            return args
        for group in ("i2h", "h2h"):
            for kind in ("weight", "bias"):
                parts = [args.pop(f"{self._prefix}{group}{gate}_{kind}")
                         for gate in self._gate_names]
                args[f"{self._prefix}{group}_{kind}"] = nd.concat(*parts, dim=0)
        return args

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs=None):
        """The cell run for ``length`` steps over ``inputs`` (one Symbol with a time axis
        where ``layout`` has T, or a list of ``length`` per-step Symbols). Returns
        (outputs, final states); outputs are one Symbol when ``merge_outputs`` is true, a
        list when false, and as ``inputs`` came when None."""
        self.reset()
        steps, axis = split_sequence(length, inputs, layout)
        states = zero_states(self, steps[0]) if begin_state is None else begin_state
        outputs = []
        for step_input in steps:
            output, states = self(step_input, states)
            outputs.append(output)
        return merge_sequence(outputs, axis, inputs, merge_outputs), states

    def _get_activation(self, inputs, activation, **kwargs):
        """``activation`` applied: an MXNet act_type name or a function of a Symbol."""
        if isinstance(activation, str):
            return sym.Activation(inputs, act_type=activation, **kwargs)
        return activation(inputs, **kwargs)


def _state_options(info: dict | None, kwargs: dict) -> dict:
    """``func``'s keyword arguments for one state: its info and ``kwargs``, the
    ``__layout__``-style keys as ``attr`` (what MXNet makes of them either way)."""
    options = dict(info or {})
    options.update(kwargs)
    attr = dict(options.pop("attr", None) or {})
    attr.update({key: options.pop(key) for key in list(options)
                 if key.startswith("__") and key.endswith("__")})
    if attr:
        options["attr"] = attr
    return options


def _default_state_func():
    zeros = getattr(sym, "zeros", None)
    if zeros is None:
        raise InputError("begin_state: mixrt.sym has no zeros operator to make default "
                         "states; pass func= (e.g. sym.Variable), or give unroll no "
                         "begin_state to start from zeros")
    return zeros


def split_sequence(length: int, inputs, layout: str) -> tuple[list, int]:
    """(``length`` per-step Symbols, the time axis) from a sequence Symbol or a list."""
    if layout not in _LAYOUTS:
        raise InputError(f"unroll: layout must be one of {_LAYOUTS}, got {layout!r}")
    axis = layout.find("T")
    if isinstance(inputs, sym.Symbol) and len(inputs.list_outputs()) == 1:
        steps = sym.split(inputs, axis=axis, num_outputs=length, squeeze_axis=1)
        steps = [steps] if length == 1 else list(steps)
    else:
        steps = list(inputs)
    if len(steps) != length:
        raise InputError(f"unroll: length is {length} but inputs has {len(steps)} steps")
    return steps, axis


def merge_sequence(outputs: list, axis: int, inputs, merge_outputs):
    """``outputs`` (per step) as one Symbol along ``axis`` or as the list itself."""
    if merge_outputs is None:
        merge_outputs = isinstance(inputs, sym.Symbol) and len(inputs.list_outputs()) == 1
    if not merge_outputs:
        return outputs
    return sym.Concat(*[sym.expand_dims(step, axis=axis) for step in outputs], dim=axis)


def zero_states(cell: BaseRNNCell, first_step) -> list:
    """Zeros of each of ``cell``'s state shapes (``(0, H)``: 0 is the batch), the batch
    taken from ``first_step``'s first axis. Built by broadcasting a (batch, 1) column of
    zeros like the input against a (1, H) row, so that shape inference sees (batch, H)
    whenever it knows the input's shape (a shape computed from Shape values it could not)."""
    one = np.array([1], dtype=np.int64)
    column = sym.zeros_like(sym.Slice(first_step, one - 1, one, one))  # first_step[:, :1]
    states = []
    for info in cell.state_info:
        row = np.zeros([1] + [size for size in info["shape"] if size != 0], np.float32)
        states.append(sym.broadcast_add(column, sym.CastLike(row, first_step)))
    return states


class _GatedCell(BaseRNNCell):
    """A cell whose step is ``i2h = FC(x)``, ``h2h = FC(h)`` over packed gates."""

    _gates = 1

    def __init__(self, num_hidden: int, prefix: str, params, i2h_bias_init=None):
        super().__init__(prefix=prefix, params=params)
        self._num_hidden = num_hidden
        self._iW = self._params.get("i2h_weight")
        bias_options = {} if i2h_bias_init is None else {"init": i2h_bias_init}
        self._iB = self._params.get("i2h_bias", **bias_options)
        self._hW = self._params.get("h2h_weight")
        self._hB = self._params.get("h2h_bias")

    def _projections(self, inputs, hidden, name: str):
        size = self._num_hidden * self._gates
        i2h = sym.FullyConnected(data=inputs, weight=self._iW, bias=self._iB,
                                 num_hidden=size, name=f"{name}i2h")
        h2h = sym.FullyConnected(data=hidden, weight=self._hW, bias=self._hB,
                                 num_hidden=size, name=f"{name}h2h")
        return i2h, h2h

    def _step_name(self) -> str:
        self._counter += 1
        return f"{self._prefix}t{self._counter}_"


class RNNCell(_GatedCell):
    """An Elman cell: ``h' = activation(W_i x + b_i + W_h h + b_h)``."""

    def __init__(self, num_hidden: int, activation="tanh", prefix: str = "rnn_",
                 params: RNNParams | None = None):
        super().__init__(num_hidden, prefix, params)
        self._activation = activation

    @property
    def state_info(self) -> list:
        return [{"shape": (0, self._num_hidden), "__layout__": "NC"}]

    @property
    def _gate_names(self) -> tuple:
        return ("",)

    def __call__(self, inputs, states):
        name = self._step_name()
        i2h, h2h = self._projections(inputs, states[0], name)
        output = self._get_activation(i2h + h2h, self._activation, name=f"{name}out")
        return output, [output]


class LSTMCell(_GatedCell):
    """An LSTM cell; the forget gate's bias starts at ``forget_bias``."""

    _gates = 4

    def __init__(self, num_hidden: int, prefix: str = "lstm_",
                 params: RNNParams | None = None, forget_bias: float = 1.0):
        super().__init__(num_hidden, prefix, params,
                         i2h_bias_init=initializers.LSTMBias(forget_bias=forget_bias))

    @property
    def state_info(self) -> list:
        return [{"shape": (0, self._num_hidden), "__layout__": "NC"},
                {"shape": (0, self._num_hidden), "__layout__": "NC"}]

    @property
    def _gate_names(self) -> tuple:
        return ("_i", "_f", "_c", "_o")

    def __call__(self, inputs, states):
        name = self._step_name()
        i2h, h2h = self._projections(inputs, states[0], name)
        gates = sym.SliceChannel(i2h + h2h, num_outputs=4, name=f"{name}slice")
        in_gate = sym.Activation(gates[0], act_type="sigmoid", name=f"{name}i")
        forget_gate = sym.Activation(gates[1], act_type="sigmoid", name=f"{name}f")
        in_transform = sym.Activation(gates[2], act_type="tanh", name=f"{name}c")
        out_gate = sym.Activation(gates[3], act_type="sigmoid", name=f"{name}o")
        next_c = sym.elemwise_add(forget_gate * states[1], in_gate * in_transform,
                                  name=f"{name}state")
        next_h = sym.elemwise_mul(out_gate, sym.Activation(next_c, act_type="tanh"),
                                  name=f"{name}out")
        return next_h, [next_h, next_c]


class GRUCell(_GatedCell):
    """A GRU cell: ``h' = (1 - z) * tanh(W_in x + b_in + r * (W_hn h + b_hn)) + z * h``."""

    _gates = 3

    def __init__(self, num_hidden: int, prefix: str = "gru_",
                 params: RNNParams | None = None):
        super().__init__(num_hidden, prefix, params)

    @property
    def state_info(self) -> list:
        return [{"shape": (0, self._num_hidden), "__layout__": "NC"}]

    @property
    def _gate_names(self) -> tuple:
        return ("_r", "_z", "_o")

    def __call__(self, inputs, states):
        name = self._step_name()
        previous = states[0]
        i2h, h2h = self._projections(inputs, previous, name)
        i2h_r, i2h_z, i2h_n = sym.SliceChannel(i2h, num_outputs=3, name=f"{name}i2h_slice")
        h2h_r, h2h_z, h2h_n = sym.SliceChannel(h2h, num_outputs=3, name=f"{name}h2h_slice")
        reset_gate = sym.Activation(i2h_r + h2h_r, act_type="sigmoid", name=f"{name}r_act")
        update_gate = sym.Activation(i2h_z + h2h_z, act_type="sigmoid", name=f"{name}z_act")
        candidate = sym.Activation(i2h_n + reset_gate * h2h_n, act_type="tanh",
                                   name=f"{name}h_act")
        # (1 - z) * n + z * h, written so that no constant of the batch's shape is needed
        next_h = sym.elemwise_add(candidate, update_gate * (previous - candidate),
                                  name=f"{name}out")
        return next_h, [next_h]


class CellGroup(BaseRNNCell):
    """A cell made of the cells in ``self._cells``: their states one after another, and
    their weights packed and unpacked each by its own cell."""

    @property
    def state_info(self) -> list:
        return [info for cell in self._cells for info in cell.state_info]

    def begin_state(self, func=None, **kwargs) -> list:
        return [state for cell in self._cells for state in cell.begin_state(func, **kwargs)]

    def unpack_weights(self, args: dict) -> dict:
        for cell in self._cells:
            args = cell.unpack_weights(args)
        return args

    def pack_weights(self, args: dict) -> dict:
        for cell in self._cells:
            args = cell.pack_weights(args)
        return args



class SequentialRNNCell(CellGroup):
    """Cells stacked: each one's output is the next one's input; the states are all the
    cells' states in order."""

    def __init__(self, params: RNNParams | None = None):
        super().__init__(prefix="", params=params)
        self._override_cell_params = params is not None
        self._cells: list = []

    def add(self, cell: BaseRNNCell) -> None:
        """Append ``cell``; with ``params`` given to the stack, the cell uses those."""
        self._cells.append(cell)
        if self._override_cell_params:
            if not cell._own_params:
                raise InputError("SequentialRNNCell.add: the stack was given params, so "
                                 "each cell added must have its own (none passed to it)")
            cell._params._params.update(self._params._params)
        self._params._params.update(cell.params._params)

    def __call__(self, inputs, states):
        self._counter += 1
        next_states = []
        for cell, cell_states in zip(self._cells, split_states(self._cells, states)):
            inputs, new_states = cell(inputs, cell_states)
            next_states.extend(new_states)
        return inputs, next_states

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs=None):
        self.reset()
        states = None if begin_state is None else split_states(self._cells, begin_state)
        next_states = []
        for i, cell in enumerate(self._cells):
            last = i == len(self._cells) - 1
            inputs, cell_states = cell.unroll(
                length, inputs, None if states is None else states[i], layout,
                merge_outputs=merge_outputs if last else None)
            next_states.extend(cell_states)
        return inputs, next_states


def split_states(cells: list, states) -> list:
    """The flat ``states`` list cut into each cell's part."""
    parts, start = [], 0
    for cell in cells:
        count = len(cell.state_info)
        parts.append(list(states[start:start + count]))
        start += count
    if start != len(states):
        raise InputError(f"the cells take {start} states, got {len(states)}")
    return parts
