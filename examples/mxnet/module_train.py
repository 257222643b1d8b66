"""Train a multilayer perceptron with MXNet 1.x's symbolic API and Module.

Runs unchanged under MXNet 1.9.1 and under mixrt through its ``mxnet`` alias
(``pip install ./compat/mxnet``). The data is synthetic and seeded: points in 10
dimensions labelled by which of 3 fixed centres they lie nearest, so the script needs
no download and the task is learnable in a few epochs.

    python examples/mxnet/module_train.py [--epochs N] [--out DIR]

Prints the validation accuracy after each epoch and, at the end, ``final accuracy:
0.xxxx`` (the reloaded checkpoint's accuracy); it exits with status 1 if the accuracy
stays below ``--target``.
"""

import argparse
import logging
import os
import sys
import tempfile

import numpy as np

import mxnet as mx

NUM_FEATURES = 10
NUM_CLASSES = 3


def synthetic_points(num_samples, centres, rng):
    """Gaussian noise around a random centre each; the label is the centre's index."""
    labels = rng.randint(0, NUM_CLASSES, size=num_samples)
    points = centres[labels] + rng.normal(0.0, 1.0, size=(num_samples, NUM_FEATURES))
    return points.astype("float32"), labels.astype("float32")


def build_symbol():
    data = mx.sym.Variable("data")
    label = mx.sym.Variable("softmax_label")
    hidden = mx.sym.FullyConnected(data=data, num_hidden=32, name="fc1")
    hidden = mx.sym.Activation(data=hidden, act_type="relu", name="relu1")
    logits = mx.sym.FullyConnected(data=hidden, num_hidden=NUM_CLASSES, name="fc2")
    return mx.sym.SoftmaxOutput(data=logits, label=label, name="softmax")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", 5)))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--out", default=None, help="where the checkpoint goes (default: a temp dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    # MXNet's own generators, then NumPy's global one, which the shuffling samplers draw from
    mx.random.seed(42)
    np.random.seed(42)
    rng = np.random.RandomState(42)
    centres = rng.normal(0.0, 1.5, size=(NUM_CLASSES, NUM_FEATURES))
    train_x, train_y = synthetic_points(1024, centres, rng)
    val_x, val_y = synthetic_points(256, centres, rng)
    train_iter = mx.io.NDArrayIter(train_x, train_y, args.batch_size, shuffle=True)
    val_iter = mx.io.NDArrayIter(val_x, val_y, args.batch_size)

    mod = mx.mod.Module(symbol=build_symbol(), context=mx.cpu(),
                        data_names=["data"], label_names=["softmax_label"])
    mod.fit(train_iter, eval_data=val_iter, eval_metric="acc",
            optimizer="sgd", optimizer_params={"learning_rate": 0.1, "momentum": 0.9},
            initializer=mx.init.Xavier(), num_epoch=args.epochs)
    print("validation %s: %.4f" % mod.score(val_iter, "acc")[0])

    prefix = os.path.join(args.out or tempfile.mkdtemp(prefix="module_train_"), "mlp")
    mod.save_checkpoint(prefix, args.epochs)
    # a new Module from the saved symbol and weights must predict as the trained one does
    symbol, arg_params, aux_params = mx.model.load_checkpoint(prefix, args.epochs)
    restored = mx.mod.Module(symbol=symbol, context=mx.cpu())
    restored.bind(data_shapes=val_iter.provide_data, label_shapes=val_iter.provide_label,
                  for_training=False)
    restored.set_params(arg_params, aux_params)
    probabilities = restored.predict(val_iter)
    accuracy = float((probabilities.asnumpy().argmax(axis=1) == val_y).mean())
    print("saved %s-symbol.json and %s-%04d.params" % (prefix, prefix, args.epochs))
    print("final accuracy: %.4f" % accuracy)
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
