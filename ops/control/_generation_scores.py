"""A search step's scores in onnxruntime's generation operators (``contrib_generation.py``'s
BeamSearch and GreedySearch, ``contrib_sampling.py``'s Sampling): onnxruntime's logits
processors, in its order, over one row of scores per beam; BeamSearch's float32 log-softmax;
and the candidates' top-k, equal scores in index order as onnxruntime's TopK gives them. It
registers nothing.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.control._generation_decoders import _Settings

# what onnxruntime's logits processors write over a banned token
LOWEST = np.finfo(np.float32).min


# -- the logits processors ------------------------------------------------------------------------

def _process_scores(scores, sequences, s: _Settings, step: int) -> None:
    """onnxruntime's logits processors over scores (rows, vocab), in place, in its order."""
    if s.repetition_penalty != 1:
        _penalize_repeats(scores, sequences, s.repetition_penalty)
    if s.no_repeat_ngram_size > 0:
        _ban_repeated_ngrams(scores, sequences, s.no_repeat_ngram_size)
    if s.vocab_mask is not None:
        scores[:, s.vocab_mask == 0] = LOWEST
    if s.prefix_vocab_mask is not None and step == 1:
        banned = np.repeat(s.prefix_vocab_mask == 0, s.num_beams, axis=0)
        scores[banned] = LOWEST
    if s.min_length > 0 and sequences.shape[1] < s.min_length:
        scores[:, s.eos_token_id] = LOWEST


def _penalize_repeats(scores, sequences, penalty: np.float32) -> None:
    """Each token a row's sequence holds (its prompt and pads included) scores worse:
    a negative score times the penalty, a positive one over it."""
    for row, sequence in zip(scores, sequences):
        seen = np.unique(sequence)
        seen = seen[(seen >= 0) & (seen < row.shape[0])]
        found = row[seen]
        row[seen] = np.where(found < 0, found * penalty, found / penalty)


def _ban_repeated_ngrams(scores, sequences, size: int) -> None:
    """A token that would repeat an n-gram of its row's sequence is banned: the tokens that
    followed each earlier occurrence of the row's last size - 1 tokens."""
    length = sequences.shape[1]
    if size > length:
        return
    for row, sequence in zip(scores, sequences):
        prefix = tuple(sequence[length - size + 1:]) if size > 1 else ()
        banned = {int(sequence[j + size - 1]) for j in range(length - size + 1)
                  if tuple(sequence[j:j + size - 1]) == prefix}
        row[list(banned)] = LOWEST


def _log_softmax(logits):
    """A float32 log-softmax over the last axis, as onnxruntime's (x - max - log sum)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float32))


def _top_k(rows, k: int):
    """The k largest entries of each row, largest first; equal values in index order, as
    onnxruntime's TopK breaks ties. A partition finds the k-th largest value, so only the
    k chosen entries are sorted (a full sort of num_beams * vocab entries a step was most of
    a search's own time)."""
    if k >= rows.shape[1]:
        order = np.argsort(-rows, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(rows, order, axis=1), order
    kth = np.partition(rows, rows.shape[1] - k, axis=1)[:, rows.shape[1] - k, None]
    above, level = rows > kth, rows == kth
    # the entries equal to the k-th largest fill the places left, lowest index first
    wanted = k - above.sum(axis=1, keepdims=True)
    chosen = above | (level & (np.cumsum(level, axis=1) <= wanted))
    indices = np.nonzero(chosen)[1].reshape(rows.shape[0], k)
    values = np.take_along_axis(rows, indices, axis=1)
    order = np.lexsort((indices, -values), axis=1)
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(indices, order, axis=1)

