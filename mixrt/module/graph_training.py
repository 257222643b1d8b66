"""Training a graph Module: ``fit``'s epochs, one step, its loss and its planned program.

``fit`` runs epochs of ``train_step`` over a data iterator (a bar or a line per epoch,
evaluation, checkpoints, a barrier per epoch with a distributed store); ``train_step`` is one
:class:`~mixrt.runtime.training.TrainingProgram` run (forward and backward in one planned
arena, in float32 or mixed precision with a :class:`LossScaler`), then ``Trainer.step``.
The programs are cached by loss, trainable parameters, graph, precision and CUDA graph use.
This is what changes the parameters; it stands apart from the graph itself
(``graph_module.py``: the model, what trains, export), from inference
(``graph_inference.py``) and from the running statistics a step carries
(``graph_state.py``). :class:`GraphTraining` is a mixin of
:class:`~mixrt.module.graph_module.Module` (``SymbolModule`` overrides ``fit``,
``train_step`` and ``_loss``).
"""

from __future__ import annotations

import time

from mixrt import metric as metrics
from mixrt.base.errors import InputError
from mixrt.gluon import Trainer
from mixrt.io import NDArrayIter, read_ahead
from mixrt.module.checks import check_sharding, feed_array
from mixrt.progress import epoch_bar, epoch_line
from mixrt.runtime.training.mixed_precision import parse_precision, LossScaler
from mixrt.runtime.training.program import Loss, LOSSES, TrainingProgram


class GraphTraining:
    """``fit`` and ``train_step`` of a Module over a graph, a base of it: it reads the
    module's ``params``, ``data_names``, ``output``, ``device``, ``loss_scaler``, its
    ``_programs`` cache and ``_inference`` part, and calls its ``_loss``,
    ``_training_graph``, ``_structure``, ``_changed``, the step state's methods
    (``graph_state.RunningState``) and its checkpoints (``mixrt/checkpoints.py``)."""

    def fit(self, train_data: NDArrayIter, *, eval_data: NDArrayIter | None = None,
            loss=None, optimizer="sgd", optimizer_params=None,
            epochs: int = 1, metric="acc", checkpoint=None, resume=None, progress: bool = True,
            trainer: Trainer | None = None, on_epoch=None, precision: str = "float32",
            loss_scaler: LossScaler | bool | None = None, kvstore=None,
            cuda_graph: bool = False) -> list[dict]:
        """Train for ``epochs`` (counting epochs already done when resuming); returns one
        record per epoch run ({epoch, loss, train_<metric>, eval_<metric>, seconds}).
        ``cuda_graph=True`` (GPU): each batch shape's steps replay as a CUDA graph (see
        :meth:`train_step`).

        ``precision``: "float32" (default), "float16" or "bfloat16" (CPU only; see
        :class:`~mixrt.runtime.training.TrainingProgram`); ``loss_scaler``: a
        :class:`LossScaler` to use (it becomes ``self.loss_scaler``), False for none, None for
        the default (a dynamic one for float16).

        ``loss``: a name from ``runtime.training.LOSSES`` or a Loss; None: the model's own
        (softmax cross-entropy here; a symbol's output layer's for :meth:`from_symbol`).

        ``progress``: a bar per epoch on a terminal; in a pipe or a log, one line per epoch
        on stderr instead; False: neither.

        ``kvstore``: a store or kind name (``"dist_sync"``, ...) the gradients go through
        (see :class:`~mixrt.gluon.Trainer`); shard ``train_data`` over the workers
        (``NDArrayIter(..., num_parts=kv.num_workers, part_index=kv.rank)``). Every epoch
        ends at a barrier, where workers that ran different numbers of batches get a
        KVStoreError instead of a hang; under dist_async each worker then takes the
        servers' weights before it scores the epoch."""
        trainer = trainer or Trainer(self.params.trainable(), optimizer, optimizer_params,
                                     kvstore=kvstore)
        check_sharding(train_data, trainer.kvstore)
        loss_spec = self._loss(loss)
        parse_precision(precision, self.device)  # a bad name fails before any work
        self._scaler_for(precision, loss_scaler)  # before resume loads its state into it
        history, first = [], 0
        if resume is not None:
            first, history = self.load_checkpoint(resume, trainer, train_data)
        for epoch in range(first, epochs):
            record = self._train_epoch(epoch, epochs, train_data, trainer, loss_spec, metric,
                                       progress, precision=precision,
                                       loss_scaler=loss_scaler, cuda_graph=cuda_graph)
            if trainer.kvstore is not None:
                trainer.kvstore.barrier()
                self._take_the_jobs_weights(trainer)
            if eval_data is not None:
                name, value = self.score(eval_data, metric)
                record[f"eval_{name}"] = value
            history.append(record)
            epoch_line(record, epochs, progress)
            if on_epoch is not None:
                on_epoch(record)
            if checkpoint is not None:
                self.save_checkpoint(checkpoint, trainer, epoch + 1, train_data, history)
        return history

    def _take_the_jobs_weights(self, trainer: Trainer) -> None:
        """Under dist_async a worker's weights are those it pulled after its own last push,
        without the other workers' later updates. Past the epoch's barrier each worker takes
        the servers' weights, so every epoch's score, and the model ``fit`` leaves, is the
        job's model, the same on every worker. (dist_sync's pull already waits for the
        round of every worker.)"""
        if getattr(trainer.kvstore, "type", "") == "dist_async":
            trainer.pull_weights()
            self._changed()

    def _train_epoch(self, epoch, epochs, data, trainer, loss_spec, metric, progress,
                     **step_options) -> dict:
        started = time.perf_counter()
        train_metric = metrics.create(metric)
        total, batches = 0.0, 0
        data.reset()
        bar = epoch_bar(len(data), f"epoch {epoch + 1}/{epochs}", progress)
        for batch in read_ahead(data):
            inputs, labels, real = self._inference.batch_arrays(batch)
            loss_value, outputs = self.train_step(inputs, labels, trainer, loss_spec,
                                                  **step_options)
            train_metric.update(labels[:real], outputs[0][:real])
            total, batches = total + loss_value, batches + 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{total / batches:.4f}")
        if bar is not None:
            bar.close()
        name, value = train_metric.get()
        return {"epoch": epoch + 1, "loss": total / max(batches, 1), f"train_{name}": value,
                "seconds": time.perf_counter() - started}

    def train_step(self, data, label, trainer: Trainer, loss=None, *,
                   precision: str = "float32", loss_scaler: LossScaler | bool | None = None,
                   cuda_graph: bool = False):
        """Forward, backward and one optimizer update on one batch: (loss, outputs). In
        float16 a step whose scaled gradients overflow updates nothing (the loss scaler
        backs off instead). ``data`` and ``label`` may be host arrays or arrays already on
        the module's device. ``cuda_graph=True`` (GPU) replays each batch shape's forward
        and backward as one CUDA graph from its second step (see TrainingProgram)."""
        scaler = self._scaler_for(precision, loss_scaler)
        program = self._program(self._loss(loss), precision, scaler, cuda_graph)
        feeds = {self.data_names[0]: feed_array(data), program.loss_spec.label: label,
                 **self._state_feeds()}
        loss_value, outputs, grads = program.step(self.params.arrays(), feeds)
        with program.session.device.active():  # the state is written on its own GPU
            outputs = self._store_state(outputs)
        if grads is not None:
            for name, grad in grads.items():
                self.params[name].set_grad(grad)
            trainer.step(1)  # the loss is already a mean over the batch
            self._changed()
        return loss_value, outputs

    def _scaler_for(self, precision: str, loss_scaler) -> LossScaler | None:
        """The scaler a step uses. None: float16 gets the module's (made once, so its scale
        carries over steps, programs and checkpoints), other precisions none; a LossScaler
        becomes the module's; False: none."""
        if loss_scaler is False:
            return None
        if isinstance(loss_scaler, LossScaler):
            self.loss_scaler = loss_scaler
            return loss_scaler
        if loss_scaler is not None:
            raise InputError(f"loss_scaler must be a LossScaler, False or None, got "
                             f"{loss_scaler!r}")
        if precision != "float16":
            return None
        if self.loss_scaler is None:
            self.loss_scaler = LossScaler()
        return self.loss_scaler

    def _loss(self, loss) -> Loss:
        if isinstance(loss, Loss):
            return loss
        loss = "softmax_cross_entropy" if loss is None else loss
        if loss not in LOSSES:
            raise InputError(f"unknown loss {loss!r}; choose one of {sorted(LOSSES)}")
        return LOSSES[loss](self.output, "label")

    def _program(self, loss: Loss, precision: str = "float32",
                 scaler: LossScaler | None = None, cuda_graph: bool = False) -> TrainingProgram:
        trainable = tuple(p.name for p in self.params.trainable())
        if not trainable:
            raise InputError("every parameter is frozen; unfreeze some before training")
        key = (loss.kind, trainable, self._structure, precision, scaler is not None,
               cuda_graph)
        if key not in self._programs:
            self._programs[key] = TrainingProgram(
                self._training_graph(), loss, list(trainable), device=self.device,
                precision=precision, loss_scaler=scaler or False, cuda_graph=cuda_graph,
                state=(list(self._state_feeds()), self._state_outputs()))
        program = self._programs[key]
        program.scaler = scaler  # the same kind of graph; this object's scale
        return program

