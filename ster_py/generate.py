"""The sampling loop: prefill the prompt once, then decode one position at a time.

Greedy when temperature is 0; otherwise temperature, top-k then top-p (nucleus,
Holtzman et al. 2019) filtering, sampled from a seeded numpy generator so a run
is reproducible. Generation stops at any end-of-generation token or after
``max_new_tokens``. The KV cache is float32 unless ``kv_cache="f16"`` asks for a
float16 one (half the memory and the bytes read per token; logits move by about
1e-4 to 2e-3 relative on SmolLM2-135M and Gemma 3 270M).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

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

    @property
    def prefill_tokens_per_second(self) -> float:
        return len(self.prompt_ids) / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        # The first new token comes from the prefill's logits; decode steps make the rest.
        steps = max(len(self.ids) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


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
             layer_hook: LayerHook | None = None, kv_cache: str = "f32") -> Generation:
    """Continue ``prompt_ids`` with the decoder.

    Args:
        decoder: the model.
        prompt_ids: int token ids (at least one).
        sampling: decoding settings.
        stop_ids: end-of-generation ids; the stop token is kept in ``ids`` but not streamed.
        on_token: called with each new id as it is chosen (streaming).
        layer_hook: passed to every forward call (steering).
        kv_cache: "f32" (exact, the default) or "f16": the dtype keys and values are cached in.

    Raises:
        SterError: an empty prompt, invalid sampling settings, or an unknown ``kv_cache``.
    """
    sampling.validate()
    kv_dtype = kv_cache_dtype(kv_cache)
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise SterError("the prompt encodes to no tokens; give a non-empty prompt")
    stops = set(int(t) for t in stop_ids)
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
    # f32 is new_cache's default: the decoder is asked for a dtype only when it is another one
    cache = decoder.new_cache() if kv_dtype is np.float32 else decoder.new_cache(kv_dtype)
    t0 = time.perf_counter()
    logits = decoder.forward(prompt, cache, layer_hook=layer_hook, last_only=True)[-1]
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
