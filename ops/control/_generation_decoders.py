"""The node's settings and the decoders of onnxruntime's generation operators
(``contrib_generation.py``'s BeamSearch and GreedySearch, ``contrib_sampling.py``'s
Sampling): the attributes and scalar inputs a run searches with, checked as onnxruntime
checks them; the decoder graphs' interfaces, a GPT-2 decoder's and a T5 encoder's and
decoder's, checked as ``onnxruntime.transformers.convert_generation`` writes them; and their
calls from one step to the next, each giving the step's last-position logits as float32 rows
on the host and taking the chosen tokens and the beams they continue. It registers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixrt.ops.device import to_host

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


def _check_attention_mask(attention_mask, input_ids) -> None:
    if attention_mask is not None and np.shape(attention_mask) != np.shape(input_ids):
        raise ValueError(f"attention_mask must have input_ids' shape {np.shape(input_ids)}; "
                         f"got {np.shape(attention_mask)}")


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
