"""Looped decoders: stored layers run more than once (seed 002, "Looped models").

A looped model's layers are the layers it *executes*, every pass's: a model of n stored layers run
twice has 2n layers here, each with its own cache slot, its own steering and capture index and its
own ``LayerSpec``; ``LayerSpec.stored`` names the stored layer whose weights it reads (the ``{i}``
of its tensor names) and ``LayerSpec.stack`` the stack it comes from (the ``{stack}`` of its names,
for models that store more than one stack of layers). ``LoopSpec`` says how the passes join:

- the model keeps ``states`` running streams; the first starts as the (scaled) embeddings, each
  other one as the stored vector of role ``init`` (broadcast over the positions);
- a pass reads the sum of the states, runs its layers ``[start, stop)`` as one residual stream,
  ends in the model's final norm when ``Pass.norm``, and replaces the state ``Pass.state``;
- after the last pass, state 0 goes through the model's final norm and head.

One stream (Nanbeige, IQuest-LoopCoder): each pass continues the last, with the final norm between
passes unless the config skips it. Two streams run in cycles (HRM-Text): the low stack's passes
replace the low state, the high stack's the high state, each reading both summed.
This module holds data only; ``model.Decoder.forward`` runs it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pass:
    """One run of a stack of stored layers: the executed layers ``[start, stop)``, the state it
    replaces (``state``), and whether the model's final norm closes it (``norm``)."""

    start: int
    stop: int
    state: int = 0
    norm: bool = False


@dataclass(frozen=True)
class LoopSpec:
    """How a looped model's passes join (see the module docstring).

    ``passes``: every pass, in the order they run, covering the executed layers once each;
    ``states``: how many running streams; ``init``: the role of the stored vector [hidden] the
    streams after the first start from (None: zeros).
    """

    passes: tuple[Pass, ...]
    states: int = 1
    init: str | None = None


def repeated(n_stored: int, loops: int, norm_between: bool) -> LoopSpec:
    """``loops`` passes over the same ``n_stored`` layers, one stream, each pass but the last closed
    by the final norm when ``norm_between`` (Nanbeige's loop, unless skip_loop_final_norm)."""
    return LoopSpec(tuple(Pass(j * n_stored, (j + 1) * n_stored, 0, norm_between and j < loops - 1)
                          for j in range(loops)))
