"""Running a graph Module forward: ``predict``, ``score`` and the session they share.

Inference runs the model with its current parameters in one cached
:class:`~mixrt.runtime.session.Session` (made again when the parameters or the graph
change: ``_version``), batch by batch, with a DataBatch's padding left out. Kept apart from
training (``graph_training.py``), which runs a different program over the same graph.
:class:`GraphInference` is a mixin of :class:`~mixrt.module.graph_module.Module`
(``SymbolModule`` overrides ``predict`` and ``score``).
"""

from __future__ import annotations

import numpy as np

from mixrt import metric as metrics
from mixrt.io import DataIter
from mixrt.runtime.session import Session


class GraphInference:
    """``predict`` and ``score`` of a Module over a graph."""

    def predict(self, data, batch_size: int = 256) -> np.ndarray:
        session = self._session()
        data = np.asarray(data)
        parts = [session.run([self.output], {self.data_names[0]: data[i:i + batch_size]})[0]
                 for i in range(0, len(data), batch_size)]
        return np.concatenate(parts)

    def score(self, eval_data: DataIter, metric="acc") -> tuple[str, float]:
        chosen = metrics.create(metric)
        eval_data.reset()
        session = self._session()
        for batch in eval_data:
            inputs, labels, real = self._batch_arrays(batch)
            out = session.run([self.output], {self.data_names[0]: inputs})[0]
            chosen.update(labels[:real], out[:real])
        return chosen.get()

    def _batch_arrays(self, batch) -> tuple:
        """A DataBatch's first data and label arrays on the host, the data in the model's
        input dtype (MXNet's iterators serve float32), and how many rows are real."""
        inputs = batch.data[0].asnumpy()
        wanted = self._input_dtype()
        if wanted is not None and inputs.dtype != wanted:
            inputs = inputs.astype(wanted)
        labels = batch.label[0].asnumpy() if batch.label else None
        return inputs, labels, len(inputs) - (batch.pad or 0)

    def _input_dtype(self):
        found = self.graph.type_of(self.data_names[0]) if self.graph is not None else None
        dtype = getattr(found, "dtype", None)
        return None if dtype is None or np.dtype(dtype).kind != "f" else np.dtype(dtype)

    def _session(self) -> Session:
        if self._predictor is None or self._predictor[0] != self._version:
            self._predictor = (self._version, Session(self.to_graph(), device=self.device,
                                                      opt_level=2))
        return self._predictor[1]

