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
of the beams it continues. A T5 node adds the ``encoder`` (``_t5_interface`` says which two
forms it takes); its sequences start with decoder_start_token_id. The search itself (scores,
processors, beams) runs on the host, as onnxruntime's CPU kernel's does; in a GPU session the
decoder runs on the device, keeps its pasts there, and each step reads its logits back.

The results are onnxruntime's CPU kernel's, bit for bit in the sequences, which meant
following it where a textbook beam search differs (the module's functions say where):

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.attention.contrib_transformer import MICROSOFT
from mixrt.ops.device import to_host
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

INT32, FLOAT32 = np.dtype(np.int32), np.dtype(np.float32)
# what onnxruntime's logits processors write over a banned token
LOWEST = np.finfo(np.float32).min
# onnxruntime starts every beam but the first of a batch entry this far behind, so that
# the first step does not pick one token num_beams times
BEHIND = np.float32(-1e9)
MAX_LENGTH = 4096  # onnxruntime's limit on max_length
MAX_BEAMS = 128  # and on num_beams


# -- the node's settings --------------------------------------------------------------------------

@dataclass
class _Settings:
    """What one run searches with: the node's attributes and its scalar inputs."""

    batch: int
    prompt_length: int
    max_length: int
    min_length: int
    num_beams: int
    num_return_sequences: int
    length_penalty: np.float32
    repetition_penalty: np.float32
    vocab_size: int
    eos_token_id: int
    pad_token_id: int
    no_repeat_ngram_size: int
    early_stopping: bool
    vocab_mask: np.ndarray | None
    prefix_vocab_mask: np.ndarray | None

    @property
    def rows(self) -> int:
        """Sequences searched at once: batch entries times beams."""
        return self.batch * self.num_beams


def _scalar(value, name: str, default, kind=int):
    """A scalar input's value (a one-element tensor); ``default`` where it is absent."""
    if value is None:
        return default
    array = to_host(value)
    if array.size != 1:
        raise ValueError(f"input {name} must hold one value; got shape {array.shape}")
    return kind(array.reshape(-1)[0])


def _settings(input_ids, max_length, min_length, num_beams, num_return_sequences,
              length_penalty, repetition_penalty, vocab_mask, prefix_vocab_mask, *,
              eos_token_id, pad_token_id, no_repeat_ngram_size, early_stopping,
              vocab_size, prompt_length=None) -> _Settings:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, sequence); got shape {input_ids.shape}")
    if eos_token_id < 0 or pad_token_id < 0:
        raise ValueError(f"eos_token_id ({eos_token_id}) and pad_token_id ({pad_token_id}) "
                         f"must be token ids (0 or more)")
    settings = _Settings(
        batch=input_ids.shape[0],
        prompt_length=input_ids.shape[1] if prompt_length is None else prompt_length,
        max_length=_scalar(max_length, "max_length", MAX_LENGTH),
        min_length=_scalar(min_length, "min_length", 0),
        num_beams=_scalar(num_beams, "num_beams", 1),
        num_return_sequences=_scalar(num_return_sequences, "num_return_sequences", 1),
        length_penalty=np.float32(_scalar(length_penalty, "length_penalty", 1.0, float)),
        repetition_penalty=np.float32(
            _scalar(repetition_penalty, "repetition_penalty", 1.0, float)),
        vocab_size=vocab_size, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        no_repeat_ngram_size=no_repeat_ngram_size, early_stopping=bool(early_stopping),
        vocab_mask=to_host(vocab_mask), prefix_vocab_mask=to_host(prefix_vocab_mask))
    _check_settings(settings)
    return settings


def _check_settings(s: _Settings) -> None:
    if not s.prompt_length < s.max_length <= MAX_LENGTH:
        raise ValueError(f"max_length ({s.max_length}) must exceed the prompt's length "
                         f"({s.prompt_length}) and be at most {MAX_LENGTH}")
    if not 1 <= s.num_beams <= MAX_BEAMS:
        raise ValueError(f"num_beams must be in [1, {MAX_BEAMS}]; got {s.num_beams}")
    if not 1 <= s.num_return_sequences <= s.num_beams:
        raise ValueError(f"num_return_sequences ({s.num_return_sequences}) must be in "
                         f"[1, num_beams ({s.num_beams})]")
    if s.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be positive; got {s.repetition_penalty}")
    if s.vocab_mask is not None and s.vocab_mask.shape != (s.vocab_size,):
        raise ValueError(f"vocab_mask must be (vocab_size,) = ({s.vocab_size},); got "
                         f"{s.vocab_mask.shape}")
    if s.prefix_vocab_mask is not None and \
            s.prefix_vocab_mask.shape != (s.batch, s.vocab_size):
        raise ValueError(f"prefix_vocab_mask must be (batch, vocab_size) = ({s.batch}, "
                         f"{s.vocab_size}); got {s.prefix_vocab_mask.shape}")


# -- the decoder ----------------------------------------------------------------------------------

GPT_INPUTS = ("input_ids", "position_ids", "attention_mask")


@dataclass
class _GptInterface:
    """The decoder graph's shape as the search needs it, checked as onnxruntime checks it."""

    layers: int
    heads: int
    head_size: int
    vocab_size: int
    past_dtype: np.dtype


def _gpt_interface(decoder) -> _GptInterface:
    if decoder is None:
        raise ValueError("needs the decoder attribute (the GPT-2 decoder graph)")
    graph = decoder.graph
    inputs, outputs = list(graph.input_names), list(graph.output_names)
    if "past_sequence_length" in inputs:
        raise ValueError("a decoder that shares past and present buffers "
                         "(past_sequence_length input) is not implemented")
    layers = len(outputs) - 1
    if layers < 1 or len(inputs) != len(outputs) + 2:
        raise ValueError(f"the decoder must take input_ids, position_ids, attention_mask and "
                         f"one past per present it outputs; it takes {len(inputs)} inputs "
                         f"and gives {len(outputs)} outputs (logits and {layers} presents)")
    expected_inputs = [*GPT_INPUTS, *(f"past_{i}" for i in range(layers))]
    expected_outputs = ["logits", *(f"present_{i}" for i in range(layers))]
    if inputs[:4] != expected_inputs[:4] or outputs[:2] != expected_outputs[:2]:
        raise ValueError(f"the decoder's inputs must begin {expected_inputs[:4]} and its "
                         f"outputs {expected_outputs[:2]}; got {inputs[:4]} and {outputs[:2]}")
    past, logits = graph.inputs[3].type, graph.outputs[0].type
    past_shape = getattr(past, "shape", None)
    logits_shape = getattr(logits, "shape", None)
    if past_shape is None or len(past_shape) != 5 or past_shape[0] != 2 or \
            not _positive(past_shape[2]) or not _positive(past_shape[4]):
        raise ValueError(f"the decoder's past_0 must be declared (2, batch, heads, length, "
                         f"head size) with heads and head size as numbers; got {past}")
    if logits_shape is None or len(logits_shape) != 3 or not _positive(logits_shape[2]):
        raise ValueError(f"the decoder's logits must be declared (batch, length, vocab) with "
                         f"the vocab as a number; got {logits}")
    return _GptInterface(layers, past_shape[2], past_shape[4], logits_shape[2],
                         np.dtype(past.dtype or np.float32))


def _positive(dim) -> bool:
    return isinstance(dim, int) and dim > 0


class _GptDecoding:
    """A GPT-2 decoder's calls from one step to the next (onnxruntime's CreateGptInputs
    and UpdateGptFeeds): the prompt first, then one token per beam."""

    def __init__(self, xp, decoder, init_decoder, interface: _GptInterface, input_ids,
                 attention_mask, s: _Settings):
        self.xp, self.decoder, self.init_decoder, self.s = xp, decoder, init_decoder, s
        ids = to_host(input_ids).astype(np.int32)
        real = ids != s.pad_token_id
        # a pad token sits at position 0, the others count up over the real tokens only
        positions = np.where(real, np.cumsum(real, axis=1) - 1, 0).astype(np.int32)
        mask = real.astype(np.int32) if attention_mask is None else \
            to_host(attention_mask).astype(np.int32)
        self.input_ids = np.repeat(ids, s.num_beams, axis=0)
        self.position_ids = np.repeat(positions, s.num_beams, axis=0)
        self.attention_mask = np.repeat(mask, s.num_beams, axis=0)
        # the position of each row's next token: its count of real tokens
        self.next_positions = np.repeat(real.sum(axis=1, dtype=np.int32), s.num_beams)[:, None]
        empty = (2, s.rows, interface.heads, 0, interface.head_size)
        self.past = [xp.zeros(empty, dtype=interface.past_dtype)] * interface.layers
        self.presents: list = []

    def first_sequences(self):
        """Each beam's sequence before the first step: its prompt."""
        return self.input_ids.copy()

    def logits(self, step: int):
        """The step's logits, one float32 row per beam (``init_decoder`` serves step 1)."""
        decoder = self.init_decoder if step == 1 and self.init_decoder else self.decoder
        # the feeds are made on the host; the pasts stay where the decoder made them
        feeds = [self.xp.asarray(f) for f in (self.input_ids, self.position_ids,
                                              self.attention_mask)]
        logits, *self.presents = decoder(*feeds, *self.past)
        return _last_logits(logits, self.s)

    def may_stop(self, step: int) -> bool:
        """Whether the search stops once every entry is done after ``step``."""
        return True

    def advance(self, tokens, beam_indices, step: int, sequences) -> None:
        """The feeds for the tokens chosen at ``step``, continuing rows ``beam_indices``."""
        self.input_ids = tokens.astype(np.int32)[:, None]
        if step > 1:  # the prompt's call leaves the next positions as they start
            self.next_positions = self.next_positions + 1
        self.position_ids = self.next_positions
        ones = np.ones((self.attention_mask.shape[0], 1), dtype=np.int32)
        self.attention_mask = np.concatenate([self.attention_mask, ones], axis=1)
        self.past = _continued(self.xp, self.presents, beam_indices, self.s, axis=1)


def _continued(xp, presents: list, beam_indices, s: _Settings, axis: int) -> list:
    """The presents of the beams that continue (``axis`` is the beam axis). onnxruntime
    hands one beam's presents straight on."""
    if s.num_beams == 1:
        return list(presents)
    rows = xp.asarray(beam_indices)
    return [xp.take(p, rows, axis=axis) for p in presents]


def _last_logits(logits, s: _Settings):
    """The last position's logits, one float32 row per beam, on the host."""
    logits = to_host(logits)
    if logits.ndim != 3 or logits.shape[2] < s.vocab_size or \
            logits.shape[0] not in (s.rows, s.batch):
        raise ValueError(f"the decoder's logits must be ({s.rows} or {s.batch}, length, "
                         f"{s.vocab_size}); got {logits.shape}")
    last = logits[:, -1, :s.vocab_size].astype(np.float32)
    if last.shape[0] != s.rows:  # one row per batch entry serves each of its beams
        last = np.repeat(last, s.num_beams, axis=0)
    return last


# -- encoder-decoder models (T5) ------------------------------------------------------------------

@dataclass
class _T5Interface:
    """An encoder and decoder pair as convert_generation writes them for T5, checked as
    onnxruntime checks them. The encoder comes in two forms: the old one also runs the
    decoder's first step (inputs encoder_input_ids, encoder_attention_mask,
    decoder_input_ids; outputs logits, encoder_hidden_states, the self presents, the cross
    presents), the new one only makes the cross attention's keys and values."""

    layers: int
    heads: int
    head_size: int
    vocab_size: int
    past_dtype: np.dtype
    encoder_decodes: bool  # the old form: the encoder's logits give the first token
    hidden_states: bool  # the decoder reads encoder_hidden_states
    whole_sequence: bool  # the decoder's input_ids are the whole sequence, not one token


ENCODER_INPUTS = ("encoder_input_ids", "encoder_attention_mask", "decoder_input_ids")


def _t5_interface(encoder, decoder) -> _T5Interface:
    if encoder is None or decoder is None:
        raise ValueError("model_type 1 needs the encoder and decoder attributes")
    decoder_inputs, decoder_outputs = list(decoder.graph.input_names), \
        list(decoder.graph.output_names)
    hidden = len(decoder_inputs) > 2 and decoder_inputs[2] == "encoder_hidden_states"
    first_past = 3 if hidden else 2
    layers = (len(decoder_outputs) - 1) // 2
    if decoder_inputs[:2] != ["input_ids", "encoder_attention_mask"] or \
            decoder_outputs[:1] != ["logits"] or layers < 1 or \
            len(decoder_outputs) != 1 + 2 * layers or \
            len(decoder_inputs) != first_past + 4 * layers:
        raise ValueError(f"the decoder must take input_ids, encoder_attention_mask, "
                         f"[encoder_hidden_states,] then a self and a cross key and value per "
                         f"layer, and give logits and a self key and value per layer; it takes "
                         f"{decoder_inputs} and gives {decoder_outputs}")
    encoder_decodes = _check_t5_encoder(encoder, layers)
    if hidden and not encoder_decodes:
        raise ValueError("the decoder reads encoder_hidden_states, which only an encoder "
                         "that outputs logits and encoder_hidden_states makes")
    present, logits = decoder.graph.outputs[1].type, decoder.graph.outputs[0].type
    present_shape, logits_shape = getattr(present, "shape", None), getattr(logits, "shape", None)
    if present_shape is None or len(present_shape) != 4 or not _positive(present_shape[1]) \
            or not _positive(present_shape[3]):
        raise ValueError(f"the decoder's first present must be declared (batch, heads, "
                         f"length, head size) with heads and head size as numbers; got {present}")
    if logits_shape is None or len(logits_shape) != 3 or not _positive(logits_shape[2]):
        raise ValueError(f"the decoder's logits must be declared (batch, length, vocab) with "
                         f"the vocab as a number; got {logits}")
    ids_shape = getattr(decoder.graph.inputs[0].type, "shape", None)
    whole_sequence = not (ids_shape is not None and len(ids_shape) == 2 and ids_shape[1] == 1)
    return _T5Interface(layers, present_shape[1], present_shape[3], logits_shape[2],
                        np.dtype(present.dtype or np.float32), encoder_decodes, hidden,
                        whole_sequence)


def _check_t5_encoder(encoder, layers: int) -> bool:
    """The encoder's form: True for the old one (logits first), False for the new."""
    inputs, outputs = list(encoder.graph.input_names), list(encoder.graph.output_names)
    encoder_decodes = bool(outputs) and outputs[0] == "logits"
    if encoder_decodes:
        expected = ["logits", "encoder_hidden_states"]
        fits = inputs == list(ENCODER_INPUTS) and len(outputs) == 2 + 4 * layers
    else:
        expected = ["present_key_cross_0", "present_value_cross_0"]
        fits = inputs == list(ENCODER_INPUTS[:2]) and len(outputs) == 2 * layers
    if not fits or outputs[:2] != expected:
        raise ValueError(f"the encoder must take {list(ENCODER_INPUTS)} and give logits, "
                         f"encoder_hidden_states and a self and a cross key and value per "
                         f"decoder layer, or take {list(ENCODER_INPUTS[:2])} and give a cross key "
                         f"and value per layer; it takes {inputs} and gives {outputs}")
    return encoder_decodes


class _T5Decoding:
    """An encoder-decoder's calls (onnxruntime's BeamSearchT5): the encoder once over the
    unexpanded batch, then the decoder one token per beam, its cross keys and values the
    encoder's throughout. Every sequence starts with decoder_start_token_id."""

    def __init__(self, xp, encoder, decoder, interface: _T5Interface, input_ids,
                 attention_mask, start_token: int, s: _Settings):
        self.xp, self.decoder, self.interface, self.s = xp, decoder, interface, s
        ids = to_host(input_ids).astype(np.int32)
        mask = _leading_pads_masked(ids, s.pad_token_id) if attention_mask is None else \
            to_host(attention_mask).astype(np.int32)
        starts = np.full((s.batch, 1), start_token, dtype=np.int32)
        self.sequences = np.repeat(starts, s.num_beams, axis=0)
        self.encoder_mask = xp.asarray(np.repeat(mask, s.num_beams, axis=0))
        ids, mask, starts = xp.asarray(ids), xp.asarray(mask), xp.asarray(starts)
        if interface.encoder_decodes:
            logits, hidden, *presents = encoder(ids, mask, starts)
            self.encoder_logits = logits
            self.hidden = xp.repeat(hidden, s.num_beams, axis=0)
            expanded = [xp.repeat(p, s.num_beams, axis=0) for p in presents]
            self.self_past = expanded[:2 * interface.layers]
            self.cross_past = expanded[2 * interface.layers:]
        else:
            self.cross_past = [xp.repeat(p, s.num_beams, axis=0) for p in encoder(ids, mask)]
            empty = (s.rows, interface.heads, 0, interface.head_size)
            self.self_past = [xp.zeros(empty, dtype=interface.past_dtype)] * \
                (2 * interface.layers)
        self.input_ids = self.sequences
        self.presents: list = []

    def first_sequences(self):
        return self.sequences.copy()

    def logits(self, step: int):
        if step == 1 and self.interface.encoder_decodes:
            return _last_logits(self.encoder_logits, self.s)
        hidden = [self.hidden] if self.interface.hidden_states else []
        logits, *self.presents = self.decoder(self.xp.asarray(self.input_ids),
                                              self.encoder_mask, *hidden, *self.self_past,
                                              *self.cross_past)
        return _last_logits(logits, self.s)

    def may_stop(self, step: int) -> bool:
        # onnxruntime runs the decoder after the encoder's token whatever the scorer says
        return step > 1 or not self.interface.encoder_decodes

    def advance(self, tokens, beam_indices, step: int, sequences) -> None:
        self.input_ids = sequences.astype(np.int32) if self.interface.whole_sequence else \
            tokens.astype(np.int32)[:, None]
        if step == 1 and self.interface.encoder_decodes:
            return  # the encoder's self keys and values, one copy per beam, come first
        self.self_past = _continued(self.xp, self.presents, beam_indices, self.s, axis=0)


def _leading_pads_masked(ids, pad_token_id: int):
    """The encoder's attention mask where none is given: 0 on the pad tokens before a row's
    first real token, 1 elsewhere (a pad token inside or after the text is attended)."""
    started = np.cumsum(ids != pad_token_id, axis=1) > 0
    return started.astype(np.int32)


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


def _check_attention_mask(attention_mask, input_ids) -> None:
    if attention_mask is not None and np.shape(attention_mask) != np.shape(input_ids):
        raise ValueError(f"attention_mask must have input_ids' shape {np.shape(input_ids)}; "
                         f"got {np.shape(attention_mask)}")


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
