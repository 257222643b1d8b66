"""Gluon's data API: datasets, samplers, batchify functions and the DataLoader.

    from mixrt.gluon.data import ArrayDataset, DataLoader
    loader = DataLoader(ArrayDataset(images, labels), batch_size=64, shuffle=True)

``mixrt.random.seed`` called before a loader is built makes its shuffles reproducible.
"""

from mixrt.gluon.data import batchify
from mixrt.gluon.data.batchify import default_batchify_fn
from mixrt.gluon.data.dataloader import DataLoader, DataLoaderError
from mixrt.gluon.data.dataset import ArrayDataset, Dataset, SimpleDataset
from mixrt.gluon.data.sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler,
                                      SplitSampler)

__all__ = ["Dataset", "SimpleDataset", "ArrayDataset", "Sampler", "SequentialSampler",
           "RandomSampler", "BatchSampler", "SplitSampler", "DataLoader", "DataLoaderError",
           "default_batchify_fn", "batchify"]
