"""A ``tokenizers.Tokenizer`` rebuilt from a GGUF file's ``tokenizer.ggml.*`` metadata.

A GGUF file carries no tokenizer.json: it stores the vocabulary (``tokens``),
each token's kind (``token_type``), the BPE merge ranks (``merges``) or the
SentencePiece scores (``scores``), the special ids and flags, and only the
*name* of the pre-tokenizer (``pre``). This module turns that back into a
``tokenizers.Tokenizer`` that tokenizes the way llama.cpp (``src/llama-vocab.cpp``)
does, which is the behaviour reference for GGUF files:

- ``gpt2``: BPE. The text is cut into words the way the ``pre`` name says
  (``pretokenizers.PRE_TOKENIZERS``: all 91 names llama.cpp 0.3.36 knows, with its
  flags per name: whole-word shortcut, default BOS, byte alphabet or raw UTF-8),
  mapped through the GPT-2 byte alphabet (most names) and merged by rank.
- ``llama``: SentencePiece BPE. Spaces become U+2581 (▁), a ▁ is put in front
  of every text run (the start, and after each special token) when
  ``add_space_prefix`` (default true), and pieces are merged best score first;
  characters left without a token fall back to ``<0xHH>`` byte tokens. This one
  runs on the ``sentencepiece`` library, which merges by score natively
  (``sentencepiece_bpe.SentencePieceBPE``, a stand-in with the part of
  ``tokenizers.Tokenizer``'s interface ster uses): a merge list derived from the
  scores made ``tokenizers`` take longer than llama.cpp's whole load.
- ``gemma4`` (or ``gpt2`` with ``pre`` = ``gemma4``, ``granite-embed-multi-311m``
  or ``sarvam-moe``): BPE with ranked merges over ▁-escaped UTF-8 (not the byte
  alphabet), split only at newline runs, with ``<0xHH>`` byte fallback.
- ``whitespace``: BPE over raw UTF-8 of the text with its white space removed
  (lower-cased unless ``normalizer.lowercase`` is false; the pre name
  ``whitespace``, which the converter always writes, says false).
- ``bert``: WordPiece (llama.cpp's WPM session): BERT normalization and word
  split, then the longest vocabulary match; [CLS] text [SEP] as special tokens.
- ``t5``: SentencePiece Unigram (llama.cpp's UGM session): the precompiled
  character map, ▁ for spaces, then the best-scoring segmentation; EOS at the end.
- ``plamo2``: PLaMo's Unigram (llama.cpp's ``llm_tokenizer_plamo2``): the raw text's
  best-scoring segmentation, scores to 1e-4, an uncovered character as its UTF-8
  ``<0xHH>`` byte tokens (``ster_py.plamo_tokenizer.build``).

Control, unknown and user-defined tokens are added as added tokens so they
are cut out of the text (longest first) before the scheme runs; control and
unknown ones are special (cut out only when special texts are parsed), user-defined
ones always. As in llama.cpp, a token whose text ends a generation or plays a
fill-in-the-middle role is control whatever its ``token_type`` (``_token_kinds``).
BOS/EOS are added by the post-processor when ``add_bos_token``/``add_eos_token``
(or the scheme's or name's llama.cpp default) says so.

The other models llama.cpp reads (``rwkv``, ``hybriddna``, ``none``) are
refused with the reason (``REFUSED_MODELS``): no family ster runs from GGUF needs them.
"""
from __future__ import annotations

import gc
import re
from itertools import repeat
from operator import itemgetter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from ster_py.errors import SterError
from ster_py.gguf.pretokenizers import (
    PRE_TOKENIZERS,
    PreTokenizerSpec,
    pre_tokenizer_spec,
    split_pre_tokenizer,
)

try:  # the merge lines' cut in C (a build from older sources lacks it: the Python reference runs)
    from ster_py._kernels.quants import merge_pairs as _kernel_merge_pairs
except ImportError:
    _kernel_merge_pairs = None

if TYPE_CHECKING:  # the wrapper imports nothing from here; avoid a cycle at import time
    from ster_py.gguf.sentencepiece_bpe import SentencePieceBPE  # (imported where a SentencePiece GGUF needs it)
    from ster_py.tokenizer import Tokenizer

__all__ = [
    "GGUFTokenizerParts",
    "tokenizer_from_gguf_metadata",
    "split_pre_tokenizer",
    "PRE_TOKENIZERS",
    "SUPPORTED_MODELS",
    "END_OF_GENERATION_TEXTS",
    "check_precompiled_charsmap",
]

# llama_token_type in llama.cpp (gguf-py's TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPACE_MARK = "\u2581"  # ▁, SentencePiece's visible space

#: tokenizer.ggml.model values: byte-level or raw-UTF-8 BPE ("gpt2", "gemma4", "whitespace"),
#: SentencePiece BPE ("llama"), WordPiece ("bert") and Unigram ("t5", PLaMo's "plamo2").
SUPPORTED_MODELS = ("gpt2", "llama", "gemma4", "whitespace", "bert", "t5", "plamo2")
_BPE_MODELS = ("gpt2", "gemma4", "whitespace")

#: The other models llama.cpp 0.3.36 reads, refused with the reason.
REFUSED_MODELS = {
    "rwkv": "RWKV's trie tokenizer; no family ster runs uses it (RWKV is refused at the architecture gate)",
    "hybriddna": "the DNA k-mer tokenizer; no family ster runs uses it",
    "none": "no vocabulary at all (the file holds weights only)",
    "no_vocab": "no vocabulary at all (the file holds weights only)",
    "test": "llama.cpp's test tokenizer (ids as hexadecimal text), not a model's",
}

# ------------------------------------------------------------- token attributes
# Texts llama.cpp (llama_vocab::impl::load) recognises in a vocabulary, whatever their
# token_type: it makes each such token a control token (special) as it finds it.

#: Vocabulary texts that end a generation (llama.cpp's end-of-generation list), on top
#: of the eos/eot/eom ids; each is a control token. Two exceptions follow llama.cpp:
#: <|end|> is neither when the vocabulary has <|return|> and <|call|> (GPT-OSS) or
#: <|calls|> and <|flush|> (Solar Open), and </s> is a plain token next to <|tool_response>.
END_OF_GENERATION_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek: full-width bars around end▁of▁sentence
    "[e~[",
)

#: Fill-in-the-middle tokens by text, used when the file names no id for the role (its
#: key, and the deprecated one). pad, rep and sep also end a generation.
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
                "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
                "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
                "\u2581<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_FIM_KEYS = {"fim_pre": ("fim_pre_token_id", "prefix_token_id"), "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
             "fim_mid": ("fim_mid_token_id", "middle_token_id"), "fim_pad": ("fim_pad_token_id",),
             "fim_rep": ("fim_rep_token_id",), "fim_sep": ("fim_sep_token_id",)}

#: GPT-OSS's channel tokens: always cut out of the text, even with special parsing off.
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# ----------------------------------------------------------------------- result

@dataclass(frozen=True)
class GGUFTokenizerParts:
    """What a GGUF file's metadata says about its tokenizer.

    Attributes:
        tokenizer: the ``tokenizers.Tokenizer``; ids equal the GGUF token indices.
            ``encode(text, add_special_tokens=True)`` adds BOS/EOS per ``add_bos``/``add_eos``.
        model: ``tokenizer.ggml.model`` ("gpt2", "llama", "gemma4", "whitespace", "bert" or "t5").
        pre: the pre-tokenizer name in effect ("default" when the file names none,
            "gemma4" for that model; None for SentencePiece, WordPiece and Unigram,
            which have none).
        bos_token_id, eos_token_id, unk_token_id, pad_token_id: ids, or None.
        bos_token, eos_token: their texts, or None.
        add_bos, add_eos: whether a prompt gets BOS in front / EOS at the end.
        add_space_prefix: SentencePiece's / Unigram's leading-▁ flag (False for the others).
        eos_token_ids: the end-of-generation ids: eos, eot and eom from the
            metadata plus every ``END_OF_GENERATION_TEXTS`` token the vocabulary has.
        chat_template: ``tokenizer.chat_template``, or None.
        sep_token_id, add_sep: WordPiece's separator and whether a prompt ends with it.
        notes: warning lines for the user (a special id outside the vocabulary, ignored).
        clean_spaces: llama.cpp's detokenizer (``llama_detokenize``) tidies the spaces
            before ``?!.,`` and apostrophe contractions for this vocabulary; see
            ``clean_up_spaces``. ``tokenizer.decode`` does not (it gives the token pieces
            as llama.cpp prints them while generating).
    """

    tokenizer: tokenizers.Tokenizer | SentencePieceBPE
    model: str
    pre: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    bos_token: str | None
    eos_token: str | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eos_token_ids: frozenset[int]
    chat_template: str | None
    sep_token_id: int | None = None
    add_sep: bool = False
    clean_spaces: bool = False
    notes: tuple[str, ...] = ()

    def to_tokenizer(self, source: str = "GGUF metadata") -> "Tokenizer":
        """The ``ster_py.tokenizer.Tokenizer`` wrapper over these parts.

        BOS/EOS addition is left to this tokenizer's post-processor (the wrapper's
        ``add_bos=None`` mode), which also keeps a prompt that already starts with
        BOS from getting a second one.
        """
        from ster_py.tokenizer import Tokenizer

        special = {}
        for name, token_id in (("unk_token", self.unk_token_id), ("pad_token", self.pad_token_id)):
            if token_id is not None:
                special[name] = self.tokenizer.id_to_token(token_id)
        tok = Tokenizer(
            self.tokenizer,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            chat_template=self.chat_template,
            eos_token_ids=self.eos_token_ids,
            special_tokens=special,
            source=source,
        )
        tok.notes = list(self.notes)  # LoadedModel.warnings shows them
        return tok


# ------------------------------------------------------------------------ build

def tokenizer_from_gguf_metadata(meta: Mapping[str, Any], *, for_generation: bool = True) -> GGUFTokenizerParts:
    """Build the tokenizer a GGUF file describes.

    Args:
        meta: GGUF metadata, key -> value, as a reader produces it: strings as
            ``str``, string arrays as ``list[str]``, numeric arrays as numpy
            arrays or lists, booleans as ``bool``. Keys read:
            ``tokenizer.ggml.{model, pre, tokens, token_type, scores, merges,
            bos_token_id, eos_token_id, eot_token_id, eom_token_id,
            unknown_token_id, padding_token_id, seperator_token_id, add_bos_token,
            add_eos_token, add_sep_token, add_space_prefix, remove_extra_whitespaces,
            precompiled_charsmap, normalizer.lowercase, normalizer.strip_accents,
            fim_{pre,suf,mid,pad,rep,sep}_token_id, {prefix,suffix,middle}_token_id}``,
            ``tokenizer.chat_template``, ``general.name``, ``general.architecture``.
        for_generation: refuse a vocabulary without any end-of-generation token
            (True, for running a model); False only tokenizes (an encoder's
            WordPiece vocabulary has none).

    Returns:
        GGUFTokenizerParts; ``parts.tokenizer`` ids equal the GGUF token indices.

    Raises:
        SterError: unsupported ``tokenizer.ggml.model`` or ``tokenizer.ggml.pre``
            (the message names it and lists the supported ones); missing or
            malformed tokens/merges/scores; a duplicated token text (a text ends at its
            first NUL, as llama.cpp reads it); a SentencePiece token over
            ``MAX_SPM_TOKEN_CHARS`` characters, or a NaN SentencePiece score; BOS, EOS or SEP to be
            added without its id; no end-of-generation token (``for_generation``).

    Source: llama.cpp ``src/llama-vocab.cpp`` (llama_vocab::impl::load, the
    SPM, BPE, WPM and UGM sessions, tokenizer_st_partition) for the behaviour;
    transformers ``integrations/gguf`` for deriving SentencePiece merges from scores.
    """
    model = meta.get("tokenizer.ggml.model")
    if isinstance(model, str) and model in REFUSED_MODELS:
        raise SterError(
            f"unsupported tokenizer model {model!r} (tokenizer.ggml.model): {REFUSED_MODELS[model]}; supported: "
            f"{', '.join(SUPPORTED_MODELS)}. Use the model's Hugging Face checkpoint (its own tokenizer) instead"
        )
    if model not in SUPPORTED_MODELS:
        raise SterError(
            f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); supported: "
            f"{', '.join(SUPPORTED_MODELS)}. This GGUF's tokenizer cannot be rebuilt; use the model's "
            "Hugging Face checkpoint (tokenizer.json) instead"
        )
    # Building a big vocabulary makes a million small objects; the cycle collector
    # would walk them over and over and find nothing to free.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(meta, model, for_generation)
    except SterError:
        raise
    except BaseException as e:  # noqa: BLE001 - only tokenizers' own failures, see below
        # tokenizers raises a bare Exception for what it refuses and, for what it did not
        # expect, a Rust panic (pyo3's PanicException, a BaseException). Python's own errors
        # (bugs here) and Ctrl-C pass through.
        if type(e) is not Exception and isinstance(e, (Exception, KeyboardInterrupt, SystemExit, GeneratorExit)):
            raise
        raise SterError(f"the tokenizers library could not build this GGUF's {model} tokenizer ({e}); the "
                        "tokenizer.ggml.* metadata is corrupt or crafted, re-convert the model") from None
    finally:
        if collecting:
            gc.enable()


def _build(meta: Mapping[str, Any], model: str, for_generation: bool) -> GGUFTokenizerParts:
    tokens = _token_texts(meta)
    n = len(tokens)
    types = _int_array(meta, "tokenizer.ggml.token_type", n, default=NORMAL)
    vocab = _vocab(tokens)

    spec: PreTokenizerSpec | None = None
    pre: str | None = None
    if model in _BPE_MODELS:
        # llama.cpp forces the name for the gemma4 model; a file without one gets the default split.
        pre = "gemma4" if model == "gemma4" else meta.get("tokenizer.ggml.pre") or "default"
        if not isinstance(pre, str):
            raise SterError(f"tokenizer.ggml.pre must be a string, not {type(pre).__name__}; the file is corrupt")
        spec = pre_tokenizer_spec(pre)

    notes: list[str] = []
    ids = _special_ids(meta, model, n, spec, notes)
    add_space_prefix = _flag(meta, "tokenizer.ggml.add_space_prefix", model == "llama")
    if model not in ("llama", "t5"):
        add_space_prefix = False
    add_bos, add_eos, add_sep = _bos_eos_flags(meta, model, spec)

    if spec is not None:
        merges = _file_merges(meta, required=pre != "kimi-k2")  # llama.cpp lets Kimi K2 have none
        # The whitespace model drops white space and (unless the file says otherwise) lower-cases.
        lowercase = model == "whitespace" and _flag(meta, "tokenizer.ggml.normalizer.lowercase", pre != "whitespace")
        tk = _bpe(vocab, merges, spec, drop_spaces=model == "whitespace", lowercase=lowercase)
    elif model == "llama":
        _check_spm_token_lengths(tokens)
        scores = _float_array(meta, "tokenizer.ggml.scores", n)
        if np.isnan(scores).any():
            # llama.cpp's merge queue orders by < and ==, which a NaN breaks: no defined merge order.
            raise SterError(f"tokenizer.ggml.scores[{int(np.flatnonzero(np.isnan(scores))[0])}] is NaN; a "
                            "SentencePiece merge order needs ordered scores. The GGUF file is corrupt, re-convert it")
    elif model == "bert":
        tk = _wordpiece(meta, tokens, types, ids["unk"])  # llama.cpp ignores the pre name for WordPiece
    elif model == "plamo2":
        tk = _plamo2(tokens, types, _float_array(meta, "tokenizer.ggml.scores", n), ids["unk"])
    else:
        tk = _unigram(meta, tokens, types, _float_array(meta, "tokenizer.ggml.scores", n), ids["unk"],
                      add_space_prefix)

    kinds = _token_kinds(meta, tokens, types, vocab, ids)
    if model == "llama":  # its added tokens are given at construction
        from ster_py.gguf.sentencepiece_bpe import SentencePieceBPE

        tk = SentencePieceBPE(tokens, scores, ids["unk"], add_space_prefix, special=kinds.special, plain=kinds.plain,
                              lstrip=kinds.lstrip, rstrip=kinds.rstrip, vocab=vocab)
    else:
        _add_special_tokens(tk, tokens, kinds)
    if spec is not None and spec.byte_level:
        _keep_added_texts_raw(tk, [tokens[i] for i in sorted(kinds.special | kinds.plain)])

    for flag, key, name in ((add_bos, "bos", "add_bos_token"), (add_eos, "eos", "add_eos_token"),
                            (add_sep, "sep", "add_sep_token")):
        if flag and ids[key] is None:
            raise SterError(
                f"tokenizer.ggml.{name} is true but tokenizer.ggml.{'seperator' if key == 'sep' else key}_token_id "
                "is not set; the GGUF file is inconsistent, re-convert it"
            )
    # WordPiece's [CLS] text [SEP]: llama.cpp appends the separator where other schemes append EOS.
    tail = ids["sep"] if add_sep else (ids["eos"] if add_eos else None)
    if model == "llama":  # (the SentencePieceBPE built above)
        tk.ends = (ids["bos"] if add_bos else None, tail)
    else:
        tk.post_processor = _post_processor(tokens, ids["bos"] if add_bos else None, tail)

    if not kinds.end_of_generation and for_generation:
        raise SterError(
            "this GGUF names no end-of-generation token: tokenizer.ggml.eos_token_id (and eot/eom) are absent and "
            f"the vocabulary has none of {', '.join(END_OF_GENERATION_TEXTS)}; generation could never stop"
        )

    chat_template = meta.get("tokenizer.chat_template")
    return GGUFTokenizerParts(
        tokenizer=tk,
        model=model,
        pre=pre,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        unk_token_id=ids["unk"],
        pad_token_id=ids["pad"],
        bos_token=tokens[ids["bos"]] if ids["bos"] is not None else None,
        eos_token=tokens[ids["eos"]] if ids["eos"] is not None else None,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        eos_token_ids=frozenset(kinds.end_of_generation),
        chat_template=chat_template if isinstance(chat_template, str) and chat_template else None,
        sep_token_id=ids["sep"],
        add_sep=add_sep,
        clean_spaces=spec.clean_spaces if spec is not None else model == "bert",
        notes=tuple(notes),
    )


# -------------------------------------------------------------------- metadata

def _token_texts(meta: Mapping[str, Any]) -> list[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, (str, bytes)):
        _check_array(tokens, "tokenizer.ggml.tokens")
    if tokens is None or isinstance(tokens, (str, bytes)) or len(tokens) == 0:
        raise SterError("the GGUF has no tokenizer.ggml.tokens (the vocabulary); it cannot be tokenized")
    if len(tokens) > MAX_GGUF_TOKENS:
        raise SterError(f"tokenizer.ggml.tokens holds {len(tokens)} tokens; real vocabularies hold at most a few "
                        f"hundred thousand (Gemma 3: 262144) and ster refuses more than {MAX_GGUF_TOKENS}. The file "
                        "is corrupt or crafted; re-convert the model")
    tokens = list(tokens)
    try:  # one pass that refuses a token that is not a string and counts the characters
        text = "".join(tokens)
    except TypeError:
        i = next(i for i, t in enumerate(tokens) if not isinstance(t, str))
        raise SterError(f"tokenizer.ggml.tokens[{i}] is {type(tokens[i]).__name__}, not a string; the file is "
                        "corrupt") from None
    if len(text) > MAX_GGUF_VOCAB_CHARS:
        raise SterError(f"tokenizer.ggml.tokens holds {len(text)} characters of token text; real vocabularies hold "
                        f"a few million at most and ster refuses more than {MAX_GGUF_VOCAB_CHARS}. The file is corrupt "
                        "or crafted; re-convert the model")
    if "\x00" in text:
        # llama.cpp reads each token text as a C string (gguf_get_arr_str), so it ends at a NUL: "x\0y" is
        # the token "x" there (and a duplicate, then refused below, where llama.cpp aborts).
        tokens = [t.partition("\x00")[0] for t in tokens]
    if "" in tokens:
        # llama.cpp renames empty tokens so that every text maps to one id.
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    return tokens


#: Bounds on a GGUF vocabulary, so a small crafted file cannot make the tokenizer build
#: gigabytes of tables (each token costs ~100-200 bytes in Python and again in the tokenizer
#: library). Real ones stay far below: Gemma 3 has 262,144 tokens of ~2 M characters.
MAX_GGUF_TOKENS = 1 << 20
MAX_GGUF_VOCAB_CHARS = 16 << 20


def _check_array(value: Any, key: str) -> None:
    """SterError unless ``value`` (present) is an array (what a reader makes of a GGUF array; through the
    Python API, a scalar would otherwise fail as a bare TypeError)."""
    if value is not None and not isinstance(value, (list, tuple, np.ndarray)):
        raise SterError(f"{key} must be an array of strings, not {type(value).__name__}; the file is corrupt")


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    vocab = dict(zip(tokens, range(len(tokens))))
    if len(vocab) != len(tokens):
        first: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if first.setdefault(t, i) != i:
                raise SterError(
                    f"duplicate token in the GGUF vocabulary: {t!r} has ids {first[t]} and {i}; the file is broken "
                    "(llama.cpp refuses it too), re-convert it"
                )
    return vocab


def _int_array(meta: Mapping[str, Any], key: str, n: int, default: int) -> np.ndarray:
    value = meta.get(key)
    if value is None:
        return np.full(n, default, dtype=np.int64)
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.shape[0] < n or not np.issubdtype(arr.dtype, np.integer):
        raise SterError(f"{key} must be {n} integers (one per token); got {arr.dtype} of shape {arr.shape}")
    return arr[:n].astype(np.int64)


def _float_array(meta: Mapping[str, Any], key: str, n: int) -> np.ndarray:
    value = meta.get(key)
    if value is None:
        raise SterError(
            f"this SentencePiece GGUF has no {key}; the merge order comes from the scores, so it cannot be "
            "tokenized (re-convert the model)"
        )
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.shape[0] < n or not (np.issubdtype(arr.dtype, np.floating)
                                                 or np.issubdtype(arr.dtype, np.integer)):
        raise SterError(f"{key} must be {n} numbers (one per token); got {arr.dtype} of shape {arr.shape}")
    return arr[:n].astype(np.float64)


def _special_ids(meta: Mapping[str, Any], model: str, n: int, spec: PreTokenizerSpec | None,
                 notes: list[str] | None = None) -> dict[str, int | None]:
    """The special ids (bos, eos, eot, eom, unk, pad, sep, FIM) of a vocabulary of ``n`` tokens:
    the file's ``tokenizer.ggml.*_token_id``, else llama.cpp's default for ``model``; an id outside
    the vocabulary keeps the default and appends a warning line to ``notes`` (llama-vocab.cpp's
    load_vocab). Raises SterError for an id that is not an integer."""
    # llama.cpp's defaults per scheme when a key is absent: BPE's is id 11 for BOS and EOS
    # (Falcon's <|endoftext|>), except the gemma4 model (none) and the ChatGLM names (no BOS).
    defaults = {"llama": {"bos": 1, "eos": 2, "unk": 0},
                "bert": {"bos": 101, "unk": 100, "sep": 102, "pad": 0},
                "t5": {"eos": 1, "unk": 2, "pad": 0},
                "plamo2": {"bos": 1, "eos": 2, "unk": 0, "pad": 3},
                "gpt2": {"bos": 11, "eos": 11},
                "whitespace": {"bos": 11, "eos": 11}}.get(model, {})
    if spec is not None and not spec.default_bos:
        defaults = {k: v for k, v in defaults.items() if k != "bos"}
    keys = {"bos": ("bos_token_id",), "eos": ("eos_token_id",), "eot": ("eot_token_id",),
            "eom": ("eom_token_id",), "unk": ("unknown_token_id",), "pad": ("padding_token_id",),
            "sep": ("seperator_token_id",), **_FIM_KEYS}
    ids: dict[str, int | None] = {}
    for name, names in keys.items():
        value = defaults.get(name)
        if value is not None and value >= n:
            value = None  # a default outside the vocabulary is dropped, as llama.cpp does
        for key in names:  # a later key (the deprecated FIM names) wins, as in llama.cpp
            given = meta.get(f"tokenizer.ggml.{key}")
            if given is None:
                continue
            if isinstance(given, (bool, np.bool_)) or not isinstance(given, (int, np.integer)):
                # llama.cpp refuses a key of the wrong type too; 1.5 or "3" is no token id.
                raise SterError(f"tokenizer.ggml.{key} must be an integer token id, not {type(given).__name__} "
                                f"{_short(given)}; the GGUF file is corrupt, re-convert it")
            # An id outside the vocabulary is ignored with a warning, as llama.cpp's load_vocab does
            # ("bad special token ... using default id"): the default stays.
            if 0 <= int(given) < n:
                value = int(given)
            elif notes is not None:
                notes.append(f"tokenizer.ggml.{key} = {int(given)} is outside the vocabulary of {n} tokens; "
                             f"ignored, {'using the default id ' + str(value) if value is not None else 'none is used'}"
                             " (as llama.cpp does); the GGUF file is inconsistent")
        ids[name] = value
    return ids


def _flag(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    """A boolean key; anything but a GGUF bool (the string "false", a 0) is refused rather than guessed."""
    value = meta.get(key)
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise SterError(f"{key} must be a boolean, not {type(value).__name__} {_short(value)}; the GGUF file is "
                    "corrupt or from an unknown converter, re-convert it")


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _bos_eos_flags(meta: Mapping[str, Any], model: str, spec: PreTokenizerSpec | None
                   ) -> tuple[bool, bool, bool]:
    # Scheme defaults from llama.cpp: SentencePiece and WordPiece add BOS (WordPiece's is
    # [CLS], and it ends with [SEP]); Unigram (T5) adds EOS only; BPE adds BOS only for the
    # names whose spec says so. The file's flags win, except that llama.cpp forces BOS on
    # for Gemma 4's split (ggml-org/llama.cpp#21500).
    add_bos = model in ("llama", "bert") or (spec is not None and spec.add_bos)
    add_bos = _flag(meta, "tokenizer.ggml.add_bos_token", add_bos)
    add_eos = _flag(meta, "tokenizer.ggml.add_eos_token", model == "t5")
    add_sep = model == "bert" and _flag(meta, "tokenizer.ggml.add_sep_token", True)
    if spec is not None and spec.force_bos:
        add_bos = True
    return add_bos, add_eos, add_sep


def _file_merges(meta: Mapping[str, Any], required: bool = True) -> list[tuple[str, str]]:
    raw = meta.get("tokenizer.ggml.merges")
    if raw is None and not required:
        return []
    if raw is None or isinstance(raw, (str, bytes)):
        raise SterError("this BPE GGUF has no tokenizer.ggml.merges; it cannot be tokenized (re-convert the model)")
    _check_array(raw, "tokenizer.ggml.merges")
    # A line without a cut has "" on its right, which is no token: _bpe drops it.
    try:
        return (_kernel_merge_pairs or _split_merges)(list(raw))
    except TypeError:  # (both cut str lines only)
        i = next((i for i, line in enumerate(raw) if not isinstance(line, str)), None)
        if i is None:
            raise
        raise SterError(f"tokenizer.ggml.merges[{i}] is not a string; the file is corrupt") from None


def _split_merges(lines: list[str]) -> list[tuple[str, str]]:
    """Each merge line cut at its first space after the first character, as llama.cpp cuts it (so a
    pair may start with a space): [(left, right)], (line, "") for a line without one. The reference of
    the kernel ``ster_py._kernels.quants.merge_pairs``, and the path where it is not built."""
    # str.partition mapped in C is that cut for lines that do not start with a space
    pairs = list(map(str.partition, lines, repeat(" ")))
    if "" in map(itemgetter(0), pairs):
        pairs = [p if p[0] else _cut_after_first(line) for p, line in zip(pairs, lines)]
    return list(map(itemgetter(0, 2), pairs))


def _known_merges(merges: list[tuple[str, str]], vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """The merges whose two parts and result are all tokens (the others can never yield a token id)."""
    return [(left, right) for left, right in merges if left in vocab and right in vocab and left + right in vocab]


def _cut_after_first(line: str) -> tuple[str, str, str]:
    """``line.partition(" ")`` from its second character on: (left, " " or "", right)."""
    cut = line.find(" ", 1)
    return (line[:cut], " ", line[cut + 1:]) if cut > 0 else (line, "", "")


def _bpe(vocab: dict[str, int], merges: list[tuple[str, str]], spec: PreTokenizerSpec, *, drop_spaces: bool = False,
         lowercase: bool = False) -> tokenizers.Tokenizer:
    """llama.cpp's BPE session for one pre-tokenizer spec.

    Byte-level names map each word through the GPT-2 byte alphabet; the others merge
    raw UTF-8 characters and spell a piece without a token as ``<0xHH>`` byte tokens
    (Gemma 4 and Sarvam also write spaces as ▁ first). ``drop_spaces`` and ``lowercase``
    are the whitespace model's session (white space removed, text lower-cased).

    llama.cpp also takes a Gemma 4 word of newlines that is itself a token without
    merging (ggml-org/llama.cpp#21343); Gemma 4's merges build every such run anyway,
    so the plain merge gives the same ids (checked against llama.cpp on runs of 1..69).
    """
    def model(merges: list[tuple[str, str]]) -> models.BPE:
        return models.BPE(vocab=vocab, merges=merges, ignore_merges=spec.ignore_merges,
                          byte_fallback=not spec.byte_level)

    # tokenizers refuses a merge that names or makes a token outside the vocabulary; real files
    # have none, so the list is only filtered (a Python pass over every line) when it is refused.
    try:
        bpe = model(merges)
    except Exception:  # noqa: BLE001 - tokenizers' bare Exception for an unknown token
        bpe = model(_known_merges(merges, vocab))
    tk = tokenizers.Tokenizer(bpe)
    steps = []
    if lowercase:
        steps.append(normalizers.Lowercase())
    if spec.escape_spaces:
        steps.append(normalizers.Replace(" ", SPACE_MARK))
    if steps:
        tk.normalizer = steps[0] if len(steps) == 1 else normalizers.Sequence(steps)
    splits = [pre_tokenizers.Split(Regex(c.pattern), behavior=c.behavior) for c in spec.cuts]
    if drop_spaces:
        splits.insert(0, pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"))
    if spec.byte_level:
        splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tk.decoder = decoders.ByteLevel()
    else:
        steps = [decoders.Replace(SPACE_MARK, " ")] if spec.escape_spaces else []
        tk.decoder = decoders.Sequence(steps + [decoders.ByteFallback(), decoders.Fuse()])
    tk.pre_tokenizer = splits[0] if len(splits) == 1 else pre_tokenizers.Sequence(splits)
    return tk


def _keep_added_texts_raw(tk: tokenizers.Tokenizer, texts: Sequence[str]) -> None:
    """Make byte-level decoding give an added token's own text, as llama.cpp prints it.

    tokenizers passes added tokens through the ByteLevel decoder too, which turns a
    character of the GPT-2 byte alphabet back into its byte: DeepSeek's user-defined
    "ö" (GPT-2's spelling of byte 0xF6) would decode to that lone byte, where llama.cpp
    prints the text "ö". Each such token (a whole token string equal to its text, which
    no vocabulary piece can be) is first respelled in the byte alphabet.
    """
    changed = set(pre_tokenizers.ByteLevel.alphabet()) - {chr(c) for c in range(0x21, 0x7F)}
    steps = []
    for text in texts:
        if changed.intersection(text):
            spelled = "".join(_BYTE_ALPHABET[b] for b in text.encode("utf-8"))
            steps.append(decoders.Replace(Regex(r"\A" + re.escape(text) + r"\z"), spelled))
    if steps:
        tk.decoder = decoders.Sequence(steps + [tk.decoder])


def _gpt2_byte_alphabet() -> list[str]:
    """The GPT-2 byte alphabet: byte -> its character (printable Latin-1 as itself, the rest from U+0100)."""
    shown = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = iter(range(0x100, 0x200))
    return [chr(b) if b in shown else chr(next(rest)) for b in range(256)]


_BYTE_ALPHABET = _gpt2_byte_alphabet()


def _wordpiece(meta: Mapping[str, Any], tokens: Sequence[str], types: np.ndarray, unk: int | None
               ) -> tokenizers.Tokenizer:
    """BERT's WordPiece as llama.cpp's WPM session runs it.

    llama.cpp's converter stores a word-initial piece ``w`` as ``▁w`` and a
    continuation ``##w`` as ``w``; the session lower-cases and strips accents,
    splits at whitespace, punctuation, ASCII symbols and CJK ideographs, then
    takes the longest vocabulary match from the start of ``▁word`` and of each
    rest, and a word with an unmatched rest becomes the unknown token. That is
    tokenizers' WordPiece over the pieces spelled back the Hugging Face way
    (``w`` and ``##w``), after its BERT normalizer and pre-tokenizer. Control,
    unknown and user-defined tokens keep their text (they are matched whole).
    """
    if unk is None:
        raise SterError("this WordPiece GGUF has no unknown token (tokenizer.ggml.unknown_token_id, default 100 "
                        "is out of range); it cannot be tokenized")
    vocab: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(tokens, types.tolist())):
        if kind in (CONTROL, UNKNOWN, USER_DEFINED):
            piece = text
        elif text.startswith(SPACE_MARK):
            piece = text[1:]
        else:
            piece = "##" + text
        first = vocab.setdefault(piece, i)
        if first != i:
            raise SterError(f"WordPiece tokens {first} ({tokens[first]!r}) and {i} ({text!r}) are the same piece "
                            f"{piece!r}; the GGUF vocabulary is inconsistent, re-convert it")
    lowercase = _flag(meta, "tokenizer.ggml.normalizer.lowercase", True)
    strip_accents = _flag(meta, "tokenizer.ggml.normalizer.strip_accents", lowercase)
    tk = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token=tokens[unk],
                                               max_input_chars_per_word=MAX_WORDPIECE_WORD_CHARS))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=strip_accents, lowercase=lowercase)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return tk


#: A longer word (no space or punctuation inside) becomes WordPiece's unknown token.
#: transformers' BERT uses 100; llama.cpp has no limit, but the longest-match search
#: grows with the cube of a word's length, so a bound is kept far above real words.
MAX_WORDPIECE_WORD_CHARS = 500


def _unigram(meta: Mapping[str, Any], tokens: Sequence[str], types: np.ndarray, scores: np.ndarray,
             unk: int | None, add_space_prefix: bool) -> tokenizers.Tokenizer:
    """T5's SentencePiece Unigram as llama.cpp's UGM session runs it.

    The text goes through the precompiled character map (SentencePiece's
    normalization rules, ``tokenizer.ggml.precompiled_charsmap``), spaces become
    ▁ (runs collapsed and ends trimmed when ``remove_extra_whitespaces``), a ▁ goes
    in front when ``add_space_prefix``, and the best-scoring segmentation wins
    (Viterbi), a character without a piece costing the lowest normal score minus
    10 and adjacent unknowns fusing into one. llama.cpp scores user-defined pieces
    0 and leaves control, unknown and byte pieces out of the search; here they sit
    at the lowest normal score so tokenizers' unknown penalty, taken from the
    lowest score of all pieces, stays llama.cpp's.
    """
    if unk is None:
        raise SterError("this Unigram GGUF has no unknown token (tokenizer.ggml.unknown_token_id, default 2 is out "
                        "of range); it cannot be tokenized")
    normal = types == NORMAL
    floor = float(scores[normal].min()) if normal.any() else 0.0
    lattice = np.where(types == USER_DEFINED, 0.0, scores)
    lattice = np.where(normal | (types == USER_DEFINED), lattice, np.maximum(lattice, floor))
    lattice = np.where((types == CONTROL) | (types == UNKNOWN) | (types == BYTE), floor, lattice)
    if not np.all(np.isfinite(lattice)):
        raise SterError("tokenizer.ggml.scores holds a NaN or infinite score; the GGUF file is corrupt")
    check_unigram_pieces(tokens, "tokenizer.ggml.tokens")
    tk = tokenizers.Tokenizer(models.Unigram(list(zip(tokens, lattice.tolist())), unk_id=unk, byte_fallback=False))

    steps = []
    charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        data = _charsmap_bytes(charsmap)
        check_precompiled_charsmap(data, "tokenizer.ggml.precompiled_charsmap")
        try:
            charmap = normalizers.Precompiled(data)
            # tokenizers maps a grapheme cluster by its first mapped character, so CR LF (one
            # cluster) would lose the LF; llama.cpp maps them one by one. Spell CR LF out first.
            crlf = charmap.normalize_str("\r") + charmap.normalize_str("\n")
            if crlf != "\r\n" and charmap.normalize_str(crlf) == crlf:
                steps.append(normalizers.Replace("\r\n", crlf))
            steps.append(charmap)
        except BaseException as e:  # noqa: BLE001 - a bare Exception, or a Rust panic (pyo3 PanicException)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise SterError(f"tokenizer.ggml.precompiled_charsmap is not a SentencePiece character map ({e}); "
                            "the GGUF file is corrupt or from an unknown converter") from None
    remove_extra = _flag(meta, "tokenizer.ggml.remove_extra_whitespaces", False)
    if remove_extra:
        steps += [normalizers.Replace(Regex("^ +| +$"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if add_space_prefix or remove_extra:
        # llama.cpp puts the ▁ in front of the first non-space character, so a text of
        # spaces only gets none.
        steps.append(normalizers.Replace(Regex(r"^(?=[\s\S]*[^ ])"), SPACE_MARK))
    steps.append(normalizers.Replace(" ", SPACE_MARK))
    tk.normalizer = normalizers.Sequence(steps)
    steps = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tk.decoder = decoders.Sequence(steps)
    return tk


_KIND_NAMES = {NORMAL: "NORMAL", UNKNOWN: "UNKNOWN", CONTROL: "CONTROL", USER_DEFINED: "USER_DEFINED",
               UNUSED: "UNUSED", BYTE: "BYTE"}


def _plamo2(tokens: Sequence[str], types: np.ndarray, scores: np.ndarray, unk: int | None) -> tokenizers.Tokenizer:
    """PLaMo's Unigram as llama.cpp's ``llm_tokenizer_plamo2`` runs it (``ster_py.plamo_tokenizer.build``):
    every piece but the byte ones searched in the raw text, no marker or break-around split (llama.cpp has
    none). Raises SterError for a vocabulary without the 256 byte tokens or an unknown token."""
    from ster_py.plamo_tokenizer import build

    if unk is None:
        raise SterError("this plamo2 GGUF has no unknown token (tokenizer.ggml.unknown_token_id); it cannot be "
                        "tokenized")
    if not np.all(np.isfinite(scores)):
        raise SterError("tokenizer.ggml.scores holds a NaN or infinite score; the GGUF file is corrupt")
    kinds = [_KIND_NAMES.get(int(t), "NORMAL") for t in types]
    bytes_ok = [t for t, k in zip(tokens, kinds) if k == "BYTE" and len(t) == 6 and t.startswith("<0x")]
    if len(bytes_ok) != sum(k == "BYTE" for k in kinds):
        raise SterError("a plamo2 byte token is not spelled <0xXX>; the GGUF file is corrupt, re-convert it")
    return build(tokens, scores.tolist(), kinds, unk)


def _charsmap_bytes(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    arr = np.asarray(value)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer) or (len(arr) and (arr.min() < 0 or arr.max() > 255)):
        raise SterError(f"tokenizer.ggml.precompiled_charsmap must be an array of bytes (uint8); got {arr.dtype} of "
                        f"shape {arr.shape}. The GGUF file is corrupt or from an unknown converter")
    return arr.astype(np.uint8).tobytes()


#: Unigram vocabularies are bounded before ``tokenizers`` builds its trie, which takes about
#: 350 bytes per character of piece text (measured; a 15 M-character vocabulary aborts the
#: process at 4 GB). Real ones are far smaller: Gemma 3's 262,144 pieces hold 1.48 M
#: characters (longest 31), so 4 Mi characters (~1.4 GB of trie) leaves room; a piece is at
#: most 1024 characters (PLaMo's own reader's bound).
MAX_UNIGRAM_CHARS = 4 << 20
MAX_UNIGRAM_PIECE_CHARS = 1024


def check_unigram_pieces(pieces: Sequence[str], where: str) -> None:
    """Refuse a Unigram vocabulary too large for ``tokenizers`` to build without aborting.

    Args:
        pieces: the vocabulary's piece texts (str), in id order.
        where: the start of the error message, naming the file.

    Raises:
        SterError: a piece over ``MAX_UNIGRAM_PIECE_CHARS`` characters, or all pieces together
            over ``MAX_UNIGRAM_CHARS`` characters.
    """
    total = 0
    for i, piece in enumerate(pieces):
        n = len(piece)
        if n > MAX_UNIGRAM_PIECE_CHARS:
            raise SterError(f"{where}: piece {i} holds {n} characters; a Unigram piece may hold at most "
                            f"{MAX_UNIGRAM_PIECE_CHARS} (real vocabularies: under 100)")
        total += n
    if total > MAX_UNIGRAM_CHARS:
        raise SterError(f"{where}: its {len(pieces)} pieces hold {total} characters; a Unigram vocabulary may "
                        f"hold at most {MAX_UNIGRAM_CHARS} (Gemma 3's 262,144 pieces hold 1.5 M); the file is "
                        "not a real vocabulary")


def check_precompiled_charsmap(data: bytes, where: str) -> None:
    """Refuse a SentencePiece precompiled character map whose inner sizes do not fit its length.

    Layout (SentencePiece ``normalizer.cc``, ``Normalizer::DecodePrecompiledCharsMap``): a
    little-endian uint32 trie size in bytes, the Darts double-array trie (4-byte units),
    then the NUL-separated normalized strings. tokenizers allocates from the size before
    comparing it with the data, so a crafted size aborts the process; it is checked here.
    Then every node reachable from the root is walked (vectorised, each once) the way
    tokenizers' look-up walks it for any input byte (darts-clone's unit layout: offset,
    label, has-leaf bit, value), so no look-up can index outside the trie or past the
    normalized strings: tokenizers does not check and would panic.

    Args:
        data: the map's bytes. where: the key or file named in the error.

    Raises:
        SterError: shorter than 8 bytes, a trie size that is zero, not a multiple of 4 or
            larger than the bytes that follow it; a trie link or value out of range.
    """
    if len(data) < 8:
        raise SterError(f"{where} is not a SentencePiece character map: {len(data)} bytes is too short for its "
                        "4-byte trie size and a trie; the file is corrupt or from an unknown converter")
    trie_size = int.from_bytes(data[:4], "little")
    if trie_size == 0 or trie_size % 4 or trie_size > len(data) - 4:
        raise SterError(f"{where} is not a SentencePiece character map: its trie size {trie_size} does not fit "
                        f"its {len(data)} bytes (it must be a non-zero multiple of 4 of at most {len(data) - 4}); "
                        "the file is corrupt or from an unknown converter")
    problem = _trie_problem(np.frombuffer(data, dtype="<u4", count=trie_size // 4, offset=4).astype(np.int64),
                            data[4 + trie_size:])
    if problem:
        raise SterError(f"{where} is not a SentencePiece character map: {problem}; the file is corrupt or from an "
                        "unknown converter")


def _trie_problem(units: np.ndarray, normalized: bytes) -> str | None:
    """Why a look-up in this darts-clone double array could leave it, or None when none can.

    A unit ``u`` holds: offset ``(u >> 10) << ((u & 512) >> 6)``, has-leaf bit ``(u >> 8) & 1``,
    label ``u & 0x800000FF``, and (for a value unit) value ``u & 0x7FFFFFFF``. From a node
    whose base is ``b``, byte ``c`` leads to unit ``b ^ c`` when its label is ``c``; that
    child's base is ``(b ^ c) ^ offset``, and a leaf's value unit sits at that base.
    """
    n = len(units)

    def offset(u: np.ndarray) -> np.ndarray:
        return (u >> 10) << ((u & 512) >> 6)

    byte = np.arange(1, 256, dtype=np.int64)
    seen = np.zeros(n, dtype=bool)
    base = offset(units[:1])
    while len(base):
        if base.max() >= n or (base[:, None] ^ byte).max() >= n:
            return "a trie link points outside the trie"
        children = base[:, None] ^ byte
        kids = np.unique(children[(units[children] & 0x800000FF) == byte])
        kids = kids[~seen[kids]]
        seen[kids] = True
        base = kids ^ offset(units[kids])
        if len(base) and base.max() >= n:
            return "a trie link points outside the trie"
        leaf = ((units[kids] >> 8) & 1) == 1
        values = units[base[leaf]] & 0x7FFFFFFF
        if len(values) and values.max() >= len(normalized):
            return "a trie value points past the normalized strings"
        if len(values) and (np.frombuffer(normalized, dtype=np.uint8)[values] & 0xC0 == 0x80).any():
            return "a trie value points inside a UTF-8 character of the normalized strings"
        base = np.unique(base)
    return None


def _check_spm_token_lengths(tokens: Sequence[str]) -> None:
    """Refuse a SentencePiece token over ``MAX_SPM_TOKEN_CHARS`` characters (before any table is built)."""
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    longest = int(lengths.argmax())
    if lengths[longest] > MAX_SPM_TOKEN_CHARS:
        raise SterError(
            f"tokenizer.ggml.tokens[{longest}] is {int(lengths[longest])} characters long; SentencePiece "
            f"vocabularies hold tokens of a few dozen characters and ster refuses any over {MAX_SPM_TOKEN_CHARS}. "
            "The file is corrupt or crafted; re-convert the model"
        )


#: SentencePiece tokens longer than this are refused (real vocabularies stay under ~50).
MAX_SPM_TOKEN_CHARS = 1024


# ----------------------------------------------------------- special handling

@dataclass(frozen=True)
class _TokenKinds:
    """Which tokens are cut out of the text before the scheme runs, as llama.cpp decides.

    special: control and unknown tokens (cut out only when special texts are parsed).
    plain: user-defined tokens (always cut out). end_of_generation: the ids that stop a
    generation. lstrip/rstrip: tokens that swallow the white space before/after them.
    """

    special: frozenset[int]
    plain: frozenset[int]
    end_of_generation: frozenset[int]
    lstrip: frozenset[int]
    rstrip: frozenset[int]


def _token_kinds(meta: Mapping[str, Any], tokens: Sequence[str], types: np.ndarray, vocab: Mapping[str, int],
                 ids: dict[str, int | None]) -> _TokenKinds:
    """Token kinds as llama.cpp's loader (llama_vocab::impl::load) leaves them.

    From ``token_type``: control and unknown tokens are special, user-defined ones plain.
    Then, by text: a fill-in-the-middle token the file names no id for, and every
    end-of-generation text (``END_OF_GENERATION_TEXTS``), becomes control; GPT-OSS's
    channel tokens become user-defined; <|end|> and </s> lose that status next to the
    tokens that say they are ordinary (see ``END_OF_GENERATION_TEXTS``). A FIM role with
    two candidate texts in one vocabulary takes the lowest id (llama.cpp takes the first
    its hash map yields).

    Per model, by name: Phi-3's special tokens swallow the white space after them (not
    <unk>, <s> and <|endoftext|>; </s> does); <mask> swallows the space before it in
    Jina v2 and nomic-bert-moe vocabularies, [MASK] in ModernBERT's.
    """
    control = set(np.flatnonzero(types == CONTROL).tolist())
    unknown = set(np.flatnonzero(types == UNKNOWN).tolist())
    user = set(np.flatnonzero(types == USER_DEFINED).tolist())
    eog: set[int] = set()
    for role, texts in _FIM_TEXTS.items():
        if ids[role] is None:
            found = [vocab[t] for t in texts if t in vocab]
            if found:
                ids[role] = min(found)
                control.add(ids[role])
        if role in ("fim_pad", "fim_rep", "fim_sep") and ids[role] is not None:
            eog.add(ids[role])
    for text in END_OF_GENERATION_TEXTS:
        if text in vocab:
            eog.add(vocab[text])
            control.add(vocab[text])
    eog |= {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
    for text in _ALWAYS_USER_DEFINED:
        if text in vocab:
            i = vocab[text]
            control.discard(i)
            unknown.discard(i)
            user.add(i)
    eog_texts = {tokens[i] for i in eog}
    if "<|end|>" in eog_texts and ({"<|return|>", "<|call|>"} <= eog_texts or {"<|calls|>", "<|flush|>"} <= eog_texts):
        i = vocab["<|end|>"]
        eog.discard(i)
        control.discard(i)
        unknown.discard(i)
        user.add(i)
    if "</s>" in eog_texts and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        i = vocab["</s>"]
        eog.discard(i)
        control.discard(i)
        unknown.discard(i)
        user.discard(i)
    special = frozenset(control | unknown)
    plain = frozenset(user - special)

    lstrip: set[int] = set()
    rstrip: set[int] = set()
    pre = str(meta.get("tokenizer.ggml.pre") or "")
    arch = str(meta.get("general.architecture") or "")
    name = str(meta.get("general.name") or "").lower()
    if any(t in pre for t in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or arch in ("nomic-bert-moe",
                                                                                      "jina-bert-v3"):
        lstrip = {vocab["<mask>"]} if "<mask>" in vocab else set()
    elif "phi-3" in name or "phi3" in name:
        rstrip = set(special | plain) | ({vocab["</s>"]} if "</s>" in vocab else set())
        rstrip -= {vocab[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in vocab}
    elif "modern-bert" in name:
        lstrip = {vocab["[MASK]"]} if "[MASK]" in vocab else set()
    return _TokenKinds(special, plain, frozenset(eog), frozenset(lstrip), frozenset(rstrip))


def _add_special_tokens(tk: tokenizers.Tokenizer, tokens: Sequence[str], kinds: _TokenKinds) -> None:
    """Control, unknown and user-defined tokens are matched whole in the raw text before
    the scheme runs (llama.cpp's tokenizer_st_partition): the special ones only when
    special texts are parsed (tokenizers' ``encode_special_tokens`` False), the plain
    (user-defined) ones always."""
    def added(i: int, special: bool) -> AddedToken:
        return AddedToken(tokens[i], special=special, normalized=False, lstrip=i in kinds.lstrip,
                          rstrip=i in kinds.rstrip)

    if kinds.special:
        tk.add_special_tokens([added(i, True) for i in sorted(kinds.special)])
    if kinds.plain:
        tk.add_tokens([added(i, False) for i in sorted(kinds.plain)])


def clean_up_spaces(text: str) -> str:
    """llama.cpp's ``clean_spaces`` pass of ``llama_detokenize`` (``src/llama-vocab.cpp``).

    Three passes over the text: the space before ``?``, ``!``, ``.`` or ``,`` goes;
    `` ' `` (an apostrophe between spaces) becomes ``'``; the space before ``'s``,
    ``'m``, ``'re`` and ``'ve`` goes (not before ``'t``, ``'d`` or ``'ll``). Used for the
    vocabularies whose ``GGUFTokenizerParts.clean_spaces`` is set.
    """
    text = re.sub(r" ([?!.,])", r"\1", text)
    text = text.replace(" ' ", "'")
    return re.sub(r" '(?=[sm]|re|ve)", "'", text)


def _post_processor(tokens: Sequence[str], bos: int | None, eos: int | None) -> processors.PostProcessor | None:
    if bos is None and eos is None:
        return None
    # Template pieces name the tokens by an identifier (token texts may hold ':' or spaces,
    # which the template syntax cannot spell).
    head = ["BOS"] if bos is not None else []
    tail = ["EOS"] if eos is not None else []
    specials = [{"id": name, "ids": [i], "tokens": [tokens[i]]} for name, i in (("BOS", bos), ("EOS", eos))
                if i is not None]
    single = head + ["$A"] + tail
    pair = single + [f"{t}:1" for t in head] + ["$B:1"] + [f"{t}:1" for t in tail]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
