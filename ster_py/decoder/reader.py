"""A stack that reads another decoder's state: a drafter without keys and values of its own.

Multi-token-prediction drafters such as Gemma 4's assistant keep no cache. For the pending token at
position p of the target's sequence, one step computes::

    x      = target.embed_tokens([token])              # the target's scaled embedding, [1, Hb]
    h      = pre_projection([x ; hidden])              # [1, 2 Hb] -> [1, H]
    h      = layers(h)   # each layer's queries at position p attend over the target's keys and values
                         # at positions 0..p-1 of the target layer it reads (``sources``), window included
    normed = final_norm(h)
    logits = head(normed)                              # no soft-cap
    hidden = post_projection(normed)                   # [1, Hb]: the next step's hidden

where ``hidden`` is first the target's final-norm output at position p - 1 and then the previous
step's. Every step stays at position p (Transformers' ``Gemma4AssistantForCausalLM`` and its
``SinglePositionMultiTokenCandidateGenerator``; llama.cpp's ``src/models/gemma4-assistant.cpp``).
Its layers are ordinary blocks whose mixer has a ``LayerSpec.kv_source``; the target's cache is
lent to them through ``TargetView``, which maps each layer to its source and shows only the
committed positions.
"""
from __future__ import annotations

import numpy as np

from .linear import make_linear


class TargetView:
    """The target's ``KVCache`` as a drafter layer sees it: ``buffers(i, end)`` gives the keys and
    values of target layer ``sources[i]`` at positions 0..length-1 (never the unwritten rows), so a
    query at position ``length`` attends over exactly the committed positions."""

    def __init__(self, cache, sources: list[int]):
        self.cache, self.sources, self.length = cache, sources, cache.length

    def buffers(self, layer: int, end: int):
        k, v = self.cache.buffers(self.sources[layer], self.length)
        return k[:, :self.length], v[:, :self.length]


class CacheReader:
    """A drafter reading a target decoder's state (module docstring).

    Args:
        decoder: the drafter's own ``model.Decoder`` (its layers' mixers all have a ``kv_source``;
            its embedding table is its tied head).
        pre: float [H, 2 * Hb] pre-projection; post: float [Hb, H] post-projection.
        target: the target ``model.Decoder`` (its embedding and its cache are read).
        sources: per drafter layer, the target layer whose keys and values it reads.
    """

    def __init__(self, decoder, pre, post, target, sources: list[int]):
        self.decoder, self.target, self.sources = decoder, target, list(sources)
        self.pre, self.post = make_linear(pre), make_linear(post)

    def step(self, token: int, hidden: np.ndarray, cache) -> tuple[np.ndarray, np.ndarray]:
        """One draft step at position ``cache.length`` (the pending token's).

        Args:
            token: the last id (the pending one, then each draft).
            hidden: float32 [Hb]: the target's final-norm output before ``token``, then the previous
                step's post-projected output.
            cache: the target's ``KVCache`` (read, never written).

        Returns:
            (logits float32 [vocab], hidden float32 [Hb]).
        """
        view = TargetView(cache, self.sources)
        x = self.target.embed_tokens(np.array([token]))
        h = self.pre(np.ascontiguousarray(np.concatenate([x, np.asarray(hidden, np.float32)[None]], axis=1)))
        positions = np.array([cache.length], dtype=np.int64)
        tables: dict = {}
        for layer in self.decoder.layers:
            h = layer(h, view, positions, None, tables)
        normed = self.decoder.final_norm(h)
        return self.decoder.head(normed)[0], self.post(normed)[0]
