"""Running a graph Module forward: ``predict``, ``score`` and the session they share.

Inference runs the model with its current parameters in one cached
:class:`~mixrt.runtime.session.Session` (made again when the parameters or the graph
change: the module's ``_version``), batch by batch, with a DataBatch's padding left out.
Kept apart from training (``graph_training.py``), which runs a different program over the
same graph. :class:`GraphInference` is a part of :class:`~mixrt.module.graph_module.Module`
(its ``_inference``, whose ``predict`` and ``score`` are the Module's; ``SymbolModule``
binds first, then asks it too), reading the module's graph and parameters.
"""

from __future__ import annotations

import numpy as np

from mixrt import metric as metrics
from mixrt.io import DataIter
from mixrt.runtime.session import Session


class GraphInference:
    """``predict`` and ``score`` of ``module`` (a Module over a graph)."""

    def __init__(self, module):
        self.module = module
        self._predictor: tuple[int, Session] | None = None  # (module version, its session)

    def predict(self, data, batch_size: int = 256) -> np.ndarray:
        """The output for an array of samples, ``batch_size`` at a time."""
        session, module = self.session(), self.module
        data = np.asarray(data)
        parts = [session.run([module.output],
                             {module.data_names[0]: data[i:i + batch_size]})[0]
                 for i in range(0, len(data), batch_size)]
        return np.concatenate(parts)

    def predict_batches(self, data: DataIter) -> np.ndarray:
        """The output for every batch of a data iterator, its padding left out."""
        session, module, parts = self.session(), self.module, []
        data.reset()
        for batch in data:
            inputs, _, real = self.batch_arrays(batch)
            out = session.run([module.output], {module.data_names[0]: inputs})[0]
            parts.append(out[:real])
        return np.concatenate(parts)

    def score(self, eval_data: DataIter, metric="acc") -> tuple[str, float]:
        """``metric`` over every batch of ``eval_data``: (name, value)."""
        chosen, module = metrics.create(metric), self.module
        eval_data.reset()
        session = self.session()
        for batch in eval_data:
            inputs, labels, real = self.batch_arrays(batch)
            out = session.run([module.output], {module.data_names[0]: inputs})[0]
            chosen.update(labels[:real], out[:real])
        return chosen.get()

    def batch_arrays(self, batch) -> tuple:
        """A DataBatch's first data and label arrays on the host, the data in the model's
        input dtype (MXNet's iterators serve float32), and how many rows are real."""
        inputs = batch.data[0].asnumpy()
        wanted = self._input_dtype()
        if wanted is not None and inputs.dtype != wanted:
            inputs = inputs.astype(wanted)
        labels = batch.label[0].asnumpy() if batch.label else None
        return inputs, labels, len(inputs) - (batch.pad or 0)

    def _input_dtype(self):
        module = self.module
        found = module.graph.type_of(module.data_names[0]) if module.graph is not None \
            else None
        dtype = getattr(found, "dtype", None)
        return None if dtype is None or np.dtype(dtype).kind != "f" else np.dtype(dtype)

    def session(self) -> Session:
        """The session of the module's graph with its current values (made again once the
        parameters or the graph changed)."""
        module = self.module
        if self._predictor is None or self._predictor[0] != module._version:
            self._predictor = (module._version, Session(module.to_graph(), device=module.device,
                                                        opt_level=2))
        return self._predictor[1]

