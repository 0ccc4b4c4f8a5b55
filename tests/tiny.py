"""Tiny random checkpoints made with transformers, for parity tests.

``make_checkpoint(dir, model_type, **overrides)`` writes config.json,
model.safetensors and a small tokenizer.json (a word-level vocabulary that
covers every id) and returns the transformers model (f32, eval mode) that is
the oracle for that directory. ``build_checkpoint(dir, model_type, config)`` does
the same from a config in the family's own key spellings, with every weight
randomised (the dense-family suites). ``one_torch_thread`` is an autouse fixture
for modules that import it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

VOCAB = 128
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """A word-level tokenizer.json whose ids 0..vocab_size-1 are '<unk>', '<s>', '</s>', 'w3', ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
         "tokenizer_class": "PreTrainedTokenizerFast"}))


def make_checkpoint(path: Path, model_type: str, *, seed: int = 0, dtype=None, **overrides):
    """Build, save and return a tiny random ``model_type`` model (transformers, f32, eval)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    kwargs = dict(SMALL, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kwargs.update(overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # random init leaves norms at 1 and biases at 0: make them matter
        for name, p in model.named_parameters():
            if p.ndim != 1:
                continue
            noise = torch.randn_like(p)
            if "norm" in name:  # Gemma stores norms as offsets from one
                p.copy_(noise * 0.3 + (0.0 if model_type.startswith("gemma") else 1.0))
            else:
                p.copy_(noise * 0.1)
    path.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    write_tokenizer(path, kwargs["vocab_size"])
    if dtype is not None:
        # Reload in f32 rather than casting back: a cast would keep buffers such as the
        # rotary inv_freq rounded to the half dtype, which the saved checkpoint does not hold.
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    return model.float().eval()


# Norms stored as offsets from one (applied as 1 + w) are randomised around zero.
UNIT_OFFSET = {"nemotron", "vaultgemma", "step3p5"}


def build_checkpoint(path: Path, model_type: str, config: dict, *, attn="eager", seed: int = 0):
    """Save a tiny random ``model_type`` checkpoint with ``config``; return transformers' model (f32, eval).

    Unlike ``make_checkpoint``, ``config`` is passed as is (no ``SMALL`` defaults) and every
    matrix is redrawn wider than the default init, so that greedy tokens vary.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = dict(config)
    as_given = config.pop(CONFIG_AS_GIVEN, False)
    cfg = AutoConfig.for_model(TEXT_CONFIG_TYPES.get(model_type, model_type), bos_token_id=1, eos_token_id=2,
                               pad_token_id=0, **config)
    if model_type == "step3p5":
        model = step3p5_causal_lm(cfg, attn).eval()
    elif model_type in CONDITIONAL_GENERATION:  # a wrapper whose only language-model class also holds a vision tower
        import transformers

        model = getattr(transformers, CONDITIONAL_GENERATION[model_type])(cfg).eval()
    else:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()
    with torch.no_grad():
        norm_params = {f"{m}.{p}" if m else p for m, mod in model.named_modules() if "Norm" in type(mod).__name__
                       for p, _ in mod.named_parameters(recurse=False)}
        for name, p in model.named_parameters():
            noise = torch.randn_like(p)
            if p.ndim == 0:
                continue
            if p.ndim > 1 and name not in norm_params:
                p.copy_(noise * 0.15)
            elif name in norm_params and name.endswith("weight"):
                p.copy_(noise * 0.3 + (0.0 if model_type in UNIT_OFFSET else 1.0))
            else:
                p.copy_(noise * 0.1)
        for name, b in model.named_buffers():  # routers' selection-only biases are buffers, zero at init
            if name.endswith(SELECTION_BIASES):
                b.copy_(torch.randn_like(b) * 0.1)
    path.mkdir(parents=True, exist_ok=True)
    if model_type == "step3p5":
        model.save_hub_layout(path, dict(config, model_type=model_type, bos_token_id=1, eos_token_id=2,
                                         pad_token_id=0) if as_given else None)
    else:
        model.save_pretrained(path)
    if model_type in TEXT_CONFIG_TYPES:  # the release's spelling: the text config at the top, its own model_type
        saved = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps(dict(saved, model_type=model_type), indent=1))
    write_tokenizer(path, VOCAB)
    return model


# Families whose releases state the text decoder's config at the top level under the multimodal model_type
# (Transformers' Dots3NoteConfig reads such a config as its text_config): built from the text config and
# causal LM Transformers registers, saved under the release's model_type.
TEXT_CONFIG_TYPES = {"dots3_note": "dots3_note_text"}


# Wrappers Transformers runs only through a conditional-generation class (text and vision): ``config`` holds
# their text_config and a (tiny) vision_config; the text-only forward pass is the oracle.
CONDITIONAL_GENERATION = {"glm5_next": "Glm5NextForConditionalGeneration"}


# A key of a ``build_checkpoint`` config: write config.json as given (a hub spelling Transformers
# reads through its legacy keys) instead of the configuration Transformers saves.
CONFIG_AS_GIVEN = "_config_as_given"


def step3p5_causal_lm(config, attn: str = "eager"):
    """Step 3.5 as Transformers 5 runs it: its ``model_type`` step3p5 maps to ``Step3p7TextConfig``
    and ``Step3p7TextModel``, with no causal-LM class of its own, so this adds the head.

    ``save_hub_layout`` writes the checkpoint under the names stepfun-ai/Step-3.5-Flash uses
    (Transformers' step3p7 conversion mapping, reversed): ``moe.gate_proj`` / ``moe.up_proj`` /
    ``moe.down_proj`` stacked per layer, ``moe.gate``, ``moe.router_bias``, ``share_expert``.
    """
    import torch
    from transformers.models.step3p7.modeling_step3p7 import Step3p7TextModel

    class _Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            config._attn_implementation = attn
            self.config = config
            self.model = Step3p7TextModel(config)
            self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)

        def forward(self, input_ids, past_key_values=None, use_cache=False, output_hidden_states=False):
            from types import SimpleNamespace

            out = self.model(input_ids=input_ids, cache=past_key_values, use_cache=use_cache,
                             output_hidden_states=output_hidden_states)
            return SimpleNamespace(logits=self.lm_head(out.last_hidden_state), past_key_values=out.cache,
                                   hidden_states=out.hidden_states)

        def save_hub_layout(self, path: Path, config_json: dict | None) -> None:
            from safetensors.torch import save_file

            out = {}
            for name, t in self.state_dict().items():
                t = t.detach().contiguous()
                name = name.replace(".mlp.gate.e_score_correction_bias", ".moe.router_bias")
                name = name.replace(".mlp.gate.", ".moe.gate.").replace(".mlp.shared_experts.", ".share_expert.")
                if name.endswith(".mlp.experts.gate_up_proj"):
                    half = t.shape[1] // 2
                    stem = name[: -len(".mlp.experts.gate_up_proj")]
                    out[stem + ".moe.gate_proj.weight"] = t[:, :half].contiguous()
                    out[stem + ".moe.up_proj.weight"] = t[:, half:].contiguous()
                    continue
                if name.endswith(".mlp.experts.down_proj"):
                    name = name[: -len(".mlp.experts.down_proj")] + ".moe.down_proj.weight"
                out[name] = t
            save_file(out, str(path / "model.safetensors"), metadata={"format": "pt"})
            if config_json is None:
                config_json = self.config.to_dict()
            config_json["architectures"] = ["Step3p5ForCausalLM"]
            (path / "config.json").write_text(json.dumps(config_json))

    return _Model()


# Buffers that routers add to their scores to choose experts (not parameters, so not redrawn above).
SELECTION_BIASES = ("e_score_correction_bias", "expert_bias")


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The oracle runs on one thread: tiny matmuls on two contended cores cost 10x more."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reference_logits(model, ids) -> tuple[np.ndarray, list[np.ndarray]]:
    """transformers' logits float32 [T, vocab] and hidden states for int ids [T]."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), output_hidden_states=True)
    return out.logits[0].float().numpy(), [h[0].float().numpy() for h in out.hidden_states]


def reference_greedy(model, ids, n: int) -> list[int]:
    """transformers' greedy continuation of ``ids``: n new ids (argmax each step, through its KV cache).

    A plain loop rather than ``generate`` so that no end-of-sequence rule or logits
    processor changes which token is chosen: both sides pick the argmax n times.
    """
    import torch

    out, past, feed = [], None, list(ids)
    with torch.no_grad():
        for _ in range(n):
            res = model(torch.tensor([feed]), past_key_values=past, use_cache=True)
            past = res.past_key_values
            feed = [int(res.logits[0, -1].argmax())]
            out.append(feed[0])
    return out


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(ours.astype(np.float64) - ref) / np.linalg.norm(ref))


def reference_split_logits(model, ids, split: int) -> np.ndarray:
    """transformers' logits when ``ids`` is fed as ids[:split] then ids[split:] through its KV cache."""
    import torch

    with torch.no_grad():
        first = model(torch.tensor([list(ids[:split])]), use_cache=True)
        second = model(torch.tensor([list(ids[split:])]), past_key_values=first.past_key_values, use_cache=True)
    return np.concatenate([first.logits[0].float().numpy(), second.logits[0].float().numpy()])


def rewrite_checkpoint(path, config: dict, drop: tuple[str, ...] = (), tensors=None) -> None:
    """Replace config.json by a family's own (``config`` over the saved one, ``drop`` removed) and, with
    ``tensors`` (a function of the saved state dict), the weights by its result: a Transformers checkpoint
    rewritten into the layout and spellings of a family Transformers does not implement."""
    saved = json.loads((Path(path) / "config.json").read_text())
    for key in drop:
        saved.pop(key, None)
    saved.update(config)
    (Path(path) / "config.json").write_text(json.dumps(saved))
    if tensors is not None:
        from safetensors.numpy import load_file, save_file

        state = load_file(str(Path(path) / "model.safetensors"))
        save_file(tensors(state), str(Path(path) / "model.safetensors"), metadata={"format": "pt"})


def check_against(model, ref, prompt, split: int = 9, tol: float = 1e-4) -> np.ndarray:
    """ster's loaded ``model`` against the Transformers model ``ref`` on ``prompt``: logits whole and through
    the cache in two pieces (at ``split``) within ``tol``, 16 equal greedy tokens, every stored tensor read.
    Returns the reference logits [T, vocab]."""
    from ster_py.generate import Sampling, generate

    ref_logits, _ = reference_logits(ref, prompt)
    err = rel_err(model.decoder.forward(prompt), ref_logits)
    assert err < tol, f"logits rel err {err:.2e}"
    cache = model.decoder.new_cache()
    pieces = np.concatenate([model.decoder.forward(prompt[:split], cache), model.decoder.forward(prompt[split:], cache)])
    assert rel_err(pieces, reference_split_logits(ref, prompt, split)) < tol
    assert generate(model.decoder, prompt, Sampling(max_new_tokens=16)).ids == reference_greedy(ref, prompt, 16)
    assert model.decoder._weights.unused_tensors(model.spec) == []
    return ref_logits


def check_llamacpp_top1(ours: np.ndarray, ref: np.ndarray, rel_tol: float = 0.05, flips: int = 3) -> None:
    """ster's logits ``ours`` [T, V] against llama.cpp's ``ref`` on a quantized file: relative error within
    ``rel_tol``, and llama.cpp's top-1 token at every position except where llama.cpp's own top two lie closer
    than three standard deviations of the difference of two logits' errors (sqrt(2) times their rms over the
    prompt) -- a tie neither side's arithmetic can settle -- and at most ``flips`` such positions."""
    rel = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
    assert rel < rel_tol, rel
    mine, theirs = ours.argmax(1), ref.argmax(1)
    rows = np.arange(len(mine))
    margin = ref[rows, theirs] - ref[rows, mine]
    noise = np.sqrt(np.mean((ours - ref) ** 2))
    assert np.all((mine == theirs) | (margin <= 3 * np.sqrt(2) * noise)), (np.nonzero(mine != theirs), margin, noise)
    assert (mine == theirs).sum() >= len(mine) - flips


def check_token_steps(model, prompt, ours: np.ndarray) -> None:
    """Decoding ``prompt`` one token at a time through the cache gives the whole-prompt logits ``ours``."""
    cache = model.decoder.new_cache()
    steps = np.concatenate([model.decoder.forward([t], cache) for t in prompt])
    assert np.abs(steps - ours).max() <= 1e-3 * np.abs(ours).max()


# The clock chat templates see in tests (strftime_now), for ster and for transformers alike.
PINNED = __import__("datetime").datetime(2026, 10, 18, 9, 30, 5)


def gguf_py_reader(path):
    """gguf-py's ``GGUFReader`` of ``path``, parsing the file's bytes read into memory.

    The parser is gguf-py's own; only its data source changes: over a ``np.memmap`` every one of the
    hundreds of thousands of small reads a 262k-token vocabulary takes goes through memmap's Python-level
    ``__getitem__``/``__array_finalize__``, 3.3x the CPU time of the same reads over a plain array (Gemma 3's
    GGUF: 14.3 s against 4.4 s).
    """
    from unittest import mock

    import gguf
    from gguf import gguf_reader

    data = np.fromfile(str(path), dtype=np.uint8)
    with mock.patch.object(gguf_reader.np, "memmap", lambda *args, **kwargs: data):
        return gguf.GGUFReader(str(path))


def sigint_as_at_a_terminal():
    """``preexec_fn`` of a child the test interrupts: Ctrl-C's default action, as a command typed at a
    terminal has. A test run started in the background (``pytest &`` from a script, ``nohup``) has SIGINT
    ignored, children inherit that, and a Python started so never turns SIGINT into KeyboardInterrupt (the
    Ctrl-C test's child then streamed on until its timeout: the whole-suite runs that hung were started so)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
