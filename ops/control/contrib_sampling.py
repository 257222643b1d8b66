"""onnxruntime's Sampling (``com.microsoft``): GreedySearch's decoder and loop, the next token
drawn at random from the processed logits rather than taken as their best. The decoder is a
GPT-2 style one with GreedySearch's interface (``contrib_generation.py`` says which); only
model_type 0 exists, as in onnxruntime.

With a given ``seed`` onnxruntime's CPU kernel is deterministic, and mixrt draws the same
tokens, which meant reproducing its random engine and every step before the draw:

* the engine is ``std::default_random_engine`` seeded with ``seed`` (0 where absent), which
  is libstdc++'s ``minstd_rand0`` on the Linux wheels: x <- 16807 x mod (2^31 - 1), a seed of
  0 (mod 2^31 - 1) starting it at 1. It is seeded once per run and drawn from once per batch
  row per step, the rows in order, rows that have ended included;
* a draw is ``std::uniform_real_distribution<double>(0, 1)``, whose ``generate_canonical``
  takes two engine outputs for 53 bits: (a - 1 + (b - 1) r) / r^2 with r = 2^31 - 2, in
  doubles, and the largest double below 1 where that rounds to 1;
* the token is onnxruntime's Multinomial's: the row's finite scores as doubles,
  exp(score - max) summed in order into an unnormalized cdf, the first entry greater than
  the draw times the total (``std::upper_bound``);
* before it, the logits processors run in onnxruntime's order: GreedySearch's (repetition
  penalty, no-repeat n-grams, vocab_mask, prefix_vocab_mask at the first step, min_length),
  then the division by ``temperature`` (where it is above 0 and not 1), then the presence
  penalty; then the top-p filter sets ``filter_value`` over the tokens it drops.

Two of those steps are onnxruntime's own rather than the textbook's, and mixrt follows them:

* onnxruntime: the presence penalty subtracts ``presence_mask[i] * presence_penalty`` for
  every i of the whole (batch, vocab) mask from one score, row 0's token 0, since its loop
  never advances its pointer; the other scores are untouched;
* onnxruntime: the top-p filter (``custom`` 0) sorts a row's scores ascending, takes the
  float32 softmax of the sorted scores and their running sum, and drops each token whose
  running sum is at most 1 - top_p, except the last ``min_tokens_to_keep``; ``custom`` 1
  sorts descending and drops every token after the first whose running sum exceeds top_p
  (min_tokens_to_keep is not read). top_p defaults to 0, with which custom 0 drops every
  token whose running sum stays at most 1, often all of them; the draw is then uniform, as
  every score is filter_value (-1e20 by default, finite).

The filter's cut depends on float32 roundings (with the default top_p, on whether a running
sum rounds above 1), so its softmax is MLAS's to the bit: MLAS's exp polynomial with fused
multiply-adds and its lanes' order of summing, for the kernel onnxruntime picks on the CPU
(AVX512F's, checked against onnxruntime's Softmax; FMA3's on CPUs without AVX512F, read from
its source but not checked on such a CPU; the SSE2 kernel of CPUs without AVX2 is not
reproduced). Equal scores are ordered as libstdc++'s ``std::sort`` (an introsort, not stable)
orders them; that order only decides which tokens are dropped where equal scores straddle
the cut, and only then is it worked out (``_introsort_order``). The cdf's exponentials are
NumPy's doubles where onnxruntime's are Eigen's, so a draw within a double's rounding of an
entry could pick its neighbour; that was never seen.

The second output, filtered_logits, only onnxruntime's debug builds write (its release builds
leave it unset); mixrt gives the last step's filtered scores, (batch, vocab), the scores the
last token was drawn from.
"""

from __future__ import annotations

import functools

import numpy as np

from mixrt.ops.attention.contrib_transformer import MICROSOFT
from mixrt.ops.control._generation_decoders import (MAX_LENGTH, _GptDecoding,
                                                    _check_attention_mask, _gpt_interface,
                                                    _scalar, _settings)
from mixrt.ops.control.contrib_generation import (FLOAT32, INT32, _dims, _known_scalar,
                                                  _search_greedily)
from mixrt.ops.device import to_host
from mixrt.ops.ir.registry import op
from mixrt.ops.ir.types import TensorType

# minstd_rand0, libstdc++'s std::default_random_engine
MODULUS = 2**31 - 1
MULTIPLIER = 16807
# generate_canonical's base: the engine's max - min + 1 (its outputs are 1 .. 2^31 - 2)
ENGINE_RANGE = float(MODULUS - 1)
BELOW_ONE = np.nextafter(1.0, 0.0)
# libstdc++'s std::sort: ranges this short are left to the final insertion sort
INSERTION_THRESHOLD = 16
# MLAS's exp (compute.cpp's MlasExpConstants): the AVX512F kernel's clamp (-150 ln 2) and the
# FMA3 kernel's (-127.5 ln 2)
EXP_LOWER_RANGE = np.float32(-103.9720840454)
SUM_EXP_LOWER_RANGE = np.float32(-88.3762626647949)
ROUNDING_BIAS = np.float32(12582912.0)  # 1.5 * 2^23: adding it rounds to an integer
LOG2_RECIPROCAL = np.float32(1.44269504088896341)
LOG2_HIGH, LOG2_LOW = np.float32(-6.93145752e-1), np.float32(-1.42860677e-6)
EXP_POLYNOMIAL = [np.float32(float.fromhex(c)) for c in (
    "0x1.694000p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.555450p-3", "0x1.fffff6p-2",
    "0x1.0p+0", "0x1.0p+0")]


# -- the random engine ----------------------------------------------------------------------------

class MinstdRand0:
    """libstdc++'s ``std::default_random_engine`` and the draws of a
    ``std::uniform_real_distribution<double>(0, 1)`` over it."""

    def __init__(self, seed: int):
        state = seed % MODULUS
        self.state = state if state else 1  # a zero state would stay zero forever

    def next(self) -> int:
        self.state = self.state * MULTIPLIER % MODULUS
        return self.state

    def uniform(self) -> float:
        """generate_canonical<double, 53>: 31 bits an output, so two outputs, the first the
        low digit; each product and sum rounded to a double, as libstdc++'s are."""
        low = float(self.next() - 1)
        high = float(self.next() - 1)
        value = (low + high * ENGINE_RANGE) / (ENGINE_RANGE * ENGINE_RANGE)
        return value if value < 1.0 else float(BELOW_ONE)


# -- the processors Sampling adds to GreedySearch's ------------------------------------------------

def _divide_by_temperature(scores, temperature: np.float32) -> None:
    if temperature > 0 and temperature != 1:
        scores /= temperature


def _penalize_presence(scores, presence_mask, penalty: np.float32) -> None:
    """onnxruntime: every mask entry's penalty comes off row 0's token 0, one subtraction at
    a time in float32 (its loop never moves on from the first score)."""
    if presence_mask is None or penalty == 0:
        return
    amounts = presence_mask.reshape(-1).astype(np.float32) * penalty
    running = np.concatenate([scores[0, :1], amounts.astype(np.float32)])
    scores[0, 0] = np.subtract.accumulate(running)[-1]


# -- MLAS's softmax, which the top-p filter reads -------------------------------------------------

def _fma32(a, b, c):
    """float32(a * b + c) rounded once, as a fused multiply-add rounds it: the float64
    product of two float32 values is exact, and the float64 sum, rounded to odd where it is
    inexact, rounds to float32 as the exact sum would."""
    product = np.multiply(a, b, dtype=np.float64)
    total = np.atleast_1d(product + c)
    virtual = total - product
    error = product - (total - virtual)  # the sum's rounding error (Knuth's TwoSum)
    error += np.subtract(c, virtual, out=virtual)
    nudged = (error != 0) & ((total.view(np.int64) & 1) == 0)
    if nudged.any():  # round to odd: an inexact sum moves to its odd neighbour
        total[nudged] = np.nextafter(total[nudged], np.copysign(np.inf, error[nudged]))
    return total.astype(np.float32)


@functools.lru_cache(maxsize=1)
def mlas_kernel() -> str:
    """The exp-and-sum kernel onnxruntime's MLAS runs on this CPU: AVX512F's where the CPU
    has it, else FMA3's (CPUs without AVX2 run an SSE2 one, not reproduced here)."""
    core = getattr(np, "_core", None) or np.core
    features = getattr(core._multiarray_umath, "__cpu_features__", {})
    return "avx512f" if features.get("AVX512F") else "fma3"


def _mlas_exp(shifted, kernel: str):
    """MLAS's exp of float32 values at most 0: 2^m times a degree-6 polynomial of the
    remainder, each step a fused multiply-add. AVX512F's clamps below at -150 ln 2 and
    scales with vscalefps (subnormal results rounded); FMA3's clamps at -127.5 ln 2 and
    builds 2^m in the exponent field, which gives 0 at m = -127."""
    avx512f = kernel == "avx512f"
    x = np.maximum(EXP_LOWER_RANGE if avx512f else SUM_EXP_LOWER_RANGE, shifted)
    m = _fma32(LOG2_RECIPROCAL, x, ROUNDING_BIAS) - ROUNDING_BIAS
    x = _fma32(m, LOG2_HIGH, x)
    x = _fma32(m, LOG2_LOW, x)
    p = np.full_like(x, EXP_POLYNOMIAL[0])
    for coefficient in EXP_POLYNOMIAL[1:]:
        p = _fma32(p, x, coefficient)
    if avx512f:
        return np.ldexp(p, m.astype(np.int32))
    exponent_field = ((m.astype(np.int64) + 127) << 23) % 2**32  # wraps as int32 adds do
    return p * exponent_field.astype(np.uint32).view(np.float32)


def _mlas_sum(values, kernel: str):
    """MLAS's sum of the exps: 16 lanes (AVX512F) or 8 (FMA3), each the running float32 sum
    of every 16th or 8th value; AVX512F's upper 8 lanes added onto the lower 8; then
    horizontal adds of neighbours, and the two halves' sums added."""
    width = 16 if kernel == "avx512f" else 8
    padded = np.zeros(-(-len(values) // width) * width, dtype=np.float32)
    padded[:len(values)] = values  # adding 0 leaves a lane as it is
    lanes = np.add.accumulate(padded.reshape(-1, width), axis=0)[-1]
    folded = lanes[8:] + lanes[:8] if width == 16 else lanes
    pairs = folded[0::2] + folded[1::2]
    return (pairs[0] + pairs[1]) + (pairs[2] + pairs[3])


def mlas_softmax(scores, kernel: str | None = None):
    """onnxruntime's float32 softmax of one row (MlasComputeSoftmax): exp(x - max) by MLAS's
    exp, their MLAS sum, each times the reciprocal of the sum."""
    kernel = kernel or mlas_kernel()
    with np.errstate(over="ignore"):  # float32's lowest less the maximum is -inf, clamped
        exps = _mlas_exp(scores + (-scores.max()), kernel)
    return exps * (np.float32(1) / _mlas_sum(exps, kernel))


# -- the top-p filter -----------------------------------------------------------------------------

def _dropped_positions(sorted_scores, top_p: np.float32, min_tokens_to_keep: int,
                       custom: bool) -> slice:
    """Which places of the sorted row the filter drops: a run at its start (custom 0,
    ascending) or its end (custom 1, descending)."""
    running = np.cumsum(mlas_softmax(sorted_scores), dtype=np.float32)
    vocab = len(sorted_scores)
    if custom:
        over = np.flatnonzero(running[:vocab - 1] > top_p)
        return slice(int(over[0]) + 1 if len(over) else vocab, vocab)
    considered = max(vocab - min_tokens_to_keep, 1)  # the first place is always considered
    return slice(0, int(np.count_nonzero(running[:considered] <= np.float32(1) - top_p)))


def _filter_top_p(row, top_p: np.float32, min_tokens_to_keep: int, custom: bool,
                  filter_value: np.float32) -> None:
    """Sets filter_value over the tokens top-p drops from one row of scores, in place."""
    # any order of equal scores will do unless they straddle the cut (below)
    order = np.argsort(-row if custom else row)
    dropped = _dropped_positions(row[order], top_p, min_tokens_to_keep, custom)
    cut = dropped.stop if dropped.start == 0 else dropped.start
    if 0 < cut < len(row) and row[order[cut - 1]] == row[order[cut]]:
        # equal scores either side of the cut: which of them go is std::sort's order
        order = _introsort_order(row, descending=custom)
    row[order[dropped]] = filter_value


# -- libstdc++'s std::sort on token indices -------------------------------------------------------

def _introsort_order(row, descending: bool) -> np.ndarray:
    """The token indices in the order libstdc++'s ``std::sort`` leaves them when it sorts
    0..vocab-1 by their scores: an introsort (median-of-three quicksort, heapsort past its
    depth limit) over runs longer than 16, then one insertion sort."""
    scores = row.tolist()
    if descending:
        def before(a, b):
            return scores[a] > scores[b]
    else:
        def before(a, b):
            return scores[a] < scores[b]
    items = list(range(len(scores)))
    if len(items) > 1:
        _introsort_loop(items, 0, len(items), 2 * (len(items).bit_length() - 1), before)
        _final_insertion_sort(items, before)
    return np.array(items, dtype=np.int64)


def _introsort_loop(items, first: int, last: int, depth: int, before) -> None:
    while last - first > INSERTION_THRESHOLD:
        if depth == 0:
            _heap_sort(items, first, last, before)
            return
        depth -= 1
        cut = _partition_around_median(items, first, last, before)
        _introsort_loop(items, cut, last, depth, before)
        last = cut


def _partition_around_median(items, first: int, last: int, before) -> int:
    """The median of the second, middle and last items moved to the front as the pivot,
    then libstdc++'s unguarded partition of the rest around it."""
    a, b, c = first + 1, first + (last - first) // 2, last - 1
    if before(items[a], items[b]):
        median = b if before(items[b], items[c]) else c if before(items[a], items[c]) else a
    else:
        median = a if before(items[a], items[c]) else c if before(items[b], items[c]) else b
    items[first], items[median] = items[median], items[first]
    pivot, low, high = items[first], first + 1, last
    while True:
        while before(items[low], pivot):
            low += 1
        high -= 1
        while before(pivot, items[high]):
            high -= 1
        if low >= high:
            return low
        items[low], items[high] = items[high], items[low]
        low += 1


def _heap_sort(items, first: int, last: int, before) -> None:
    """std::make_heap then std::sort_heap, libstdc++'s __partial_sort over the whole run."""
    length = last - first
    for parent in range((length - 2) // 2, -1, -1):
        _adjust_heap(items, first, parent, length, items[first + parent], before)
    while length > 1:
        length -= 1
        value = items[first + length]
        items[first + length] = items[first]
        _adjust_heap(items, first, 0, length, value, before)


def _adjust_heap(items, first: int, hole: int, length: int, value, before) -> None:
    top, child = hole, hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if before(items[first + child], items[first + child - 1]):
            child -= 1
        items[first + hole] = items[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        items[first + hole] = items[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and before(items[first + parent], value):
        items[first + hole] = items[first + parent]
        hole, parent = parent, (parent - 1) // 2
    items[first + hole] = value


def _final_insertion_sort(items, before) -> None:
    """An insertion sort of the first 16, then unguarded insertions of the rest (the
    introsort left each run's smallest item ahead of it)."""
    for index in range(1, len(items)):
        value = items[index]
        if index < INSERTION_THRESHOLD and before(value, items[0]):
            items[1:index + 1] = items[:index]
            items[0] = value
            continue
        place = index
        while before(value, items[place - 1]):
            items[place] = items[place - 1]
            place -= 1
        items[place] = value


# -- the draw -------------------------------------------------------------------------------------

def _multinomial(row, draw: float) -> int:
    """onnxruntime's Multinomial over one row of scores: the first entry of the running sum
    of exp(score - max) over the finite scores, in doubles, above draw times the sum."""
    finite = np.isfinite(row)
    top = row[finite].max() if finite.any() else np.finfo(np.float32).min
    mass = np.exp(row.astype(np.float64) - np.float64(top), where=finite,
                  out=np.zeros(len(row)))
    cdf = np.cumsum(mass)
    return int(np.searchsorted(cdf, draw * cdf[-1], side="right"))


class _Sampler:
    """Chooses each step's tokens: Sampling's processors, the top-p filter, one draw a row."""

    def __init__(self, seed: int, presence_mask, *, temperature, top_p, filter_value,
                 min_tokens_to_keep, presence_penalty, custom, vocab_size):
        self.engine = MinstdRand0(seed)
        self.presence_mask = presence_mask
        self.temperature, self.top_p = np.float32(temperature), np.float32(top_p)
        self.filter_value = np.float32(filter_value)
        self.min_tokens_to_keep, self.custom = min_tokens_to_keep, bool(custom)
        self.presence_penalty = np.float32(presence_penalty)
        self.vocab_size = vocab_size
        self.filtered = None  # the last step's filtered scores

    def __call__(self, scores):
        _divide_by_temperature(scores, self.temperature)
        _penalize_presence(scores, self.presence_mask, self.presence_penalty)
        for row in scores:
            _filter_top_p(row, self.top_p, self.min_tokens_to_keep, self.custom,
                          self.filter_value)
        self.filtered = scores
        tokens = [_multinomial(row, self.engine.uniform()) for row in scores]
        if max(tokens) >= self.vocab_size:
            raise ValueError(f"the top-p filter dropped every token of a row (top_p "
                             f"{self.top_p}, custom {int(self.custom)}); onnxruntime would "
                             f"feed token {self.vocab_size}, outside the vocabulary")
        return np.array(tokens, dtype=np.int32)


# -- the operator ---------------------------------------------------------------------------------

@op("Sampling", since=1, domain=MICROSOFT, dtypes=frozenset({"int32"}))
def sampling(xp, input_ids, max_length=None, min_length=None, repetition_penalty=None,
             vocab_mask=None, prefix_vocab_mask=None, attention_mask=None, presence_mask=None,
             seed=None, *, decoder=None, init_decoder=None, eos_token_id=-1, pad_token_id=-1,
             no_repeat_ngram_size=0, temperature=1.0, top_p=0.0,
             filter_value=-1e20, min_tokens_to_keep=0, presence_penalty=0.0,
             custom=0, model_type=0, decoder_start_token_id=-1, vocab_size=-1, _outputs=1):
    """Sampling over a GPT-2 decoder: at each step a token drawn from the processed,
    top-p filtered scores with onnxruntime's engine seeded by ``seed``. A row that drew
    eos_token_id gets pad_token_id from then on, the end token included; the search stops
    when every row has. Outputs: sequences (batch, max_length) int32, pad_token_id after
    the last step; filtered_logits (batch, vocab), the last step's filtered scores."""
    _require_gpt2(model_type)
    interface = _gpt_interface(decoder)
    vocab = vocab_size if vocab_size > 0 else interface.vocab_size
    s = _settings(to_host(input_ids), max_length, min_length, None, None, None,
                  repetition_penalty, vocab_mask, prefix_vocab_mask,
                  eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                  no_repeat_ngram_size=no_repeat_ngram_size, early_stopping=0,
                  vocab_size=vocab)
    _check_attention_mask(attention_mask, input_ids)
    sampler = _Sampler(_seed(seed), _presence_mask(presence_mask, s.batch, vocab),
                       temperature=temperature, top_p=top_p, filter_value=filter_value,
                       min_tokens_to_keep=_tokens_to_keep(min_tokens_to_keep, vocab),
                       presence_penalty=presence_penalty, custom=custom, vocab_size=vocab)
    decoding = _GptDecoding(xp, decoder, init_decoder, interface, input_ids, attention_mask, s)
    sequences = _search_greedily(decoding, s, choose=sampler)
    out = np.full((s.batch, s.max_length), s.pad_token_id, dtype=np.int32)
    out[:, :sequences.shape[1]] = sequences
    results = (xp.asarray(out), xp.asarray(sampler.filtered))
    return results[0] if _outputs == 1 else results


def _require_gpt2(model_type: int) -> None:
    if model_type != 0:
        raise ValueError(f"Sampling takes GPT-2 style decoders only (model_type 0), as "
                         f"onnxruntime's does; got model_type {model_type}")


def _seed(seed) -> int:
    value = _scalar(seed, "seed", 0)
    if value < 0:
        raise ValueError(f"seed must be 0 or more; got {value}")
    return value


def _presence_mask(presence_mask, batch: int, vocab: int):
    if presence_mask is None:
        return None
    mask = to_host(presence_mask)
    if mask.shape != (batch, vocab):
        raise ValueError(f"presence_mask must be (batch, vocab_size) = ({batch}, {vocab}); "
                         f"got {mask.shape}")
    return mask


def _tokens_to_keep(min_tokens_to_keep: int, vocab: int) -> int:
    if not 0 <= min_tokens_to_keep < vocab:
        raise ValueError(f"min_tokens_to_keep must be in [0, vocab_size ({vocab})); got "
                         f"{min_tokens_to_keep}")
    return min_tokens_to_keep


@sampling.infer
def _(input_ids, max_length=None, *_inputs, decoder=None, model_type=0, vocab_size=-1, **_):
    _require_gpt2(model_type)
    interface = _gpt_interface(decoder)
    batch, _prompt = _dims(input_ids, 2)
    vocab = vocab_size if vocab_size > 0 else interface.vocab_size
    return [TensorType(INT32, (batch, _known_scalar(max_length, MAX_LENGTH))),
            TensorType(FLOAT32, (batch, vocab))]
