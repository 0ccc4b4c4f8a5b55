"""The routed feed-forward (mixture of experts): a router picks experts per token.

Shazeer et al. 2017 (sparsely-gated mixture of experts); top-k gating as in Mixtral
(Jiang et al. 2024, arXiv:2401.04088); DeepSeek's sigmoid scores with a selection-only
bias and group-limited choice (DeepSeek-V3 report, arXiv:2412.19437, section 2.1.2).
Every family's router is one ``RouterSpec`` (data) run by ``route``:

1. ``logits = x @ router^T (+ router bias)``, float32 [T, num_experts], optionally
   soft-capped to ``cap * tanh(logits / cap)`` (Laguna's moe_router_logit_softcapping);
2. scores: ``softmax`` over all experts, or ``sigmoid`` of each;
3. choice: the scores plus an optional selection bias (``e_score_correction_bias``:
   it decides which experts, never their weight); with ``n_group`` > 1, only the
   ``topk_group`` groups ranked best (by their best expert, or the sum of their best
   two) compete; the ``top_k`` best are chosen;
4. weights: the chosen experts' scores, renormalised to sum to one when asked (the sum
   raised to at least ``renorm_min``, ERNIE 4.5's clamp, then ``renorm_eps`` added: DeepSeek's
   1e-20), times ``scale`` (``routed_scaling_factor``).

PhiMoE's SparseMixer (Liu et al. 2024, arXiv:2409.12136) replaces steps 2-3 with ``top_k``
rounds (``sparsemixer``); in inference it is deterministic. Each round takes the highest
logit ``m`` among the experts not chosen yet, and weighs it by its softmax over the
unchosen experts j that lie close to it: ``(m - l_j) / max(|l_j|, m) <= 2 * jitter_eps``
(Transformers' ``PhimoeTopKRouter`` outside training, ``sparsemixer``).

The layer's output is the weighted sum of the chosen experts' feed-forwards (Llama 4
weights each expert's *input* instead) plus the shared experts, whose output may be
gated by ``sigmoid(x @ shared_gate^T)`` (Qwen2-MoE), or averaged with the routed sum
(Cohere 2 MoE).

Prefill groups a batch's tokens by expert, so each chosen expert's matrices are read
once per call; a decoded token reads only its chosen experts' rows. Quantized GGUF
experts stay in their blocks (``QuantTensor`` row ranges of the 3-D tensors).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SterError
from ._fast import ops as _ops
from .activations import sigmoid, softmax, softplus
from .ffn import _GLU_KINDS, DenseFFN
from .parts import Part
from .qlinear import QuantLinear

SCORINGS = ("softmax", "sigmoid", "sparsemixer", "sqrtsoftplus")


@dataclass(frozen=True)
class RouterSpec:
    """How a family routes tokens to experts (module docstring, steps 1-4).

    Attributes:
        num_experts: routed experts per layer.
        top_k: experts chosen per token (``num_experts_per_tok``).
        scoring: ``"softmax"`` or ``"sigmoid"`` over the router's logits, or ``"sparsemixer"``
            (PhiMoE: choice and weights by ``sparsemixer``).
        select_bias: a per-expert bias (the ``router_select_bias`` role) is added to the
            scores to choose, not to weigh.
        n_group / topk_group: experts split into ``n_group`` equal groups; only the best
            ``topk_group`` groups take part in the choice.
        group_rank: a group's rank: ``"max"`` (its best expert) or ``"top2"`` (the sum of its best two).
        renormalize: the chosen weights are divided by their sum, raised to at least
            ``renorm_min`` (ERNIE 4.5's ``moe_norm_min``), plus ``renorm_eps``.
        scale: the weights are multiplied by it (``routed_scaling_factor``).
        on_input: each chosen expert reads its weight times x, and its output is summed
            unweighted (Llama 4).
        jitter_eps: ``sparsemixer``'s relative closeness bound (PhiMoE's ``router_jitter_noise``).
        logit_softcap: the router's logits are soft-capped to ``cap * tanh(logits / cap)``
            before scoring (None: not capped).
        hashed: the experts are the token's row of a fixed table (the ``router_hash`` role, [vocab, top_k]:
            DeepSeek-V4's ``tid2eid``), the scores only weigh them.
        sink: the router's last ``sink`` logits score that many shared experts (Inkling's
            ``shared_expert_sink``): the top-k are chosen among the first ``num_experts`` by sigmoid
            plus the selection bias, and every chosen and shared expert is weighed by its sigmoid over
            the sum of theirs, times ``scale``; the shared experts come after the routed ones
            (expert ids num_experts..num_experts + sink - 1, chosen by every token).
    """

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    select_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    group_rank: str = "max"
    renormalize: bool = False
    renorm_eps: float = 0.0
    renorm_min: float = 0.0
    scale: float = 1.0
    on_input: bool = False
    jitter_eps: float = 0.0
    logit_softcap: float | None = None
    hashed: bool = False
    sink: int = 0


@dataclass(frozen=True)
class MoESpec:
    """A routed feed-forward's shape: its router, its experts and its shared experts.

    Attributes:
        router: the ``RouterSpec``.
        expert_size: each routed expert's intermediate width (``moe_intermediate_size``).
        act: the experts' activation (``families.ACTIVATIONS``).
        glu: ``"standard"`` (act(gate) * up) or ``"oai"`` (gpt-oss's clamped unit).
        limit: the routed experts' SwiGLU clamp (``swiglu_limit``), or None.
        shared_limit: the shared experts' clamp, or None.
        clamp_act: the clamp bounds act(gate) from above instead of gate (Step 3.5:
            ``min(silu(gate), limit) * clamp(up, -limit, limit)``).
        alpha: the ``"oai"`` unit's sigmoid sharpness (``swiglu_alpha``; gpt-oss uses 1.702).
        shared_size: total width of the shared experts (0: none).
        shared_gated: the shared experts' output is multiplied by ``sigmoid(shared_gate(x))``.
        shared_average: the routed and the shared experts' outputs are averaged, not summed
            (Cohere 2 MoE's ``shared_expert_combination_strategy`` "average").
        select_bias_optional: a checkpoint may leave the router's selection bias out; it then
            chooses by the scores alone, as with a zero bias (A.X-K1).
        latent_size: the routed experts work in this width: they read ``moe_latent_in(x)`` and
            their weighted sum returns through ``moe_latent_out`` (Nemotron-H's
            ``moe_latent_size``; 0: the model width). The router and shared experts read x.
        identity_experts: the last ones of the router's ``num_experts`` return their input
            (LongCat-Flash's ``zero_expert_num``); they have no weights.
    """

    router: RouterSpec
    expert_size: int
    act: str = "silu"
    glu: str = "standard"
    limit: float | None = None
    alpha: float = 1.702
    shared_size: int = 0
    shared_gated: bool = False
    shared_average: bool = False
    shared_limit: float | None = None
    clamp_act: bool = False
    select_bias_optional: bool = False
    latent_size: int = 0
    identity_experts: int = 0


def identity(x: np.ndarray) -> np.ndarray:
    """An identity expert (LongCat-Flash's zero-computation experts): its output is its input."""
    return x


def _qmatmul():
    from .qlinear import _kernels

    return _kernels()


def _top(x: np.ndarray, k: int) -> np.ndarray:
    """int64 [T, k]: the column indices of each row's k largest values, largest first
    (ties keep the lower index, as torch.topk on CPU does)."""
    if k >= x.shape[1] or x.shape[1] <= 64:  # few columns: one stable sort is the cheaper call
        return np.argsort(-x, axis=1, kind="stable")[:, :k]
    part = np.argpartition(-x, k - 1, axis=1)[:, :k]
    rows = np.arange(x.shape[0])[:, None]  # (plain indexing: take_along_axis costs more per call)
    order = np.argsort(-x[rows, part], axis=1, kind="stable")
    return part[rows, order]


def sparsemixer(logits: np.ndarray, top_k: int, jitter_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """SparseMixer's choice as it runs in inference (module docstring): ``top_k`` rounds, each
    choosing the best expert not chosen yet and weighing it by its softmax over the unchosen
    experts close to it.

    Args:
        logits: float32 [T, num_experts].
        top_k: rounds (experts chosen per token).
        jitter_eps: the closeness bound (``router_jitter_noise``).

    Returns:
        (int64 [T, top_k] expert ids, float32 [T, top_k] weights), in the order chosen.
    """
    rows = np.arange(logits.shape[0])
    left = logits.copy()  # chosen experts drop out as -inf
    ids = np.empty((logits.shape[0], top_k), np.int64)
    weights = np.empty((logits.shape[0], top_k), np.float32)
    bound = np.float32(2 * jitter_eps)
    for r in range(top_k):
        best_id = left.argmax(axis=1)  # the first of equal maxima, as torch.max on CPU
        best = left[rows, best_id][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 and x/0 compare as torch's do
            far = (best - logits) / np.maximum(np.abs(logits), best) > bound
        close = np.where(far, -np.inf, left)
        ids[:, r] = best_id
        weights[:, r] = 1.0 / np.exp(close - best).sum(axis=1)
        left[rows, best_id] = -np.inf
    return ids, weights


def route(spec: RouterSpec, logits: np.ndarray, select_bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The experts each token goes to, and their weights.

    Args:
        spec: the router.
        logits: float32 [T, num_experts], the router's projection of the tokens.
        select_bias: float32 [num_experts] when ``spec.select_bias`` (None there: the scores alone
            choose, as a zero bias would; ``MoESpec.select_bias_optional``).

    Returns:
        (int64 [T, top_k] expert ids, float32 [T, top_k] weights).
    """
    logits = logits.astype(np.float32, copy=False)
    if spec.logit_softcap:
        logits = np.tanh(logits / np.float32(spec.logit_softcap)) * np.float32(spec.logit_softcap)
    if spec.scoring == "sparsemixer":
        ids, weights = sparsemixer(logits, spec.top_k, spec.jitter_eps)
        return ids, _weigh(spec, weights)
    if spec.sink:
        return _route_with_sink(spec, logits, select_bias)
    scores = _score(spec.scoring, logits)
    choice = scores + select_bias.astype(np.float32) if spec.select_bias and select_bias is not None else scores
    if spec.n_group > 1:
        T, E = choice.shape
        groups = choice.reshape(T, spec.n_group, E // spec.n_group)
        if spec.group_rank == "top2":
            best2 = np.sort(groups, axis=-1)[..., -2:]
            rank = best2.sum(axis=-1)
        else:
            rank = groups.max(axis=-1)
        kept = _top(rank, spec.topk_group)
        mask = np.zeros(rank.shape, bool)
        np.put_along_axis(mask, kept, True, axis=1)
        choice = np.where(np.repeat(mask, E // spec.n_group, axis=1), choice, -np.inf)
    ids = _top(choice, spec.top_k)
    return ids, _weigh(spec, scores[np.arange(ids.shape[0])[:, None], ids])


def _score(scoring: str, logits: np.ndarray) -> np.ndarray:
    """float32 scores of float32 logits [T, E]: softmax, sigmoid, or sqrt(softplus) (DeepSeek-V4's ``sqrtsoftplus``)."""
    if scoring == "softmax":
        return softmax(logits)
    if scoring == "sqrtsoftplus":
        return np.sqrt(softplus(logits))
    return sigmoid(logits)


def route_hashed(spec: RouterSpec, logits: np.ndarray, table: np.ndarray, tokens: np.ndarray):
    """Hash routing (``RouterSpec.hashed``): (int64 [T, top_k] = table[tokens], float32 [T, top_k] their scores,
    weighed as ``route`` weighs). tokens int [T]; table int [vocab, top_k]."""
    ids = np.asarray(table[np.asarray(tokens, np.int64)], np.int64)
    scores = _score(spec.scoring, logits.astype(np.float32, copy=False))
    return ids, _weigh(spec, scores[np.arange(ids.shape[0])[:, None], ids])


def _route_with_sink(spec: RouterSpec, logits: np.ndarray, select_bias) -> tuple[np.ndarray, np.ndarray]:
    """``route`` for a router scoring shared experts beside the routed ones (``RouterSpec.sink``):
    (int64 [T, top_k + sink] ids, the shared experts last; float32 [T, top_k + sink] weights).
    Transformers' ``InklingTopkRouter``: exp(logsigmoid - logsumexp(logsigmoid)) is sigmoid over the sum."""
    E, T = spec.num_experts, logits.shape[0]
    scores = sigmoid(logits)
    routed = scores[:, :E]
    choice = routed + select_bias.astype(np.float32) if spec.select_bias and select_bias is not None else routed
    ids = _top(choice, spec.top_k)
    kept = np.concatenate([routed[np.arange(T)[:, None], ids], scores[:, E:E + spec.sink]], axis=1)
    weights = kept / kept.sum(axis=1, keepdims=True) * np.float32(spec.scale)
    ids = np.concatenate([ids, np.broadcast_to(np.arange(E, E + spec.sink), (T, spec.sink))], axis=1)
    return ids, weights.astype(np.float32, copy=False)


def _weigh(spec: RouterSpec, weights: np.ndarray) -> np.ndarray:
    """Step 4: the chosen experts' weights, renormalised and scaled as ``spec`` says (float32 [T, top_k])."""
    if spec.renormalize:
        total = weights.sum(axis=1, keepdims=True)
        if spec.renorm_min:
            total = np.maximum(total, np.float32(spec.renorm_min))
        weights = weights / (total + np.float32(spec.renorm_eps))
    if spec.scale != 1.0:
        weights = weights * np.float32(spec.scale)
    return weights.astype(np.float32, copy=False)


class MoE(Part):
    """A layer's routed feed-forward.

    Args:
        spec: the ``MoESpec``.
        router: the router projection (``make_linear``: [num_experts, hidden_size], optional bias).
        select_bias: float32 [num_experts] (or [1, num_experts], as ERNIE 4.5 stores it) or None.
        experts: one feed-forward per routed expert (``DenseFFN``), each float32 [T, hidden] -> [T, hidden].
        shared: the shared experts as one feed-forward, or None.
        shared_gate: the shared experts' gate projection ([1, hidden_size]) or None.
        latent: (in, out) projections of a model routing in a latent width, or None.

    Experts are not adapter targets: ``ROLES`` is empty, so a LoRA on gate/up/down of
    such a layer is refused by the adapter checks.
    """

    ROLES = ()

    def __init__(self, spec: MoESpec, router, select_bias, experts: list, shared=None, shared_gate=None,
                 latent=None):
        self.spec, self.router, self.experts = spec, router, experts
        self.select_bias = None if select_bias is None else np.asarray(select_bias, np.float32).reshape(-1)
        self.shared, self.shared_gate = shared, shared_gate
        self.latent = latent
        self.hash_table = None  # int [vocab, top_k] of a hashed router (RouterSpec.hashed), set by the builder
        self._fused = None  # (gates, ups, downs, act) for ops.moe_experts, built on first decode

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "experts":  # (an expert's projections are not replaced in place: not adapter targets)
            object.__setattr__(self, "_fused", None)

    def _fused_experts(self):
        """The experts as the kernels take them (``ops.moe_experts``, ``qmatmul.expert_matmul``):
        (gate QMatrix per expert, up ..., down ..., activation kind), or False when the tokens must
        go through the Python loops: unless each expert is a gated ``DenseFFN`` (SiLU or tanh GELU,
        no clamp, no scales) of bias-free ``QuantLinear`` projections, all of one shape, and the
        kernels are built. Built once (again after ``experts`` is set)."""
        if self._fused is None:
            ex, m = self.experts, self.spec
            ok = (_ops is not None and len(ex) > 0 and m.act in _GLU_KINDS and all(
                type(f) is DenseFFN and f.glu == "standard" and f.limit is None and f.act_name == m.act
                and f.gate_scale == 1 and f.out_scale == 1
                and all(type(p) is QuantLinear and p.bias is None for p in (f.gate, f.up, f.down))
                for f in ex))
            if ok:
                shapes = {(f.gate._m.n_rows, f.gate._m.n_cols, f.up._m.n_rows, f.up._m.n_cols,
                           f.down._m.n_rows, f.down._m.n_cols) for f in ex}
                ok = len(shapes) == 1
            object.__setattr__(self, "_fused", (tuple(f.gate._m for f in ex), tuple(f.up._m for f in ex),
                                                tuple(f.down._m for f in ex), _GLU_KINDS[m.act]) if ok else False)
        return self._fused

    def _grouped(self, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, fused: tuple) -> np.ndarray:
        """The prefill loop of ``__call__`` over every expert at once: float32 [T, d] out.

        The tokens' rows are gathered sorted by expert (the loop's order), each projection
        runs over all experts in one threaded job (``qmatmul.expert_matmul``; an expert
        chosen by one token takes the row dots, as ``QuantLinear`` does for one row), and each
        token sums its experts' weighted outputs from zero in ascending expert order, as the
        loop's ``out[tokens] += y`` does: the same float32 values, bit for bit."""
        gates, ups, downs, act = fused
        T, k = ids.shape
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        counts = np.bincount(flat, minlength=len(gates))
        offsets = np.zeros(len(gates) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        w = weights.reshape(-1)[order][:, None]
        xs = x[order // k]
        if self.spec.router.on_input:
            xs = xs * w
        R, F = xs.shape[0], gates[0].n_rows
        g = np.empty((R, F), np.float32)
        u = np.empty((R, F), np.float32)
        y = np.empty((R, downs[0].n_rows), np.float32)
        _qmatmul().expert_matmul((gates, ups), xs, offsets, (g, u))
        singles = np.flatnonzero(counts == 1)
        for e in singles:  # one token: the row dots (QuantLinear's T = 1 path)
            r = offsets[e]
            _qmatmul().matvec_group((gates[e], ups[e]), xs[r:r + 1], (g[r:r + 1], u[r:r + 1]))
        if F % 8 == 0:  # every expert's rows start on a whole 8-float vector: one call, as per expert
            _ops.glu(g, u, act)
        else:
            for e in np.flatnonzero(counts):
                _ops.glu(g[offsets[e]:offsets[e + 1]], u[offsets[e]:offsets[e + 1]], act)
        _qmatmul().expert_matmul((downs,), g, offsets, (y,))
        for e in singles:
            r = offsets[e]
            downs[e].matmul(g[r:r + 1], y[r:r + 1])
        if not self.spec.router.on_input:
            y *= w
        # rows sorted by expert: a token's rows in ascending position are its experts in ascending order
        where = np.empty(R, np.int64)
        where[order] = np.arange(R)
        where = np.sort(where.reshape(T, k), axis=1)
        out = np.zeros((T, y.shape[1]), np.float32)
        for j in range(k):
            out += y[where[:, j]]
        return out

    def route(self, x: np.ndarray, tokens=None) -> tuple[np.ndarray, np.ndarray]:
        """(int64 [T, top_k] expert ids, float32 [T, top_k] weights) for x float32 [T, hidden]
        (``tokens``: the token ids int [T], which a hashed router reads)."""
        if self.hash_table is not None:
            if tokens is None:
                raise SterError("a hash-routed layer needs the token ids")
            return route_hashed(self.spec.router, self.router(x), self.hash_table, tokens)
        return route(self.spec.router, self.router(x), self.select_bias)

    def __call__(self, x: np.ndarray, tokens=None) -> np.ndarray:
        """x float32 [T, hidden_size] -> float32 [T, hidden_size] (``tokens``: ``route``'s)."""
        ids, weights = self.route(x, tokens)
        residual = x
        if self.latent is not None:
            x = self.latent[0](x)
        on_input = self.spec.router.on_input
        fused = (self._fused_experts() if x.__class__ is np.ndarray and x.dtype == np.float32
                 and x.flags.c_contiguous else False)
        if fused and x.shape[0] > 1:
            out = self._grouped(x, ids, weights, fused)  # the prefill loop below, in a few calls
        elif fused and not on_input:
            out = np.zeros(x.shape, np.float32)
            _ops.moe_experts(x, ids[0], weights[0], *fused, out)  # the decode loop below, in one call
        elif x.shape[0] == 1:  # decoding: the chosen experts in turn
            out = np.zeros(x.shape, np.float32)
            for e, w in zip(ids[0], weights[0]):
                y = self.experts[e](x * w) if on_input else self.experts[e](x) * w
                out += y
        else:  # prefill: each chosen expert once, over the tokens that chose it
            out = np.zeros(x.shape, np.float32)
            flat = ids.reshape(-1)
            order = np.argsort(flat, kind="stable")
            experts, starts = np.unique(flat[order], return_index=True)
            ends = np.append(starts[1:], flat.size)
            for e, a, b in zip(experts, starts, ends):
                sel = order[a:b]
                tokens = sel // ids.shape[1]
                w = weights.reshape(-1)[sel][:, None]
                xe = x[tokens]
                y = self.experts[e](xe * w) if on_input else self.experts[e](xe) * w
                out[tokens] += y   # a token chooses an expert at most once: no repeated rows
        if self.latent is not None:
            out = self.latent[1](out)
        x = residual
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = s * sigmoid(self.shared_gate(x))
            out += s
            if self.spec.shared_average:
                out *= np.float32(0.5)
        return out

    def read_order(self) -> list[tuple]:
        return []  # which experts come next is known only once the router has run
