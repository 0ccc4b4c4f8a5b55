"""Hyper-connections: several residual streams, mixed before and after each sublayer.

Hyper-Connections (Zhu et al., arXiv:2409.19606) and their manifold-constrained form (mHC: Xie et
al., 2026, DeepSeek-V4); Transformers' ``DeepseekV4HyperConnection`` / ``HYV4HyperConnection`` and
their ``HyperHead``. The residual is n streams H [T, n, d] instead of one [T, d]. Before each
sublayer (attention, feed-forward) a hyper-connection reads the streams flattened, x = H [T, n*d],
RMS-normed without a scale (the model's ``rms_norm_eps``), through one projection ``fn``
[k, n*d] with a bias ``base`` [k] and one scale per output kind (``scale``)::

    m    = (x @ fn^T) / sqrt(mean(x^2) + eps_norm)             [T, k]
    pre  = sigmoid(m[:, :n] * scale[0] + base[:n]) + eps        [T, n]   collapses the streams
    post = magnitude * sigmoid(m[:, n:2n] * scale[1] + base[n:2n]) + post_eps   spreads the output
    comb = Sinkhorn(softmax(m[:, 2n:] * scale[2] + base[2n:]) + eps)   [T, n, n] (only with comb)

    sublayer input  = sum_j pre_j * H_j
    new H_k         = post_k * sublayer output + (sum_j comb_jk * H_j   |   H_k without comb)

Sinkhorn-Knopp (``sinkhorn_iters`` rounds, DeepSeek-V4): the columns divided by their sums (+ eps),
then ``iters - 1`` times the rows and again the columns, so comb is (nearly) doubly stochastic.
Without comb (HY V4's independent hyper-connections, k = 2n) each stream keeps itself.

The head (``hc_head``: fn [n, n*d], base [n], scale [1]) collapses the last streams before the final
norm with weights sigmoid(m * scale + base) + eps, or the streams are averaged (``head="mean"``).

What ster reads and steers of the streams is their mean (seed 002): ``--layer`` captures it, and a
steering vector added to it is added to every stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .activations import sigmoid, softmax


@dataclass(frozen=True)
class StreamsSpec:
    """The residual streams of a model with hyper-connections (module docstring).

    Attributes:
        n: the number of streams (``hc_mult``).
        magnitude: ``post`` is magnitude * sigmoid(...) (``hc_magnitude``; DeepSeek-V4 fixes 2).
        post_eps: added to ``post`` (HY V4 adds ``hc_eps``; DeepSeek-V4 nothing).
        eps: added to ``pre`` (and comb), and Sinkhorn's divisor epsilon (``hc_eps``).
        norm_eps: epsilon of the weightless RMS norm over the flattened streams (``rms_norm_eps``).
        sinkhorn_iters: 0 for no comb (independent hyper-connections), else the Sinkhorn-Knopp rounds
            of the comb matrix (``hc_sinkhorn_iters``).
        head: ``"weighted"`` (the ``hc_head`` roles collapse the streams) or ``"mean"``.
    """

    n: int
    magnitude: float = 2.0
    post_eps: float = 0.0
    eps: float = 1e-6
    norm_eps: float = 1e-6
    sinkhorn_iters: int = 0
    head: str = "weighted"

    @property
    def outputs(self) -> int:
        """Rows of a sublayer hyper-connection's ``fn``: pre and post (n each), and comb (n * n)."""
        return 2 * self.n + (self.n * self.n if self.sinkhorn_iters else 0)

    def tensor_shapes(self, hidden: int) -> dict[tuple[str, str], tuple[int, ...]]:
        """(role, kind) -> shape of the hyper-connection tensors (whole names, kind "")."""
        k, n, w = self.outputs, self.n, self.n * hidden
        out = {("hc_head_fn", ""): (n, w), ("hc_head_base", ""): (n,), ("hc_head_scale", ""): (1,)}
        for part in ("attn", "ffn"):
            out.update({(f"hc_{part}_fn", ""): (k, w), (f"hc_{part}_base", ""): (k,),
                        (f"hc_{part}_scale", ""): (3 if self.sinkhorn_iters else 2,)})
        return out


def _mixes(streams: np.ndarray, fn: np.ndarray, norm_eps: float) -> np.ndarray:
    """float32 [T, k]: the flattened streams [T, n, d] through ``fn`` [k, n*d], RMS-normed (no scale)."""
    flat = streams.reshape(streams.shape[0], -1)
    inv = np.float32(1) / np.sqrt(np.mean(np.square(flat), axis=-1, keepdims=True) + np.float32(norm_eps))
    return (flat @ fn.T) * inv


class HyperConnection:
    """One sublayer's hyper-connection (module docstring).

    Args:
        spec: the ``StreamsSpec``.
        fn: float [k, n * hidden]; base: float [k]; scale: float [2] (pre, post) or [3] (and comb).
    """

    def __init__(self, spec: StreamsSpec, fn, base, scale):
        self.spec = spec
        self.fn = np.ascontiguousarray(np.asarray(fn, np.float32))
        self.base = np.asarray(base, np.float32).reshape(-1)
        self.scale = np.asarray(scale, np.float32).reshape(-1)

    def __call__(self, streams: np.ndarray):
        """streams float32 [T, n, d] -> (sublayer input float32 [T, d], post [T, n], comb [T, n, n] or None)."""
        s, n = self.spec, self.spec.n
        m = _mixes(streams, self.fn, s.norm_eps)
        pre = sigmoid(m[:, :n] * self.scale[0] + self.base[:n]) + np.float32(s.eps)
        post = np.float32(s.magnitude) * sigmoid(m[:, n:2 * n] * self.scale[1] + self.base[n:2 * n])
        if s.post_eps:
            post = post + np.float32(s.post_eps)
        comb = None
        if s.sinkhorn_iters:
            logits = (m[:, 2 * n:] * self.scale[2] + self.base[2 * n:]).reshape(-1, n, n)
            comb = softmax(logits) + np.float32(s.eps)
            eps = np.float32(s.eps)
            comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
            for _ in range(s.sinkhorn_iters - 1):
                comb = comb / (comb.sum(axis=-1, keepdims=True) + eps)
                comb = comb / (comb.sum(axis=-2, keepdims=True) + eps)
            comb = comb.astype(np.float32)
        x = np.einsum("tn,tnd->td", pre, streams).astype(np.float32)
        return x, post.astype(np.float32), comb

    @staticmethod
    def join(streams: np.ndarray, out: np.ndarray, post: np.ndarray, comb) -> np.ndarray:
        """The new streams float32 [T, n, d]: post [T, n] times the sublayer's output [T, d], plus the
        incoming streams [T, n, d] (mixed by comb [T, n, n], new_k = sum_j comb_jk H_j, where there is one)."""
        kept = streams if comb is None else np.einsum("tjk,tjd->tkd", comb, streams)
        return (post[:, :, None] * out[:, None, :] + kept).astype(np.float32)


class HyperHead:
    """The last streams' collapse before the final norm (module docstring).

    Args:
        spec: the ``StreamsSpec``.
        fn, base, scale: float [n, n * hidden], [n], [1] (``head="weighted"``), or None (``"mean"``).
    """

    def __init__(self, spec: StreamsSpec, fn=None, base=None, scale=None):
        self.spec = spec
        self.fn = None if fn is None else np.ascontiguousarray(np.asarray(fn, np.float32))
        self.base = None if base is None else np.asarray(base, np.float32).reshape(-1)
        self.scale = None if scale is None else np.asarray(scale, np.float32).reshape(-1)

    def __call__(self, streams: np.ndarray) -> np.ndarray:
        """streams float32 [T, n, d] -> float32 [T, d]."""
        if self.fn is None:
            return streams.mean(axis=1).astype(np.float32)
        m = _mixes(streams, self.fn, self.spec.norm_eps)
        pre = sigmoid(m * self.scale[0] + self.base) + np.float32(self.spec.eps)
        return np.einsum("tn,tnd->td", pre, streams).astype(np.float32)
