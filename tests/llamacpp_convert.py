"""llama.cpp's own converter (convert_hf_to_gguf.py from the pinned llama-cpp-python sdist) on tiny checkpoints.

``convert_cases`` builds each case's checkpoint with transformers (``tiny.build_checkpoint``),
writes the config.json keys a converter still reads in Transformers 4 spellings, and runs the
converter once for all cases in one subprocess. The converter's vocabulary step is replaced by a
minimal SentencePiece-style vocabulary (the tiny checkpoints' word-level tokenizer is none it
knows) unless config.json's ``_llamacpp_own_vocab`` is true (PLaMo's tokenizer.jsonl); weights and
hyper-parameters go through the converter untouched, except that a config.json key
``_llamacpp_drop_keys`` lists hyper-parameters the converter is not shown (the defaults Transformers'
config class adds for keys a config written before them lacks) and ``_llamacpp_args`` command-line
options the converter gets for that checkpoint (``--no-mtp``); under ``_llamacpp_raw_config`` the converter
reads config.json as it stands (a model_type its pinned Transformers 4.57 lacks).
"""
from __future__ import annotations

import atexit
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_DIRS = ("/root/.cache/ster-fixtures/sdist", "/tmp/llsdist")
PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/"

CONVERT = r'''
"""Run llama.cpp's convert_hf_to_gguf.py on SRC:OUT pairs with a minimal vocabulary."""
import json, logging, sys
from pathlib import Path

sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf as conv  # puts llama.cpp's own gguf-py first on sys.path
import gguf
from conversion import ModelBase


def minimal_vocab(self):
    n = self.hparams.get("vocab_size") or 128
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                      + [gguf.TokenType.NORMAL] * (n - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


get_class = conv.get_model_class
OWN_VOCAB = [False]  # the checkpoint's own vocabulary files, through the converter's own set_vocab


def _vocab_of(own):
    def set_vocab(self):
        return own(self) if OWN_VOCAB[0] else minimal_vocab(self)
    set_vocab.patched = True
    return set_vocab


def get_model_class(*args, **kwargs):
    cls = get_class(*args, **kwargs)
    for c in cls.__mro__:
        if "set_vocab" in c.__dict__ and not getattr(c.set_vocab, "patched", False):
            c.set_vocab = _vocab_of(c.set_vocab)
    return cls


load_hparams = ModelBase.load_hparams


def load_hparams_with_legacy(dir_model, *args, **kwargs):
    config = json.loads((Path(dir_model) / "config.json").read_text())
    if config.get(RAW):  # the config.json llama.cpp's pinned Transformers (4.57) reads as it stands
        return {k: v for k, v in config.items() if not k.startswith("_llamacpp")}
    hparams = load_hparams(dir_model, *args, **kwargs)
    for key, value in config.items():
        hparams.setdefault(key, value)  # Transformers 5 drops keys the converter still reads
    for key in config.get(DROP, ()):  # ... and adds defaults a config written before them lacks
        hparams.pop(key, None)
    return hparams


DROP = "_llamacpp_drop_keys"
ARGS = "_llamacpp_args"  # converter options for one checkpoint (--no-mtp)
OWN = "_llamacpp_own_vocab"  # true: the converter's own vocabulary step on the checkpoint's files (PLaMo's jsonl)
# the converter reads config.json itself, as it does where its pinned Transformers (4.57.6,
# requirements-convert_hf_to_gguf.txt) has no class for the model_type (bailing_hybrid): Transformers 5's
# BailingHybridConfig rewrites head_dim to the rotated width, which the converter would write as kda.head_dim
RAW = "_llamacpp_raw_config"
conv.get_model_class = get_model_class
ModelBase.load_hparams = staticmethod(load_hparams_with_legacy)
logging.disable(logging.WARNING)
outtype = sys.argv[2]
for pair in sys.argv[3:]:
    src, out = pair.split("::")
    extra = json.loads((Path(src) / "config.json").read_text()).get(ARGS, [])
    OWN_VOCAB[0] = bool(json.loads((Path(src) / "config.json").read_text()).get(OWN))
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out, "--outtype", outtype, *extra]
    conv.main()
'''


def _sdist(tmp_dir) -> Path:
    for d in SDIST_DIRS:
        if (Path(d) / SDIST).is_file():
            return Path(d) / SDIST
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                        "llama-cpp-python==0.3.36", "-d", str(tmp_dir)], capture_output=True, text=True)
    if r.returncode != 0 or not (Path(tmp_dir) / SDIST).is_file():
        pytest.fail(f"llama.cpp's converter is unavailable: {SDIST} is in none of {SDIST_DIRS} and pip download "
                    f"failed: {r.stderr[-500:]}", pytrace=False)
    return Path(tmp_dir) / SDIST


_UNPACKED: list[Path] = []  # the sdist's converter files, unpacked once per test process


def extract_converter(root: Path) -> Path:
    """Unpack llama.cpp's converter (and its gguf-py) from the sdist into ``root`` and write the
    driver ``root/convert.py``; returns the llama.cpp directory the driver takes first.

    The sdist (77 MB, gzip) is read once per test process; later calls copy the unpacked files."""
    if not _UNPACKED:
        cache = Path(tempfile.mkdtemp(prefix="ster-llamacpp-converter-"))
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        with tarfile.open(_sdist(root)) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(PREFIX) and m.isfile() and (
                m.name == PREFIX + "convert_hf_to_gguf.py" or m.name.startswith((PREFIX + "conversion/",
                                                                                  PREFIX + "gguf-py/")))]
            tar.extractall(cache, members=members, filter="data")
        _UNPACKED.append(cache)
    shutil.copytree(_UNPACKED[0] / PREFIX, root / PREFIX, dirs_exist_ok=True)
    (root / "convert.py").write_text(CONVERT)
    return root / PREFIX


def convert_cases(root: Path, cases: dict, build, outtype: str = "f32") -> dict:
    """name -> (converted .gguf path, transformers model) for ``cases``: name -> (model_type,
    config, legacy config.json keys); ``build(path, model_type, config)`` makes the checkpoint.

    Fails the test (not a skip) when the sdist or the converter is unavailable or fails.
    """
    import torch

    extract_converter(root)
    out, pairs = {}, []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, (model_type, config, legacy) in cases.items():
            path = root / "hf" / name
            model = build(path, model_type, config)
            (path / "config.json").write_text(json.dumps({**json.loads((path / "config.json").read_text()),
                                                          **legacy}))
            out[name] = (root / f"{name}.gguf", model)
            pairs.append(f"{path}::{out[name][0]}")
    finally:
        torch.set_num_threads(threads)
    r = subprocess.run([sys.executable, str(root / "convert.py"), str(root / PREFIX), outtype, *pairs],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"llama.cpp's convert_hf_to_gguf.py failed: {r.stderr[-2000:]}", pytrace=False)
    return out
