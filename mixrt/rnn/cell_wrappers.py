"""MXNet 1.x's cells around other cells (``mx.rnn``): dropout between layers, the modifiers
(zoneout, residual connections) and the bidirectional pair."""

from __future__ import annotations

from mixrt import sym
from mixrt.base.errors import InputError
from mixrt.rnn.rnn_cell import (BaseRNNCell, CellGroup, merge_sequence, RNNParams, split_sequence,
                                split_states, zero_states)


class DropoutCell(BaseRNNCell):
    """Dropout with probability ``dropout`` on each step's input; no states."""

    def __init__(self, dropout: float, prefix: str = "dropout_",
                 params: RNNParams | None = None):
        super().__init__(prefix, params)
        if not 0.0 <= dropout < 1.0:
            raise InputError(f"DropoutCell: dropout must be in [0, 1), got {dropout!r}")
        self.dropout = dropout

    @property
    def state_info(self) -> list:
        return []

    def __call__(self, inputs, states):
        if self.dropout > 0:
            self._counter += 1
            inputs = sym.Dropout(data=inputs, p=self.dropout,
                                 name=f"{self._prefix}t{self._counter}_fwd")
        return inputs, states

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs=None):
        self.reset()
        steps, axis = split_sequence(length, inputs, layout)
        outputs = [self(step, [])[0] for step in steps]
        return merge_sequence(outputs, axis, inputs, merge_outputs), []


class ModifierCell(BaseRNNCell):
    """A cell that changes how ``base_cell`` steps; the base cell's weights and states are
    its own, and ``begin_state`` must then be asked of the modifier."""

    def __init__(self, base_cell: BaseRNNCell):
        base_cell._modified = True
        self.base_cell = base_cell
        super().__init__(prefix="", params=None)
        self._cells = [base_cell]

    @property
    def params(self) -> RNNParams:
        self._own_params = False
        return self.base_cell.params

    @property
    def state_info(self) -> list:
        return self.base_cell.state_info

    def begin_state(self, func=None, **kwargs) -> list:
        self.base_cell._modified = False
        try:
            return self.base_cell.begin_state(func, **kwargs)
        finally:
            self.base_cell._modified = True

    def unpack_weights(self, args: dict) -> dict:
        return self.base_cell.unpack_weights(args)

    def pack_weights(self, args: dict) -> dict:
        return self.base_cell.pack_weights(args)


class ZoneoutCell(ModifierCell):
    """Zoneout (Krueger et al., 2016): in training each output and state unit keeps its
    previous value with probability ``zoneout_outputs`` / ``zoneout_states``."""

    def __init__(self, base_cell: BaseRNNCell, zoneout_outputs: float = 0.0,
                 zoneout_states: float = 0.0):
        if isinstance(base_cell, BidirectionalCell):
            raise InputError("ZoneoutCell: a BidirectionalCell has no single step to zone "
                             "out; wrap each direction's cell instead")
        super().__init__(base_cell)
        self.zoneout_outputs = zoneout_outputs
        self.zoneout_states = zoneout_states
        self.prev_output = None

    def reset(self) -> None:
        super().reset()
        self.prev_output = None

    def __call__(self, inputs, states):
        next_output, next_states = self.base_cell(inputs, states)
        previous = self.prev_output
        if previous is None:
            previous = sym.zeros_like(next_output)
        output = (_zoneout(next_output, previous, self.zoneout_outputs)
                  if self.zoneout_outputs > 0 else next_output)
        if self.zoneout_states > 0:
            next_states = [_zoneout(new, old, self.zoneout_states)
                           for new, old in zip(next_states, states)]
        self.prev_output = output
        return output, next_states


def _zoneout(new, old, probability: float):
    """``new`` where a dropout mask of ones is kept, ``old`` where it dropped; Dropout
    scales kept units, so the mask is compared with zero rather than used as a factor."""
    mask = sym.Dropout(sym.ones_like(new), p=probability)
    return sym.where(mask, new, old)


class ResidualCell(ModifierCell):
    """``base_cell``'s output plus its input (He et al., 2016)."""

    def __call__(self, inputs, states):
        output, states = self.base_cell(inputs, states)
        return sym.elemwise_add(output, inputs, name=f"{output.name}_plus_residual"), states

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs=None):
        self.reset()
        self.base_cell._modified = False
        try:
            outputs, states = self.base_cell.unroll(length, inputs, begin_state, layout,
                                                    merge_outputs=merge_outputs)
        finally:
            self.base_cell._modified = True
        if isinstance(outputs, sym.Symbol) and len(outputs.list_outputs()) == 1:
            if not isinstance(inputs, sym.Symbol):
                axis = layout.find("T")
                inputs = merge_sequence(list(inputs), axis, inputs, True)
            return sym.elemwise_add(outputs, inputs, name=f"{outputs.name}_plus_residual"), \
                states
        steps, _ = split_sequence(length, inputs, layout)
        return [sym.elemwise_add(out, step, name=f"{out.name}_plus_residual")
                for out, step in zip(outputs, steps)], states


class BidirectionalCell(CellGroup):
    """``l_cell`` over the sequence and ``r_cell`` over it reversed, their outputs
    concatenated per step (named ``<output_prefix>t<i>``). Only ``unroll`` exists: a
    single step has no reverse direction."""

    def __init__(self, l_cell: BaseRNNCell, r_cell: BaseRNNCell,
                 params: RNNParams | None = None, output_prefix: str = "bi_"):
        super().__init__("", params=params)
        self._output_prefix = output_prefix
        self._override_cell_params = params is not None
        if self._override_cell_params:
            if not (l_cell._own_params and r_cell._own_params):
                raise InputError("BidirectionalCell: given params, its cells must have "
                                 "their own (none passed to them)")
            l_cell.params._params.update(self._params._params)
            r_cell.params._params.update(self._params._params)
        self._params._params.update(l_cell.params._params)
        self._params._params.update(r_cell.params._params)
        self._cells = [l_cell, r_cell]

    def __call__(self, inputs, states):
        raise NotImplementedError("BidirectionalCell cannot be stepped; use unroll")

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs=None):
        self.reset()
        steps, axis = split_sequence(length, inputs, layout)
        if begin_state is None:
            begin_state = [state for cell in self._cells
                           for state in zero_states(cell, steps[0])]
        l_cell, r_cell = self._cells
        l_states, r_states = split_states(self._cells, begin_state)
        l_outputs, l_states = l_cell.unroll(length, steps, l_states, layout,
                                            merge_outputs=False)
        r_outputs, r_states = r_cell.unroll(length, list(reversed(steps)), r_states, layout,
                                            merge_outputs=False)
        outputs = [sym.Concat(left, right, dim=1, name=f"{self._output_prefix}t{i}")
                   for i, (left, right) in enumerate(zip(l_outputs, reversed(r_outputs)))]
        return merge_sequence(outputs, axis, inputs, merge_outputs), l_states + r_states
