"""``ster perplexity``: how well a model predicts a text, and how far it is from a reference model.

The windows are llama.cpp's ``llama-perplexity`` ones (tools/perplexity/perplexity.cpp), so the
numbers compare with llama.cpp's: the whole text is tokenized once (BOS in front when the model's
tokenizer adds one; special-token texts inside it read as plain text); it is cut into ``len(ids) // n_ctx`` non-overlapping windows of ``n_ctx``
tokens (the tail is dropped; at least two windows are needed); each window runs from an empty cache
with its first token replaced by BOS when the tokenizer adds one; only the second half is scored:
the logits at positions ``n_ctx / 2 .. n_ctx - 2`` against the next token. Perplexity is
``exp(mean NLL)``; its uncertainty is ``ppl * sqrt(var(NLL) / (count - 1))``.

With a reference model (same tokenization required) every scored position also gives, from the two
log-softmaxes (float64): the KL divergence ``sum p_ref (log p_ref - log p)``, the change in the
probability of the true next token ``Δp = p - p_ref``, and whether both rank the same token first
(llama-perplexity's ``--kl-divergence`` statistics: mean KLD, RMS Δp, "same top").
"""
from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from .errors import SterError

Progress = Callable[[str, int, "int | None"], None]

#: Positions whose logits are computed at once (bounds the logits in memory to batch x vocabulary).
BATCH = 64


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    return tokenizer.encode("x", add_special_tokens=True)[:1] == [bos] != tokenizer.encode("x", add_special_tokens=False)[:1]


def text_ids(tokenizer, text: str) -> list[int]:
    """The text's ids as llama-perplexity tokenizes it: special tokens added (BOS) but special-token texts
    in the text read as plain text (llama.cpp's ``parse_special`` off)."""
    tk = tokenizer.tk
    before = tk.encode_special_tokens
    tk.encode_special_tokens = True
    try:
        return tokenizer.encode(text, add_special_tokens=True)
    finally:
        tk.encode_special_tokens = before


def _check_count(value, option: str, none_ok: bool = False) -> None:
    """Refuse a library caller's count that is not a whole number (``n_ctx="512"``, 64.0, True, None): each was a
    TypeError from a comparison or a slice, or read True as 1."""
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SterError(f"{option} must be a whole number, got {value!r}")


def windows(ids: list[int], n_ctx: int, bos: int | None, max_chunks: int | None = None) -> list[np.ndarray]:
    """llama-perplexity's windows: int64 [n_ctx] each, the first token replaced by ``bos`` when given.

    Raises:
        SterError: ``n_ctx`` or ``max_chunks`` not a whole number, ``n_ctx`` below 8 or odd, or fewer than
            ``2 * n_ctx`` tokens.
    """
    _check_count(n_ctx, "--ctx")
    _check_count(max_chunks, "--chunks", none_ok=True)
    if n_ctx < 8 or n_ctx % 2:
        raise SterError(f"--ctx {n_ctx} must be an even number of at least 8 tokens")
    if len(ids) < 2 * n_ctx:
        count = f"{len(ids)} token" + ("" if len(ids) == 1 else "s")
        raise SterError(f"the text tokenizes to {count}; perplexity over windows of --ctx {n_ctx} needs "
                        f"at least {2 * n_ctx} (two windows, as llama-perplexity); give a longer text or a smaller "
                        "--ctx")
    n = len(ids) // n_ctx
    if max_chunks is not None:
        if max_chunks < 1:
            raise SterError(f"--chunks must be at least 1, got {max_chunks}")
        n = min(n, max_chunks)
    out = []
    for c in range(n):
        w = np.asarray(ids[c * n_ctx:(c + 1) * n_ctx], dtype=np.int64)
        if bos is not None:
            w[0] = bos
        out.append(w)
    return out


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    return x - (top + np.log(np.exp(x - top).sum(axis=1, keepdims=True)))


def _scored_logprobs(decoder, window: np.ndarray, first: int, batch: int, whose: str = "the model"):
    """Log-probabilities (float64 [rows, vocab]) at positions first .. n_ctx - 2, in pieces; a NaN or infinite
    logit (which made the perplexity "nan" and --json's document invalid JSON) is refused naming ``whose``."""
    cache = decoder.new_cache()
    decoder.forward(window[:first], cache, last_only=True)
    end = len(window) - 1
    for a in range(first, end, batch):
        b = min(end, a + batch)
        logits = decoder.forward(window[a:b], cache)
        if not np.isfinite(logits.sum()):  # any NaN or infinity makes the sum non-finite (as generate checks)
            raise SterError(f"{whose} produced non-finite logits (NaN or infinity): its weights or configuration "
                            "hold non-finite or out-of-range values (with --precision f16, try f32 or bf16)")
        yield a, _log_softmax(logits)


def _ppl(nll: float, whose: str = "the model") -> float:
    """exp(``nll``), refused when it is past a float's range (a mean NLL above ~709 nats: an OverflowError
    traceback before)."""
    try:
        return math.exp(nll)
    except OverflowError:
        raise SterError(f"{whose} scores the text at {nll:.4g} nats per token, so its perplexity exp({nll:.4g}) is "
                        "beyond a float's range: its weights or configuration hold out-of-range values") from None


def _mean_unc(s: float, s2: float, n: int) -> tuple[float, float]:
    mean = s / n
    var = s2 / n - mean * mean
    return mean, math.sqrt(var / (n - 1)) if var > 0 and n > 1 else 0.0


def perplexity(loaded, text: str, n_ctx: int = 512, *, reference=None, max_chunks: int | None = None,
               batch: int = BATCH, progress: Progress | None = None) -> dict:
    """Perplexity of ``loaded`` on ``text`` over llama-perplexity's windows, and with ``reference`` (a second
    ``LoadedModel``, same tokenizer) the divergence statistics.

    Args:
        loaded: the model (``load.LoadedModel``).
        text: the text (tokenized whole).
        n_ctx: window length in tokens (even, >= 8); the second half of each window is scored.
        reference: optional reference model.
        max_chunks: score at most this many windows (default: all).
        batch: positions whose logits are computed together.
        progress: optional ``progress("perplexity", windows done, windows)``.

    Returns:
        {"ppl", "ppl_uncertainty", "nll_mean", "tokens" (scored), "chunks", "n_ctx", "text_tokens", "add_bos",
        "per_chunk_ppl"} and, with a reference, {"reference_ppl", "ppl_ratio", "kld_mean", "kld_uncertainty",
        "kld_median", "kld_99", "kld_max", "dp_mean", "dp_uncertainty", "dp_rms", "same_top"} (probabilities as
        fractions, not percent).

    Raises:
        SterError: ``loaded`` or ``reference`` not a loaded model, ``n_ctx``, ``max_chunks`` or ``batch`` not a
            whole number, a text too short for two windows, a bad ``n_ctx`` or one past a model's
            ``max_position_embeddings``, or a reference whose tokenizer gives other
            ids for the text or whose vocabulary differs in size.
    """
    from .decoder.model import check_callbacks
    from .generate import context_limit

    for model, what in ((loaded, "perplexity"), (reference, "perplexity's reference")):
        if (model is not None or what == "perplexity") and not all(
                hasattr(model, k) for k in ("decoder", "tokenizer", "spec")):   # a path given for a loaded model
            raise SterError(f"{what} takes a loaded model (load_model(...)), got {type(model).__name__}")
    _check_count(n_ctx, "--ctx")
    _check_count(max_chunks, "--chunks", none_ok=True)
    _check_count(batch, "perplexity's batch")
    if batch < 1:
        raise SterError(f"perplexity's batch must be 1 or more, got {batch}")
    check_callbacks("perplexity", progress=progress)
    for model in (loaded, reference):  # as generate's --ctx-size: no window past the model's positions
        if model is not None and n_ctx > context_limit(model.spec):
            raise SterError(f"--ctx {n_ctx} exceeds the{' reference' if model is reference else ''} model's maximum "
                            f"of {model.spec.max_position_embeddings} positions; give at most that")
    tok = loaded.tokenizer
    ids = text_ids(tok, text)
    add_bos = _adds_bos(tok)
    chunks = windows(ids, n_ctx, tok.bos_token_id if add_bos else None, max_chunks)
    if reference is not None:
        ref_ids = text_ids(reference.tokenizer, text)
        if ref_ids != ids:
            at = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))

            def shown(t, ids_):   # the pieces from the first difference on, as the two tokenizers cut them
                return " ".join(repr(t.decode([i], skip_special_tokens=False)) for i in ids_[at:at + 4])

            raise SterError(f"the reference model tokenizes the text differently ({len(ids)} tokens against "
                            f"{len(ref_ids)}; from token {at}: {shown(tok, ids) or 'the end'} against "
                            f"{shown(reference.tokenizer, ref_ids) or 'the end'}); KL divergence compares models of "
                            "one vocabulary (for example two quantizations of one model)")
        if reference.spec.vocab_size != loaded.spec.vocab_size:
            raise SterError(f"the reference model's vocabulary has {reference.spec.vocab_size} entries, this "
                            f"model's {loaded.spec.vocab_size}; they must match")
    first = n_ctx // 2
    nll_sum = nll2_sum = 0.0
    count = 0
    per_chunk = []
    ref = {"nll": 0.0, "kld": [], "dp": [], "same": 0}
    for c, w in enumerate(chunks):
        target_all = np.asarray(ids[c * n_ctx:(c + 1) * n_ctx], dtype=np.int64)
        chunk_nll = 0.0
        ref_pieces = (_scored_logprobs(reference.decoder, w, first, batch, "the reference model")
                      if reference is not None else None)
        for a, lp in _scored_logprobs(loaded.decoder, w, first, batch):
            targets = target_all[a + 1:a + 1 + lp.shape[0]]
            nll = -lp[np.arange(len(targets)), targets]
            chunk_nll += float(nll.sum())
            nll_sum += float(nll.sum())
            nll2_sum += float((nll * nll).sum())
            count += len(targets)
            if ref_pieces is not None:
                _, rlp = next(ref_pieces)
                ref["nll"] += float(-rlp[np.arange(len(targets)), targets].sum())
                p_ref = np.exp(rlp)
                ref["kld"].append((p_ref * (rlp - lp)).sum(axis=1))
                ref["dp"].append(np.exp(-nll) - np.exp(rlp[np.arange(len(targets)), targets]))
                ref["same"] += int((lp.argmax(axis=1) == rlp.argmax(axis=1)).sum())
        per_chunk.append(_ppl(chunk_nll / (n_ctx - 1 - first)))
        if progress:
            progress("perplexity", c + 1, len(chunks))
    mean, unc = _mean_unc(nll_sum, nll2_sum, count)
    ppl = _ppl(mean)
    out = {"ppl": ppl, "ppl_uncertainty": ppl * unc, "nll_mean": mean, "tokens": count, "chunks": len(chunks),
           "n_ctx": n_ctx, "text_tokens": len(ids), "add_bos": add_bos, "per_chunk_ppl": per_chunk}
    if reference is not None:
        kld = np.concatenate(ref["kld"])
        dp = np.concatenate(ref["dp"])
        k_mean, k_unc = _mean_unc(float(kld.sum()), float((kld * kld).sum()), count)
        d_mean, d_unc = _mean_unc(float(dp.sum()), float((dp * dp).sum()), count)
        ref_ppl = _ppl(ref["nll"] / count, "the reference model")
        out.update({"reference_ppl": ref_ppl, "ppl_ratio": ppl / ref_ppl, "kld_mean": k_mean, "kld_uncertainty": k_unc,
                    "kld_median": float(np.median(kld)), "kld_99": float(np.percentile(kld, 99)),
                    "kld_max": float(kld.max()), "dp_mean": d_mean, "dp_uncertainty": d_unc,
                    "dp_rms": float(np.sqrt((dp * dp).mean())), "same_top": ref["same"] / count})
    return out
