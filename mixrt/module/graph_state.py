"""A training step's state: BatchNormalization's running statistics, fed in and stored back.

The running mean and variance a BatchNormalization reads are state, not parameters: the
optimizer never trains them (MXNet's auxiliary states, PyTorch's buffers), yet a training
step updates them. ``running_statistics`` finds them in a graph; ``statistics_updates``
rewrites a graph so that each becomes a fed input and its new value an extra output; and
:class:`RunningState` (a mixin of :class:`~mixrt.module.graph_module.Module`) feeds them to
a step and writes the new values back into the parameters. A graph rewrite and its
bookkeeping, kept apart from the training loop (``graph_training.py``) that calls it.
"""

from __future__ import annotations

from mixrt.ops.ir.types import TensorType
from mixrt.runtime.graph import Graph, Value


class RunningState:
    """The state a Module's training step reads and updates besides its parameters (the
    module's ``params`` and ``_state_updates``, {statistic: the output with its new
    value}); a base of it, which ``SymbolModule`` overrides in part."""

    def _state_feeds(self) -> dict:
        """Arrays a training step reads besides the batch and the trainable parameters: the
        running statistics its BatchNormalizations update."""
        return {name: self.params[name].raw() for name in self._state_updates}

    def _state_outputs(self) -> list[str]:
        """The training graph's outputs that hold the state's new values (after the
        model's own outputs)."""
        return list(self._state_updates.values())

    def _store_state(self, outputs: list) -> list:
        """The model's outputs of a training step, once the state it updated is written
        into its parameters (in place: on a GPU the values never leave the device)."""
        updated = list(self._state_updates)
        if not updated:
            return outputs
        head = len(outputs) - len(updated)
        for name, value in zip(updated, outputs[head:]):
            self.params[name].raw()[...] = value
        self._changed()
        return outputs[:head]


def running_statistics(graph: Graph) -> set[str]:
    """The initializers that BatchNormalizations read as running mean and variance."""
    return {node.inputs[index] for node in graph.nodes
            if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx")
            for index in (3, 4) if len(node.inputs) > index
            and node.inputs[index] in graph.initializers}


def statistics_updates(graph: Graph, statistics: set) -> dict[str, str]:
    """In ``graph``, each running statistic of ``statistics`` that a BatchNormalization in
    training mode updates becomes a fed input, and the node's output with its new value a
    graph output; returns {statistic: that output}."""
    updates: dict[str, str] = {}
    for node in graph.nodes:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") \
                or not node.attributes.get("training_mode", 0):
            continue
        while len(node.outputs) < 3:
            node.outputs.append("")
        for position, index in ((1, 3), (2, 4)):
            state = node.inputs[index] if len(node.inputs) > index else ""
            if state in statistics and state not in updates:
                if not node.outputs[position]:
                    node.outputs[position] = f"{node.name or 'batchnorm'}_{state}_update"
                updates[state] = node.outputs[position]
    for state, output in updates.items():
        array = graph.initializers.pop(state)
        graph.inputs.append(Value(state, TensorType(array.dtype, tuple(array.shape))))
        graph.outputs.append(Value(output))
    return updates

