"""The main job, end to end on built-in data (``mixrt demo``):

1. load the 8x8 handwritten digits that ship with mixrt (1,797 images) and split them;
2. train a small CNN on task A (digits 0-4 only);
3. export it to ONNX;
4. import that ONNX file again, replace its head and fine-tune it on task B (all ten digits),
   with the convolutions frozen;
5. validate the fine-tuned export against onnxruntime (``mixrt check --validate``'s check);
6. compile it to ``.mxr`` and serve the test set from the ``.mxr`` file.

Each step prints what it did; training shows a progress bar per epoch. The run is seeded, so
it prints the same figures every time on the same machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from mixrt import random as mixrt_random
from mixrt.exporters.coverage import format_report, validate
from mixrt.gluon import Trainer
from mixrt.io import NDArrayIter
from mixrt.kvstore import create as create_store
from mixrt.lr_scheduler import CosineScheduler
from mixrt.models.digits import digits_cnn, load_digits, split
from mixrt.module import Module
from mixrt.runtime.format import save_mxr
from mixrt.runtime.session import Session

TASK_A_CLASSES = 5
ACCURACY_TARGET = 0.95


def run_main_job(workdir: Path, *, seed: int = 0, epochs_a: int = 12, epochs_b: int = 12,
                 progress: bool = True, kvstore: str | None = None,
                 compression: dict | None = None) -> int:
    """Run every step; returns 0 when task B reaches the accuracy target and every check
    passes, 1 otherwise.

    ``kvstore`` ("dist_sync", "dist_async", ...; started by ``mixrt launch``): each worker
    trains on its shard of the data through the store (``compression``: its gradient
    compression, e.g. ``{"type": "2bit", "threshold": 0.5}``); every worker exports its own
    copy, and worker 0 alone validates, compiles and serves."""
    store = _store(kvstore, compression)
    rank = 0 if store is None else store.rank
    workdir = Path(workdir) if rank == 0 else Path(workdir) / f"worker{rank}"
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    mixrt_random.seed(seed)
    images, labels = load_digits()
    (train_x, train_y), (test_x, test_y) = split(images, labels, seed=seed)
    _say(1, f"data: {len(images):,} handwritten digits (8x8), {len(train_x):,} to train, "
            f"{len(test_x):,} to test")

    first = train_y < TASK_A_CLASSES
    model = Module(digits_cnn(num_classes=TASK_A_CLASSES))
    _say(2, f"train a CNN on task A (digits 0-{TASK_A_CLASSES - 1}, {first.sum():,} images), "
            f"{sum(p.raw().size for p in model.params.values()):,} parameters")
    history = _fit(model, train_x[first], train_y[first], test_x[test_y < TASK_A_CLASSES],
                   test_y[test_y < TASK_A_CLASSES], epochs_a, 0.05, progress, store, "a/")
    print(f"    task A test accuracy {history[-1]['eval_accuracy']:.2%}")

    exported = workdir / "digits_task_a.onnx"
    model.export_onnx(exported)
    _say(3, f"exported task A's model to {exported} ({exported.stat().st_size / 1024:.0f} KiB)")

    tuned = Module.from_onnx(exported)
    tuned.replace_head("features", 10)
    tuned.freeze(["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"])
    trainable = [p.name for p in tuned.params.trainable()]
    _say(4, f"imported it, replaced the head and fine-tuned on task B (all 10 digits), "
            f"training {', '.join(trainable)}")
    history_b = _fit(tuned, train_x, train_y, test_x, test_y, epochs_b, 0.02, progress, store,
                     "b/")
    accuracy = history_b[-1]["eval_accuracy"]
    print(f"    task B test accuracy {accuracy:.2%} (target {ACCURACY_TARGET:.0%})")
    if rank != 0:
        print(f"worker {rank}: trained through {store.type!r}; worker 0 validates, compiles "
              f"and serves")
        store.close()
        return 0 if accuracy >= ACCURACY_TARGET else 1

    final = workdir / "digits_task_b.onnx"
    tuned.export_onnx(final)
    valid = _validate(final, test_x[:64])
    compiled = _compile(final, workdir / "digits_task_b.mxr")
    served = _serve(compiled, test_x, test_y, tuned.predict(test_x))
    elapsed = time.perf_counter() - started
    ok = accuracy >= ACCURACY_TARGET and valid and served
    if store is not None:
        store.close()
    print(f"main job {'passed' if ok else 'FAILED'} in {elapsed:.1f} s")
    return 0 if ok else 1


def _say(step: int, text: str) -> None:
    print(f"[{step}/6] {text}", flush=True)


def _store(kind: str | None, compression: dict | None):
    if kind is None:
        return None
    store = create_store(kind)
    if compression is not None:
        store.set_gradient_compression(compression)
    print(f"[kv] worker {store.rank} of {store.num_workers} in a {kind!r} job", flush=True)
    return store


def _optimizer_params(store, learning_rate: float, momentum: float, epochs: int,
                      batches: int) -> dict:
    """SGD with momentum whose rate follows half a cosine to zero over the run: the last
    epochs take small steps, so the final model sits where training settled rather than
    where the last noisy batch left it (dist_async's final accuracy moved by 1-2 points
    between runs at a constant rate).

    dist_async applies each worker's gradient on its own, computed on weights a few
    updates old; that staleness acts as extra momentum (about 1 - 1/workers, Mitliagkas et
    al. 2016, "Asynchrony begets momentum"), and 0.9 on top of it diverges. Keep the total
    near the synchronous run's by subtracting it. Its server also counts an update per
    worker's batch, where dist_sync counts one per step of all workers."""
    updates = epochs * batches
    if store is not None and store.type == "dist_async":
        momentum = max(0.0, momentum - (1.0 - 1.0 / store.num_workers))
        updates *= store.num_workers
    schedule = CosineScheduler(max_update=max(1, updates), base_lr=learning_rate)
    return {"lr_scheduler": schedule, "momentum": momentum}


def _fit(model, train_x, train_y, test_x, test_y, epochs, learning_rate, progress,
         store=None, key_prefix=""):
    """With a store, each worker takes an equal shard and a batch of 32 / workers, so the
    global batch (and the run) matches the single-process job's."""
    workers, rank = (1, 0) if store is None else (store.num_workers, store.rank)
    train = NDArrayIter(train_x, train_y, max(1, 32 // workers), shuffle=True,
                        num_parts=workers, part_index=rank)
    test = NDArrayIter(test_x, test_y, 128)
    params = _optimizer_params(store, learning_rate, 0.9, epochs, train.num_batches)
    trainer = Trainer(model.params.trainable(), "sgd", params, kvstore=store,
                      key_prefix=key_prefix)

    def report(record):
        if not progress:
            print(f"    epoch {record['epoch']}: loss {record['loss']:.4f}, "
                  f"test accuracy {record['eval_accuracy']:.2%}", flush=True)

    return model.fit(train, eval_data=test, epochs=epochs, progress=progress,
                     on_epoch=report, trainer=trainer)


def _validate(path: Path, sample: np.ndarray) -> bool:
    report = validate(path, {"image": sample})
    _say(5, "validate the export against onnxruntime (every node supported, outputs match)")
    print("    " + format_report(report).replace("\n", "\n    "))
    return report.ok


def _compile(onnx_path: Path, mxr_path: Path) -> Path:
    session = Session(str(onnx_path), opt_level=2)
    plan = session.memory_plan({"image": np.zeros((1, 1, 8, 8), np.float32)})
    graph = session.graph
    graph.plans = [plan]
    save_mxr(graph, mxr_path, opt_level=2)
    _say(6, f"compiled to {mxr_path} ({mxr_path.stat().st_size / 1024:.0f} KiB, "
            f"{len(graph.nodes)} nodes, arena {plan.arena_bytes / 1024:.1f} KiB per image)")
    return mxr_path


def _serve(mxr_path: Path, test_x, test_y, expected_scores) -> bool:
    """Answer every test image as one request from the .mxr file, as a service would."""
    session = Session(str(mxr_path))
    started = time.perf_counter()
    scores = np.concatenate([session.run(None, {"image": test_x[i:i + 1]})[0]
                             for i in range(len(test_x))])
    per_request = (time.perf_counter() - started) / len(test_x)
    accuracy = float((scores.argmax(1) == test_y).mean())
    same = bool(np.allclose(scores, expected_scores, rtol=1e-4, atol=1e-5))
    print(f"    served {len(test_x)} requests from the .mxr: {per_request * 1e6:.0f} us each, "
          f"accuracy {accuracy:.2%}, {'same' if same else 'DIFFERENT'} scores as the "
          f"fine-tuned model")
    return same
