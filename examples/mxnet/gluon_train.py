"""Train a small convolutional classifier with MXNet 1.x's Gluon API.

Runs unchanged under MXNet 1.9.1 and under mixrt through its ``mxnet`` alias
(``pip install ./compat/mxnet``). The data is synthetic and seeded: 8x8 single-channel
images, each class a bright bar in its own place plus noise, so the script needs no
download and the task is learnable in a few epochs.

    python examples/mxnet/gluon_train.py [--epochs N] [--out DIR]

Prints the test accuracy after each epoch and, at the end, ``final accuracy: 0.xxxx``;
it exits with status 1 if the accuracy stays below ``--target``.
"""

import argparse
import os
import sys
import tempfile

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon, nd

NUM_CLASSES = 4
IMAGE_SIZE = 8


def synthetic_images(num_samples, rng):
    """Images of shape (N, 1, 8, 8): class k has a bright horizontal bar on rows 2k, 2k+1."""
    labels = rng.randint(0, NUM_CLASSES, size=num_samples)
    images = rng.normal(0.0, 1.0, size=(num_samples, 1, IMAGE_SIZE, IMAGE_SIZE))
    for row in range(2):
        images[np.arange(num_samples), 0, 2 * labels + row, :] += 1.0
    return images.astype("float32"), labels.astype("float32")


def build_net():
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Conv2D(channels=8, kernel_size=3, padding=1, activation="relu"),
                gluon.nn.MaxPool2D(pool_size=2),
                gluon.nn.Flatten(),
                gluon.nn.Dense(32, activation="relu"),
                gluon.nn.Dense(NUM_CLASSES))
    return net


def evaluate(net, loader):
    metric = mx.metric.Accuracy()
    for data, label in loader:
        metric.update([label], [net(data)])
    return metric.get()[1]


def train(net, train_loader, test_loader, epochs, batch_size):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    metric = mx.metric.Accuracy()
    for epoch in range(epochs):
        metric.reset()
        total_loss = 0.0
        for data, label in train_loader:
            with autograd.record():
                output = net(data)
                loss = loss_fn(output, label)
            loss.backward()
            trainer.step(batch_size)
            metric.update([label], [output])
            total_loss += loss.mean().asscalar()
        name, train_acc = metric.get()
        print("epoch %d: loss %.4f, train %s %.4f, test accuracy %.4f"
              % (epoch, total_loss / len(train_loader), name, train_acc,
                 evaluate(net, test_loader)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", 5)))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--out", default=None, help="where the saved files go (default: a temp dir)")
    args = parser.parse_args()

    # MXNet's own generators, then NumPy's global one, which the shuffling samplers draw from
    mx.random.seed(42)
    np.random.seed(42)
    rng = np.random.RandomState(42)
    train_x, train_y = synthetic_images(1024, rng)
    test_x, test_y = synthetic_images(256, rng)
    train_loader = gluon.data.DataLoader(
        gluon.data.ArrayDataset(nd.array(train_x), nd.array(train_y)),
        batch_size=args.batch_size, shuffle=True)
    test_loader = gluon.data.DataLoader(
        gluon.data.ArrayDataset(nd.array(test_x), nd.array(test_y)), batch_size=128)

    net = build_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    train(net, train_loader, test_loader, args.epochs, args.batch_size)

    out_dir = args.out or tempfile.mkdtemp(prefix="gluon_train_")
    params_file = os.path.join(out_dir, "cnn.params")
    net.save_parameters(params_file)
    # a fresh network with the saved weights must predict as the trained one does
    restored = build_net()
    restored.load_parameters(params_file)
    restored.hybridize()
    accuracy = evaluate(restored, test_loader)
    net.export(os.path.join(out_dir, "cnn"), epoch=0)
    print("saved to %s: %s" % (out_dir, ", ".join(sorted(os.listdir(out_dir)))))
    print("final accuracy: %.4f" % accuracy)
    return 0 if accuracy >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
