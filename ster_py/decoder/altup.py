"""Residual-stream extras of Gemma 3n: AltUp's copies of the stream and Laurel's low-rank residual.

AltUp (Alternating Updates, Baykal et al., NeurIPS 2023) carries ``n`` copies of the hidden state
through the layers. Only the first is the block's input; the others are predicted from all copies
before the block and corrected by the block's change after it. Laurel (Learned Augmented Residual
Layer, Menghani et al. 2024) adds a rank-r linear map of the block's normed input to the stream.
The math follows Transformers' ``Gemma3nTextAltUp``, ``Gemma3nTextLaurelBlock`` and
``Gemma3nTextModel.forward``; nothing here names a family.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The floor under a copy's mean square before its root rescales it (Transformers' clamp).
_MAGNITUDE_FLOOR = np.float32(1e-5)


@dataclass(frozen=True)
class AltUpSpec:
    """AltUp's settings (``ModelSpec.altup``).

    ``num_inputs``: copies of the stream (Gemma 3n's altup_num_inputs, the first being the block's
    input); ``correct_scale``: the first corrected copy is multiplied by the layer's
    ``correct_output_scale`` [hidden] before it gates the per-layer input (altup_correct_scale).
    """

    num_inputs: int
    correct_scale: bool = True


def _rms(x: np.ndarray) -> np.ndarray:
    """float32 [..., T, 1]: root mean square of each row of x float32 [..., T, d]."""
    return np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32))


def rescaled(x: np.ndarray, target: np.ndarray) -> np.ndarray:
    """x float32 [T, d] with each row scaled to root mean square ``target`` float32 [T, 1]
    (x's own root mean square floored at sqrt(1e-5))."""
    mine = np.sqrt(np.maximum(np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32), _MAGNITUDE_FLOOR))
    return x * target / mine


def expand(h: np.ndarray, projections) -> list[np.ndarray]:
    """The copies AltUp starts from: h float32 [T, d] (the scaled embeddings), then each
    ``projections[j](h)`` rescaled to h's root mean square per token -> n arrays float32 [T, d]."""
    target = _rms(h)
    return [h] + [rescaled(p(h), target) for p in projections]


def collapse(copies: list[np.ndarray], projections) -> np.ndarray:
    """The stream the final norm reads: copies[0], and each later copy through its
    ``projections[j - 1]`` (altup_unembed_projections) rescaled to copies[0]'s root mean square,
    averaged -> float32 [T, d]."""
    target = _rms(copies[0])
    total = copies[0].copy()
    for c, p in zip(copies[1:], projections):
        total += rescaled(p(c), target)
    return total / np.float32(len(copies))


class AltUp:
    """One layer's prediction and correction of the n copies (Transformers' ``Gemma3nTextAltUp``).

    Args:
        spec: the ``AltUpSpec``; hidden: the stream's width.
        router: the modality router (a linear, [n, hidden]); router_norm: its ``Norm``.
        prediction: float32 [n * n, n] (prediction_coefs); correction: float32 [n, n] (correction_coefs).
        output_scale: float32 [hidden] (correct_output_scale) or None.
    """

    def __init__(self, spec: AltUpSpec, hidden: int, router, router_norm, prediction, correction, output_scale):
        self.spec, self.router, self.router_norm = spec, router, router_norm
        self.prediction = np.asarray(prediction, dtype=np.float32)
        self.correction = np.asarray(correction, dtype=np.float32)
        self.output_scale = None if output_scale is None else np.asarray(output_scale, dtype=np.float32)
        self._router_scale = np.float32(1.0 / hidden)

    def _modalities(self, x: np.ndarray) -> np.ndarray:
        """float32 [T, n]: tanh(router(router_norm(x) / hidden)) for x float32 [T, hidden]."""
        return np.tanh(self.router(self.router_norm(x) * self._router_scale))

    def predict(self, copies: list[np.ndarray]) -> list[np.ndarray]:
        """n arrays float32 [T, d] -> their predictions: copy i + sum_j C[t, i, j] * copy j, with
        C[t] the token's [n, n] coefficients (prediction_coefs of the first copy's modalities)."""
        n = self.spec.num_inputs
        coefs = (self._modalities(copies[0]) @ self.prediction.T).reshape(-1, n, n)  # [T, i, j]
        stacked = np.stack(copies)  # [n, T, d]
        mixed = np.einsum("tij,jtd->itd", coefs, stacked, dtype=np.float32)
        return list(stacked + mixed)

    def correct(self, predictions: list[np.ndarray], activated: np.ndarray) -> list[np.ndarray]:
        """Each prediction plus (activated - predictions[0]) times (its correction coefficient + 1),
        the coefficients from ``activated``'s modalities; activated float32 [T, d] is the block's output."""
        coefs = self._modalities(activated) @ self.correction.T + np.float32(1.0)  # [T, n]
        change = activated - predictions[0]
        return [p + change * coefs[:, i:i + 1] for i, p in enumerate(predictions)]

    def scaled_first(self, first: np.ndarray) -> np.ndarray:
        """The first corrected copy as it gates the per-layer input (times correct_output_scale)."""
        return first * self.output_scale if self.spec.correct_scale else first


class Laurel:
    """Laurel's residual on a normed input x float32 [T, d]: x + post_norm(right(left(x)))
    (Transformers' ``Gemma3nTextLaurelBlock``); left [r, d], right [d, r] are linears."""

    def __init__(self, left, right, post_norm):
        self.left, self.right, self.post_norm = left, right, post_norm

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x + self.post_norm(self.right(self.left(x)))
