"""Speculative decoding with a drafter: greedy output of the target, fewer target calls.

A drafter (a smaller model of the same vocabulary) proposes up to ``n_draft`` next tokens; the
target runs once over the pending token and the proposals (one forward call of k + 1 rows, its
cache growing by k + 1 positions) and, row by row, chooses its own next token exactly as plain
greedy decoding would (``generate.penalize`` then argmax). Each proposal equal to the target's
choice is accepted and the next row is read; at the first disagreement the target's own choice is
kept and the rest is dropped (the cache rolls back to the accepted positions). Every emitted token
is therefore the target's greedy choice given the tokens before it (Leviathan et al. 2023,
arXiv:2211.17192, Algorithm 1 at temperature 0; Chen et al. 2023, arXiv:2302.01318), and a round
emits between 1 and k + 1 tokens for one target call.

The rows of one verification call are computed together rather than one token at a time. Over
quantized and 16-bit weights their products run as the one-token row dots, each weight row read
once for all the rows (``decoder.qlinear.few_rows``), so those products equal decoding's; the rest
of the block (attention over several rows, float32 weights through BLAS) can differ from
single-token decoding's in the last float32 bits (the row-exactness note in ``prefix.py``); only an
exact near-tie between two tokens could make the two outputs part.

Drafters (``Drafter``):
- ``ModelDrafter``: any model ster runs, with its own cache, fed the accepted tokens;
- ``ReaderDrafter``: a drafter without keys and values of its own that reads the target's cache,
  its embedding table and its last hidden state (llama.cpp's ``gemma4-assistant``, Transformers'
  ``Gemma4AssistantForCausalLM``; ``decoder.reader.CacheReader``).

A target whose cache keeps a recurrent state (which cannot be cut back) is checkpointed before each
verification and, after a disagreement, rolled back to the checkpoint and advanced over the accepted
tokens again.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .errors import SterError
from .files import expand_user

#: Proposals per round when ``--draft-max`` is not given (llama.cpp's server drafts up to 16).
DEFAULT_DRAFT = 8


class Drafter(Protocol):
    """What proposes tokens. ``propose`` returns at most ``k`` ids (fewer is allowed)."""

    name: str

    def propose(self, history: list[int], k: int, hidden: np.ndarray | None, cache) -> list[int]:
        """Up to ``k`` ids to follow ``history`` (the prompt and every emitted id; the last one is
        pending: the target's ``cache`` holds ``len(history) - 1`` positions). ``hidden`` float32
        [hidden_size]: the target's final-norm output at the last cached position (the row that chose
        the pending id)."""
        ...


def _greedy(logits: np.ndarray, vocab: int) -> int:
    """argmax over the first ``vocab`` logits (a drafter's padded rows are never proposed)."""
    return int(np.argmax(logits[:vocab]))


class ModelDrafter:
    """A model ster runs, drafting greedily with its own cache.

    The cache keeps the positions of the ids it was last fed; each ``propose`` rolls it back to the
    part ``history`` shares with them, feeds the rest in one call, then decodes ``k`` tokens one at a
    time. A cache that cannot roll back (a recurrent state) starts afresh (correct, slower).

    Args:
        decoder: the drafter's ``decoder.model.Decoder``.
        vocab: ids the target knows (proposals are chosen among the first ``vocab`` logits).
        name: for messages and ``--json``.
    """

    kind = "model"

    def __init__(self, decoder, vocab: int, name: str = "drafter"):
        self.decoder, self.vocab, self.name = decoder, vocab, name
        self.cache = None
        self.ids: list[int] = []

    def propose(self, history: list[int], k: int, hidden=None, cache=None) -> list[int]:
        from .prefix import common_prefix

        if k <= 0:
            return []
        keep = common_prefix(self.ids, history) if self.cache is not None else 0
        keep = min(keep, len(history) - 1)
        if self.cache is None or not self.cache.rollback(keep):
            self.cache, keep = self.decoder.new_cache(), 0
        logits = self.decoder.forward(history[keep:], self.cache, last_only=True)[-1]
        drafts: list[int] = []
        limit = self.decoder.spec.max_position_embeddings
        while True:
            t = _greedy(logits, self.vocab)
            drafts.append(t)
            if len(drafts) >= k or self.cache.length >= limit:
                break
            logits = self.decoder.forward([t], self.cache, last_only=True)[-1]
        self.ids = list(history) + drafts[:-1]
        return drafts


class ReaderDrafter:
    """A drafter that reads the target's state (``decoder.reader.CacheReader``): every draft step
    sits at the pending token's position p, attends over the target's keys and values at positions
    0..p-1, and takes [target embedding of the last id; hidden] through its pre-projection; the next
    step's hidden is its own post-projected output (Transformers' ``SinglePositionMultiTokenCandidate
    Generator``; llama.cpp's ``common/speculative.cpp`` with a shared memory).

    Args:
        reader: the ``CacheReader``, already bound to the target (``reader.bind``).
        vocab: ids the target knows.
    """

    kind = "reader"

    def __init__(self, reader, vocab: int, name: str = "drafter"):
        self.reader, self.vocab, self.name = reader, vocab, name

    def propose(self, history: list[int], k: int, hidden: np.ndarray | None, cache) -> list[int]:
        if k <= 0:
            return []
        if hidden is None:
            raise SterError("this drafter reads the target's last hidden state, which the target did not give")
        token, h = history[-1], hidden
        drafts: list[int] = []
        for _ in range(k):
            logits, h = self.reader.step(token, h, cache)
            token = _greedy(logits, self.vocab)
            drafts.append(token)
        return drafts


def check_draft_sampling(sampling) -> None:
    """Refuse sampling settings a greedy drafter cannot keep exact.

    Raises:
        SterError: a temperature above 0 (rejection sampling is not implemented).
    """
    if sampling.temperature != 0:
        raise SterError("--draft decodes greedily (its output equals plain greedy decoding): use --temperature 0, "
                        "or drop --draft to sample")


def check_draft_options(draft: str | None, draft_max: int | None, sampling) -> None:
    """The command line's ``--draft`` / ``--draft-max`` against the sampling settings, before any
    weight is read.

    Raises:
        SterError: ``--draft-max`` without ``--draft`` or outside 1..64; ``--draft`` with sampling; a
            ``--draft`` that names a local path (as ``resolve.resolve`` tells one) that does not exist.
    """
    import os

    from .resolve import _looks_like_path

    if draft_max is not None and draft is None:
        raise SterError("--draft-max needs --draft (a drafter model)")
    if draft is None:
        return
    check_draft_sampling(sampling)
    if draft_max is not None and not 1 <= draft_max <= 64:
        raise SterError(f"--draft-max must be 1 to 64, got {draft_max}")
    path = expand_user(draft, "--draft")
    if not (path.is_file() or path.is_dir()) and (_looks_like_path(draft) or os.path.lexists(path)):
        raise SterError(f"no such file or directory: {draft} (given as the drafter, --draft)")


def check_pair(target_tokenizer, target_spec, drafter_tokenizer, drafter_name: str) -> None:
    """Refuse a drafter whose vocabulary is not the target's: the same token -> id map (added tokens
    included).

    Raises:
        SterError: the maps differ (names the first difference).
    """
    a = target_tokenizer.tk.get_vocab(with_added_tokens=True)
    b = drafter_tokenizer.tk.get_vocab(with_added_tokens=True)
    if a == b:
        return
    only_t = sorted(set(a) - set(b))
    only_d = sorted(set(b) - set(a))
    moved = sorted(t for t in set(a) & set(b) if a[t] != b[t])
    detail = (f"{len(a)} tokens against {len(b)}" if len(a) != len(b) else
              f"token {moved[0]!r} is id {a[moved[0]]} in the target and {b[moved[0]]} in the drafter" if moved else
              f"token {(only_t or only_d)[0]!r} is in one vocabulary only")
    raise SterError(f"the drafter {drafter_name} does not share the target's vocabulary ({detail}); "
                    "use a drafter from the same model family and tokenizer")


def speculate(decoder, cache, logits: np.ndarray, hidden: np.ndarray | None, history: list[int], drafter: Drafter,
              n_draft: int, out, *, choose, emit, layer_hook, context) -> None:
    """The verification loop after the prompt's prefill (``generate.generate`` calls it).

    Args:
        decoder: the target; cache: its ``KVCache`` holding ``history`` (the prompt).
        logits: float32 [vocab], the last prompt position's; hidden: that row's final-norm output.
        history: the prompt ids (grows with every emitted id).
        drafter: the ``Drafter``; n_draft: proposals per round at most.
        out: the ``generate.Generation`` (``drafted`` / ``accepted`` counted here).
        choose: ``choose(logits, history) -> id`` (the target's greedy choice, penalty included).
        emit: ``emit(logits, id) -> str | None``: records the id; a stop reason ends the run.
        layer_hook: the target's steering hook; context: positions the run may fill.
    """
    from .decoder.qlinear import few_rows

    token = choose(logits, history)
    if (reason := emit(logits, token)) is not None:
        out.stop_reason = reason
        return
    with few_rows():  # the verification's k + 1 rows read each weight once (qlinear.few_rows)
        _rounds(decoder, cache, hidden, history, drafter, n_draft, out, token, choose, emit, layer_hook, context)


def _rounds(decoder, cache, hidden, history, drafter, n_draft, out, token, choose, emit, layer_hook, context):
    """``speculate``'s rounds after the first emitted id ``token``.

    Proposals per round adapt as Transformers' assisted generation does (its "heuristic" schedule):
    two more after a round whose proposals were all accepted, one fewer after a rejection, between 1
    and ``n_draft``. A drafter that keeps missing then costs one proposal per round instead of
    ``n_draft`` (each is a row the target verifies); the emitted ids do not depend on it."""
    budget = n_draft
    while True:
        if cache.length >= context:
            out.stop_reason = "context"
            return
        base = cache.length  # positions before the pending token
        k = int(min(budget, out.remaining(), context - base - 1))
        drafts = drafter.propose(history, k, hidden, cache)[:max(k, 0)]
        recurrent = cache.has_recurrent_state()
        if recurrent and drafts:
            cache.checkpoint()
        normed: list = []
        rows = decoder.forward([token] + drafts, cache, layer_hook=layer_hook, normed=normed)
        out.draft_rounds += 1
        accepted, stop = 0, None
        for j in range(len(drafts) + 1):
            t = choose(rows[j], history)
            stop = emit(rows[j], t)
            if j < len(drafts) and t == drafts[j]:
                accepted += 1
                if stop is None:
                    continue
            token = t
            break
        # proposals past a stop (the drafter does not know where the answer ends) were never checked
        # against an emitted id: counted neither drafted nor rejected
        out.drafted += len(drafts) if stop is None else min(len(drafts), j + 1)
        out.accepted += accepted
        budget = min(n_draft, budget + 2) if accepted == len(drafts) else max(1, budget - 1)
        keep = base + 1 + accepted
        if keep < cache.length and not cache.rollback(keep):
            # a recurrent state: back to the checkpoint before the call, then over the accepted ids again
            if not cache.rollback(base):
                raise SterError("the target's cache could not return to its state before the verification")
            decoder.forward([history[base]] + drafts[:accepted], cache, layer_hook=layer_hook, last_only=True)
        hidden = normed[0][accepted]
        if stop is not None:
            out.stop_reason = stop
            return


def load_drafter(model: str, target, *, precision: str = "f32", progress=None):
    """The ``Drafter`` for ``--draft MODEL`` beside the loaded ``target`` (a ``load.LoadedModel``).

    A Gemma 4 assistant (config.json ``model_type`` gemma4_assistant, or a GGUF file of llama.cpp's
    ``gemma4-assistant`` architecture) becomes a ``ReaderDrafter`` over the target; any other model
    ster runs becomes a ``ModelDrafter``. Steering vectors and adapters given with the target apply to
    the target only.

    Raises:
        SterError: what loading the drafter raises, said of the drafter ("the drafter (--draft
            MODEL): ...") when the message does not already name it; a vocabulary other than the
            target's; an assistant beside a target it cannot read (``decoder.reader``).
    """
    if not isinstance(model, str) or not model.strip():
        raise SterError(f"no drafter given (--draft is {model!r}); pass a local directory, a .gguf file, a preset "
                        "name or a Hugging Face Hub id of a small model with the target's vocabulary")
    try:
        return _load_drafter(model, target, precision=precision, progress=progress)
    except SterError as e:
        if str(e).startswith("the drafter") or "--draft" in str(e):  # check_pair's messages name it already
            raise
        raise SterError(f"the drafter (--draft {model}): {e}") from None


def _load_drafter(model: str, target, *, precision: str, progress):
    from .load import load_model

    reader = _reader_source(model)
    if reader is not None:
        kind, path = reader
        r = _assistant_from_config(path, target, precision) if kind == "config" else \
            _assistant_from_gguf(path, target, precision)
        return ReaderDrafter(r, target.spec.vocab_size, model)
    from .load import load_tokenizer

    check_pair(target.tokenizer, target.spec, load_tokenizer(model, progress=progress), model)  # before its weights
    loaded = load_model(model, precision=precision, progress=progress)
    return ModelDrafter(loaded.decoder, target.spec.vocab_size, model)


def _reader_source(model: str):
    """(kind, path) when ``model`` names a local drafter that reads its target's state, else None."""
    from pathlib import Path

    p = Path(model)
    if p.is_dir() and (p / "config.json").is_file():
        from .resolve import read_config

        config = read_config(p / "config.json")
        if config.get("model_type") in READER_MODEL_TYPES:
            return ("config", p)
    ggufs = [p] if p.is_file() and p.suffix == ".gguf" else sorted(p.glob("*.gguf")) if p.is_dir() else []
    if len(ggufs) == 1:
        from .gguf.reader import GGUFFile

        from .steering import refuse_control_vector

        g = GGUFFile(ggufs[0])
        refuse_control_vector(g, ggufs[0])
        arch = g.metadata.get("general.architecture")
        if arch in READER_GGUF_ARCHS:
            return ("gguf", ggufs[0])
    return None


#: Drafters that read their target's state: config.json model_type and llama.cpp architecture names.
READER_MODEL_TYPES = ("gemma4_assistant",)
READER_GGUF_ARCHS = ("gemma4-assistant",)

#: Targets a Gemma 4 assistant reads (seed 000: it pairs only with a gemma4 model).
ASSISTANT_TARGETS = ("gemma4_text", "gemma4_unified_text")


def _assistant_from_config(path, target, precision: str):
    """A Gemma 4 assistant checkpoint (Transformers' ``Gemma4AssistantForCausalLM``: config.json with
    a gemma4_text ``text_config``, ``backbone_hidden_size``; tensors ``model.*`` as gemma4_text's
    without keys and values, ``pre_projection``, ``post_projection``) as a ``CacheReader`` over the
    target.

    Raises:
        SterError: a config that is not an assistant's, the ordered-embedding head, or a target the
            assistant cannot read (``_check_assistant``).
    """
    from collections.abc import Mapping
    from dataclasses import replace

    from .config import spec_from_config
    from .decoder.model import Decoder
    from .decoder.reader import CacheReader
    from .families import gate
    from .resolve import read_config
    from .validate import check_config, check_spec, interpret
    from .weights import SafetensorsWeights

    source = str(path / "config.json")
    config = read_config(path / "config.json")
    text = config.get("text_config")
    if not isinstance(text, Mapping):
        raise SterError(f"{source}: a gemma4_assistant config needs a text_config object (the drafter's layers)")
    if config.get("use_ordered_embeddings"):
        raise SterError(f"{source}: the assistant's ordered-embedding head (use_ordered_embeddings: centroids "
                        "choosing which logits to compute) is not supported; use an assistant without it")
    if text.get("hidden_size_per_layer_input"):
        raise SterError(f"{source}: an assistant with per-layer inputs (hidden_size_per_layer_input) is not valid")
    backbone = config.get("backbone_hidden_size", 1536)
    # every layer reads the target's keys and values: none of its own (set below, per layer)
    text = {"model_type": "gemma4_text", **text, "num_kv_shared_layers": 0, "hidden_size_per_layer_input": 0,
            "final_logit_softcapping": None}
    check_config(text, source)
    family = gate(text, source)
    spec = check_spec(interpret(source, spec_from_config, text, family, source), source)
    sources = _check_assistant(spec, backbone, target, source)
    spec = replace(spec, layers=tuple(replace(layer, kv_source=i) for i, layer in enumerate(spec.layers)))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SterError(f"{path} holds no .safetensors file (the assistant's weights)")
    weights = SafetensorsWeights(files, precision)
    pre, post = weights.get("pre_projection.weight"), weights.get("post_projection.weight")
    if pre is None or post is None:
        raise SterError(f"{path}: the assistant's pre_projection or post_projection tensor is missing")
    if pre.shape != (spec.hidden_size, 2 * backbone) or post.shape != (backbone, spec.hidden_size):
        raise SterError(f"{path}: pre_projection {tuple(pre.shape)} / post_projection {tuple(post.shape)} do not "
                        f"map between the target's width {backbone} and the assistant's {spec.hidden_size}")
    return CacheReader(Decoder(spec, weights), pre, post, target.decoder, sources)


def _check_assistant(spec, backbone: int, target, source: str) -> list[int]:
    """Per assistant layer, the target layer whose keys and values it reads: the last target layer of
    its kind (sliding or full attention), through that layer's own ``kv_source`` (Transformers'
    ``kv_sharing_modes`` "store" layers; llama.cpp reads the target's last two layers, which are
    those in every Gemma 4).

    Raises:
        SterError: a target that is not Gemma 4, another width or vocabulary, no target layer of a
            kind the assistant reads, or head widths that differ.
    """
    t = target.spec
    if t.model_type not in ASSISTANT_TARGETS:
        raise SterError(f"{source} is a Gemma 4 assistant, which drafts only for a Gemma 4 model (it reads the "
                        f"target's keys and values), not for {t.model_type}")
    if backbone != t.hidden_size:
        raise SterError(f"{source}: the assistant was made for a target {backbone} wide, and this model is "
                        f"{t.hidden_size} wide; use the assistant released with this model")
    if spec.vocab_size != t.vocab_size:
        raise SterError(f"{source}: the assistant's vocabulary of {spec.vocab_size} is not the target's "
                        f"{t.vocab_size}; use the assistant released with this model")
    last: dict[bool, int] = {}
    for i, layer in enumerate(t.layers):
        last[layer.sliding_window is not None] = layer.kv_source if layer.kv_source is not None else i
    sources = []
    for i, layer in enumerate(spec.layers):
        kind = layer.sliding_window is not None
        if kind not in last:
            raise SterError(f"{source}: assistant layer {i} reads a {'sliding' if kind else 'full'}-attention layer "
                            "of the target, which has none")
        j = last[kind]
        mine, theirs = spec.attention_shape(i), t.attention_shape(j)
        if mine[2] != theirs[2] or mine[0] % theirs[1]:
            raise SterError(f"{source}: assistant layer {i}'s {mine[0]} heads of width {mine[2]} cannot attend over "
                            f"target layer {j}'s {theirs[1]} key/value heads of width {theirs[2]}")
        sources.append(j)
    return sources


def _assistant_from_gguf(path, target, precision: str):
    """A llama.cpp ``gemma4-assistant`` GGUF file (``src/models/gemma4-assistant.cpp``: the gemma4
    layer keys under its own architecture name, ``embedding_length_out`` = the target's width,
    ``nextn.pre_projection`` / ``nextn.post_projection``, no key or value tensors) as a
    ``CacheReader`` over the target. Its layers are read as gemma4's (``gguf.config.spec_from_gguf``).

    Raises:
        SterError: a malformed file, a missing tensor, or a target the assistant cannot read.
    """
    from dataclasses import replace

    from .decoder.model import Decoder
    from .decoder.reader import CacheReader
    from .gguf.config import spec_from_gguf
    from .gguf.reader import GGUFFile
    from .validate import check_spec, interpret
    from .weights import GGUFWeights

    source = str(path)
    gguf = GGUFFile(path)
    arch = gguf.metadata["general.architecture"]
    meta = {("gemma4." + k[len(arch) + 1:] if k.startswith(arch + ".") else k): v for k, v in gguf.metadata.items()}
    meta["general.architecture"] = "gemma4"
    meta["gemma4.attention.shared_kv_layers"] = 0  # every layer reads the target (set below, per layer)
    meta.pop("gemma4.nextn_predict_layers", None)  # all of its layers: the assistant is only these
    backbone = meta.get("gemma4.embedding_length_out")
    if not isinstance(backbone, (int, np.integer)) or backbone <= 0:
        raise SterError(f"{source}: a gemma4-assistant file needs {arch}.embedding_length_out (the target's width)")
    names = set(gguf.tensor_names())
    for need in ("token_embd.weight", "nextn.pre_projection.weight", "nextn.post_projection.weight"):
        if need not in names:
            raise SterError(f"{source} has no {need} tensor, which a gemma4-assistant file holds")
    rope_freqs = gguf.tensor("rope_freqs.weight").dequantize() if "rope_freqs.weight" in names else None
    spec = check_spec(interpret(source, spec_from_gguf, meta, source, rope_freqs=rope_freqs,
                                vocab_size=gguf.tensor("token_embd.weight").shape[0], has_output=False,
                                tensors={n: t.shape for n, t in gguf.tensors.items()}), source)
    sources = _check_assistant(spec, int(backbone), target, source)
    spec = replace(spec, final_softcap=None,
                   layers=tuple(replace(layer, kv_source=i) for i, layer in enumerate(spec.layers)))
    weights = GGUFWeights(gguf, precision)
    pre, post = weights.get("nextn.pre_projection.weight"), weights.get("nextn.post_projection.weight")
    if tuple(pre.shape) != (spec.hidden_size, 2 * backbone) or tuple(post.shape) != (backbone, spec.hidden_size):
        raise SterError(f"{source}: nextn.pre_projection {tuple(pre.shape)} / nextn.post_projection "
                        f"{tuple(post.shape)} do not map between the target's width {backbone} and the "
                        f"assistant's {spec.hidden_size}")
    return CacheReader(Decoder(spec, weights), pre, post, target.decoder, sources)
