"""Every ``tokenizer.ggml.pre`` name llama.cpp knows, as ``tokenizers`` pre-tokenizers.

A BPE GGUF file names its pre-tokenizer but does not store it. llama.cpp 0.3.36
(``src/llama-vocab.cpp``, ``llama_vocab::impl::load`` and the ``llm_tokenizer_bpe``
constructor) maps 91 names onto 42 ways of cutting text into words, each with its
own flags. This module holds that map as data (``PRE_TOKENIZERS``: name ->
``PreTokenizerSpec``) and builds each one from ``tokenizers`` parts:
``Split(Regex, "isolated")`` steps run one after the other (the matches and the
gaps between them both become words, as in llama.cpp's ``unicode_regex_split``),
then the GPT-2 byte alphabet (``ByteLevel``) unless the name works on raw UTF-8.

The expressions are written so that the Oniguruma engine of ``tokenizers``, run on
the real text, cuts exactly where llama.cpp cuts. llama.cpp runs most expressions
through ``std::regex`` on a "collapsed" copy of the text in which every non-ASCII
character stands for its Unicode category (a letter, a digit, a punctuation mark,
a symbol, a combining mark, white space or other); a few it runs through
hand-written splitters. That has consequences written into the expressions here:

- A case class (``\\p{Lu}``, ``\\p{Ll}``...) collapses to "any letter": the Tiny Aya
  and Youtu expressions keep no case split at all, and Tekken's and GPT-4o's
  look-aheads over ``[^a-z]``/``[^A-Z]`` treat every non-ASCII letter as both upper
  and lower case (so "ПриветМир" stays one word, where Hugging Face splits it).
- ``\\d`` is ASCII 0-9 only (``[0-9]`` here; Oniguruma's ``\\d`` is every decimal digit).
- llama.cpp's category tables stop at Unicode 15.1, this Oniguruma's go to 16.0: every
  category class here leaves out the characters 16.0 added (``_UNICODE_16``).
- The AFMoE and Tiny Aya digit splitter glues the text before a run of digits to the
  run's first group ("ab1234" -> "ab1", "234"): a ``merged_with_previous`` split.
- The Kimi K2 splitter is written out as the expression it implements, with its
  own list of Han ranges (not ``\\p{Han}``) and no case split.

Source of the facts: llama.cpp 0.3.36 ``src/llama-vocab.cpp`` (names, flags and
expressions), ``src/unicode.cpp`` (``unicode_regex_split``, the collapsed text and the
hand-written splitters) and ``src/unicode-data.cpp`` (the category tables). The tests
compare every name against llama.cpp itself.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, NamedTuple

from tokenizers import Regex, pre_tokenizers

from ster_py.errors import SterError

__all__ = ["Cut", "PreTokenizerSpec", "PRE_TOKENIZERS", "pre_tokenizer_spec", "split_pre_tokenizer",
           "unicode_class"]


class Cut(NamedTuple):
    """One split step: an Oniguruma expression and how its matches become words.

    ``behavior`` is a ``tokenizers`` ``Split`` behaviour: "isolated" (each match and each
    gap between matches is a word) or "merged_with_previous" (each match ends a word
    that starts after the previous match).
    """

    pattern: str
    behavior: str = "isolated"


@dataclass(frozen=True)
class PreTokenizerSpec:
    """What llama.cpp does for one ``tokenizer.ggml.pre`` name of a BPE vocabulary.

    Attributes:
        kind: llama.cpp's pre-tokenizer type the name maps to (``LLAMA_VOCAB_PRE_TYPE_*``
            without the prefix, lower case); names of one kind cut text the same way.
        cuts: the split steps, applied in order to every word the previous step made.
        byte_level: words are mapped through the GPT-2 byte alphabet before merging
            (False: merged as raw UTF-8, unknown pieces fall back to ``<0xHH>`` tokens).
        escape_spaces: spaces become U+2581 before splitting (Gemma 4 style).
        ignore_merges: a word that is itself a vocabulary token skips the merges.
        add_bos: BOS goes in front of a prompt unless ``tokenizer.ggml.add_bos_token`` says no.
        force_bos: BOS goes in front whatever the file says (Gemma 4's workaround).
        default_bos: without ``tokenizer.ggml.bos_token_id``, BPE's default BOS/EOS id 11
            applies to BOS too (False for the ChatGLM names: no BOS unless the file names one).
        clean_spaces: llama.cpp's detokenizer removes the space before ``?!.,`` and
            before some apostrophe contractions (``llama_detokenize``).

    Not a field: llama.cpp also takes a Gemma 4 word of newlines that is itself a token
    without merging; plain merging reaches the same token on Gemma 4's vocabulary.
    """

    kind: str
    cuts: tuple[Cut, ...]
    byte_level: bool = True
    escape_spaces: bool = False
    ignore_merges: bool = False
    add_bos: bool = False
    force_bos: bool = False
    default_bos: bool = True
    clean_spaces: bool = True


# ----------------------------------------------------------------- Unicode classes

#: Characters Unicode 16.0 assigned to each category. The Oniguruma engine of tokenizers
#: knows them; llama.cpp 0.3.36's tables (Unicode 15.1) do not, so there they are
#: unassigned, in no category. A test checks every code point against llama.cpp's table.
_UNICODE_16 = {
    "L": "1C89-1C8A A7CB-A7CD A7DA-A7DC 105C0-105F3 10D4A-10D65 10D6F-10D85 10EC2-10EC4 11380-11389 1138B 1138E "
         "11390-113B5 113B7 113D1 113D3 11BC0-11BE0 13460-143FA 16100-1611D 16D40-16D6C 18CFF 1E5D0-1E5ED 1E5F0",
    "N": "10D40-10D49 116D0-116E3 11BF0-11BF9 16130-16139 16D70-16D79 1CCF0-1CCF9 1E5F1-1E5FA",
    "P": "1B4E-1B4F 1B7F 10D6E 113D4-113D5 113D7-113D8 11BE1 16D6D-16D6F 1E5FF",
    "S": "2427-2429 31E4-31E5 10D8E-10D8F 1CC00-1CCEF 1CD00-1CEB3 1F8B2-1F8BB 1F8C0-1F8C1 1FA89 1FA8F 1FABE 1FAC6 "
         "1FADC 1FADF 1FAE9 1FBCB-1FBEF",
    "M": "897 10D69-10D6D 10EFC 113B8-113C0 113C2 113C5 113C7-113CA 113CC-113D0 113D2 113E1-113E2 11F5A 1611E-1612F "
         "1E5EE-1E5EF",
}


def _ranges(spec: str) -> str:
    """Class contents for hexadecimal code points and ranges: "41-5A 61" -> ``\\x{41}-\\x{5A}\\x{61}``."""
    out = []
    for item in spec.split():
        first, _, last = item.partition("-")
        out.append(rf"\x{{{first}}}" + (rf"-\x{{{last}}}" if last else ""))
    return "".join(out)


def unicode_class(category: str) -> str:
    """A character class (Oniguruma syntax) of a Unicode category as llama.cpp 0.3.36 reads it.

    ``category`` is one of L, N, P, S, M; the result is ``\\p{L}`` (or N...) without the characters
    Unicode 16.0 added, as a bracket class that may also stand inside another one.
    """
    return rf"[\p{{{category}}}&&[^{_ranges(_UNICODE_16[category])}]]"


_CATEGORY = re.compile(r"\\p\{([LNPSM])\}")


def _as_llama_cpp_categories(pattern: str) -> str:
    """Every ``\\p{X}`` of ``pattern`` narrowed to llama.cpp's category (``unicode_class``);
    the nested class is a union member inside a bracket class, a class of its own outside."""
    return _CATEGORY.sub(lambda m: unicode_class(m.group(1)), pattern)


# -------------------------------------------------------------------- expressions
# Each expression as llama.cpp (after its collapsing) matches it, in Oniguruma syntax.

# English contractions; ASCII case only (llama.cpp spells (?i:...) out this way).
_C = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_WS = r"\s*[\r\n]+|\s+(?!\S)|\s+"  # newline runs, spaces left before a word, other runs
_LEAD = r"[^\r\n\p{L}\p{N}]?"  # one optional non-letter, non-digit before a word

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = rf"{_C}|{_LEAD}\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_WS}"
QWEN2 = rf"{_C}|{_LEAD}\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_WS}"
QWEN35 = rf"{_C}|{_LEAD}[\p{{L}}\p{{M}}]+|\p{{N}}| ?[^\s\p{{L}}\p{{M}}\p{{N}}]+[\r\n]*|{_WS}"
MINICPM5_WORDS = rf"{_C}|{_LEAD}\p{{L}}+|\p{{N}}+| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_WS}"
UFAKZEKA = rf"{_LEAD}\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_WS}"
SEED_CODER = rf"{_C}|{_LEAD}\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}\r\n]+|{_WS}"
BAILINGMOE = rf"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|{_LEAD}\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*" \
             r"|\s*[\r\n]|\s+(?!\S)|\s+"
EXAONE_MOE = rf"{_C}|{_LEAD}(?:\p{{L}}\p{{M}}*(?: \p{{L}}\p{{M}}*)*)+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]?" \
             r"|\s*[\r\n]|\s+(?!\S)|\s+"
# Jais 2: Llama 3's expression with space runs cut into powers of two.
JAIS2 = (rf"{_C}|{_LEAD}\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|"
         + "|".join(rf"\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4)) + r"|\s{1,2}(?!\S)|\s")


def _cased_words(letters: str, digits: str) -> str:
    """GPT-4o's words (an upper-case run, then lower case) as llama.cpp's collapsed
    look-aheads decide case: a letter that is not a-z counts as upper, one that is not
    A-Z as lower, so every non-ASCII letter is both."""
    upper, lower = rf"[{letters}&&[^a-z]]", rf"[{letters}&&[^A-Z]]"
    return (rf"{_LEAD}{upper}*{lower}+{_C}?|{_LEAD}{upper}+{lower}*{_C}?|{digits}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|" + _WS)


GPT4O = _cased_words(r"\p{L}", r"\p{N}{1,3}")
GRANITE_EMB_MULTI = _cased_words(r"\p{L}\p{M}", r"\p{N}{1,3}")
TEKKEN = _cased_words(r"\p{L}", r"\p{N}").replace(f"{_C}?", "")
# Tiny Aya's and Youtu's case classes collapse to "letter or mark" on both sides.
TINY_AYA_WORDS = rf"{_LEAD}[\p{{L}}\p{{M}}]+{_C}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|{_WS}"
YOUTU_WORDS = rf"{_LEAD}[\p{{L}}\p{{M}}]+{_C}?|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n/]*|{_WS}"

# DeepSeek V3 / HunYuan dense: ASCII punctuation glued to a following ASCII word.
_ASCII_PUNCT = r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"""
DEEPSEEK3_WORDS = (rf"{_ASCII_PUNCT}[A-Za-z]+|[^\r\n\p{{L}}\p{{P}}\p{{S}}]?[\p{{L}}\p{{M}}]+| ?[\p{{P}}\p{{S}}]+[\r\n]*"
                   rf"|{_WS}")
SPARK2_5_WORDS = (rf"{_ASCII_PUNCT}[A-Za-z]+|[^\r\n\p{{L}}\p{{P}}\p{{S}}]?[\p{{L}}\p{{M}}]+| ?[\p{{P}}\p{{S}}]+|[\r\n]"
                  r"|\s+(?!\S)|\s+")
CJK_KANA = r"[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+"
# llama.cpp runs an expression without a category on the text with every non-ASCII space
# replaced by U+000B, so a literal range never matches a space (U+3000 is one).
CJK_HANGUL = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}&&\S]+"
YOUTU_ASIAN = (r"[\x{AC00}-\x{D7A3}\x{3131}-\x{318E}]+"
               r"|[\x{FF01}\x{2026}\x{201C}\x{201D}\x{2018}\x{2019}\x{2014}\x{FF1A}\x{FF1B}\x{FF0C}\x{3001}-\x{303F}"
               r"\x{FE30}-\x{FE4F}]+|[\x{3105}-\x{312F}]+|" + CJK_KANA)
AFMOE_ASIAN = ("[" + _ranges("4E00-9FFF 3400-4DBF 8C48-FAFF 3040-309F 30A0-30FF FF65-FF9F 2F00-2FDF E40-E7F E80-EFF "
                             "1780-17FF 1000-109F AA60-AA7F A9E0-A9FF AC00-D7AF 1100-11FF") + "]+")

# DeepSeek LLM's cased-letter class (from its tokenizer.json), as code point ranges.
_DEEPSEEK_LETTERS = _ranges(
    "41-5A 61-7A B5 C0-D6 D8-F6 F8-1BA 1BC-1BF 1C4-293 295-2AF 370-373 376-377 37B-37D 37F 386 388-38A 38C 38E-3A1 "
    "3A3-3F5 3F7-481 48A-52F 531-556 10A0-10C5 13A0-13F5 13F8-13FD 1C90-1CBA 1CBD-1CBF 1D00-1D2B 1D6B-1D77 1D79-1D9A "
    "1E00-1F15 1F18-1F1D 1F20-1F45 1F48-1F4D 1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 1FB6-1FBC 1FBE 1FC2-1FC4 "
    "1FC6-1FCC 1FD0-1FD3 1FD6-1FDB 1FE0-1FEC 1FF2-1FF4 1FF6-1FFC 2102 2107 210A-2113 2115 2119-211D 2124 2126 2128 "
    "212A-212D 212F-2134 2139 213C-213F 2145-2149 214E 2183-2184 2C00-2C7B 2C7E-2CE4 2CEB-2CEE 2CF2-2CF3 A640-A66D "
    "A680-A69B A722-A76F A771-A787 A78B-A78E AB70-ABBF FB00-FB06 FB13-FB17 FF21-FF3A FF41-FF5A 10400-1044F "
    "104B0-104D3 104D8-104FB 10C80-10CB2 10CC0-10CF2 118A0-118DF 1E900-1E943")
DEEPSEEK_LLM_PUNCT = r"\s?[!-/:-~" + _ranges("FF01-FF0F FF1A-FF5E 2018-201F 3000-3002") + r"&&\S]+"

# BLOOM / Poro / GPT-3 Finnish: anything up to white space or one of these marks.
BLOOM = r" ?[^(\s|.,!?" + _ranges("2026 3002 FF0C 3001 964 6D4 60C") + ")]+"

# The Kimi K2 splitter (src/unicode.cpp): Han runs, then words of other letters (no marks,
# no case split), digits in threes, punctuation runs, white space as in Llama 3.
_HAN = _ranges("4E00-9FFF 3400-4DBF 20000-2A6DF 2A700-2B73F 2B740-2B81F 2B820-2CEAF 2CEB0-2EBEF F900-FAFF "
               "2F800-2FA1F")
KIMI_K2 = (rf"[{_HAN}]+|{_LEAD}[\p{{L}}&&[^{_HAN}]]+(?:'[sStTmMdD]|'(?:[rR][eE]|[vV][eE]|[lL][lL]))?"
           rf"|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|{_WS}")

# AFMoE / Tiny Aya digits: runs cut into threes from the right, the text before a run
# glued to its first group (llama.cpp's splitter emits everything since the last cut).
DIGIT_GROUPS = Cut(r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))", "merged_with_previous")
NEWLINE_RUNS = r"[^\n]+|\n+"


def _cuts(*patterns: str | Cut) -> tuple[Cut, ...]:
    return tuple(p if isinstance(p, Cut) else Cut(p) for p in patterns)


# ------------------------------------------------------------------ kinds and names
# llama.cpp's pre-tokenizer kinds (LLAMA_VOCAB_PRE_TYPE_*) and their split steps.

_KIND = {
    "default": _cuts(r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "llama3": _cuts(LLAMA3),
    "jais2": _cuts(JAIS2),
    "dbrx": _cuts(LLAMA3),
    "smaug": _cuts(LLAMA3),
    "chatglm4": _cuts(LLAMA3),
    "deepseek_llm": _cuts(r"[\r\n]", r"\s?[" + _DEEPSEEK_LETTERS + "]+", DEEPSEEK_LLM_PUNCT, r"\s+\z", CJK_HANGUL,
                          r"\p{N}+"),
    "deepseek_coder": _cuts(r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL, r"\p{N}"),
    "deepseek3_llm": _cuts(r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3_WORDS),
    "spark2_5": _cuts(r"\p{N}{1,3}", CJK_KANA, SPARK2_5_WORDS, r"\p{N}"),
    "youtu": _cuts(YOUTU_ASIAN, YOUTU_WORDS),
    "falcon": _cuts(r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "starcoder": _cuts(r"\p{N}", GPT2),
    "gpt2": _cuts(GPT2),
    "qwen2": _cuts(QWEN2),
    "qwen35": _cuts(QWEN35),
    "bloom": _cuts(BLOOM),
    "viking": _cuts(BLOOM, r"\p{N}"),
    "tekken": _cuts(TEKKEN),
    "chameleon": _cuts("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\t\n]|    |  )", r"\p{N}",
                       r"[\p{P}!-/:-@\[-`{-~]", GPT2),
    "gpt4o": _cuts(GPT4O),
    "granite_emb_multi": _cuts(GRANITE_EMB_MULTI),
    "tiny_aya": _cuts(DIGIT_GROUPS, TINY_AYA_WORDS),
    "kimi_k2": _cuts(KIMI_K2),
    "superbpe": _cuts(r"\p{N}+", "(?=(?:[0-9]{3})+(?![0-9]))"),
    "bailingmoe": _cuts(BAILINGMOE),
    "seed_coder": _cuts(SEED_CODER),
    "ufakzeka": _cuts(UFAKZEKA),
    "grok_2": _cuts(QWEN2),
    "afmoe": _cuts(DIGIT_GROUPS, AFMOE_ASIAN, DEEPSEEK3_WORDS),
    "laguna": _cuts(NEWLINE_RUNS, QWEN2),
    "exaone_moe": _cuts(EXAONE_MOE),
    "gemma4": _cuts(NEWLINE_RUNS),
    "sarvam_moe": _cuts(NEWLINE_RUNS),
    "minicpm5": _cuts(r"\p{N}{1,3}", MINICPM5_WORDS),
    "whitespace": _cuts(r"\S+"),
}
for _kind in ("mpt", "olmo", "jais", "trillion", "granite_docling"):
    _KIND[_kind] = _KIND["gpt2"]
for _kind in ("refact", "command_r", "smollm", "codeshell", "exaone", "minerva", "mellum2"):
    _KIND[_kind] = _KIND["starcoder"]
for _kind in ("stablelm2", "hunyuan", "solar_open"):
    _KIND[_kind] = _KIND["qwen2"]
for _kind in ("poro", "gpt3_finnish"):
    _KIND[_kind] = _KIND["bloom"]
for _kind in ("hunyuan_dense", "joyai_llm", "hy_v4"):
    _KIND[_kind] = _KIND["deepseek3_llm"]
_KIND["minimax_m2"] = _KIND["gpt4o"]


def _spec(kind: str, **flags) -> PreTokenizerSpec:
    cuts = tuple(Cut(_as_llama_cpp_categories(c.pattern), c.behavior) for c in _KIND[kind])
    return PreTokenizerSpec(kind=kind, cuts=cuts, **flags)


_NO_CLEAN = {"clean_spaces": False}
_RAW_UTF8 = {"byte_level": False}


def _recipe(kind: str, **flags) -> tuple[str, dict]:
    """A name's (kind, flags), made into its spec by ``_Specs`` when the name is first read."""
    return kind, flags


class _Specs(Mapping):
    """name -> ``PreTokenizerSpec``, each made on first use from its (kind, flags): narrowing the
    patterns of all 91 names took ~3-5 ms of every import, for the one name a file uses."""

    def __init__(self, recipes: dict[str, tuple[str, dict]]):
        self._recipes, self._made = recipes, {}

    def __getitem__(self, name: str) -> PreTokenizerSpec:
        spec = self._made.get(name)
        if spec is None:
            kind, flags = self._recipes[name]
            spec = self._made[name] = _spec(kind, **flags)
        return spec

    def __iter__(self):
        return iter(self._recipes)

    def __len__(self) -> int:
        return len(self._recipes)


#: ``tokenizer.ggml.pre`` -> what llama.cpp 0.3.36 does for it (``llama_vocab::impl::load``).
PRE_TOKENIZERS: Mapping[str, PreTokenizerSpec] = _Specs({
    "default": _recipe("default"),
    **{n: _recipe("llama3", ignore_merges=True, add_bos=True)
       for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                 "jina-v5-nano")},
    "minicpm5": _recipe("minicpm5", ignore_merges=True),
    "deepseek-llm": _recipe("deepseek_llm", **_NO_CLEAN),
    "deepseek-coder": _recipe("deepseek_coder", **_NO_CLEAN),
    "deepseek-v3": _recipe("deepseek3_llm", **_NO_CLEAN),
    "spark2_5": _recipe("spark2_5", **_NO_CLEAN),
    "youtu": _recipe("youtu", ignore_merges=True, **_NO_CLEAN),
    "falcon": _recipe("falcon"),
    "mpt": _recipe("mpt"),
    "starcoder": _recipe("starcoder"),
    **{n: _recipe("gpt2") for n in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
                                  "a.x-4.0", "mellum", "modern-bert", "exaone4")},
    "jais-2": _recipe("jais2"),
    **{n: _recipe("gemma4", escape_spaces=True, force_bos=True, **_RAW_UTF8)
       for n in ("gemma4", "granite-embed-multi-311m")},
    "sarvam-moe": _recipe("sarvam_moe", escape_spaces=True, **_RAW_UTF8, **_NO_CLEAN),
    # llama.cpp also sets add_sep for these three; its BPE tokenizer never appends SEP.
    **{n: _recipe("gpt2") for n in ("jina-v1-en", "jina-v2-code", "roberta-bpe")},
    "whitespace": _recipe("whitespace", **_RAW_UTF8),
    "refact": _recipe("refact"),
    "command-r": _recipe("command_r", **_NO_CLEAN),
    **{n: _recipe("qwen2", **_NO_CLEAN) for n in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2")},
    "qwen35": _recipe("qwen35", **_NO_CLEAN),
    "stablelm2": _recipe("stablelm2"),
    "olmo": _recipe("olmo"),
    "dbrx": _recipe("dbrx"),
    "smaug-bpe": _recipe("smaug"),
    "poro-chat": _recipe("poro", **_NO_CLEAN),
    "chatglm-bpe": _recipe("chatglm4", default_bos=False),
    "glm4": _recipe("chatglm4", default_bos=False, ignore_merges=True),
    "glm5": _recipe("chatglm4", default_bos=False, ignore_merges=True),
    "viking": _recipe("viking", **_NO_CLEAN),
    "jais": _recipe("jais"),
    "tekken": _recipe("tekken", ignore_merges=True, add_bos=True, **_NO_CLEAN),
    "smollm": _recipe("smollm", **_NO_CLEAN),
    "codeshell": _recipe("codeshell"),
    "bloom": _recipe("bloom"),
    "gpt3-finnish": _recipe("gpt3_finnish"),
    "exaone": _recipe("exaone"),
    "exaone-moe": _recipe("exaone_moe"),
    "chameleon": _recipe("chameleon", add_bos=True, **_NO_CLEAN),
    "minerva-7b": _recipe("minerva"),
    "megrez": _recipe("qwen2"),
    **{n: _recipe("gpt4o", **_NO_CLEAN) for n in ("gpt-4o", "llama4", "kanana2", "talkie")},
    "granite-embed-multi-97m": _recipe("granite_emb_multi", ignore_merges=True, **_NO_CLEAN),
    **{n: _recipe("tiny_aya", **_NO_CLEAN) for n in ("tiny_aya", "cohere2moe")},
    "superbpe": _recipe("superbpe", **_NO_CLEAN),
    "trillion": _recipe("trillion", **_NO_CLEAN),
    "granite-docling": _recipe("granite_docling", **_NO_CLEAN),
    **{n: _recipe("bailingmoe", **_NO_CLEAN) for n in ("bailingmoe", "bailingmoe2", "llada-moe")},
    "seed-coder": _recipe("seed_coder", **_NO_CLEAN),
    "hunyuan": _recipe("hunyuan", **_NO_CLEAN),
    "hunyuan-dense": _recipe("hunyuan_dense", **_NO_CLEAN),
    "hy_v4": _recipe("hy_v4", **_NO_CLEAN),
    "joyai-llm": _recipe("joyai_llm", **_NO_CLEAN),
    "kimi-k2": _recipe("kimi_k2", **_NO_CLEAN),
    "ufakzeka": _recipe("ufakzeka", **_NO_CLEAN),
    "grok-2": _recipe("grok_2", **_NO_CLEAN),
    "afmoe": _recipe("afmoe", **_NO_CLEAN),
    "laguna": _recipe("laguna", **_NO_CLEAN),
    "minimax-m2": _recipe("minimax_m2", **_NO_CLEAN),
    "solar-open": _recipe("solar_open", **_NO_CLEAN),
    "mellum2": _recipe("mellum2"),
})


def pre_tokenizer_spec(name: str) -> PreTokenizerSpec:
    """The spec of a ``tokenizer.ggml.pre`` name.

    Raises:
        SterError: llama.cpp 0.3.36 does not know the name (the message lists the known ones).
    """
    spec = PRE_TOKENIZERS.get(name)
    if spec is None:
        raise SterError(
            f"unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); supported (llama.cpp 0.3.36's "
            f"{len(PRE_TOKENIZERS)} names): {', '.join(sorted(PRE_TOKENIZERS))}. A newer llama.cpp may know it, but "
            "ster cannot split text for this vocabulary; use the model's Hugging Face checkpoint (tokenizer.json) "
            "instead"
        )
    return spec


def split_pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer:
    """The text-splitting part of a ``tokenizer.ggml.pre`` name, without the byte mapping.

    Returns a ``tokenizers`` pre-tokenizer: one ``Split`` per step of the name's
    ``cuts``, in a ``Sequence`` when there are several; words come out as text.

    Raises:
        SterError: an unknown name.
    """
    splits = [pre_tokenizers.Split(Regex(c.pattern), behavior=c.behavior) for c in pre_tokenizer_spec(name).cuts]
    return splits[0] if len(splits) == 1 else pre_tokenizers.Sequence(splits)


del _kind
