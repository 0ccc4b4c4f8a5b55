"""Value experts (K2-Horizon's MoVA, seed 002): a layer's values from routed experts instead of v_proj.

Each token's value is sum_j w_j * silu(E_j x) over the ``top_k`` value experts E_j its router
(``self_attn.v_router``) chooses, chosen and weighted as the model's feed-forward router does
(``ModelSpec.value_router``, a ``RouterSpec``: the same scoring, selection bias, renormalisation and
scale; ``moe.route``). ``value_experts_reference`` is the plain per-token definition the grouped loop
of ``ValueExperts`` is tested against.
"""
from __future__ import annotations

import numpy as np

from .activations import silu
from .moe import RouterSpec, route


class ValueExperts:
    """A layer's value experts.

    Args:
        spec: the value router (``ModelSpec.value_router``).
        router: the router projection (``make_linear``: [num_experts, hidden_size]).
        select_bias: float32 [num_experts] added to the scores to choose (``spec.select_bias``), or None.
        experts: one projection per expert, each float32 [T, hidden_size] -> [T, kv_heads * head_dim].
    """

    def __init__(self, spec: RouterSpec, router, select_bias, experts: list):
        self.spec, self.router, self.experts = spec, router, experts
        self.select_bias = None if select_bias is None else np.asarray(select_bias, np.float32).reshape(-1)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x float32 [T, hidden_size] (the attention's normed input) -> values float32 [T, kv_heads * head_dim]."""
        ids, weights = route(self.spec, self.router(x), self.select_bias)
        out = None
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        chosen, starts = np.unique(flat[order], return_index=True)
        ends = np.append(starts[1:], flat.size)
        for e, a, b in zip(chosen, starts, ends):  # each chosen expert once, over the tokens that chose it
            sel = order[a:b]
            tokens = sel // ids.shape[1]
            y = silu(self.experts[e](np.ascontiguousarray(x[tokens]))) * weights.reshape(-1)[sel][:, None]
            if out is None:
                out = np.zeros((x.shape[0], y.shape[1]), np.float32)
            out[tokens] += y  # a token chooses an expert at most once
        return out


def value_experts_reference(spec: RouterSpec, router_w: np.ndarray, select_bias, experts_w: list,
                            x: np.ndarray) -> np.ndarray:
    """The numpy definition, token by token (float64): sum_j w_j * silu(E_j x) over the chosen experts."""
    ids, weights = route(spec, (x @ router_w.T).astype(np.float32), select_bias)
    out = np.zeros((x.shape[0], experts_w[0].shape[0]))
    for t in range(x.shape[0]):
        for e, w in zip(ids[t], weights[t]):
            out[t] += w * silu(experts_w[e].astype(np.float64) @ x[t].astype(np.float64))
    return out
