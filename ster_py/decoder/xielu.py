"""xIELU, an activation with learned parameters per layer (Huang et al. 2024, arXiv:2411.13010).

As Transformers' ``XIELUActivation`` computes it (Apertus): with alpha_p = softplus(a_p)
and alpha_n = beta + softplus(a_n) from the stored a_p, a_n,

    x > 0:  alpha_p * x^2 + beta * x
    else:   (expm1(min(x, eps)) - x) * alpha_n + beta * x
"""
from __future__ import annotations

import numpy as np

from .activations import softplus


class XIELU:
    """The activation of one layer, from its stored alpha_p [1], alpha_n [1], beta [] and eps []."""

    def __init__(self, alpha_p, alpha_n, beta, eps):
        beta_f = float(np.asarray(beta, np.float32).reshape(()))
        self.alpha_p = np.float32(softplus(float(np.asarray(alpha_p, np.float32).reshape(()))))
        self.alpha_n = np.float32(beta_f + softplus(float(np.asarray(alpha_n, np.float32).reshape(()))))
        self.beta = np.float32(beta_f)
        self.eps = np.float32(np.asarray(eps, np.float32).reshape(()))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x float32 [...] -> float32 [...]."""
        positive = self.alpha_p * x * x + self.beta * x
        negative = (np.expm1(np.minimum(x, self.eps)) - x) * self.alpha_n + self.beta * x
        return np.where(x > 0, positive, negative)
