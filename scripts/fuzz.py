"""Structure-aware fuzzing of ster's untrusted inputs, every case in a child process.

Four kinds of input, each mutated from a small valid seed built here (no network):

- ``gguf``: a tiny llama GGUF (SentencePiece vocabulary, chat template); the metadata
  entries and tensor infos are mutated as values (boundary integers, wrong types, long
  or invalid strings, inflated counts, nested arrays, shapes, types, offsets) and the
  bytes re-serialized, sometimes then truncated or bit-flipped;
- ``safetensors``: the JSON header of a tiny checkpoint's model.safetensors (numbers out
  of range, Infinity, overlapping or reordered offsets, dtypes, header length);
- ``checkpoint``: the directory's config.json, tokenizer.json, tokenizer_config.json and
  the index (values replaced, keys dropped, normalizers and decoders stacked, special
  files: symlinks to /dev/zero, FIFOs, directories, empty files);
- ``template``: chat templates assembled from fragments (loops, nesting, filters with
  extreme arguments, format strings, big numbers, repeats);
- ``adapter``: a PEFT LoRA adapter of the tiny checkpoint: its adapter_config.json (values
  replaced, keys dropped or added, other targets, ranks, alphas, bases) and the JSON header
  of its adapter_model.safetensors (as ``safetensors``); a case applies it at run time
  (``generate --adapter``'s steps, one token) and merges it (``tune merge``).

Each case runs ``inspect``, ``load``, a tokenize/render and one generated token (for the
kinds that make a model) in a forked child under an address-space limit
(``--memory``, default 3 GiB more than the parent holds) and a timeout (``--timeout``,
20 CPU seconds, the machine may be shared; 10x that in wall-clock time as a backstop). Outcomes: ``ok`` (accepted), ``refused`` (one SterError), ``traceback`` (any other
exception), ``memory`` (MemoryError), ``signal`` (the child died of a signal), ``timeout``.
The harness itself never loads torch or transformers.

    python scripts/fuzz.py --cases 10000                 # every kind, 10,000 cases each
    python scripts/fuzz.py --kind template --cases 300 --seed 7 --jobs 2
    python scripts/fuzz.py --cases 10000 --findings /tmp/fuzz-findings   # keep failing inputs

Exit status 1 when any case ends in a traceback, signal, timeout or memory outcome.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KINDS = ("gguf", "safetensors", "checkpoint", "template", "adapter")
OUTCOMES = ("ok", "refused", "traceback", "memory", "signal", "timeout")
BAD = ("traceback", "memory", "signal", "timeout")
_EXIT = {"ok": 0, "refused": 10, "traceback": 11, "memory": 12}
_BY_EXIT = {v: k for k, v in _EXIT.items()}

VOCAB = 40
DIMS = dict(hidden=16, ffn=24, heads=2, kv_heads=1, head_dim=8, layers=1, context=64)
#: A fuzzed template's time budget (s); the renderer's kill grace is cut to match (see main).
TEMPLATE_SECONDS = 1.0
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# ------------------------------------------------------------------ extreme values

def _numbers(rng: random.Random):
    return rng.choice([0, 1, -1, 2, 3, 7, 255, 256, 65535, 2**31 - 1, 2**31, -2**31, 2**32, 2**53 + 1,
                       2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, 0.5, -0.0, 1e-45, 1e308, float("inf"),
                       float("-inf"), float("nan"), rng.randint(-1000, 1000), rng.randint(0, 2**40)])


def _strings(rng: random.Random):
    return rng.choice(["", "x", "llama", "gpt2", "\u2581", "\ud800", "\x00", "a" * rng.randint(1, 5000),
                       "{{ 1 }}", "%s" * 10, "../../etc/passwd", "/dev/zero", "q" * 100_000,
                       "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 20)))])


def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.35:
        return _numbers(rng)
    if r < 0.6:
        return _strings(rng)
    if r < 0.7:
        return rng.choice([None, True, False])
    if depth > 3:
        return []
    if r < 0.85:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.97:
        return {_strings(rng)[:20]: _json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    nest = rng.choice([100, 1000, 5000, 100_000])
    return json.loads("[" * nest + "]" * nest) if nest < 900 else {"deep": "[" * nest + "]" * nest}


def _load(path: Path):
    """A seed file's JSON for the next mutation; {} when an earlier one broke or replaced it."""
    try:
        if not path.is_file() or path.is_symlink():
            return {}
        value = json.loads(path.read_bytes().decode("utf-8", "surrogatepass"))
        return value if isinstance(value, dict) else {}
    except (ValueError, RecursionError):
        return {}


def _write(path: Path, text: str) -> None:
    if path.is_symlink() or path.is_dir() or (path.exists() and not path.is_file()):
        return  # a special file put there by an earlier mutation stays
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


def _dump(value) -> str:
    text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=str)
    return text.replace('{"deep": "', "").replace(']"}', "]") if '{"deep": "[' in text else text


# ------------------------------------------------------------------ seeds

def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """HF llama tensor names -> float32 arrays (tiny)."""
    d = DIMS
    h, f, q, kv = d["hidden"], d["ffn"], d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    w = {"model.embed_tokens.weight": (VOCAB, h), "model.norm.weight": (h,), "lm_head.weight": (VOCAB, h)}
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                  p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                  p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                  p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                  p + "mlp.down_proj.weight": (h, f)})
    return {k: (rng.standard_normal(s) * 0.2).astype(np.float32) for k, s in w.items()}


def write_checkpoint(path: Path) -> None:
    """A tiny llama checkpoint directory: config.json, model.safetensors, tokenizer files."""
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    d = DIMS
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
              "hidden_size": d["hidden"], "intermediate_size": d["ffn"], "num_hidden_layers": d["layers"],
              "num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"], "head_dim": d["head_dim"],
              "max_position_embeddings": d["context"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    (path / "config.json").write_text(json.dumps(config))
    save_file(_weights(np.random.default_rng(0)), str(path / "model.safetensors"))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": TEMPLATE}))


ADAPTER_RANK = 2
ADAPTER_TARGETS = ("q_proj", "v_proj", "down_proj")


def write_adapter(path: Path) -> None:
    """A PEFT LoRA adapter for ``write_checkpoint``'s model (the files PEFT saves; no torch needed)."""
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    shapes = {k: v.shape for k, v in _weights(np.random.default_rng(0)).items()}
    rng = np.random.default_rng(1)
    tensors = {}
    for i in range(DIMS["layers"]):
        for target in ADAPTER_TARGETS:
            part = "mlp" if target == "down_proj" else "self_attn"
            out, inp = shapes[f"model.layers.{i}.{part}.{target}.weight"]
            stem = f"base_model.model.model.layers.{i}.{part}.{target}"
            tensors[stem + ".lora_A.weight"] = (rng.standard_normal((ADAPTER_RANK, inp)) * 0.1).astype(np.float32)
            tensors[stem + ".lora_B.weight"] = (rng.standard_normal((out, ADAPTER_RANK)) * 0.1).astype(np.float32)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": ADAPTER_RANK, "lora_alpha": 4,
         "target_modules": list(ADAPTER_TARGETS), "base_model_name_or_path": None, "revision": None,
         "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "bias": "none",
         "modules_to_save": None, "layers_to_transform": None}))


def mutate_adapter(rng: random.Random, seed_dir: Path, case_dir: Path) -> None:
    """The seed adapter with its config's values and / or its weights' header mutated."""
    shutil.copytree(seed_dir, case_dir)
    if rng.random() < 0.5:
        path = case_dir / "adapter_model.safetensors"
        path.write_bytes(mutate_safetensors(rng, path.read_bytes()))
        if rng.random() < 0.5:
            return
    cfg = _load(case_dir / "adapter_config.json")
    keys = list(cfg) + ["layers_pattern", "rank_pattern", "alpha_pattern", "init_lora_weights", "lora_bias"]
    for _ in range(rng.randint(1, 3)):
        key, r = rng.choice(keys), rng.random()
        if r < 0.15:
            cfg.pop(key, None)
        elif r < 0.3:
            cfg[key] = rng.choice([["q_proj"], ["o_proj", "gate_proj"], "all-linear", [], ["lm_head"], ".*q_proj",
                                   {"q_proj": 1}, ["q_proj"] * 3])
        elif r < 0.45:
            cfg[key] = rng.choice([0, 1, 2, 3, -1, 64, 2 ** 40, 0.5, -0.0, True, "2", None])
        elif r < 0.55:
            cfg[key] = rng.choice(["LORA", "LOHA", "IA3", "lora", "", "PROMPT_TUNING", "ADALORA"])
        else:
            cfg[key] = _json_value(rng)
    _write(case_dir / "adapter_config.json", _dump(cfg))


# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
         I64: "<q", F64: "<d"}


def gguf_seed() -> tuple[list, list]:
    """(metadata [(key, type, value, elem)], tensors [(name, dims innermost first, ggml type, data)])."""
    d = DIMS
    tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "c"]
    tokens += [f"t{i}" for i in range(VOCAB - len(tokens))]
    meta = [("general.architecture", STRING, "llama", None), ("general.alignment", U32, 32, None),
            ("llama.block_count", U32, d["layers"], None), ("llama.context_length", U32, d["context"], None),
            ("llama.embedding_length", U32, d["hidden"], None), ("llama.feed_forward_length", U32, d["ffn"], None),
            ("llama.attention.head_count", U32, d["heads"], None),
            ("llama.attention.head_count_kv", U32, d["kv_heads"], None),
            ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5, None), ("llama.rope.freq_base", F32, 1e4, None),
            ("llama.rope.dimension_count", U32, d["head_dim"], None),
            ("tokenizer.ggml.model", STRING, "llama", None),
            ("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
            ("tokenizer.ggml.scores", ARRAY, [-float(i) for i in range(VOCAB)], F32),
            ("tokenizer.ggml.token_type", ARRAY, [2, 3, 3] + [1] * (VOCAB - 3), I32),
            ("tokenizer.ggml.bos_token_id", U32, 1, None), ("tokenizer.ggml.eos_token_id", U32, 2, None),
            ("tokenizer.chat_template", STRING, TEMPLATE, None)]
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
           "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    tensors = []
    for name, array in _weights(np.random.default_rng(1)).items():
        if name in names:
            gname = names[name]
        else:
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{i}.{per[rest.removesuffix('.weight')]}.weight"
        tensors.append((gname, tuple(reversed(array.shape)), 0, array.tobytes()))  # type 0 = F32
    return meta, tensors


def _gstr(s) -> bytes:
    b = s if isinstance(s, bytes) else str(s).encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(b)) + b


def _gvalue(vtype: int, value, elem) -> bytes:
    """Encode a value as type ``vtype`` (whatever the mutated value is: never raises)."""
    if vtype == STRING:
        return _gstr(value)
    if vtype == ARRAY:
        items = list(value) if isinstance(value, (list, tuple)) else []
        elem = elem if isinstance(elem, int) else U8
        body = b"".join(_gvalue(elem, v, U8) for v in items)
        return struct.pack("<IQ", elem % 2**32, len(items)) + body
    fmt = _PACK.get(vtype)
    if fmt is None:
        return b""
    try:
        return struct.pack(fmt, value)
    except (struct.error, TypeError, OverflowError, ValueError):
        return struct.pack(fmt, 0)


def gguf_bytes(meta, tensors, n_kv=None, n_tensors=None, version=3) -> bytes:
    out = [b"GGUF", struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                len(meta) if n_kv is None else n_kv)]
    for key, vtype, value, elem in meta:
        out.append(_gstr(key) + struct.pack("<I", vtype % 2**32) + _gvalue(vtype, value, elem))
    offset, datas = 0, []
    for name, dims, ggml_type, data in tensors:
        out.append(_gstr(name) + struct.pack("<I", len(dims) % 2**32)
                   + b"".join(struct.pack("<Q", d % 2**64) for d in dims)
                   + struct.pack("<IQ", ggml_type % 2**32, offset % 2**64))
        pad = -len(data) % 32
        datas.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = b"".join(out)
    head += b"\0" * (-len(head) % 32)
    return head + b"".join(datas)


# ------------------------------------------------------------------ mutators

def mutate_gguf(rng: random.Random, seed) -> bytes:
    meta, tensors = [list(m) for m in seed[0]], [list(t) for t in seed[1]]
    n_kv = n_tensors = None
    version = 3
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.30 and meta:  # a metadata value
            m = rng.choice(meta)
            choice = rng.random()
            if choice < 0.4:
                m[1], m[2] = rng.choice([U8, I8, U16, I16, U32, I32, U64, I64, F32, F64, BOOL]), _numbers(rng)
                if isinstance(m[2], float) and m[1] not in (F32, F64):
                    m[2] = 0
            elif choice < 0.6:
                m[1], m[2] = STRING, _strings(rng)
            elif choice < 0.8 and m[1] == ARRAY:
                items = list(m[2])
                op = rng.random()
                if op < 0.3:
                    items = items[:rng.randint(0, len(items))]
                elif op < 0.6 and items:
                    items[rng.randrange(len(items))] = _strings(rng) if m[3] == STRING else _numbers(rng)
                    if m[3] != STRING and isinstance(items[-1], float) and m[3] not in (F32, F64):
                        items[-1] = 0
                else:
                    items = items + [rng.choice(items or ["x"]) for _ in range(rng.randint(1, 3000))]
                m[2] = items
            else:
                m[1], m[3], m[2] = ARRAY, ARRAY, [[] for _ in range(rng.choice([1, 10, 5000, 20000]))]
        elif r < 0.40:  # a new key, sometimes a known one twice
            key = rng.choice([m[0] for m in meta] + ["llama.expert_count", "llama.rope.scaling.type",
                                                      "tokenizer.ggml.merges", "tokenizer.ggml.pre",
                                                      "llama.attention.sliding_window", "x.y"])
            meta.append([key, rng.choice([U32, STRING, F32, ARRAY]), _numbers(rng), STRING])
            if meta[-1][1] == STRING:
                meta[-1][2] = _strings(rng)
            if meta[-1][1] == ARRAY:
                meta[-1][2] = [_strings(rng) for _ in range(rng.randint(0, 50))]
        elif r < 0.45 and meta:
            meta.pop(rng.randrange(len(meta)))
        elif r < 0.70 and tensors:  # a tensor info
            t = rng.choice(tensors)
            op = rng.random()
            if op < 0.4:
                dims = list(t[1])
                value = _numbers(rng)
                dims[rng.randrange(len(dims))] = abs(value) if isinstance(value, int) else 3
                if rng.random() < 0.3:
                    dims.append(rng.choice([1, 2, 3, 2**32]))
                t[1] = tuple(int(x) % 2**64 for x in dims)
            elif op < 0.7:
                t[2] = rng.choice([1, 2, 3, 6, 7, 8, 10, 12, 14, 16, 30, 39, 40, 99, 2**31])
            elif op < 0.85:
                t[0] = rng.choice([_strings(rng)[:2000], t[0] + "x", tensors[0][0]])
            else:
                t[3] = t[3][:rng.randint(0, len(t[3]))]
        elif r < 0.75 and tensors:
            tensors.pop(rng.randrange(len(tensors)))
        elif r < 0.85:  # header counts
            n_kv = rng.choice([0, len(meta) + 1, 2**32, 2**63, 2**64 - 1]) if rng.random() < 0.5 else n_kv
            n_tensors = rng.choice([0, len(tensors) + 1, 2**40, 2**64 - 1]) if rng.random() < 0.5 else n_tensors
        elif r < 0.88:
            version = rng.choice([1, 2, 4, 2**24 * 3, 0])
    data = bytearray(gguf_bytes([tuple(m) for m in meta], [tuple(t) for t in tensors], n_kv, n_tensors, version))
    r = rng.random()
    if r < 0.15 and data:
        del data[rng.randint(0, len(data) - 1):]
    elif r < 0.35 and data:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


_ST_DTYPES = ["F32", "F16", "BF16", "F64", "I32", "I64", "U8", "BOOL", "F8_E4M3", "X", "", 3]
_ST_NUMBERS = ["Infinity", "-Infinity", "NaN", "1e400", "-1", "0", "1.5", "true", "null", '"4"', str(2**63),
               str(2**64 + 16), str(2**32), "9" * 400, "[]", "{}"]


def mutate_safetensors(rng: random.Random, raw: bytes) -> bytes:
    (n,) = struct.unpack_from("<Q", raw)
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    text = None
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        name = rng.choice(names)
        entry = header.get(name)
        if not isinstance(entry, dict):  # an earlier step replaced or dropped it
            continue
        if r < 0.2:
            entry["dtype"] = rng.choice(_ST_DTYPES)
        elif r < 0.45:
            shape = list(entry["shape"]) if isinstance(entry.get("shape"), list) else []
            if shape and rng.random() < 0.7:
                shape[rng.randrange(len(shape))] = "@@"
            else:
                shape = rng.choice([[], [0], ["@@", "@@"], [2**32, 2**32], [1] * 70])
            entry["shape"] = shape
        elif r < 0.7:
            offsets = list(entry.get("data_offsets") or [0, 0]) if isinstance(entry.get("data_offsets"), list) \
                else [0, 0]
            op = rng.random()
            if op < 0.5 and offsets:   # (an earlier step may have left fewer than two)
                offsets[rng.randrange(len(offsets))] = "@@"
            elif op < 0.8:
                other = header.get(rng.choice(names))
                offsets = list(other["data_offsets"]) if isinstance(other, dict) else [0, 4]  # overlap
            else:
                offsets = rng.choice([[0], [0, 0, 0], "x", None])
            entry["data_offsets"] = offsets
        elif r < 0.8:
            header[rng.choice([name, "z" * rng.randint(1, 3000), "__metadata__"])] = _json_value(rng)
        elif r < 0.85:
            header.pop(name)
        elif r < 0.9:
            header["__metadata__"] = {"format": _json_value(rng)}
        else:
            text = rng.choice(["[]", "null", "{", '{"a": ' * 5000, "\xff", ""])
    if text is None:
        text = json.dumps(header, allow_nan=True)
        while "@@" in text:
            text = text.replace('"@@"', rng.choice(_ST_NUMBERS), 1)
    blob = text.encode("utf-8", "surrogatepass")
    size = len(blob)
    r = rng.random()
    if r < 0.1:
        size = rng.choice([0, size + 1, size - 1, 2**63, 2**64 - 1, len(blob) + len(data) + 8])
    return struct.pack("<Q", size % 2**64) + blob + data[:len(data) if rng.random() < 0.9 else rng.randint(0, len(data))]


_CONFIG_KEYS = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                "rms_norm_eps", "rope_theta", "tie_word_embeddings", "bos_token_id", "eos_token_id", "hidden_act",
                "rope_scaling", "rope_parameters", "sliding_window", "layer_types", "partial_rotary_factor",
                "attention_bias", "mlp_bias", "quantization_config", "architectures", "text_config",
                "num_experts", "num_local_experts", "torch_dtype", "pad_token_id"]
_NORMALIZERS = [{"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": "h"}, "content": "hh"},
                {"type": "Replace", "pattern": {"Regex": ""}, "content": "ab"},
                {"type": "Replace", "pattern": {"Regex": "(a*)*$"}, "content": "x"},
                {"type": "Strip", "strip_left": True, "strip_right": True},
                {"type": "Precompiled", "precompiled_charsmap": "AAAA"}, {"type": "Nope"}]
_DECODERS = [{"type": "Replace", "pattern": {"String": "w"}, "content": "ww"}, {"type": "ByteFallback"},
             {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0},
             {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]
_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json",
          "generation_config.json", "special_tokens_map.json", "chat_template.jinja", "model.safetensors"]


def mutate_checkpoint(rng: random.Random, seed_dir: Path, case_dir: Path) -> None:
    shutil.copytree(seed_dir, case_dir, symlinks=True)
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.35:
            config = _load(case_dir / "config.json")
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(_CONFIG_KEYS)
                if rng.random() < 0.15:
                    config.pop(key, None)
                elif key == "model_type" and rng.random() < 0.5:
                    config[key] = rng.choice(["llama", "mistral", "qwen2", "gemma", "gemma3_text", "phi3",
                                              "mixtral", "mamba", "gpt2", "falcon", "bert", "q" * 100_000])
                else:
                    config[key] = _json_value(rng)
            _write(case_dir / "config.json", _dump(config))
        elif r < 0.55:
            doc = _load(case_dir / "tokenizer.json")
            part = rng.choice(["normalizer", "decoder", "pre_tokenizer", "model", "added_tokens", "post_processor"])
            if part == "normalizer":
                doc[part] = {"type": "Sequence", "normalizers": [rng.choice(_NORMALIZERS)
                                                                 for _ in range(rng.randint(1, 45))]}
            elif part == "decoder":
                doc[part] = {"type": "Sequence", "decoders": [rng.choice(_DECODERS) for _ in range(rng.randint(1, 45))]}
            elif part == "model" and rng.random() < 0.5:
                if not isinstance(doc.get("model"), dict) or not isinstance(doc["model"].get("vocab"), dict):
                    doc["model"] = {"type": "WordLevel", "vocab": {}, "unk_token": "<unk>"}
                doc["model"]["vocab"][_strings(rng)[:50]] = rng.choice([0, 5, VOCAB + 10, 2**32, -1])
            else:
                doc[part] = _json_value(rng)
            _write(case_dir / "tokenizer.json", _dump(doc))
        elif r < 0.75:
            doc = _load(case_dir / "tokenizer_config.json")
            key = rng.choice(["bos_token", "eos_token", "chat_template", "added_tokens_decoder", "unk_token",
                              "additional_special_tokens", "pad_token"])
            if key == "chat_template" and rng.random() < 0.6:
                doc[key] = random_template(rng)
            elif key == "added_tokens_decoder" and rng.random() < 0.6:
                doc[key] = {str(rng.choice([5, VOCAB + 3, 2**40, -1])): {"content": _strings(rng)[:100],
                                                                         "special": rng.choice([True, "x"])}}
            else:
                doc[key] = _json_value(rng)
            _write(case_dir / "tokenizer_config.json", _dump(doc))
        elif r < 0.85:
            _write(case_dir / "model.safetensors.index.json", _dump(rng.choice([
                {"weight_map": {"model.norm.weight": rng.choice(["model.safetensors", "missing.safetensors",
                                                                 "../x", 5])}}, _json_value(rng)])))
        else:  # a special file in place of one of ours
            name = rng.choice(_FILES)
            target = case_dir / name
            if target.exists() or target.is_symlink():
                target.unlink() if not target.is_dir() else shutil.rmtree(target)
            how = rng.choice(["dev_zero", "fifo", "dir", "empty", "dangling", "self"])
            if how == "dev_zero":
                target.symlink_to("/dev/zero")
            elif how == "fifo":
                os.mkfifo(target)
            elif how == "dir":
                target.mkdir()
            elif how == "empty":
                target.write_bytes(b"")
            elif how == "dangling":
                target.symlink_to(case_dir / "nowhere")
            else:
                target.symlink_to(target)


_T_EXPR = ["messages", "messages[0]['content']", "'a' * 33554431", "'a' * 1000000", "range(100000)|list",
           "(range(100000)|list) * 10", "10 ** 400", "2 ** 65536", "[1] * 1048576", "'{0:33554431}'.format(1)",
           "'%33554431d%33554431d' % (1, 2)", "'%*d' % (33554431, 1)", "'{0:{1}}'.format(1, 33554431)",
           "'{0}{0}{0}'.format('x' * 20000000)", "namespace(a=1)", "strftime_now('%Y' * 100000)",
           "dict(a=1)", "lipsum()", "raise_exception('no')", "undefined_thing.x", "messages|tojson(indent=100)",
           "'x'|center(40000000)", "'x'|indent(40000000)", "'a\\nb' * 1000000", "1 / 0", "'\\ud800'",
           "tools", "'a'.ljust(99999999)", "''.join(['x'] * 10000000)", "'x'.__class__", "cycler",
           "(range(1000)|list)|batch(10000000, 'x')|list", "'www.a.com ' * 300000", "messages[10]",
           "'%s' % messages", "loop", "self", "[[[[[[1]]]]]]"]
_T_FILTERS = ["|length", "|string", "|sort", "|unique|list", "|urlize", "|wordwrap(1)", "|title", "|upper",
              "|tojson", "|tojson(indent=1000)", "|batch(1000)|list", "|slice(1000000)|list", "|join('xx')",
              "|replace('a', 'aaaa')", "|format(1, 2)", "|center(1000)", "|list", "|sum", "|int", "|float",
              "|first", "|reverse|list", "|dictsort", "|groupby('x')|list", "|map('upper')|list", "|trim",
              "|truncate(5)", "|wordcount", "|e", "|pprint", "|xmlattr", "|random", "|min", "|max", ""]


def random_template(rng: random.Random) -> str:
    def expr() -> str:
        e = rng.choice(_T_EXPR)
        for _ in range(rng.randint(0, 2)):
            e = f"({e}){rng.choice(_T_FILTERS)}"
        return e

    def block(depth: int) -> str:
        r = rng.random()
        if depth > 30 or r < 0.35:
            return "{{ " + expr() + " }}"
        if r < 0.5:
            inner = block(depth + 1)
            return "{% for x in " + rng.choice(["messages", "range(100000)", "range(3)", "[1, 2]"]) + " %}" \
                + inner + "{% endfor %}"
        if r < 0.62:
            return "{% if " + rng.choice(["true", "x", "messages"]) + " %}" + block(depth + 1) + "{% endif %}"
        if r < 0.7:
            return "{% set v = " + expr() + " %}{{ v }}"
        if r < 0.78:
            return "{% macro m(a) %}" + block(depth + 1) + "{{ m(a) }}{% endmacro %}{{ m(1) }}"
        if r < 0.84:
            n = rng.choice([21, 99, 200, 3])
            kind = rng.choice(["for", "if"])
            if kind == "for":
                return "{% for a in [1] %}" * n + "x" + "{% endfor %}" * n
            return "{% if true %}" * n + "x" + "{% endif %}" * n
        if r < 0.9:
            return "{% set ns = namespace(v=[]) %}{% for i in range(" + str(rng.choice([30, 60, 1000])) + \
                ") %}{% set ns.v = [ns.v, ns.v] %}{% endfor %}{{ ns.v" + rng.choice(_T_FILTERS) + " }}"
        if r < 0.95:
            return rng.choice(["{% if x %}{% endif %}" * rng.choice([100, 20000]), "{{ (" * 2000 + "1" + ") }}" * 2000,
                               "{% raw %}", "{{", "{% endfor %}", "{% include 'x' %}", "{% import 'os' as o %}",
                               "{% extends 'x' %}", "{% generation %}x{% endgeneration %}"])
        return block(depth + 1) + block(depth + 1)

    return "".join(block(0) for _ in range(rng.randint(1, 3)))


# ------------------------------------------------------------------ what a case runs

def _use_model(model: str, loaded_ok: list, seconds: float | None = None) -> None:
    from ster_py.generate import Sampling, generate
    from ster_py.inspect import inspect_model
    from ster_py.load import load_model

    try:
        inspect_model(model)
    finally:
        loaded = load_model(model)
    loaded_ok.append(True)
    tok = loaded.tokenizer
    ids = tok.encode("w5 w6 a b hello", add_special_tokens=True)
    tok.decode(ids + [3, 4])
    if tok.chat_template is not None:
        ids = tok.encode(tok.render_chat([{"role": "user", "content": "w5 ab"}], time_limit=seconds or TEMPLATE_SECONDS),
                         add_special_tokens=False)
    generate(loaded.decoder, ids[: 32] or [1], Sampling(max_new_tokens=1))


def _use_adapter(model: str, adapter: str, out: Path) -> None:
    """``generate --adapter``'s steps (read and check against the loaded model, apply, one token), then
    ``tune merge``; the first refusal is raised after both ran."""
    from ster_py.adapters import apply_adapter, load_adapter_for
    from ster_py.errors import SterError
    from ster_py.generate import Sampling, generate
    from ster_py.load import load_model
    from ster_py.tune.merge import merge_adapter

    def at_run_time():
        loaded = load_model(model)
        apply_adapter(loaded, load_adapter_for(adapter, loaded))
        generate(loaded.decoder, [1, 5, 6], Sampling(max_new_tokens=1))

    refusals = []
    for step in (at_run_time, lambda: merge_adapter(model, adapter, out)):
        try:
            step()
        except SterError as e:
            refusals.append(e)
    if refusals:
        raise refusals[0]


def run_case(kind: str, case_dir: Path) -> None:
    """The work of one case (in the child)."""
    if kind == "adapter":
        _use_adapter(str(case_dir / "base"), str(case_dir / "a"), case_dir / "merged")
    elif kind == "gguf":
        _use_model(str(case_dir / "m.gguf"), [])
    elif kind in ("safetensors", "checkpoint"):
        _use_model(str(case_dir / "m"), [])
    else:
        from ster_py.chat import render_chat

        template = (case_dir / "t.jinja").read_text(encoding="utf-8", errors="surrogatepass")
        render_chat(template, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                    bos_token="<s>", eos_token="</s>", time_limit=TEMPLATE_SECONDS)


def make_case(kind: str, rng: random.Random, seeds: dict, case_dir: Path) -> None:
    case_dir.mkdir(parents=True)
    if kind == "gguf":
        (case_dir / "m.gguf").write_bytes(mutate_gguf(rng, seeds["gguf"]))
    elif kind == "safetensors":
        shutil.copytree(seeds["dir"], case_dir / "m")
        (case_dir / "m" / "model.safetensors").write_bytes(mutate_safetensors(rng, seeds["safetensors"]))
    elif kind == "checkpoint":
        mutate_checkpoint(rng, seeds["dir"], case_dir / "m")
    elif kind == "adapter":
        (case_dir / "base").symlink_to(seeds["dir"], target_is_directory=True)   # the base is not mutated
        mutate_adapter(rng, seeds["adapter"], case_dir / "a")
    else:
        (case_dir / "t.jinja").write_text(random_template(rng), encoding="utf-8", errors="surrogatepass")


# ------------------------------------------------------------------ the harness

def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running child and its own children (/proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / _TICKS  # utime stime cutime cstime
    except (OSError, ValueError, IndexError):
        return 0.0


def _child(kind: str, case_dir: Path, memory: int, log: int) -> None:
    """In the forked child: limit, run, exit with the outcome's code."""
    code = _EXIT["traceback"]
    try:
        cap = _address_space() + memory
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(log, 2)
        from ster_py.errors import SterError

        try:
            run_case(kind, case_dir)
            code = _EXIT["ok"]
        except SterError:
            code = _EXIT["refused"]
        except MemoryError:
            code = _EXIT["memory"]
        except BaseException:  # noqa: BLE001 - a traceback is a finding
            traceback.print_exc()
            code = _EXIT["traceback"]
    finally:
        os._exit(code)


def run(kind: str, cases: int, seed: int, jobs: int, memory: int, timeout: float, findings: Path | None,
        work: Path, seeds: dict, on_progress=None) -> dict:
    """Run ``cases`` cases of ``kind``; returns {outcome: count, "seconds": s, "examples": {...}}."""
    counts = {o: 0 for o in OUTCOMES}
    examples: dict[str, list[str]] = {o: [] for o in BAD}
    running: dict[int, tuple] = {}
    next_case, start, last_check, reported = 0, time.monotonic(), 0.0, 0

    def finish(pid: int, status: int) -> None:
        index, case_dir, begun, log_path, timed_out = running.pop(pid)
        if timed_out:
            outcome = "timeout"
        elif os.WIFSIGNALED(status):
            outcome = "signal"
        else:
            outcome = _BY_EXIT.get(os.WEXITSTATUS(status), "traceback")
        counts[outcome] += 1
        if outcome in BAD:
            detail = Path(log_path).read_text(errors="replace")[-3000:]
            examples[outcome].append(f"case {index}: {detail.strip().splitlines()[-1] if detail.strip() else ''}")
            if findings is not None:
                keep = findings / kind / f"{outcome}-{index}"
                shutil.rmtree(keep, ignore_errors=True)
                shutil.copytree(case_dir, keep, symlinks=True, ignore_dangling_symlinks=True,
                                ignore=lambda d, names: [n for n in names if not (Path(d) / n).is_file()
                                                         and not (Path(d) / n).is_dir()])
                (keep / "log.txt").write_text(detail)
        shutil.rmtree(case_dir, ignore_errors=True)
        os.unlink(log_path)

    while next_case < cases or running:
        while next_case < cases and len(running) < jobs:
            rng = random.Random(f"{seed}:{kind}:{next_case}")
            case_dir = work / f"{kind}-{next_case}"
            make_case(kind, rng, seeds, case_dir)
            log_fd, log_path = tempfile.mkstemp(dir=work, suffix=".log")
            pid = os.fork()
            if pid == 0:
                _child(kind, case_dir, memory, log_fd)
            os.close(log_fd)
            running[pid] = (next_case, case_dir, time.monotonic(), log_path, False)
            next_case += 1
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            finish(pid, status)
            continue
        now = time.monotonic()
        if now - last_check > 0.1:
            last_check = now
            for pid, (index, case_dir, begun, log_path, timed_out) in list(running.items()):
                # CPU seconds (the machine may be shared), and a wall-clock backstop of 10x.
                if not timed_out and (_cpu_seconds(pid) > timeout or now - begun > 10 * timeout):
                    os.kill(pid, signal.SIGKILL)
                    running[pid] = (index, case_dir, begun, log_path, True)
        time.sleep(0.002)
        done = sum(counts.values())
        if on_progress is not None and done and done % 250 == 0 and done != reported:
            reported = done
            on_progress({**counts, "seconds": round(time.monotonic() - start, 1), "partial": True})
    return {**counts, "seconds": round(time.monotonic() - start, 1),
            "examples": {k: v[:5] for k, v in examples.items() if v}}


def build_seeds(work: Path) -> dict:
    seed_dir = work / "seed-checkpoint"
    write_checkpoint(seed_dir)
    write_adapter(work / "seed-adapter")
    return {"dir": seed_dir, "safetensors": (seed_dir / "model.safetensors").read_bytes(), "gguf": gguf_seed(),
            "adapter": work / "seed-adapter"}


def check_seeds(seeds: dict, work: Path) -> None:
    """The unmutated seeds must load and generate: a fuzzer whose seeds are refused tests nothing."""
    (work / "seed.gguf").write_bytes(gguf_bytes(*seeds["gguf"]))
    _use_model(str(work / "seed.gguf"), [], seconds=120)  # a loaded machine must not fail the seeds
    _use_model(str(seeds["dir"]), [], seconds=120)
    _use_adapter(str(seeds["dir"]), str(seeds["adapter"]), work / "seed-merged")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=KINDS, action="append", help="input kind (repeatable; default: all)")
    ap.add_argument("--cases", type=int, default=10_000, help="cases per kind (default 10000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="children at a time")
    ap.add_argument("--memory", type=float, default=3.0, help="GiB a case may add to the address space")
    ap.add_argument("--timeout", type=float, default=20.0, help="CPU seconds per case (wall clock: 10x)")
    ap.add_argument("--findings", type=Path, help="directory to keep failing inputs and their logs")
    ap.add_argument("--json", action="store_true", help="print the counts as JSON")
    ap.add_argument("--out", type=Path, help="also write the counts as JSON to this file")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Import everything a case uses once, so each forked child starts warm.
    import ster_py.chat

    ster_py.chat._KILL_GRACE = 1.0  # the budgets are what is tested, not their length: keep cases short
    import ster_py.generate  # noqa: F401
    import ster_py.inspect  # noqa: F401
    import ster_py.load  # noqa: F401
    import ster_py.tune.merge  # noqa: F401

    results = {}
    with tempfile.TemporaryDirectory(prefix="ster-fuzz-") as tmp:
        work = Path(tmp)
        seeds = build_seeds(work)
        check_seeds(seeds, work)
        for kind in args.kind or KINDS:
            def partial(counts, kind=kind):  # the counts so far, for a run stopped before its end
                if args.out:
                    args.out.write_text(json.dumps({**results, kind: counts}, indent=1))

            results[kind] = run(kind, args.cases, args.seed, args.jobs, int(args.memory * (1 << 30)), args.timeout,
                                args.findings, work, seeds, on_progress=partial)
            if not args.json:
                r = results[kind]
                print(f"{kind:12s} " + " ".join(f"{o}={r[o]}" for o in OUTCOMES) + f"  ({r['seconds']} s)",
                      flush=True)
                for outcome, lines in r["examples"].items():
                    for line in lines:
                        print(f"    {outcome}: {line[:300]}")
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
    if args.json:
        print(json.dumps(results, indent=1))
    return 1 if any(r[o] for r in results.values() for o in BAD) else 0


if __name__ == "__main__":
    sys.exit(main())
