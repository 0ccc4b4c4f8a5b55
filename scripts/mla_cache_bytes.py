"""Cache bytes per position of a DeepSeek-V2-Lite-shaped model: the latent cache against expanded keys/values.

Reads the shape from DeepSeek-V2-Lite's config.json values (inlined below: 27 layers, 16 heads,
kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128), then measures:

1. per position, from the spec: what the latent cache holds (``ModelSpec.cache_width``, r + rope per
   layer) and what expanded keys and values would hold (H * (qk + v) per layer), at f32 and f16;
2. through the decoder: a two-layer model of that attention shape with random weights (dense
   feed-forwards, a small vocabulary: the cache does not depend on them) runs a ``--context``-token
   prompt through ``Decoder.forward``; the bytes its ``KVCache`` then holds (the ``LatentSlot`` buffers)
   are counted and scaled to 27 layers, beside the same prompt's keys and values expanded.

    python scripts/mla_cache_bytes.py [--context 512]
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from ster_py.config import spec_from_config
from ster_py.decoder.model import Decoder
from ster_py.families import FAMILIES

# deepseek-ai/DeepSeek-V2-Lite config.json (the attention and sizes that decide the cache)
V2_LITE = {"model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
           "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512,
           "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
           "first_k_dense_replace": 1, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
           "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
           "rope_theta": 10000, "topk_method": "greedy", "routed_scaling_factor": 1.0}


class RandomWeights:
    """Named float32 arrays of the shapes ``Layout`` asks for, drawn once per name (std 0.02)."""

    def __init__(self, spec):
        from ster_py.decoder.layout import expected_shapes

        self.shapes = expected_shapes(spec, 0)
        self.rng = np.random.default_rng(0)

    def get(self, name: str):
        role = {"model.embed_tokens": "embed", "lm_head": "head", "model.norm": "final_norm"}.get(
            name.rsplit(".", 1)[0])
        if role is None:
            tail = name.split(".layers.", 1)[1].split(".", 1)[1].rsplit(".", 1)[0]
            role = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                    "self_attn.q_proj": "q", "self_attn.kv_a_proj_with_mqa": "kv_a",
                    "self_attn.kv_a_layernorm": "kv_a_norm", "self_attn.kv_b_proj": "kv_b",
                    "self_attn.o_proj": "o", "mlp.gate_proj": "gate", "mlp.up_proj": "up",
                    "mlp.down_proj": "down"}.get(tail)
        if role is None or not name.endswith(".weight"):
            return None
        shape = self.shapes[(role, "weight")]
        if role.endswith("norm"):
            return np.ones(shape, np.float32)
        return (self.rng.standard_normal(shape) * 0.02).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=512)
    n = ap.parse_args().context
    spec = spec_from_config(V2_LITE, FAMILIES["deepseek_v2"])
    L, m = spec.num_hidden_layers, spec.latent
    latent = sum(map(spec.cache_width, range(L)))
    expanded = sum(kv * (dk + dv) for _, kv, dk, dv in map(spec.attention_shape, range(L)))
    print(f"DeepSeek-V2-Lite shape: {L} layers, {spec.num_attention_heads} heads, kv_lora_rank {m.kv_lora_rank}, "
          f"qk {m.qk_nope_head_dim}+{m.qk_rope_head_dim}, v {m.v_head_dim}")
    for name, size in (("f32", 4), ("f16", 2)):
        print(f"per position, {name}: latent {latent * size:,} bytes, expanded keys/values {expanded * size:,} "
              f"bytes ({expanded / latent:.2f}x)")
    # Through the decoder: two layers of that shape, dense feed-forwards, a small vocabulary.
    small = dataclasses.replace(spec, num_hidden_layers=2, vocab_size=1000, intermediate_size=1024,
                                layers=tuple(dataclasses.replace(layer, ffn="dense") for layer in spec.layers[:2]),
                                moe=None)
    decoder = Decoder(small, RandomWeights(small))
    ids = np.random.default_rng(1).integers(0, 1000, n)
    for dtype in (np.float32, np.float16):
        cache = decoder.new_cache(dtype)
        decoder.forward(ids, cache, last_only=True)
        held = sum(cache.slot(i).rows[:cache.length].nbytes for i in range(2))  # rows of the positions held
        buffers = sum(cache.slot(i).rows.nbytes for i in range(2))  # with the doubling buffer's spare room
        size = np.dtype(dtype).itemsize
        print(f"decoder, {np.dtype(dtype).name} cache after {cache.length} positions: {held // 2:,} bytes per layer "
              f"({held // (2 * n):,} per position) -> {held // 2 * L:,} bytes for {L} layers "
              f"(buffers {buffers // 2 * L:,}); expanded keys/values would hold {expanded * size * n:,}")


if __name__ == "__main__":
    main()
