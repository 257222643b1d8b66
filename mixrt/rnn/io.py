"""MXNet 1.x's sequence input helpers (``mx.rnn``): ``encode_sentences`` turns words into
integer ids, ``BucketSentenceIter`` batches id sentences by length bucket for a
``BucketingModule``."""

from __future__ import annotations

import bisect
import logging
import random

import numpy as np

from mixrt import nd
from mixrt.base.errors import InputError
from mixrt.io_base import DataBatch, DataDesc, DataIter


def encode_sentences(sentences, vocab=None, invalid_label=-1, invalid_key="\n",
                     start_label=0, unknown_token=None):
    """(``sentences`` as lists of ids, the vocabulary dict). Without ``vocab`` one is built,
    ids from ``start_label`` on (skipping ``invalid_label``), ``invalid_key`` mapped to
    ``invalid_label``. With ``vocab`` an unknown word is ``unknown_token``'s id, or an
    InputError when there is none."""
    building = vocab is None
    if building:
        vocab = {invalid_key: invalid_label}
    next_id = start_label
    encoded = []
    for sentence in sentences:
        ids = []
        for word in sentence:
            if word not in vocab:
                if not building and unknown_token is None:
                    raise InputError(f"encode_sentences: {word!r} is not in vocab and no "
                                     f"unknown_token was given")
                if not building:
                    word = unknown_token
                else:
                    if next_id == invalid_label:
                        next_id += 1
                    vocab[word] = next_id
                    next_id += 1
            ids.append(vocab[word])
        encoded.append(ids)
    return encoded, vocab


class BucketSentenceIter(DataIter):
    """Batches of ``batch_size`` id sentences, each padded with ``invalid_label`` to the
    smallest bucket length that holds it (longer sentences are dropped, with a warning);
    the label is the sentence shifted one step left (next-word prediction). Without
    ``buckets``, every length that at least ``batch_size`` sentences have is one. A
    batch's ``bucket_key`` is its length; ``layout`` 'NT' or 'TN' places the time axis."""

    def __init__(self, sentences, batch_size: int, buckets=None, invalid_label=-1,
                 data_name="data", label_name="softmax_label", dtype="float32",
                 layout="NT"):
        super().__init__(batch_size)
        if layout not in ("NT", "TN"):
            raise InputError(f"BucketSentenceIter: layout must be 'NT' or 'TN', got "
                             f"{layout!r}")
        if not buckets:
            counts = np.bincount([len(sentence) for sentence in sentences])
            buckets = [length for length, count in enumerate(counts) if count >= batch_size]
        buckets = sorted(buckets)
        self.data = self._padded_by_bucket(sentences, buckets, invalid_label, dtype)
        self.batch_size = batch_size
        self.buckets = buckets
        self.data_name = data_name
        self.label_name = label_name
        self.dtype = dtype
        self.invalid_label = invalid_label
        self.nddata: list = []
        self.ndlabel: list = []
        self.major_axis = layout.find("N")
        self.layout = layout
        self.default_bucket_key = max(buckets)
        self.provide_data = [DataDesc(data_name, self._shape(self.default_bucket_key),
                                      layout=layout)]
        self.provide_label = [DataDesc(label_name, self._shape(self.default_bucket_key),
                                       layout=layout)]
        # (bucket, first row) of every full batch
        self.idx = [(i, start) for i, bucket in enumerate(self.data)
                    for start in range(0, len(bucket) - batch_size + 1, batch_size)]
        self.curr_idx = 0
        self.reset()

    @staticmethod
    def _padded_by_bucket(sentences, buckets, invalid_label, dtype) -> list:
        rows = [[] for _ in buckets]
        discarded = 0
        for sentence in sentences:
            bucket = bisect.bisect_left(buckets, len(sentence))
            if bucket == len(buckets):
                discarded += 1
                continue
            row = np.full((buckets[bucket],), invalid_label, dtype=dtype)
            row[:len(sentence)] = sentence
            rows[bucket].append(row)
        if discarded:
            logging.warning("BucketSentenceIter: discarded %d sentences longer than the "
                            "largest bucket.", discarded)
        return [np.asarray(bucket_rows, dtype=dtype).reshape(len(bucket_rows), length)
                for bucket_rows, length in zip(rows, buckets)]

    def _shape(self, length: int) -> tuple:
        return (self.batch_size, length) if self.major_axis == 0 else (length, self.batch_size)

    def reset(self) -> None:
        """Shuffle the batch order and each bucket's sentences; make the label arrays."""
        self.curr_idx = 0
        random.shuffle(self.idx)
        for bucket in self.data:
            np.random.shuffle(bucket)
        self.nddata, self.ndlabel = [], []
        for bucket in self.data:
            label = np.empty_like(bucket)
            label[:, :-1] = bucket[:, 1:]
            label[:, -1] = self.invalid_label
            self.nddata.append(nd.array(bucket, dtype=self.dtype))
            self.ndlabel.append(nd.array(label, dtype=self.dtype))

    def next(self) -> DataBatch:
        if self.curr_idx == len(self.idx):
            raise StopIteration
        bucket, start = self.idx[self.curr_idx]
        self.curr_idx += 1
        data = self.nddata[bucket][start:start + self.batch_size]
        label = self.ndlabel[bucket][start:start + self.batch_size]
        if self.major_axis == 1:
            data, label = data.T, label.T
        return DataBatch([data], [label], pad=0, bucket_key=self.buckets[bucket],
                         provide_data=[DataDesc(self.data_name, data.shape,
                                                layout=self.layout)],
                         provide_label=[DataDesc(self.label_name, label.shape,
                                                 layout=self.layout)])
