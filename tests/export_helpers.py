"""Tiny checkpoints that can be written as GGUF: a byte-level BPE tokenizer trained in the test.

``tiny.build_checkpoint`` writes a word-level tokenizer (no GGUF vocabulary expresses one); here the
same random transformers models get a real byte-level BPE vocabulary (trained with the ``tokenizers``
library on a fixed text, deterministic), GPT-2 style, with ChatML specials and a chat template, so
that ``ster convert`` writes their tokenizer as llama.cpp reads it.
"""
from __future__ import annotations

import json
from pathlib import Path

from tiny import build_checkpoint

CORPUS = """The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!
How vexingly quick daft zebras jump; 1234567890 numbers, 3.14 and 42 apples.
A model that runs on the CPU reads its weights, its tokenizer and its template, then writes text.
Steering adds a direction to the residual stream; quantization keeps weights in small blocks.
""" * 20

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def write_bpe_tokenizer(path: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer.json (ids 0-2 the ChatML specials) of at most ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer=trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}))


def tiny_bpe_checkpoint(path: Path, model_type: str, config: dict, seed: int = 0, scale: float = 1.0):
    """``tiny.build_checkpoint`` with a byte-level BPE tokenizer (``config["vocab_size"]`` ids) in place of the
    word-level one; returns transformers' model.

    ``scale`` multiplies every matrix but the embeddings and the head: at 0.25 the random blocks perturb the
    residual stream instead of scrambling it, so that next-token margins exceed the few per cent by which
    llama.cpp's 8-bit activations move quantized logits (as ``test_parity_moe`` does for its routers)."""
    model = build_checkpoint(path, model_type, config, seed=seed)
    if scale != 1.0:
        import torch

        keep = {id(p) for p in (model.get_input_embeddings().weight, model.get_output_embeddings().weight)}
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim > 1 and id(p) not in keep and "wpe" not in name:
                    p.mul_(scale)
        model.save_pretrained(path)
    write_bpe_tokenizer(path, config["vocab_size"])
    return model
