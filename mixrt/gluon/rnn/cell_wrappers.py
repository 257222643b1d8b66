"""Cells made of cells, as MXNet's ``gluon.rnn`` has them: stacks (``SequentialRNNCell``,
``HybridSequentialRNNCell``), ``BidirectionalCell``, the modifiers (``ResidualCell``,
``ZoneoutCell``) and ``DropoutCell``.

    stack = rnn.HybridSequentialRNNCell()
    stack.add(rnn.BidirectionalCell(rnn.LSTMCell(64), rnn.LSTMCell(64)))
    stack.add(rnn.DropoutCell(0.2))
    stack.add(rnn.ResidualCell(rnn.LSTMCell(128)))
    outputs, states = stack.unroll(T, x, layout="NTC", merge_outputs=True)

Their steps are plain Python over the cells they hold, on whichever of ``nd`` and ``sym``
their inputs belong to: they hold no parameters of their own, and the cells inside
hybridize. A hybridized block that unrolls them traces every step into its graph. States
are flat lists: a stack's are its cells' in order, a bidirectional cell's the left cell's
then the right cell's.
"""

from __future__ import annotations

import numpy as np

from mixrt.base.errors import InputError
from mixrt.gluon.nn.basic_layers import dropout
from mixrt.gluon.rnn.rnn_cell import (as_list, HybridRecurrentCell, mask_steps, merged,
                                      named, namespace_of, RecurrentCell, reverse_steps,
                                      sequence_steps)


def _state_slices(cells, states) -> list:
    """``states`` (a flat list, or None for zeros) cut into each cell's part."""
    if states is None:
        return [None] * len(cells)
    parts, position = [], 0
    for cell in cells:
        count = len(cell.state_info())
        parts.append(list(states[position:position + count]))
        position += count
    if position != len(states):
        raise InputError(f"the cells take {position} states in all, got {len(states)}")
    return parts


class _CellStack:
    """What both stacks do: step each cell in turn, or unroll each over the sequence."""

    def add(self, cell: RecurrentCell) -> None:
        if not isinstance(cell, RecurrentCell):
            raise InputError(f"{type(self).__name__}.add: expected a recurrent cell, got "
                             f"{type(cell).__name__}")
        self.register_child(cell)

    def __len__(self) -> int:
        return len(self._children)

    def __getitem__(self, index):
        return list(self._children.values())[index]

    def state_info(self, batch_size: int = 0) -> list:
        return [info for cell in self._children.values()
                for info in cell.state_info(batch_size)]

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        return [state for cell in self._children.values()
                for state in cell.begin_state(batch_size, func, **kwargs)]

    def forward(self, inputs, states=None):
        self._counter += 1
        cells = list(self._children.values())
        next_states = []
        for cell, cell_states in zip(cells, _state_slices(cells, states)):
            inputs, new_states = cell(inputs, cell_states)
            next_states.extend(new_states)
        return inputs, next_states

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs: bool | None = None, valid_length=None):
        """Each cell unrolled over the whole sequence in turn (so a bidirectional cell may
        be one of them); the last one's outputs merged as ``merge_outputs`` says."""
        self.reset()
        cells = list(self._children.values())
        final_states = []
        for i, (cell, cell_states) in enumerate(zip(cells, _state_slices(cells,
                                                                          begin_state))):
            merge = merge_outputs if i == len(cells) - 1 else None
            inputs, states = cell.unroll(length, inputs, cell_states, layout, merge,
                                         valid_length)
            final_states.extend(states)
        return inputs, final_states


class SequentialRNNCell(_CellStack, RecurrentCell):
    """Cells stacked: each step's output is the next cell's input."""


class HybridSequentialRNNCell(_CellStack, HybridRecurrentCell):
    """:class:`SequentialRNNCell` that a HybridBlock may hold and hybridize."""


class DropoutCell(HybridRecurrentCell):
    """Dropout of each step's input at ``rate`` while training; no states."""

    def __init__(self, rate: float, axes=(), prefix=None, params=None):
        if not 0.0 <= rate < 1.0:
            raise InputError(f"DropoutCell: rate must be in [0, 1), got {rate}")
        if tuple(axes):
            raise InputError(f"DropoutCell: axes={tuple(axes)} (a mask shared along axes) "
                             "is not supported; give axes=()")
        super().__init__(prefix, params)
        self._rate = float(rate)

    def state_info(self, batch_size: int = 0) -> list:
        return []

    def forward(self, inputs, states=None):
        self._counter += 1
        return dropout(namespace_of(inputs), inputs, self._rate), as_list(states)

    def __repr__(self) -> str:
        return f"DropoutCell(rate={self._rate})"


class ModifierCell(HybridRecurrentCell):
    """A cell that changes what ``base_cell`` computes; its states are the base cell's."""

    def __init__(self, base_cell: RecurrentCell):
        if not isinstance(base_cell, RecurrentCell):
            raise InputError(f"{type(self).__name__}: base_cell must be a recurrent cell, "
                             f"got {type(base_cell).__name__}")
        super().__init__(prefix=base_cell.prefix + type(self).__name__.lower() + "_")
        self.base_cell = base_cell

    def state_info(self, batch_size: int = 0) -> list:
        return self.base_cell.state_info(batch_size)

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        return self.base_cell.begin_state(batch_size, func, **kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_cell!r})"


class ResidualCell(ModifierCell):
    """``base_cell``'s output plus its input (He et al. 2016; Wu et al. 2016, GNMT)."""

    def forward(self, inputs, states=None):
        self._counter += 1
        output, states = self.base_cell(inputs, states)
        return named(output + inputs, f"{self.base_cell.prefix}t{self._counter}_out_plus_"
                                      "residual"), states

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs: bool | None = None, valid_length=None):
        self.reset()
        steps, axis, merged_in = sequence_steps(length, inputs, layout)
        outputs, states = self.base_cell.unroll(length, steps, begin_state, layout, False,
                                                valid_length)
        if valid_length is not None:  # the inputs past a sequence's end are not added
            steps = mask_steps(namespace_of(steps[0]), steps, valid_length)
        outputs = [out + x for out, x in zip(outputs, steps)]
        return merged(outputs, axis, merged_in if merge_outputs is None else merge_outputs), \
            states


class ZoneoutCell(ModifierCell):
    """Zoneout (Krueger et al. 2016): while training, each unit keeps its previous output
    with probability ``zoneout_outputs`` and its previous state with probability
    ``zoneout_states`` instead of taking the new one."""

    def __init__(self, base_cell: RecurrentCell, zoneout_outputs: float = 0.0,
                 zoneout_states: float = 0.0):
        if isinstance(base_cell, BidirectionalCell):
            raise InputError("ZoneoutCell: a BidirectionalCell cannot be stepped; zone out "
                             "its two cells instead")
        for name, rate in (("zoneout_outputs", zoneout_outputs),
                           ("zoneout_states", zoneout_states)):
            if not 0.0 <= rate < 1.0:
                raise InputError(f"ZoneoutCell: {name} must be in [0, 1), got {rate}")
        super().__init__(base_cell)
        self.zoneout_outputs, self.zoneout_states = float(zoneout_outputs), \
            float(zoneout_states)
        self._prev_output = None

    def reset(self) -> None:
        super().reset()
        self._prev_output = None

    def forward(self, inputs, states=None):
        self._counter += 1
        output, new_states = self.base_cell(inputs, states)
        F = namespace_of(output)
        previous = self._prev_output if self._prev_output is not None else \
            _full_like(F, output, 0.0)
        output = _zone_out(F, self.zoneout_outputs, output, previous)
        if states is not None:
            new_states = [_zone_out(F, self.zoneout_states, new, old)
                          for new, old in zip(new_states, states)]
        self._prev_output = output
        return output, new_states


class VariationalDropoutCell(ModifierCell):
    """Variational dropout (Gal and Ghahramani 2016): one dropout mask per sequence for the
    inputs (rate ``drop_inputs``), for the first state h (``drop_states``) and for the
    outputs (``drop_outputs``), the same at every step until ``reset()`` (``unroll``
    resets); nothing is dropped outside training. MXNet's
    ``gluon.contrib.rnn.VariationalDropoutCell``."""

    def __init__(self, base_cell: RecurrentCell, drop_inputs: float = 0.0,
                 drop_states: float = 0.0, drop_outputs: float = 0.0):
        if drop_states and isinstance(base_cell, BidirectionalCell):
            raise InputError("VariationalDropoutCell: drop_states needs a cell that steps; "
                             "a BidirectionalCell does not")
        for name, rate in (("drop_inputs", drop_inputs), ("drop_states", drop_states),
                           ("drop_outputs", drop_outputs)):
            if not 0.0 <= rate < 1.0:
                raise InputError(f"VariationalDropoutCell: {name} must be in [0, 1), got "
                                 f"{rate}")
        super().__init__(base_cell)
        self.drop_inputs, self.drop_states, self.drop_outputs = \
            float(drop_inputs), float(drop_states), float(drop_outputs)
        self._masks: dict = {}

    def reset(self) -> None:
        super().reset()
        self._masks = {}

    def _masked(self, F, which: str, rate: float, x):
        """``x`` times this sequence's mask for ``which``, drawn at its first step."""
        if rate == 0.0:
            return x
        if which not in self._masks:
            self._masks[which] = dropout(F, _full_like(F, x, 1.0), rate)
        return x * self._masks[which]

    def forward(self, inputs, states=None):
        self._counter += 1
        F = namespace_of(inputs)
        if states is not None and len(states):
            states = [self._masked(F, "states", self.drop_states, states[0]),
                      *list(states)[1:]]
        output, new_states = self.base_cell(self._masked(F, "inputs", self.drop_inputs,
                                                         inputs), states)
        return self._masked(F, "outputs", self.drop_outputs, output), new_states


def _full_like(F, x, value: float):
    return F.Expand(F.CastLike(np.array(value, dtype=np.float32), x), F.Shape(x))


def _zone_out(F, rate: float, new, old):
    """``new`` where a dropout mask of ``rate`` keeps the unit, else ``old`` (the mask is
    all ones outside training, so nothing zones out then)."""
    if rate == 0.0:
        return new
    keep = dropout(F, _full_like(F, new, 1.0), rate)
    return F.Where(F.Cast(keep, to=9), new, old)  # 9: ONNX BOOL


class BidirectionalCell(HybridRecurrentCell):
    """``l_cell`` over the sequence and ``r_cell`` over it reversed; each step's output is
    the two outputs concatenated (MXNet names it ``{output_prefix}t{step}``; two of them
    in one graph need two prefixes, a graph's node names being unique). Only ``unroll``
    runs it: a step needs the whole sequence."""

    def __init__(self, l_cell: RecurrentCell, r_cell: RecurrentCell,
                 output_prefix: str = "bi_"):
        super().__init__(prefix="", params=None)
        self.l_cell, self.r_cell = l_cell, r_cell
        self._output_prefix = output_prefix

    def state_info(self, batch_size: int = 0) -> list:
        return self.l_cell.state_info(batch_size) + self.r_cell.state_info(batch_size)

    def begin_state(self, batch_size: int = 0, func=None, **kwargs) -> list:
        return self.l_cell.begin_state(batch_size, func, **kwargs) + \
            self.r_cell.begin_state(batch_size, func, **kwargs)

    def forward(self, inputs, states=None):
        raise InputError("BidirectionalCell cannot be stepped; call unroll() with the "
                         "whole sequence")

    def unroll(self, length: int, inputs, begin_state=None, layout: str = "NTC",
               merge_outputs: bool | None = None, valid_length=None):
        self.reset()
        steps, axis, merged_in = sequence_steps(length, inputs, layout)
        F = namespace_of(steps[0])
        l_states, r_states = _state_slices([self.l_cell, self.r_cell], begin_state)
        l_outputs, l_final = self.l_cell.unroll(length, steps, l_states, layout, False,
                                                valid_length)
        r_outputs, r_final = self.r_cell.unroll(length,
                                                reverse_steps(F, steps, valid_length),
                                                r_states, layout, False, valid_length)
        r_outputs = reverse_steps(F, r_outputs, valid_length)
        outputs = [named(F.Concat(left, right, axis=-1), f"{self._output_prefix}t{t}")
                   for t, (left, right) in enumerate(zip(l_outputs, r_outputs))]
        merge = merged_in if merge_outputs is None else merge_outputs
        return merged(outputs, axis, merge), l_final + r_final

    def __repr__(self) -> str:
        return f"BidirectionalCell({self.l_cell!r}, {self.r_cell!r})"
