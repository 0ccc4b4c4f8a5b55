"""The sampling loop: prefill the prompt once, then decode one position at a time.

Greedy when temperature is 0; otherwise temperature, top-k then top-p (nucleus,
Holtzman et al. 2019) filtering, sampled from a seeded numpy generator so a run
is reproducible. Generation stops at any end-of-generation token or after
``max_new_tokens``. The KV cache is float32 unless ``kv_cache="f16"`` asks for a
float16 one (half the memory and the bytes read per token; logits move by about
1e-4 to 2e-3 relative on SmolLM2-135M and Gemma 3 270M).

Prompt reuse (``PromptCache``), as seed 000 describes it for hybrids: a recurrent state cannot be
cut back to a shorter prefix, so while prefilling, ``generate`` keeps one checkpoint of the whole
cache right after the prompt's last end-of-turn token (the end of the last complete chat
message). A later call whose prompt starts with those tokens restores the checkpoint and
prefills only what follows; its output equals a cold run's (the same tokens; the logits within
float32 rounding of a prefill in two pieces). Attention-only models take the same path.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from .decoder.cache import CacheCheckpoint, KVCache
from .decoder.model import Decoder, LayerHook
from .errors import SterError


@dataclass(frozen=True)
class Sampling:
    """Decoding settings. temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Raises SterError for values outside their ranges."""
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


@dataclass
class Generation:
    """What a run produced: new token ids, why it stopped, and timings in seconds."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    stop_reason: str = "length"  # "stop_token" | "length" | "context" (the model's context is full)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    reused_tokens: int = 0  # prompt tokens restored from a PromptCache checkpoint, not prefilled

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt_ids) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first new token comes from the prefill's logits; decode steps make the rest.
        steps = max(len(self.ids) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


class PromptCache:
    """One conversation's prompt checkpoint, carried from one ``generate`` call to the next.

    Holds the cache of the last call made with it and one checkpoint of it (seed 000: one slot; a
    new checkpoint replaces the one before), taken after the prompt's last end-of-turn token
    (``generate``'s ``checkpoint_at``). ``tokens`` are the prompt ids the checkpoint covers. The
    checkpoint is used only by a call with the same decoder, ``kv_cache`` and ``layer_hook``
    whose prompt is longer than ``tokens`` and starts with them; any other call runs cold and
    takes a new checkpoint. Memory: the cache's keys and values plus two copies of every
    recurrent state (the live one and the checkpoint's, ``KVCache.nbytes_fixed()`` each).
    """

    def __init__(self):
        self.tokens: tuple[int, ...] = ()
        self._cache: KVCache | None = None
        self._checkpoint: CacheCheckpoint | None = None
        self._key: tuple | None = None

    def clear(self) -> None:
        """Forget the cache and its checkpoint (the next call runs cold)."""
        self.__init__()

    def _resume(self, key: tuple, prompt: list[int]) -> tuple[KVCache | None, int]:
        """(the cache restored to the checkpoint, tokens it covers) when ``prompt`` extends them
        under the same ``key``; else (None, 0)."""
        n = len(self.tokens)
        if (self._checkpoint is None or key != self._key or not 0 < n < len(prompt)
                or tuple(prompt[:n]) != self.tokens):
            return None, 0
        self._cache.restore(self._checkpoint)
        return self._cache, n

    def _keep(self, key: tuple, cache: KVCache, tokens: list[int]) -> None:
        self._key, self._cache, self.tokens = key, cache, tuple(tokens)
        self._checkpoint = cache.checkpoint()


def last_turn_end(prompt: list[int], stop_ids: Iterable[int]) -> int:
    """Where ``generate`` checkpoints by default: the number of prompt tokens up to and including
    the last end-of-generation token (``stop_ids``: a chat template's end-of-turn tokens), 0 when
    the prompt holds none."""
    stops = set(int(t) for t in stop_ids)
    return next((i + 1 for i in range(len(prompt) - 1, -1, -1) if prompt[i] in stops), 0)


KV_CACHE_DTYPES = {"f32": np.float32, "f16": np.float16}


def kv_cache_dtype(kv_cache: str):
    """The numpy dtype of a ``--kv-cache`` choice ("f32" or "f16").

    Raises:
        SterError: any other name.
    """
    if not isinstance(kv_cache, str) or kv_cache not in KV_CACHE_DTYPES:
        raise SterError(f"--kv-cache {kv_cache!r} is not a cache type; choose one of "
                        f"{', '.join(KV_CACHE_DTYPES)} (lower case)")
    return KV_CACHE_DTYPES[kv_cache]


def pick_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """Choose the next id from float32 logits [vocab] under ``sampling``."""
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / max(sampling.temperature, 1e-6)  # tiny temperatures act as greedy
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
    return int(rng.choice(p.shape[0], p=p))


def generate(decoder: Decoder, prompt_ids: Iterable[int], sampling: Sampling, stop_ids: Iterable[int] = (),
             *, on_token: Callable[[int], None] | None = None,
             layer_hook: LayerHook | None = None, kv_cache: str = "f32",
             prompt_cache: PromptCache | None = None, checkpoint_at: int | None = None) -> Generation:
    """Continue ``prompt_ids`` with the decoder.

    Args:
        decoder: the model.
        prompt_ids: int token ids (at least one).
        sampling: decoding settings.
        stop_ids: end-of-generation ids; the stop token is kept in ``ids`` but not streamed.
        on_token: called with each new id as it is chosen (streaming).
        layer_hook: passed to every forward call (steering).
        kv_cache: "f32" (exact, the default) or "f16": the dtype keys and values are cached in.
        prompt_cache: reuse and keep a prompt checkpoint (``PromptCache``): the prompt's prefix it
            covers is restored, not prefilled (``Generation.reused_tokens`` counts it), and a new
            checkpoint is taken at ``checkpoint_at`` when that lies beyond the restored prefix.
        checkpoint_at: how many prompt tokens the checkpoint covers (0 < checkpoint_at <= len(prompt));
            default ``last_turn_end(prompt, stop_ids)``, the end of the last complete message.

    Raises:
        SterError: an empty prompt, invalid sampling settings, an unknown ``kv_cache``, or a
            ``checkpoint_at`` outside 0..len(prompt).
    """
    sampling.validate()
    kv_dtype = kv_cache_dtype(kv_cache)
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise SterError("the prompt encodes to no tokens; give a non-empty prompt")
    stops = set(int(t) for t in stop_ids)
    if checkpoint_at is not None and (isinstance(checkpoint_at, bool) or not isinstance(checkpoint_at, int)
                                      or not 0 <= checkpoint_at <= len(prompt)):
        raise SterError(f"checkpoint_at must be a token count in 0..{len(prompt)} (the prompt's length), "
                        f"got {checkpoint_at!r}")
    rng = np.random.default_rng(sampling.seed)
    out = Generation(prompt_ids=prompt)
    if sampling.max_new_tokens == 0:
        return out
    spec = decoder.spec
    # Dynamic NTK rotation exists to run past max_position_embeddings: no hard limit then.
    dynamic = any(layer.rope is not None and layer.rope.dynamic for layer in spec.layers)
    context = float("inf") if dynamic else spec.max_position_embeddings
    if len(prompt) > context:
        raise SterError(f"the prompt is {len(prompt)} tokens, longer than the model's context of {context} "
                        "positions; shorten it")
    t0 = time.perf_counter()
    key = (decoder, kv_cache, layer_hook)
    cache, start = prompt_cache._resume(key, prompt) if prompt_cache is not None else (None, 0)
    if cache is None:
        # f32 is new_cache's default: the decoder is asked for a dtype only when it is another one
        cache = decoder.new_cache() if kv_dtype is np.float32 else decoder.new_cache(kv_dtype)
    out.reused_tokens = start
    cut = last_turn_end(prompt, stops) if checkpoint_at is None else checkpoint_at
    if prompt_cache is not None and cut > start:  # prefill up to the checkpoint, take it, then the rest
        logits = decoder.forward(prompt[start:cut], cache, layer_hook=layer_hook, last_only=True)[-1]
        prompt_cache._keep(key, cache, prompt[:cut])
        start = cut
    if start < len(prompt):
        logits = decoder.forward(prompt[start:], cache, layer_hook=layer_hook, last_only=True)[-1]
    out.prefill_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    while True:
        if not np.isfinite(logits.sum()):  # any NaN or infinity makes the sum non-finite (no mask array)
            raise SterError("the model produced non-finite logits (NaN or infinity): its weights or configuration "
                            "hold non-finite or out-of-range values (with --precision f16, try f32 or bf16"
                            + ("; with --kv-cache f16, keys or values may exceed float16's 65504: try f32"
                               if kv_cache == "f16" else "")
                            + ("; a steering strength this large may overflow the activations: try a smaller one"
                               if layer_hook is not None else "") + ")")
        token = pick_token(logits, sampling, rng)
        out.ids.append(token)
        if token in stops:
            out.stop_reason = "stop_token"
            break
        if on_token is not None:
            on_token(token)
        if len(out.ids) >= sampling.max_new_tokens:
            break
        if cache.length >= context:
            out.stop_reason = "context"
            break
        logits = decoder.forward([token], cache, layer_hook=layer_hook, last_only=True)[-1]
    out.decode_seconds = time.perf_counter() - t0
    return out
