"""onnxruntime's text generation operators (``com.microsoft``): BeamSearch over a GPT-2 style
decoder (model_type 0) or a T5 style encoder and decoder (model_type 1), and GreedySearch over
a GPT-2 style decoder, the nodes ``onnxruntime.transformers.convert_generation`` writes.

A GPT-2 node holds the decoder as its ``decoder`` GRAPH attribute, with the interface that
converter checks: inputs ``input_ids``, ``position_ids``, ``attention_mask`` (int32) and
``past_0`` .. ``past_{n-1}``, outputs ``logits`` and ``present_0`` .. ``present_{n-1}``. A past
or present is the layer's keys and values stacked, shaped (2, batch * beams, heads,
length, head size); the first call gets empty ones, so the declared past_0 must name
heads and head size, and the declared logits the vocabulary, as onnxruntime requires. The
first call sees the whole prompt, each later call one new token per beam with the presents
of the beams it continues. A T5 node adds the ``encoder`` (``_T5Interface`` says which two
forms it takes); its sequences start with decoder_start_token_id. The search itself (scores,
processors, beams) runs on the host, as onnxruntime's CPU kernel's does; in a GPU session the
decoder runs on the device, keeps its pasts there, and each step reads its logits back.

The results are onnxruntime's CPU kernel's, bit for bit in the sequences, which meant
following it where a textbook beam search differs (the functions that do so say where):

* scores are a float32 log-softmax of the last position's logits (GreedySearch takes the
  logits themselves), then the logits processors in onnxruntime's order: repetition
  penalty, no-repeat n-grams, vocab_mask, prefix_vocab_mask (first step only), min_length;
  a banned token gets float32's lowest value, not -inf;
* the candidates are the 2 * num_beams best scores of a batch entry over all its beams,
  equal scores in index order (onnxruntime's TopK);
* a finished hypothesis is scored over its length without the end token, and a batch entry
  decides whether it is done from a window of the candidate scores that starts at
  ``entry * num_beams`` rather than ``entry * 2 * num_beams`` (onnxruntime's reading);
* a finished entry's beams are fed on as pad tokens continuing batch beam 0, so the
  repetition penalty and the ``scores`` output see what onnxruntime's see;
* GreedySearch writes the end token itself as pad_token_id.

Whisper (model_type 2), the decoders that share past and present buffers (a
``past_sequence_length`` input) and GreedySearch over T5 are not implemented: each is refused
with an error naming the node. Sampling, GreedySearch with each token drawn at random, is in
``contrib_sampling.py``.

Two modules hold what the search works on, Sampling's included: ``_generation_decoders.py``
the node's settings, the decoders' interfaces and their calls step by step;
``_generation_scores.py`` the logits processors, BeamSearch's log-softmax and the
candidates' top-k. This module holds the beam scorer, the two search loops and the
operators.
"""

from __future__ import annotations

import numpy as np

from mixrt.ops.attention.contrib_transformer import MICROSOFT
from mixrt.ops.control._generation_decoders import (MAX_LENGTH, _GptDecoding, _Settings,
                                                    _T5Decoding, _check_attention_mask,
                                                    _gpt_interface, _settings, _t5_interface)
from mixrt.ops.control._generation_scores import _log_softmax, _process_scores, _top_k
from mixrt.ops.device import to_host
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

INT32, FLOAT32 = np.dtype(np.int32), np.dtype(np.float32)
# onnxruntime starts every beam but the first of a batch entry this far behind, so that
# the first step does not pick one token num_beams times
BEHIND = np.float32(-1e9)


# -- beam hypotheses ------------------------------------------------------------------------------

class _Hypotheses:
    """A batch entry's finished sequences, best first, at most num_beams of them
    (onnxruntime's BeamHypotheses)."""

    def __init__(self, num_beams: int, length_penalty: np.float32):
        self.num_beams, self.length_penalty = num_beams, length_penalty
        self.kept: list[tuple[np.float32, np.ndarray]] = []
        self.done = False

    def _score(self, sum_logprobs, length: int) -> np.float32:
        return np.float32(sum_logprobs) / np.float32(float(length) ** float(self.length_penalty))

    def add(self, tokens, sum_logprobs) -> None:
        score = self._score(sum_logprobs, len(tokens))
        if len(self.kept) == self.num_beams:
            if score <= self.kept[-1][0]:
                return
            self.kept.pop()
        index = len(self.kept)
        while index > 0 and score > self.kept[index - 1][0]:  # after equal scores
            index -= 1
        self.kept.insert(index, (score, np.array(tokens)))

    def can_improve(self, best_sum_logprobs, length: int) -> bool:
        return self.kept[-1][0] < self._score(best_sum_logprobs, length)


class _BeamScorer:
    """Chooses each step's beams from the candidates and keeps the finished hypotheses
    (onnxruntime's BeamSearchScorer)."""

    def __init__(self, s: _Settings):
        self.s = s
        self.hypotheses = [_Hypotheses(s.num_beams, s.length_penalty) for _ in range(s.batch)]

    @property
    def all_done(self) -> bool:
        return all(h.done for h in self.hypotheses)

    def step(self, sequences, top_scores, top_tokens, top_beams):
        """The next beams' scores, tokens and the rows they continue, from each entry's
        2 * num_beams candidates (batch, 2 * num_beams), best first."""
        s = self.s
        scores = np.zeros(s.rows, dtype=np.float32)
        tokens = np.full(s.rows, s.pad_token_id, dtype=np.int32)
        rows = np.zeros(s.rows, dtype=np.int32)  # a finished entry continues row 0
        for entry, hypotheses in enumerate(self.hypotheses):
            if hypotheses.done:
                continue
            chosen = self._choose(entry, sequences, top_scores[entry], top_tokens[entry],
                                  top_beams[entry])
            first = entry * s.num_beams
            for offset, (score, token, row) in enumerate(chosen):
                scores[first + offset], tokens[first + offset], rows[first + offset] = \
                    score, token, row
            self._settle(entry, top_scores, sequences.shape[1])
        return scores, tokens, rows

    def _choose(self, entry, sequences, scores, tokens, beams) -> list:
        """The entry's next beams in candidate order; an end token among its num_beams
        best candidates finishes that hypothesis instead."""
        s, chosen = self.s, []
        for rank, (score, token, beam) in enumerate(zip(scores, tokens, beams)):
            row = entry * s.num_beams + int(beam)
            if token == s.eos_token_id:
                if rank < s.num_beams:
                    self.hypotheses[entry].add(sequences[row], score)
            else:
                chosen.append((score, token, row))
            if len(chosen) == s.num_beams:
                break
        return chosen

    def _settle(self, entry: int, top_scores, length: int) -> None:
        """Whether the entry is done: num_beams hypotheses, and with early_stopping off none
        of the beams can beat the worst of them. onnxruntime reads the best candidate from
        the flat candidate list at entry * num_beams (not entry * 2 * num_beams)."""
        hypotheses = self.hypotheses[entry]
        if len(hypotheses.kept) < self.s.num_beams:
            return
        if not self.s.early_stopping:
            start = entry * self.s.num_beams
            window = top_scores.reshape(-1)[start:start + 2 * self.s.num_beams]
            if hypotheses.can_improve(window.max(), length):
                return
        hypotheses.done = True

    def finish(self, sequences, beam_scores):
        """sequences (batch, num_return_sequences, max_length) padded with pad_token_id, and
        their scores; entries still open count each beam as a hypothesis."""
        s = self.s
        for entry, hypotheses in enumerate(self.hypotheses):
            if not hypotheses.done:
                for row in range(entry * s.num_beams, (entry + 1) * s.num_beams):
                    hypotheses.add(sequences[row], beam_scores[row])
        out = np.full((s.batch, s.num_return_sequences, s.max_length), s.pad_token_id,
                      dtype=np.int32)
        out_scores = np.zeros((s.batch, s.num_return_sequences), dtype=np.float32)
        for entry, hypotheses in enumerate(self.hypotheses):
            for rank, (score, tokens) in enumerate(hypotheses.kept[:s.num_return_sequences]):
                out[entry, rank, :len(tokens)] = tokens
                out_scores[entry, rank] = score
        return out, out_scores


# -- BeamSearch -----------------------------------------------------------------------------------

@op("BeamSearch", since=1, domain=MICROSOFT, dtypes=frozenset({"int32"}))
def beam_search(xp, input_ids, max_length=None, min_length=None, num_beams=None,
                num_return_sequences=None, length_penalty=None, repetition_penalty=None,
                vocab_mask=None, prefix_vocab_mask=None, attention_mask=None,
                decoder_input_ids=None, logits_processor=None, *, decoder=None,
                encoder=None, init_decoder=None, eos_token_id=-1, pad_token_id=-1,
                no_repeat_ngram_size=0, early_stopping=0, model_type=0,
                decoder_start_token_id=-1, vocab_size=-1, _outputs=1):
    """Beam search over a GPT-2 decoder (model_type 0) or a T5 encoder and decoder
    (model_type 1). Outputs: sequences (batch, num_return_sequences, max_length) int32,
    padded with pad_token_id (a T5 sequence starts with decoder_start_token_id);
    sequences_scores (batch, num_return_sequences), each finished sequence's summed
    log-probability over its length ** length_penalty; scores (max_length - prompt length,
    batch, num_beams, vocab), each step's processed log-probabilities plus the beams'
    running scores (zeros for steps after every entry finished; T5's prompt is its start
    token). ``init_decoder``, where given, serves a GPT-2 search's first step.
    logits_processor selects Whisper's processor, which only model_type 2 reads."""
    _require_model_type(model_type, decoder_input_ids)
    interface = _interface(model_type, encoder, decoder)
    s = _settings(to_host(input_ids), max_length, min_length, num_beams,
                  num_return_sequences, length_penalty, repetition_penalty, vocab_mask,
                  prefix_vocab_mask, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                  no_repeat_ngram_size=no_repeat_ngram_size, early_stopping=early_stopping,
                  vocab_size=vocab_size if vocab_size > 0 else interface.vocab_size,
                  prompt_length=1 if model_type == 1 else None)
    _check_attention_mask(attention_mask, input_ids)
    if model_type == 1:
        if decoder_start_token_id < 0:
            raise ValueError("model_type 1 needs decoder_start_token_id (0 or more)")
        decoding = _T5Decoding(xp, encoder, decoder, interface, input_ids, attention_mask,
                               decoder_start_token_id, s)
    else:
        decoding = _GptDecoding(xp, decoder, init_decoder, interface, input_ids,
                                attention_mask, s)
    sequences, scorer, beam_scores, steps = _search_beams(decoding, s)
    out, out_scores = scorer.finish(sequences, beam_scores)
    # the search runs on the host; the outputs go where the session keeps its values
    results = tuple(xp.asarray(r) for r in (out, out_scores, _stacked_steps(steps, s)))
    return results[0] if _outputs == 1 else results[:_outputs]


def _require_model_type(model_type: int, decoder_input_ids=None) -> None:
    if model_type not in (0, 1):
        raise ValueError(f"model_type {model_type} is not implemented; GPT-2 style decoders "
                         f"(0) and T5 style encoder-decoders (1) are")
    if decoder_input_ids is not None:
        raise ValueError("decoder_input_ids (Whisper's) is not implemented")


def _interface(model_type: int, encoder, decoder):
    if model_type == 1:
        return _t5_interface(encoder, decoder)
    if encoder is not None:
        raise ValueError("an encoder attribute needs model_type 1")
    return _gpt_interface(decoder)


def _search_beams(decoding, s: _Settings):
    """Run the decoding step by step until max_length or every entry is done; the beams'
    sequences and running scores, the scorer and each step's scores."""
    sequences = decoding.first_sequences()
    scorer = _BeamScorer(s)
    beam_scores = np.zeros(s.rows, dtype=np.float32)
    beam_scores.reshape(s.batch, s.num_beams)[:, 1:] = BEHIND
    steps, step = [], 0
    while sequences.shape[1] < s.max_length:
        step += 1
        scores = _log_softmax(decoding.logits(step))
        _process_scores(scores, sequences, s, step)
        scores += beam_scores[:, None]
        steps.append(scores)
        top_scores, top = _top_k(scores.reshape(s.batch, -1), 2 * s.num_beams)
        beam_scores, tokens, rows = scorer.step(sequences, top_scores, top % s.vocab_size,
                                                top // s.vocab_size)
        sequences = np.concatenate([sequences[rows], tokens[:, None]], axis=1)
        if scorer.all_done and decoding.may_stop(step):
            break
        if sequences.shape[1] < s.max_length:
            decoding.advance(tokens, rows, step, sequences)
    return sequences, scorer, beam_scores, steps


def _require_gpt(model_type: int) -> None:
    if model_type != 0:
        raise ValueError(f"model_type {model_type} is not implemented for GreedySearch; only "
                         f"GPT-2 style decoders (model_type 0) are")


def _stacked_steps(steps: list, s: _Settings):
    """The scores output: one (batch, num_beams, vocab) block per step the search could
    take, zeros for those it did not."""
    out = np.zeros((s.max_length - s.prompt_length, s.batch, s.num_beams, s.vocab_size),
                   dtype=np.float32)
    for index, scores in enumerate(steps):
        out[index] = scores.reshape(s.batch, s.num_beams, s.vocab_size)
    return out


@beam_search.infer
def _(input_ids, max_length=None, min_length=None, num_beams=None, num_return_sequences=None,
      *_inputs, decoder=None, encoder=None, model_type=0, vocab_size=-1, **_):
    _require_model_type(model_type)
    interface = _interface(model_type, encoder, decoder)
    batch, prompt = _dims(input_ids, 2)
    prompt = 1 if model_type == 1 else prompt
    longest = _known_scalar(max_length, MAX_LENGTH)
    beams = _known_scalar(num_beams, 1)
    returned = _known_scalar(num_return_sequences, 1)
    vocab = vocab_size if vocab_size > 0 else interface.vocab_size
    steps = longest - prompt if isinstance(longest, int) and isinstance(prompt, int) else None
    return [TensorType(INT32, (batch, returned, longest)),
            TensorType(FLOAT32, (batch, returned)),
            TensorType(FLOAT32, (steps, batch, beams, vocab))]


def _dims(value_type, rank: int) -> tuple:
    shape = getattr(value_type, "shape", None)
    return tuple(shape) if shape is not None and len(shape) == rank else (None,) * rank


def _known_scalar(value_type, default):
    """A scalar input's value where inference knows it, its default where the input is
    absent, else None."""
    if value_type is None:
        return default
    value = getattr(value_type, "value", None)
    if value is None or np.asarray(value).size != 1:
        return None
    return int(np.asarray(value).reshape(-1)[0])


# -- GreedySearch ---------------------------------------------------------------------------------

@op("GreedySearch", since=1, domain=MICROSOFT, dtypes=frozenset({"int32"}))
def greedy_search(xp, input_ids, max_length=None, min_length=None, repetition_penalty=None,
                  vocab_mask=None, prefix_vocab_mask=None, attention_mask=None, *,
                  decoder=None, init_decoder=None, eos_token_id=-1, pad_token_id=-1,
                  no_repeat_ngram_size=0, model_type=0, decoder_start_token_id=-1,
                  vocab_size=-1):
    """Greedy search over a GPT-2 decoder: at each step the best processed logit (the first
    of equal ones). A row that produced eos_token_id gets pad_token_id from then on, the
    end token included; the search stops when every row has. Output: sequences (batch,
    max_length) int32, pad_token_id after the last step."""
    _require_gpt(model_type)
    interface = _gpt_interface(decoder)
    s = _settings(to_host(input_ids), max_length, min_length, None, None, None,
                  repetition_penalty, vocab_mask, prefix_vocab_mask,
                  eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                  no_repeat_ngram_size=no_repeat_ngram_size, early_stopping=0,
                  vocab_size=vocab_size if vocab_size > 0 else interface.vocab_size)
    _check_attention_mask(attention_mask, input_ids)
    decoding = _GptDecoding(xp, decoder, init_decoder, interface, input_ids, attention_mask, s)
    sequences = _search_greedily(decoding, s)
    out = np.full((s.batch, s.max_length), s.pad_token_id, dtype=np.int32)
    out[:, :sequences.shape[1]] = sequences
    return xp.asarray(out)


def _best_tokens(scores):
    """Each row's best processed score, the first of equal ones."""
    return scores.argmax(axis=1).astype(np.int32)


def _search_greedily(decoding, s: _Settings, choose=_best_tokens):
    """One token per row a step until max_length or every row has ended; ``choose`` picks
    the tokens from the processed scores (Sampling draws them)."""
    sequences = decoding.first_sequences()
    ended = np.zeros(s.batch, dtype=bool)
    step = 0
    while sequences.shape[1] < s.max_length:
        step += 1
        scores = decoding.logits(step)
        _process_scores(scores, sequences, s, step)
        tokens = choose(scores)
        ended |= tokens == s.eos_token_id
        tokens[ended] = s.pad_token_id
        sequences = np.concatenate([sequences, tokens[:, None]], axis=1)
        if ended.all():
            break
        if sequences.shape[1] < s.max_length:
            decoding.advance(tokens, None, step, sequences)
    return sequences


@greedy_search.infer
def _(input_ids, max_length=None, *_inputs, decoder=None, model_type=0, **_):
    _require_gpt(model_type)
    _gpt_interface(decoder)
    batch, _prompt = _dims(input_ids, 2)
    return [TensorType(INT32, (batch, _known_scalar(max_length, MAX_LENGTH)))]
