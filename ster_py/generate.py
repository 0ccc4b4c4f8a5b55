"""The sampling loop: prefill the prompt once, then decode one position at a time.

Each step: the repetition penalty (Keskar et al. 2019, CTRL: a logit of a token among the
last ``repeat_last_n`` ids, prompt included, is divided by the penalty when positive and
multiplied when negative), then greedy when temperature is 0; otherwise temperature, top-k,
top-p (nucleus, Holtzman et al. 2019) and min-p (Nguyen et al. 2024: drop tokens less likely
than ``min_p`` times the most likely one) filtering, in transformers' order, sampled from a
seeded numpy generator so a run is reproducible. With ``logprobs`` each step also records the
log-probability of the chosen id and of the most likely ids under the model's own
distribution (a log-softmax of the raw logits, before penalty, temperature and filters).
Generation stops at any end-of-generation token, when the caller's ``on_token`` says so
(stop strings, an interrupted turn, a client that went away), after ``max_new_tokens``, or
when the context (``ctx_size``, at most the model's) is full. The KV cache is float32 unless ``kv_cache="f16"`` asks for a
float16 one (half the memory and the bytes read per token; logits move by about
1e-4 to 2e-3 relative on SmolLM2-135M and Gemma 3 270M).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from .decoder.cache import KV_CACHE_DTYPES
from .decoder.model import Decoder, LayerHook, as_token_ids, check_callbacks, check_layer_hook
from .errors import Cancelled, ContextFull, SterError
from .prefix import PromptCache


@dataclass(frozen=True)
class Sampling:
    """Decoding settings. temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    logprobs: int | None = None  # None: none; N >= 0: the chosen id's and the N most likely ids'
    #: (id, bias) pairs added to the logits before the penalty and the choice (OpenAI's
    #: ``logit_bias``: -100..100, ids in the vocabulary); logprobs stay the model's own.
    logit_bias: tuple[tuple[int, float], ...] = ()

    def validate(self) -> None:
        """Raises SterError for a field of the wrong type (a library caller's ``top_k=2.5``,
        ``max_new_tokens="3"``, ``logit_bias={12: 5.0}``) or a value outside its range."""
        import numbers

        def check(names, kind, what, optional=False):
            for name in names:
                value = getattr(self, name)
                if (value is None and optional) or (isinstance(value, kind) and not isinstance(value, bool)):
                    continue
                raise SterError(f"Sampling.{name} must be {what}{' or None' if optional else ''}, got {value!r}")

        check(("max_new_tokens", "top_k", "repeat_last_n"), numbers.Integral, "a whole number")
        check(("seed", "logprobs"), numbers.Integral, "a whole number", optional=True)
        check(("temperature", "top_p", "min_p", "repeat_penalty"), numbers.Real, "a number")
        pairs = self.logit_bias
        if isinstance(pairs, (str, bytes, dict)) or not isinstance(pairs, (tuple, list)) or not all(
                isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], numbers.Integral)
                and isinstance(p[1], numbers.Real) and not isinstance(p[0], bool) for p in pairs):
            raise SterError(f"Sampling.logit_bias must be (id, bias) pairs such as ((12, 5.0),); "
                            f"got {str(pairs)[:80]}")
        if not 0 <= self.min_p <= 1:
            raise SterError(f"--min-p must be in [0, 1] (0 = off), got {self.min_p}")
        if not 0 < self.repeat_penalty < float("inf"):
            raise SterError(f"--repeat-penalty must be a finite number above 0 (1 = off), got {self.repeat_penalty}")
        if self.repeat_last_n < -1:
            raise SterError(f"--repeat-last-n must be -1 (the whole context), 0 (off) or more, got "
                            f"{self.repeat_last_n}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise SterError(f"--logprobs must be 0 to {MAX_LOGPROBS}, got {self.logprobs}")
        if self.max_new_tokens < 0:
            raise SterError(f"--max-new-tokens must be 0 or more, got {self.max_new_tokens}")
        if not 0 <= self.temperature < float("inf"):
            raise SterError(f"--temperature must be 0 (greedy) or a finite number above 0, got {self.temperature}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise SterError(f"--seed must be in 0..2**63-1, got {self.seed}")
        if self.top_k < 0:
            raise SterError(f"--top-k must be 0 (off) or more, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SterError(f"--top-p must be in (0, 1], got {self.top_p}")
        for token, bias in self.logit_bias:   # numpy's integers too (the types are checked above)
            if not (token >= 0 and math.isfinite(bias) and -100 <= bias <= 100):
                raise SterError(f"logit_bias {token}: ids must be 0 or more and biases finite in -100..100, "
                                f"got {bias}")


def bias_logits(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """Logits float32 [vocab] plus ``sampling.logit_bias`` (a new array, or ``logits`` itself when
    there is none). Ids at or past the vocabulary raise SterError (callers check them first)."""
    if not sampling.logit_bias:
        return logits
    top = max(int(t) for t, _ in sampling.logit_bias)   # in Python: an id past int64 (10**30) too
    if top >= logits.shape[0]:
        raise SterError(f"logit_bias names id {top}, past the model's {logits.shape[0]} ids")
    ids = np.fromiter((t for t, _ in sampling.logit_bias), dtype=np.int64)
    out = logits.copy()
    np.add.at(out, ids, np.fromiter((b for _, b in sampling.logit_bias), dtype=np.float32))
    return out


#: The most alternatives ``logprobs`` may ask for per token (OpenAI's top_logprobs allows 20).
MAX_LOGPROBS = 20


@dataclass
class Generation:
    """What a run produced: new token ids, why it stopped, and timings in seconds.

    ``logprobs`` (when asked for) holds one entry per new id: ``{"id", "logprob", "top":
    [(id, logprob), ...]}``, natural logarithms. ``reused`` prompt tokens came from a prompt
    cache; ``prefilled`` were computed.
    """

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    stop_reason: str = "length"  # "stop_token" | "length" | "context" (full) | "stopped" (on_token said so)
    #                              | "cancelled" (``cancelled`` said so during the prefill: no ids)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    logprobs: list[dict] = field(default_factory=list)
    reused: int = 0
    prefilled: int = 0
    drafted: int = 0   # with a drafter: ids it proposed (up to the stop), and how many the target accepted
    accepted: int = 0
    draft_rounds: int = 0  # target calls that verified proposals (each emits 1 to k + 1 ids)
    max_new_tokens: int = 0

    def remaining(self) -> int:
        """New ids the run may still add."""
        return max(self.max_new_tokens - len(self.ids), 0)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def prefill_tokens_per_second(self) -> float | None:
        """Prompt tokens computed per second; None when the prefill computed none (the whole prompt reused)."""
        done = self.prefilled if self.prefilled or self.reused else len(self.prompt_ids)
        return _rate(done, self.prefill_seconds)

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Decode steps per second; None when there was none. The first new token comes from the prefill's
        logits and the decode steps make the rest, so a run of at most one new token has no decode rate."""
        return _rate(max(len(self.ids) - 1, 0), self.decode_seconds)


def _rate(count: int, seconds: float) -> float | None:
    """``count`` per second, or None when nothing was counted or timed (no rate, rather than 0.0 tok/s)."""
    return count / seconds if count and seconds > 0 else None


def last_turn_end(prompt: list[int], stop_ids: Iterable[int]) -> int:
    """Where a hybrid's prompt cache keeps its checkpoint (``prefix.PromptCache.prefill``): the
    number of prompt tokens up to and including the last end-of-generation token (``stop_ids``: a
    chat template's end-of-turn tokens), the end of the last complete message; 0 when none."""
    stops = set(int(t) for t in stop_ids)
    return next((i + 1 for i in range(len(prompt) - 1, -1, -1) if prompt[i] in stops), 0)


def kv_cache_dtype(kv_cache: str):
    """The numpy dtype of a ``--kv-cache`` choice ("f32" or "f16").

    Raises:
        SterError: any other name.
    """
    if not isinstance(kv_cache, str) or kv_cache not in KV_CACHE_DTYPES:
        raise SterError(f"--kv-cache {kv_cache!r} is not a cache type; choose one of "
                        f"{', '.join(KV_CACHE_DTYPES)} (lower case)")
    return KV_CACHE_DTYPES[kv_cache]


def penalize(logits: np.ndarray, history: list[int], sampling: Sampling) -> np.ndarray:
    """Logits float32 [vocab] after the repetition penalty over the last ``repeat_last_n`` ids of
    ``history`` (-1: all of them); a new array, or ``logits`` itself when there is none."""
    n = sampling.repeat_last_n
    if sampling.repeat_penalty == 1.0 or n == 0 or not history:
        return logits
    seen = np.unique(np.asarray(history if n < 0 else history[-n:], dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < logits.shape[0])]
    out = logits.copy()
    # In float64, rounded once to float32 (the same bits as float32 arithmetic for any penalty float32 holds): a
    # penalty beyond float32's range (1e-300, 1e300) sends logits to +-inf, never to NaN; pick_token takes those.
    v, penalty = out[seen].astype(np.float64), float(sampling.repeat_penalty)
    with np.errstate(over="ignore"):
        out[seen] = np.where(v > 0, v / penalty, v * penalty)
    return out


def top_logprobs(logits: np.ndarray, token: int, n: int) -> dict:
    """``{"id", "logprob", "top"}`` of ``token`` under log-softmax(logits) (float64), with the
    ``n`` most likely ids as (id, logprob) pairs, most likely first."""
    z = logits.astype(np.float64)
    z = z - z.max()
    lse = np.log(np.exp(z).sum())
    top = np.argpartition(-z, n - 1)[:n] if 0 < n < z.shape[0] else np.arange(z.shape[0] if n else 0)
    top = top[np.lexsort((top, -z[top]))]
    return {"id": int(token), "logprob": float(z[token] - lse),
            "top": [(int(i), float(z[i] - lse)) for i in top]}


def pick_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """Choose the next id from float32 logits [vocab] under ``sampling`` (the repetition penalty
    is applied before, by ``penalize``)."""
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / max(sampling.temperature, 1e-6)  # tiny temperatures act as greedy
    top = z.max()
    if not np.isfinite(top):  # an extreme repeat_penalty overflowed: the ids at +inf (or all, at -inf) share the mass
        return int(rng.choice(np.flatnonzero(z == top)))
    if sampling.top_k and sampling.top_k < z.shape[0]:
        kth = np.partition(z, -sampling.top_k)[-sampling.top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if sampling.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, sampling.top_p) + 1)]
        mask = np.zeros_like(p)
        mask[keep] = p[keep]
        p = mask / mask.sum()
    if sampling.min_p > 0:
        p = np.where(p >= sampling.min_p * p.max(), p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.shape[0], p=p))


def context_limit(spec, ctx_size: int | None = None) -> float:
    """Positions a sequence may fill: ``ctx_size`` when given, else the model's
    ``max_position_embeddings`` (no limit when a layer rotates with dynamic NTK, which exists to
    run past it).

    Raises:
        SterError: ``ctx_size`` not a whole number (a library caller's "512" or 5.5), below 1, or above the
            model's maximum.
    """
    import numbers

    dynamic = any(layer.rope is not None and layer.rope.dynamic for layer in spec.layers)
    model = float("inf") if dynamic else spec.max_position_embeddings
    if ctx_size is None:
        return model
    if isinstance(ctx_size, bool) or not isinstance(ctx_size, numbers.Integral):
        raise SterError(f"--ctx-size must be a whole number of positions, got {ctx_size!r}")
    if ctx_size < 1:
        raise SterError(f"--ctx-size must be 1 or more, got {ctx_size}")
    if ctx_size > model:
        raise SterError(f"--ctx-size {ctx_size} exceeds the model's maximum of {model} positions; give at most that")
    return ctx_size


def check_prompt_fits(n_prompt: int, spec, ctx_size: int | None = None) -> None:
    """Refuse a prompt of ``n_prompt`` tokens that the context (``context_limit``'s) cannot hold.

    Raises:
        ContextFull: the prompt is longer than the context (the message names both, and ``--ctx-size``
            when it was given); SterError: as ``context_limit``.
    """
    context = context_limit(spec, ctx_size)
    if n_prompt > context:
        raise ContextFull(f"the prompt is {n_prompt} tokens, longer than the context of {context} "
                          "positions; shorten it" + ("" if ctx_size is None else " or raise --ctx-size"))


def generate(decoder: Decoder, prompt_ids: Iterable[int], sampling: Sampling, stop_ids: Iterable[int] | None = (),
             *, on_token: Callable[[int], bool | None] | None = None,
             on_logprobs: Callable[[dict], None] | None = None,
             layer_hook: LayerHook | None = None, kv_cache: str = "f32", cache: PromptCache | None = None,
             cache_key=None, ctx_size: int | None = None, draft=None, n_draft: int | None = None,
             cancelled: Callable[[], bool] | None = None,
             progress: Callable[[str, int, int | None], None] | None = None) -> Generation:
    """Continue ``prompt_ids`` with the decoder.

    Args:
        decoder: the model.
        prompt_ids: int token ids (at least one).
        sampling: decoding settings.
        stop_ids: end-of-generation ids; the stop token is kept in ``ids`` but not streamed. None given
            (or None), the run goes on to ``max_new_tokens`` past any end token: pass ``LoadedModel.stop_ids()``
            (the model's and the tokenizer's end tokens) to stop where ``ster generate`` stops.
        on_token: called with each new id as it is chosen (streaming); a true return value
            stops the run after that id (``stop_reason`` "stopped").
        on_logprobs: with ``sampling.logprobs``, called with each new id's ``logprobs`` entry as it
            is recorded, before ``on_token`` (a stream that sends each piece's logprobs with it).
        layer_hook: passed to every forward call (steering).
        kv_cache: "f32" (exact, the default) or "f16": the dtype keys and values are cached in.
        cache: a ``PromptCache`` to reuse across calls (its longest exact shared prefix is not
            computed again; the reply equals a fresh cache's); None: a fresh cache.
        cache_key: what ``layer_hook`` is, for ``cache`` (equal keys mean equal hooks; a hook without
            one is computed afresh each call).
        ctx_size: positions the prompt and the reply may fill (default: the model's).
        draft: a ``speculative.Drafter``: speculative decoding, whose ids equal greedy decoding's
            (``speculative.py``); ``Generation.drafted`` / ``accepted`` count its proposals.
        n_draft: proposals per round with ``draft`` (default ``speculative.DEFAULT_DRAFT``).
        cancelled: polled between the decoder's layers during the prefill; True ends the run there
            with no ids and ``stop_reason`` "cancelled" (within a layer's time, not after a long
            prompt's whole prefill), the prompt cache left consistent (``PromptCache.prefill``).
            After the prefill, ``on_token`` is how a caller stops the run.
        progress: optional ``progress(f"prefill {n}", done, total)`` after each layer of the prompt's
            prefill (``PromptCache.prefill``): a long prompt's progress, in layers.

    Raises:
        SterError: an empty prompt, ids that are not whole numbers (``as_token_ids``), ``loaded``
            given for ``loaded.decoder``, invalid sampling settings, an unknown ``kv_cache``, a
            ``ctx_size`` above the model's, a prompt longer than the context (``ContextFull``), or
            ``draft`` with a temperature above 0 or ``n_draft`` below 1; a callback that is not callable or
            a ``cache`` that is not a ``PromptCache``; a ``layer_hook`` from ``steering_hook`` whose vector
            names a layer past the model's last or has another width (``check_layer_hook``).
    """
    if not isinstance(sampling, Sampling):
        raise SterError(f"the sampling settings are a Sampling (e.g. Sampling(max_new_tokens=64)), got "
                        f"{type(sampling).__name__}")
    sampling.validate()
    if draft is not None:
        from .speculative import DEFAULT_DRAFT, check_draft_sampling

        check_draft_sampling(sampling)
        n_draft = DEFAULT_DRAFT if n_draft is None else n_draft
        if isinstance(n_draft, bool) or not isinstance(n_draft, int) or not 1 <= n_draft <= 64:
            raise SterError(f"--draft-max must be 1 to 64, got {n_draft}")
    if not hasattr(decoder, "forward") and hasattr(decoder, "decoder"):
        raise SterError("generate takes the model's decoder: pass loaded.decoder, not the loaded model")
    check_callbacks("generate", layer_hook=layer_hook, on_token=on_token, cancelled=cancelled, progress=progress,
                    on_logprobs=on_logprobs)
    if layer_hook is not None:   # a steering vector's layer past the model
        check_layer_hook("generate", layer_hook, decoder.spec)
    if cache is not None and not isinstance(cache, PromptCache):
        raise SterError(f"generate's cache must be a prefix.PromptCache or None, got {type(cache).__name__}")
    kv_dtype = kv_cache_dtype(kv_cache)
    prompt = as_token_ids(prompt_ids, empty_ok=True).tolist()
    stops = set(as_token_ids(() if stop_ids is None else stop_ids, empty_ok=True).tolist())
    if not prompt:
        raise SterError("the prompt encodes to no tokens; give a non-empty prompt")
    rng = np.random.default_rng(sampling.seed)
    out = Generation(prompt_ids=prompt, max_new_tokens=sampling.max_new_tokens)
    context = context_limit(decoder.spec, ctx_size)
    check_prompt_fits(len(prompt), decoder.spec, ctx_size)
    if sampling.max_new_tokens == 0:
        return out
    if cache is None:
        cache = PromptCache(decoder, kv_dtype)
    elif cache.kv_dtype != kv_dtype:
        raise SterError(f"the prompt cache holds {cache.kv_dtype} keys and values, not {kv_cache}'s")
    t0 = time.perf_counter()
    normed: list | None = [] if draft is not None else None
    try:
        logits = cache.prefill(prompt, layer_hook=layer_hook, key=cache_key,
                               checkpoint_at=last_turn_end(prompt, stops), normed=normed, cancelled=cancelled,
                               progress=progress)
    except Cancelled:
        out.stop_reason = "cancelled"
        out.prefill_seconds = time.perf_counter() - t0
        return out
    out.reused, out.prefilled = cache.reused, cache.prefilled
    out.prefill_seconds = time.perf_counter() - t0
    history = list(prompt)

    def choose(logits: np.ndarray, history: list[int]) -> int:
        if not np.isfinite(logits.sum()):  # any NaN or infinity makes the sum non-finite (no mask array)
            raise SterError("the model produced non-finite logits (NaN or infinity): its weights or configuration "
                            "hold non-finite or out-of-range values (with --precision f16, try f32 or bf16"
                            + ("; with --kv-cache f16, keys or values may exceed float16's 65504: try f32"
                               if kv_cache == "f16" else "")
                            + ("; a steering strength this large may overflow the activations: try a smaller one"
                               if layer_hook is not None else "") + ")")
        return pick_token(penalize(bias_logits(logits, sampling), history, sampling), sampling, rng)

    def emit(logits: np.ndarray, token: int) -> str | None:
        """Record ``token``; the reason to stop after it, or None."""
        if sampling.logprobs is not None:
            out.logprobs.append(top_logprobs(logits, token, sampling.logprobs))
            if on_logprobs is not None:
                on_logprobs(out.logprobs[-1])
        out.ids.append(token)
        history.append(token)
        if token in stops:
            return "stop_token"
        if on_token is not None and on_token(token):
            return "stopped"
        if len(out.ids) >= sampling.max_new_tokens:
            return "length"
        return None

    t0 = time.perf_counter()
    if draft is not None:
        from .speculative import speculate

        speculate(decoder, cache.cache, logits, normed[-1][-1], history, draft, n_draft, out, choose=choose,
                  emit=emit, layer_hook=layer_hook, context=context)
        out.decode_seconds = time.perf_counter() - t0
        return out
    while True:
        token = choose(logits, history)
        reason = emit(logits, token)
        if reason is not None:
            out.stop_reason = reason
            break
        if cache.cache.length >= context:
            out.stop_reason = "context"
            break
        logits = decoder.forward([token], cache.cache, layer_hook=layer_hook, last_only=True)[-1]
    out.decode_seconds = time.perf_counter() - t0
    return out
