"""Training scenarios that a distributed job runs one after another, and the single-process
runs they must equal.

A worker runs ``python fit_job.py CONFIG_JSON``: every scenario trains a fresh model (the same
seeded weights on every worker) through ``Module.fit`` or a Gluon ``Trainer`` loop, on this
worker's shard of a dataset whose size divides by neither the workers nor the batch, and
every worker saves its trained weights (``saved_name``). The first Module scenario
passes the store itself, as the README does; the others use a Trainer with their own
``key_prefix``, so that one store serves them all. ``reference(scenario, workers)``
trains the same model in one process on the workers' batches put side by side: what a
synchronous job must reproduce.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SAMPLES, BATCH, EPOCHS = 203, 8, 3
OPTIMIZER = {"learning_rate": 0.02, "momentum": 0.5}


def scenarios(kind: str = "dist_sync") -> list[dict]:
    """Every (api, last batch, eval data) case a job runs. The Gluon Trainer that keeps
    the optimizer on the workers (update_on_kvstore=False: the store only sums) comes first:
    once a Trainer has set the servers' optimizer it updates every key they hold. Not in
    async mode, where MXNet's rule (and the Trainer's) is that the servers optimize. The
    first Module case fits through the store itself (``kvstore=``), the others through a
    Trainer."""
    local = [{"api": "gluon", "last": "pad", "eval": False, "local_update": True}]
    if kind == "dist_async":
        local = []
    module = [{"api": "module", "last": last, "eval": with_eval}
              for last in ("pad", "discard", "roll_over") for with_eval in (False, True)]
    module[0]["store_fit"] = True
    gluon = [{"api": "gluon", "last": last, "eval": False}
             for last in ("pad", "discard", "roll_over")]
    cases = local + module + gluon
    for index, case in enumerate(cases):
        case["name"] = f"{index}-{case['api']}-{case['last']}{'-eval' if case['eval'] else ''}" \
            + ("-local" if case.get("local_update") else "")
    return cases


def dataset():
    from mixrt.models.digits import load_digits
    images, labels = load_digits()
    return images[:SAMPLES], labels[:SAMPLES]


def iterator(last: str, workers: int, rank: int):
    from mixrt.io import NDArrayIter
    images, labels = dataset()
    return NDArrayIter(images, labels, BATCH, shuffle=True, seed=11, last_batch_handle=last,
                       num_parts=workers, part_index=rank)


# -- the models ---------------------------------------------------------------------------

def module_model():
    import mixrt
    from mixrt.models.digits import digits_cnn
    from mixrt.module import Module
    mixrt.random.seed(5)
    return Module(digits_cnn(channels=(4, 8), hidden=16))


def gluon_model():
    import mixrt
    from mixrt.gluon import nn
    mixrt.random.seed(5)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=64), nn.Dense(10, in_units=16))
    net.initialize(mixrt.initializer.Xavier())
    return net


def weights(model) -> dict[str, np.ndarray]:
    """The parameters by position (Gluon numbers its layers' names per process)."""
    if hasattr(model, "collect_params"):
        arrays = [param.data().asnumpy() for param in model.collect_params().values()]
    else:
        arrays = [np.array(param.data()) for param in model.params.values()]
    return {f"p{index}": array for index, array in enumerate(arrays)}


def gluon_epoch(net, trainer, batches) -> None:
    from mixrt import autograd, gluon, nd
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for data, label in batches:
        x, y = nd.array(data.reshape(len(data), -1)), nd.array(label)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(len(data))


def _arrays(batch) -> tuple:
    """A batch's data and label as NumPy arrays (MXNet's batches hold lists of NDArrays)."""
    return batch.data[0].asnumpy(), batch.label[0].asnumpy()


# -- one worker of a job ------------------------------------------------------------------

def saved_name(case: dict, rank: int) -> str:
    """Worker 0's weights as ``<scenario>.npz``, another worker's as ``<scenario>.rank<r>.npz``."""
    return f"{case['name']}.npz" if rank == 0 else f"{case['name']}.rank{rank}.npz"


def run_worker(config: dict) -> None:
    import mixrt
    from mixrt.gluon import Trainer
    kv = mixrt.kv.create(config["kind"])
    if config.get("compression"):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    out = Path(config["out"])
    for index, case in enumerate(scenarios(config["kind"])):
        train = iterator(case["last"], kv.num_workers, kv.rank)
        prefix = f"s{index}/"
        if case["api"] == "module":
            model = module_model()
            options = {"kvstore": kv} if case.get("store_fit") else {"trainer": Trainer(
                model.params.trainable(), "sgd", dict(OPTIMIZER), kvstore=kv,
                key_prefix=prefix)}
            evaluation = iterator("pad", kv.num_workers, kv.rank) if case["eval"] else None
            model.fit(train, eval_data=evaluation, optimizer="sgd",
                      optimizer_params=dict(OPTIMIZER), epochs=EPOCHS, progress=False,
                      **options)
        else:
            model = gluon_model()
            trainer = Trainer(model.collect_params(), "sgd", dict(OPTIMIZER), kvstore=kv,
                              key_prefix=prefix,
                              update_on_kvstore=not case.get("local_update", False))
            for _ in range(EPOCHS):
                train.reset()
                gluon_epoch(model, trainer, (_arrays(b) for b in train))
                kv.barrier()
        np.savez(out / saved_name(case, kv.rank), **weights(model))
        print(f"DONE {case['name']}", flush=True)
    kv.close()


# -- the single-process runs --------------------------------------------------------------

def reference(case: dict, workers: int) -> dict[str, np.ndarray]:
    """One process, each step on the workers' batches side by side (their mean gradient is
    what a synchronous job applies)."""
    from mixrt.gluon import Trainer
    shards = [iterator(case["last"], workers, rank) for rank in range(workers)]
    model = module_model() if case["api"] == "module" else gluon_model()
    params = model.params.trainable() if case["api"] == "module" else model.collect_params()
    trainer = Trainer(params, "sgd", dict(OPTIMIZER))
    for _ in range(EPOCHS):
        for shard in shards:
            shard.reset()
        steps = [tuple(np.concatenate(parts) for parts in zip(*map(_arrays, group)))
                 for group in zip(*shards)]
        if case["api"] == "module":
            for data, label in steps:
                model.train_step(data, label, trainer)
        else:
            gluon_epoch(model, trainer, steps)
    return weights(model)


if __name__ == "__main__":
    run_worker(json.loads(sys.argv[1]))
