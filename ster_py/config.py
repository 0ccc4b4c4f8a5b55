"""Normalise a model's configuration into the ``ModelSpec`` the decoder reads.

``spec_from_config`` reads a Hugging Face config.json (Transformers 4 or 5 shape)
through the family's ``FamilySpec``: the family's variants for this config are
applied first, then each field is read under the family's own key spellings
(``families.DEFAULT_KEYS`` / ``FamilySpec.keys``). The GGUF path builds the same
``ModelSpec`` from file metadata (``gguf/config.py``). The decoder reads only
``ModelSpec``, never a raw config key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

from .decoder.kinds import ATTENTION_MIXERS, DELTA_MIXERS, RECURRENT_MIXERS
from .decoder.positions import alibi_slopes
from .decoder.rope import Rope, brief_value, check_share, make_rope
from .errors import SterError
from .families import DEFAULT_KEYS, FamilySpec

if TYPE_CHECKING:  # the parts' specs are imported where a config builds one: a dense model imports none
    from .decoder.altup import AltUpSpec
    from .decoder.block_sparse import BlockSparseSpec
    from .decoder.compressed import CompressedSpec
    from .decoder.delta import DeltaSpec
    from .decoder.indexer import IndexerSpec
    from .decoder.latent import LatentSpec
    from .decoder.loops import LoopSpec
    from .decoder.moe import MoESpec, RouterSpec
    from .decoder.ngram import NgramSpec
    from .decoder.relative import RelativeSpec
    from .decoder.shared_block import SharedBlockSpec
    from .decoder.ssm import MupScales, SSMSpec
    from .decoder.streams import StreamsSpec

# Bounds on the counts read from a config, far above any released model. They are
# checked where a count is read, because per-layer and per-head tables are built from
# it before ``validate.check_spec`` sees the whole spec (a config.json is untrusted).
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_HEAD_DIM = 1 << 14
MAX_DIM = 1 << 24
MAX_EXPERTS = 1 << 16

ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu_tanh", "relu2", "relu",
               "xielu")


@dataclass(frozen=True)
class LayerSpec:
    """What varies from layer to layer: its mixer, its feed-forward, its window and rotation.

    ``mixer`` names the layer's token mixer: ``"attention"``, ``"latent"`` (multi-head latent
    attention, ``ModelSpec.latent``), a state-space scan (``"mamba"``, ``"mamba2"``:
    ``ModelSpec.ssm``), both side by side (``"hybrid"``, Falcon-H1), a delta-rule linear attention
    (``"gated_delta"``, ``"kda"``: ``ModelSpec.delta``) or ``"none"`` (a layer that is
    only a feed-forward, Nemotron-H's); ``ffn`` its feed-forward:
    ``"dense"``, ``"moe"`` (routed experts, ``ModelSpec.moe``) or ``"none"``.
    ``sliding_window`` counts the key positions a query sees, itself included
    (None: all earlier positions). ``rope`` is None on layers that do not rotate.
    ``attention_chunk``: a query sees only the keys of its own chunk of that many positions
    (Llama 4's chunked attention; None: no chunks). ``qk_norm``: the model's q/k norms
    (``ModelSpec.qk_norm``) apply on this layer; ``query_temperature``: the model's query
    temperature (``ModelSpec.query_temperature``) does.

    The fields after ``query_temperature`` override the model's for this layer, None keeping the
    model's: the attention geometry (query heads, key/value heads, value head width;
    ``ModelSpec.attention_shape``), whether it has attention sinks, and its
    routed feed-forward (``moe``: a layer's own SwiGLU clamps, Step 3.5). ``norms``: the sublayer
    norms of this layer when they are not the model's (A.X-K1's routed layers add ``ffn_post_norm``).
    ``indexer``: DeepSeek Sparse Attention on a latent layer (``ModelSpec.indexer``): ``"full"`` (the
    layer's own indexer chooses each query's keys), ``"shared"`` (the last indexed layer's choice) or
    None (dense). ``latent``: the layer's latent attention when it is not the model's
    (``ModelSpec.latent_of``; Dots3-Note's sliding-window layers). ``shortcut``: the routed
    feed-forward that skips a layer (LongCat-Flash's shortcut-connected experts): ``"open"`` runs
    the model's ``moe`` on this layer's feed-forward input (beside its own feed-forward) and holds
    the result, ``"close"`` adds the held result to this layer's output; None: neither.
    ``residual``: MiniMax's join, (alpha, beta) of the mixer then of the feed-forward: each
    sublayer's output adds as residual * alpha + output * beta (``ModelSpec.residual_normed``
    says which residual); None: the usual h + output. ``head_dim``: this layer's key (and, unless
    ``v_head_dim`` says otherwise, value) head width when it is not the model's (Gemma 4's
    full-attention layers). ``v_from_k``: the layer has no value projection; each value is its key
    projection before the key norm (Gemma 4's attention_k_eq_v). ``kv_source``: the layer projects
    only its queries and attends over the keys and values another, earlier layer cached
    (Gemma 4's num_kv_shared_layers); it caches nothing itself. ``ffn_sparsity``: above 0, the dense
    feed-forward's gate keeps only what lies above that share of a normal fitted to it
    (``ffn.gaussian_top``; Gemma 3n's activation_sparsity_pattern). ``intermediate_size``: this layer's
    dense feed-forward width when it is not the model's (DeciLM's block_configs). ``value_experts``:
    the layer's values come from routed value experts (``ModelSpec.value_router``; K2-Horizon's MoVA),
    not from a value projection. ``compress``: on a compressed-attention
    layer (``ModelSpec.compressed``, DeepSeek-V4), ``"sparse"`` or ``"heavy"`` entries beside its sliding
    window, None for the window alone.

    Looped models (``decoder/loops.py``): ``stored`` is the stored layer whose weights this executed
    layer reads (the ``{i}`` of its tensor names; None: its own index), ``stack`` fills ``{stack}``
    in its names (None: the names have none). ``loop_global``: on a later pass of IQuest-LoopCoder,
    the executed layer of the first pass whose keys and values this layer's queries also attend to
    (the "global" half, causal over all positions), mixed per head with its own attention (the
    "local" half, within ``sliding_window``) by the stored gate ``loop_gate``; None: plain attention.
    """

    sliding_window: int | None
    rope: Rope | None
    mixer: str = "attention"
    ffn: str = "dense"
    attention_chunk: int | None = None
    qk_norm: bool = True
    query_temperature: bool = True
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    v_head_dim: int | None = None
    sinks: bool | None = None
    moe: MoESpec | None = None
    norms: tuple[str, ...] | None = None
    indexer: str | None = None
    latent: LatentSpec | None = None
    shortcut: str | None = None
    residual: tuple[float, float, float, float] | None = None
    head_dim: int | None = None
    v_from_k: bool = False
    kv_source: int | None = None
    stored: int | None = None
    stack: str | None = None
    loop_global: int | None = None
    compress: str | None = None
    ffn_sparsity: float = 0.0
    intermediate_size: int | None = None
    value_experts: bool = False


@dataclass(frozen=True)
class ResidualSkip:
    """A block skip connection (Solar Pro's bskcn): before each layer of ``keep`` the residual stream
    is kept; before each layer of ``mix`` it becomes ``weight * kept + (1 - weight) * stream``.
    Keeping comes before mixing at a layer in both lists; layer indices count from zero."""

    keep: frozenset[int]
    mix: frozenset[int]
    weight: float


def residual_skips(config: Mapping, n_layers: int, config_name: str) -> tuple[ResidualSkip, ...]:
    """The config's ``residual_skips`` (a list of {"keep": [layers], "mix": [layers], "weight": w},
    written by a family's ``normalize``), validated.

    Raises:
        SterError: not such a list, a layer outside the model, a weight that is not a finite number,
            or a mix layer with no keep layer before it.
    """
    raw = config.get("residual_skips")
    if raw is None:
        return ()
    where = f"invalid model config {config_name}"
    if not isinstance(raw, list):
        raise SterError(f"{where}: block skip connections must be a list, got {brief_value(raw)}")
    out = []
    for skip in raw:
        layers = {}
        for key in ("keep", "mix"):
            v = skip.get(key) if isinstance(skip, Mapping) else None
            if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                  and 0 <= x < n_layers for x in v):
                raise SterError(f"{where}: a block skip connection's {key} layers must be a list of layer "
                                f"indices below {n_layers}, got {brief_value(v)}")
            layers[key] = frozenset(v)
        w = skip.get("weight")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise SterError(f"{where}: a block skip connection's weight must be a number, got {brief_value(w)}")
        if layers["mix"] and (not layers["keep"] or min(layers["mix"]) < min(layers["keep"])):
            raise SterError(f"{where}: a block skip connection mixes at layer {min(layers['mix'])} before "
                            "any layer keeps the stream")
        out.append(ResidualSkip(layers["keep"], layers["mix"], float(w)))
    return tuple(out)


@dataclass(frozen=True)
class ModelSpec:
    """The normalised description of a decoder, independent of where it came from.

    Dimensions use Transformers' names. ``names`` maps each tensor role the decoder
    asks for (``embed``, ``q``, ``attn_norm``, ...) to the tensor name prefix in the
    weight source (Hugging Face or llama.cpp names); ``fused_qkv``, ``inputs_first`` and
    ``root`` say how those tensors are laid out (``decoder/layout.py``). The fields
    after ``names`` have the Llama defaults; ``families.FamilySpec`` documents each.
    ``value_router``: how the layers with ``LayerSpec.value_experts`` choose their value
    experts (``decoder/mova.py``). ``norm_groups``: the sublayer and final RMS norms normalise
    that many equal groups of the hidden width apart, before their weight (K2-Horizon).
    ``alibi_slopes`` holds one slope per head; ``alibi_scale`` multiplies the bias
    (Falcon adds it before the 1/sqrt(head_dim) scale); ``alibi_sqrt``: the bias is
    -slope * sqrt(query position - key position) (Step1) instead of slope * key position;
    ``query_temperature`` is Llama 4's
    (beta, divisor, offset): queries at position p are multiplied by
    1 + beta * ln(1 + floor((p + offset) / divisor)) on the layers whose ``LayerSpec`` says so.
    ``qk_norm_affine`` False: the q/k norms are RMS norms without a weight (Llama 4's L2
    norm). ``moe`` describes the routed feed-forward of the layers
    whose ``LayerSpec.ffn`` is ``"moe"``;
    ``expert_inputs_first`` lists the expert roles stored [in, out] per expert, and
    ``expert_gate_up_interleaved`` says a fused expert gate/up alternates gate and up rows.
    ``decoder_prefix``: a wrapper's text decoder's tensors sit below it (``names`` include it);
    the wrapper's other tensors are not the decoder's.
    ``value_scale`` multiplies every value before it is cached (MiMo-V2-Flash's
    attention_value_scale); ``attn_gate`` multiplies the attention output, per head (or per
    element without ``attn_gate_per_head``), by ``"sigmoid"`` or ``"softplus"`` of the
    ``g`` projection of the layer's input (Step 3.5, Laguna). ``unread`` lists name prefixes
    of stored tensors the forward never reads (multi-token-prediction modules). ``latent``
    describes the multi-head latent attention of the layers whose ``LayerSpec.mixer`` is
    ``"latent"`` (their ``head_dim`` is its nope + rope, their values ``v_head_dim`` wide).
    ``indexer`` describes DeepSeek Sparse Attention's indexer of the layers whose ``LayerSpec.indexer``
    says so (``decoder/indexer.py``). ``layers_per_stored``: how many of these layers one stored
    layer holds (LongCat-Flash: 2); a tensor name's ``{i}`` is then the stored layer (i // n) and
    ``{half}`` the layer's place in it (i % n).
    ``ssm`` describes the state-space scan of the layers whose mixer is one
    (``decoder/ssm.py``); ``mup`` holds Falcon-H1's multipliers; ``adapters`` says which
    adapter targets the family takes: ``"all"``, ``"ffn"`` (feed-forward only) or ``"none"``
    (state-space families, seed 002). ``delta`` describes the delta-rule layers (``decoder/delta.py``,
    ``decoder/kda.py``); ``attn_gate_in_q``: each attention head's ``q`` rows are followed by as
    many output-gate rows (Qwen3-Next's q_proj), read as the ``g`` projection. ``residual_normed``: under a layer's ``LayerSpec.residual``,
    each sublayer's residual is its normed input (MiniMax's postnorm). ``shared_block``: the
    transformer blocks the ``"shared_hybrid"`` layers share (Zamba2, ``decoder/shared_block.py``).
    ``value_norm``: each value head passes a weightless RMS norm before it is cached (Gemma 4).
    ``layer_scalar``: each layer's output is multiplied by its stored ``layer_scalar`` [1] (Gemma 4).
    ``per_layer_input``: the width of the per-layer inputs (Gemma 4's hidden_size_per_layer_input,
    0: none), from a table of ``per_layer_vocab`` rows (``decoder/model.py``, ``PerLayerInputs``).
    ``residual_skips``: block skip connections, one ``ResidualSkip`` per kept stream (Solar Pro).
    ``loop``: a looped model's passes (``decoder/loops.py``, ``LoopSpec``); its ``layers`` and
    ``num_hidden_layers`` are then every pass's executed layers (None: each layer runs once).
    ``prefix_lm``: a prompt read whole from position zero attends both ways within itself when the
    caller asks (``Decoder.forward(bidirectional=True)``: generation's prompt; HRM-Text).
    ``compressed``: the shape of the ``"compressed"`` mixer's layers (``decoder/compressed.py``, DeepSeek-V4).
    ``streams``: the residual is several streams joined by hyper-connections (``decoder/streams.py``,
    DeepSeek-V4, HY V4, GLM-5-Next), or None for one stream.
    ``embed_norm_affine`` False: the embedding norm has no weight; ``final_norm_unit_offset``: the final
    norm's weight applies as 1 + w (True) or as stored (False) whatever ``norm_unit_offset`` says (None:
    as the others); ``post_norm_eps``: the epsilon of ``attn_post_norm`` / ``ffn_post_norm`` when not
    ``norm_eps`` (Muse Glimmer). ``block_sparse``: the index branch of the layers whose mixer is
    ``"block_sparse"`` (``decoder/block_sparse.py``, MiniMax Sparse Attention). ``ffn_glu``, ``ffn_limit``,
    ``ffn_alpha``: the dense feed-forwards' gated unit (``"oai"``: gpt-oss's clamped one, as MiniMax-M3's
    swigluoai) and its clamp and sharpness. ``relative``: the relative-bias attention of the layers whose
    mixer is ``"relative"`` (``decoder/relative.py``, Inkling); ``ffn_out_conv``: each feed-forward's
    output passes a residual short convolution (``ffn_out_conv`` role); ``gate_up_interleaved``: a fused
    dense ``gate_up`` alternates gate and up rows; ``logits_kept``: only the first n logits are scored
    (Inkling's unpadded_vocab_size; 0: all).
    ``query_bottleneck``: each attention layer's query is ``q_up(q_inter_norm(q(x)))``, ``q`` narrowing
    to this width and ``q_up`` widening it to the heads (Step3's share_q_dim, inter_norm and wq); 0: none.
    ``ngram``: hashed n-gram embeddings beside the token embedding (LongCat-Flash-Lite, ``decoder/ngram.py``).
    ``per_layer_clamp``: token ids past the per-layer table read its row 0 instead of being refused
    (Gemma 3n's multimodal ids). ``altup``: the stream travels as AltUp's copies
    (``decoder/altup.py``, ``AltUpSpec``; Gemma 3n): the block runs on the first predicted copy, the
    per-layer input joins every copy but the first, and hooks see the first copy. ``laurel``: each
    layer adds Laurel's low-rank residual of its normed input to the mixer's join, which is then
    divided by sqrt(2) (``altup.Laurel``; Gemma 3n). ``sparsity_ddof``: the activation sparsity's std
    divides by n - ddof (0: Transformers'; 1: llama.cpp's gemma3n, set for GGUF files).
    ``head_required``: the config states the head is not tied (tie_word_embeddings false), so a missing
    head tensor is refused instead of falling back to the embedding (False: the fallback).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    norm: str
    norm_eps: float
    norm_unit_offset: bool
    norms: tuple[str, ...]
    qk_norm: str | None
    hidden_act: str
    embed_scale: float
    attn_scale: float
    attn_softcap: float | None
    final_softcap: float | None
    tie_word_embeddings: bool
    layers: tuple[LayerSpec, ...]
    names: Mapping[str, str]
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    norm_affine: bool = True
    parallel: bool = False
    qk_norm_after_rope: bool = False
    qk_norm_optional: bool = False
    embed_norm: bool = False
    positions: str = "rope"
    position_offset: int = 0
    alibi_slopes: tuple[float, ...] | None = None
    alibi_scale: float = 1.0
    alibi_bf16: bool = False
    alibi_sqrt: bool = False
    norm_offsets: tuple[tuple[str, float], ...] = ()
    norm_groups: int = 1
    value_router: RouterSpec | None = None
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    clip_qkv: float | None = None
    query_temperature: tuple[float, int, int] | None = None
    qk_norm_affine: bool = True
    decoder_prefix: str | None = None
    sinks: bool = False
    fused_qkv: str | None = None
    inputs_first: bool = False
    root: str | None = None
    moe: MoESpec | None = None
    expert_inputs_first: tuple[str, ...] = ()
    expert_gate_up_interleaved: bool = False
    value_scale: float = 1.0
    attn_gate: str | None = None
    attn_gate_per_head: bool = True
    unread: tuple[str, ...] = ()
    latent: LatentSpec | None = None
    ssm: SSMSpec | None = None
    mup: MupScales | None = None
    adapters: str = "all"
    indexer: IndexerSpec | None = None
    layers_per_stored: int = 1
    delta: DeltaSpec | None = None
    attn_gate_in_q: bool = False
    residual_normed: bool = False
    shared_block: SharedBlockSpec | None = None
    value_norm: bool = False
    layer_scalar: bool = False
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    residual_skips: tuple[ResidualSkip, ...] = ()
    loop: LoopSpec | None = None
    prefix_lm: bool = False
    streams: StreamsSpec | None = None
    compressed: CompressedSpec | None = None
    embed_norm_affine: bool = True
    final_norm_unit_offset: bool | None = None
    post_norm_eps: float | None = None
    block_sparse: BlockSparseSpec | None = None
    ffn_glu: str = "standard"
    ffn_limit: float | None = None
    ffn_alpha: float = 1.702
    relative: RelativeSpec | None = None
    ffn_out_conv: bool = False
    gate_up_interleaved: bool = False
    logits_kept: int = 0
    query_bottleneck: int = 0
    ngram: NgramSpec | None = None
    per_layer_clamp: bool = False
    altup: AltUpSpec | None = None
    laurel: bool = False
    sparsity_ddof: int = 0
    head_required: bool = False

    def latent_of(self, i: int) -> LatentSpec | None:
        """Layer ``i``'s latent attention (its own, else the model's)."""
        return self.layers[i].latent or self.latent

    def has_kv(self, i: int) -> bool:
        """Whether layer ``i`` keeps keys and values (its mixer attends; DeepSeek-V4's compressed attention too)."""
        return self.layers[i].mixer in ATTENTION_MIXERS or self.layers[i].mixer == "compressed"

    def state_bytes(self) -> int:
        """Bytes of the recurrent state of one sequence over all layers (0 without scans): the scans' and,
        on relative-bias layers (Inkling), the short convolutions' last inputs."""
        total = sum((self.delta if layer.mixer in DELTA_MIXERS else self.ssm).state_bytes()
                    for layer in self.layers if layer.mixer in RECURRENT_MIXERS)
        if self.relative is not None:
            for i, layer in enumerate(self.layers):
                if layer.mixer == "relative":
                    _, kv, dk, dv = self.attention_shape(i)
                    width = kv * (dk + dv) + self.hidden_size * (2 if self.ffn_out_conv else 1)
                    total += 4 * (self.relative.conv_kernel - 1) * width
        return total

    def attention_shape(self, i: int) -> tuple[int, int, int, int]:
        """Layer ``i``'s (query heads, key/value heads, key head width, value head width)."""
        layer = self.layers[i]
        heads = layer.num_attention_heads or self.num_attention_heads
        kv = layer.num_key_value_heads or self.num_key_value_heads
        if layer.latent is not None:  # its own latent: expanded, one key/value head per head
            own = layer.latent
            return heads, heads, own.qk_head_dim, own.v_head_dim
        d = layer.head_dim or self.head_dim
        return heads, kv, d, layer.v_head_dim or d

    def norm_offset(self, role: str) -> float | None:
        """The number added to the stored weight of the norm ``role`` when it is not
        ``norm_unit_offset``'s (``norm_offsets``; PLaMo 3's post-sublayer norms), else None."""
        return dict(self.norm_offsets).get(role)

    def layer_norms(self, i: int) -> tuple[str, ...]:
        """The sublayer norms of layer ``i`` (its own, else the model's)."""
        own = self.layers[i].norms
        return self.norms if own is None else own

    def cache_width(self, i: int) -> int:
        """Numbers one position costs in layer ``i``'s cache: the latent and the rotated key part of
        a latent layer (``LatentSpec.cache_width``), keys and values of an attention layer."""
        if self.layers[i].mixer == "latent":
            return self.latent_of(i).cache_width + (self.indexer.key_width if self.layers[i].indexer == "full" else 0)
        if self.layers[i].mixer == "compressed":  # one float32 key/value row per position (entries: fewer)
            return self.compressed.head_dim
        if self.layers[i].kv_source is not None:  # attends over another layer's cache
            return 0
        _, kv, dk, dv = self.attention_shape(i)
        index = self.block_sparse.index_dim if self.layers[i].mixer == "block_sparse" else 0  # its index key
        return kv * (dk + dv) + index

    def layer_sinks(self, i: int) -> bool:
        """Whether layer ``i`` has a learned attention sink per head."""
        own = self.layers[i].sinks
        return self.sinks if own is None else own


class _Reader:
    """Reads normalised fields from a config under a family's key spellings.

    A key with dots is a path into the config's objects: ``attn_config.kv_n_heads`` is
    ``config["attn_config"]["kv_n_heads"]`` (DBRX keeps its settings in such objects).
    """

    def __init__(self, config: Mapping, family: FamilySpec, config_name: str):
        self.config, self.family, self.config_name = config, family, config_name

    def value(self, key: str):
        """The config's value at ``key`` (a name or a dotted path), or None when absent."""
        v = self.config
        for part in key.split("."):
            v = v.get(part) if isinstance(v, Mapping) else None
        return v

    def get(self, name: str, default=None):
        if name in self.family.fixed:
            return self.family.fixed[name]
        for key in self.family.keys.get(name, DEFAULT_KEYS.get(name, ())):
            if self.value(key) is not None:
                return self.value(key)
        return self.family.defaults.get(name, default)

    def positive_int(self, name: str, default=None, limit: int = MAX_DIM, per_layer: bool = False) -> int:
        """The integer field ``name`` in 1..``limit``; SterError naming its keys otherwise.

        With ``per_layer``, the field may also be stated once per layer (HunYuan's ``moe_topk``)
        provided every layer states the same value; a list whose values differ is refused.
        """
        v = self.get(name, default)
        keys = self.family.keys.get(name, DEFAULT_KEYS.get(name, ())) or (name,)
        if per_layer and isinstance(v, list) and v:
            if any(x != v[0] for x in v):
                raise SterError(f"{self.config_name}: {' / '.join(keys)} lists different values per layer "
                                f"({brief_value(v)}); ster runs mixture-of-experts layers of one shape and "
                                "refuses this configuration before reading any weight")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= limit:
            raise SterError(f"invalid model config {self.config_name}: {' / '.join(keys)} must be an integer "
                            f"in 1..{limit}, got {v!r}")
        return v

    def number(self, key: str | None, default: float | None) -> float | None:
        v = None if key is None else self.value(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SterError(f"invalid model config {self.config_name}: {key} must be a number, got {v!r}")
        return float(v)


def _rope_object(value, name: str, r: _Reader) -> Mapping:
    """``value`` if it is an object of rope parameters; else a SterError naming ``name``."""
    if not isinstance(value, Mapping):
        null = "null, or " if "." not in name else ""  # (one layer type's set cannot be null)
        raise SterError(f"{r.config_name}: {name} is {str(value)[:60]}, not an object of rope parameters "
                        f"({null}{{\"rope_type\": ..., \"factor\": ...}}); fix config.json")
    return value


def _rope_params(config: Mapping, r: _Reader) -> tuple[dict, dict | None]:
    """The (full-attention, sliding-attention or None) rope parameter sets of a config.

    Transformers 5 writes ``rope_parameters`` (flat, or one object per layer type);
    Transformers 4 wrote ``rope_theta`` (GPT-NeoX: ``rotary_emb_base``) plus an optional
    ``rope_scaling``. A top-level ``original_max_position_embeddings`` (Phi-3's, 4096 when absent) replaces
    the one a single (not per-layer-type) llama3, YaRN or LongRoPE set states, as Transformers'
    ``standardize_rope_params`` does; a per-layer-type set keeps its own.
    """
    rp = config.get("rope_parameters")
    # A rope_parameters that is not an object once fell through to the defaults (the model ran
    # with rope_theta 10000) and a per-type list of pairs was read as an object: both refused.
    if rp is not None:
        _rope_object(rp, "rope_parameters", r)
        for kind in ("full_attention", "sliding_attention"):
            if kind in rp:
                _rope_object(rp[kind], f"rope_parameters.{kind}", r)
    legacy = config.get("rope_scaling")
    if rp is not None and isinstance(legacy, Mapping) and legacy:
        # Transformers reads rope_scaling over rope_parameters (over its full-attention set, where sets are
        # per layer type): a rope_scaling that says otherwise is refused rather than read either way.
        stated = rp.get("full_attention") or {} if "full_attention" in rp or "sliding_attention" in rp else rp
        for key, value in legacy.items():
            own = stated.get("rope_type", stated.get("type")) if key in ("type", "rope_type") else stated.get(key)
            if own != value:
                raise SterError(f"{r.config_name}: rope_scaling and rope_parameters disagree on {key!r} "
                                f"({brief_value(value)} against {brief_value(own)}); Transformers reads rope_scaling, "
                                "ster refuses the pair: keep one of them in config.json")
    if rp is not None and ("full_attention" in rp or "sliding_attention" in rp):
        full = dict(rp.get("full_attention") or rp.get("sliding_attention") or {})
        sliding = dict(rp["sliding_attention"]) if "sliding_attention" in rp else None
    elif rp is not None:
        full, sliding = dict(rp), None
    else:
        full = dict(_rope_object(config.get("rope_scaling") or {}, "rope_scaling", r))
        if "rope_type" not in full and "type" in full:
            full["rope_type"] = full.pop("type")
        full.setdefault("rope_theta", r.get("rope_theta", 10000.0))
        sliding = None
    top = config.get("original_max_position_embeddings")
    single = rp is None or not ("full_attention" in rp or "sliding_attention" in rp)
    if top is not None and single and full.get("rope_type", full.get("type")) in ("llama3", "yarn", "longrope"):
        full["original_max_position_embeddings"] = top
    for params in (full, sliding):
        if params is not None and top is not None:
            params.setdefault("original_max_position_embeddings", top)
    return full, sliding


def _whole_head(params: dict | None, partial: float, partial_keys: str, config_name: str,
                head_dim: int) -> dict | None:
    """Rope parameters of a family whose Transformers rotation turns every channel of a head: its default
    tables never read the rotated share, so a share in (0, 1] is dropped (anything else is refused); other
    rope types size their tables by the share, which Transformers' own rotation cannot apply, so a share
    other than 1 is refused there."""
    if params is None:
        return None
    share = params.get("partial_rotary_factor", partial)
    check_share(head_dim, share, f"invalid model config {config_name}",
                "partial_rotary_factor" if "partial_rotary_factor" in params else partial_keys)
    kind = params.get("rope_type", params.get("type", "default"))
    if share != 1.0 and kind != "default":
        raise SterError(f"{config_name}: a rotary share ({partial_keys} {brief_value(share)}) with rope type "
                        f"{kind!r} is not supported (Transformers rotates the whole head with default tables "
                        "only); ster refuses this configuration before reading any weight")
    return {k: v for k, v in params.items() if k != "partial_rotary_factor"}


def _fixed_alpha(params: dict, head_dim: int) -> dict:
    """HunYuan's "dynamic" rope with an ``alpha`` is a fixed base: theta * alpha ** (d / (d - 2))."""
    if params.get("rope_type", params.get("type")) == "dynamic" and params.get("alpha"):
        theta = float(params.get("rope_theta", 10000.0)) * float(params["alpha"]) ** (head_dim / (head_dim - 2))
        return {"rope_type": "default", "rope_theta": theta}
    return params


def sliding_layers(config: Mapping, family: FamilySpec, n_layers: int, config_name: str) -> list[bool]:
    """Per layer: does it attend through ``sliding_window`` (``layer_types``, else the family's rule)."""
    layer_types = config.get("layer_types")
    if layer_types is not None:
        # Transformers refuses a list of the wrong length; any kind but these is a mixer ster lacks.
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            shown = f"{len(layer_types)} entries" if isinstance(layer_types, list) else repr(layer_types)
            raise SterError(f"invalid model config {config_name}: layer_types must list one entry per layer "
                            f"({n_layers}), got {shown}")
        kinds = (("full_attention", "sliding_attention") + (("chunked_attention",) if family.chunk_key else ())
                 + (("indexed_attention",) if family.indexer is not None else ())
                 + (tuple(MIXER_TYPES) if family.recurrent else ()))
        for t in layer_types:
            if t not in kinds:
                raise SterError(f"{config_name}: layer type {t!r} is not supported; ster runs layer_types "
                                f"{', '.join(repr(k) for k in kinds)}")
        return [t == "sliding_attention" and family.sliding != "never" for t in layer_types]
    if config.get("sliding_window") is None or family.sliding == "never":
        return [False] * n_layers
    rule = family.sliding
    if rule == "all":
        return [True] * n_layers
    on = bool(config.get("use_sliding_window", False))
    if rule == "qwen2":
        first = config.get("max_window_layers", n_layers)
        return [on and i >= first for i in range(n_layers)]
    if rule == "qwen2_moe":  # the layers 0, 2, 4, ... below max_window_layers, the opposite end to Qwen2's
        below = config.get("max_window_layers", n_layers)
        return [on and i % 2 == 0 and i < below for i in range(n_layers)]
    if rule == "switched":
        return [on] * n_layers
    if rule == "even":
        return [i % 2 == 0 for i in range(n_layers)]
    if rule in ("pattern", "pattern_first", "prefix_pattern"):
        def period(key, default):
            p = config.get(key) or default
            if isinstance(p, bool) or not isinstance(p, int) or p <= 0:
                raise SterError(f"invalid model config {config_name}: {key} must be a positive integer, "
                                f"got {p!r}; state the layers as layer_types instead")
            return p

        p = period(family.sliding_pattern_key, config.get("_sliding_window_pattern") or family.sliding_pattern)
        if rule == "pattern":  # the last layer of each group of p attends fully
            return [(i + 1) % p != 0 for i in range(n_layers)]
        if rule == "pattern_first":
            return [i % p != 0 for i in range(n_layers)]  # the first one does
        # Cohere 2 MoE: the first_k_dense_replace dense layers by their own period, the rest by p,
        # each counted from its own start
        k = config.get("first_k_dense_replace") or 0
        k = k if isinstance(k, int) and not isinstance(k, bool) else 0
        p0 = period("prefix_dense_sliding_window_pattern", 1)
        return [(i + 1) % p0 != 0 if i < k else (i - k + 1) % p != 0 for i in range(n_layers)]
    return [False] * n_layers


#: ``layer_types`` entries that name a layer's mixer rather than its attention (families with
#: ``FamilySpec.recurrent``): the family's scan, its hybrid (``FamilySpec.hybrid_mixer``), or a
#: feed-forward-only layer (dense or routed).
MIXER_TYPES = {"linear_attention": "recurrent", "hybrid": "hybrid", "mlp": "none", "moe": "none"}


def layer_mixers(config: Mapping, family: FamilySpec, n_layers: int) -> list[tuple[str, str | None]]:
    """Per layer: (its ``LayerSpec.mixer``, its feed-forward when its type fixes it, else None).

    Families without ``recurrent`` attend on every layer. Others read ``layer_types``
    (``sliding_layers`` has checked it): ``linear_attention`` is the family's scan, ``hybrid``
    its ``hybrid_mixer`` (attention and a Mamba-2 scan side by side, or a shared block then the
    scan), ``mlp`` / ``moe`` a layer that is only a dense /
    routed feed-forward; any other entry is attention. A family with ``ffn_layers`` "none" has
    no feed-forward, one with "typed" only on its ``mlp`` and ``moe`` layers.
    """
    types = config.get("layer_types") if family.recurrent else None
    out = []
    for i in range(n_layers):
        t = types[i] if isinstance(types, list) else "full_attention"
        kind = MIXER_TYPES.get(t, "attention")
        mixer = family.recurrent if kind == "recurrent" else family.hybrid_mixer if kind == "hybrid" else kind
        ffn = {"mlp": "dense", "moe": "moe"}.get(t)
        if ffn is None and family.ffn_layers != "all":
            ffn = "none"
        out.append((mixer, ffn))
    return out


def block_sparse_spec(config: Mapping, config_name: str, head_dim: int, n_layers: int) -> BlockSparseSpec:
    """MiniMax Sparse Attention's index branch from ``index_head_dim``, ``index_block_size``,
    ``index_topk_blocks`` and ``index_local_blocks`` (a family's ``normalize`` writes them from
    ``sparse_attention_config``), and ``_block_sparse_layers`` (one flag per layer).

    Raises:
        SterError: a size that is not a positive whole number (local blocks: at least 0, at most the
            blocks kept), a layer list of the wrong length.
    """
    where = f"invalid model config {config_name}"
    out = {}
    for name, key, low in (("index_dim", "index_head_dim", 1), ("block_size", "index_block_size", 1),
                           ("topk_blocks", "index_topk_blocks", 1), ("local_blocks", "index_local_blocks", 0)):
        v = config.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_DIM:
            raise SterError(f"{where}: {key} must be a whole number of at least {low}, got {brief_value(v)}")
        out[name] = v
    if out["local_blocks"] > out["topk_blocks"]:
        raise SterError(f"{where}: index_local_blocks ({out['local_blocks']}) is more than the blocks a query "
                        f"keeps (index_topk_blocks {out['topk_blocks']})")
    flags = config.get("_block_sparse_layers")
    if not isinstance(flags, list) or len(flags) != n_layers:
        raise SterError(f"{where}: the sparse attention layers must be listed once per layer ({n_layers})")
    from .decoder.block_sparse import BlockSparseSpec
    return BlockSparseSpec(**out)


def relative_spec(config: Mapping, config_name: str) -> RelativeSpec:
    """Inkling's relative-bias attention from ``d_rel``, ``rel_extent``, ``conv_kernel_size``,
    ``log_scaling_n_floor`` and ``log_scaling_alpha``.

    Raises:
        SterError: a size that is not a positive whole number, a non-numeric alpha."""
    where = f"invalid model config {config_name}"
    out = {}
    for name, key in (("d_rel", "d_rel"), ("rel_extent", "rel_extent"), ("conv_kernel", "conv_kernel_size"),
                      ("log_floor", "log_scaling_n_floor")):
        v = config.get(key)
        if name == "log_floor" and v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_DIM:
            raise SterError(f"{where}: {key} must be a positive whole number, got {brief_value(v)}")
        out[name] = v
    alpha = config.get("log_scaling_alpha", 0.1)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise SterError(f"{where}: log_scaling_alpha must be a number, got {brief_value(alpha)}")
    from .decoder.relative import RelativeSpec
    return RelativeSpec(**out, log_alpha=float(alpha))


def ffn_unit(r: "_Reader", family: FamilySpec) -> dict[str, Any]:
    """The dense feed-forwards' gated unit: ``ffn_glu`` and, for ``"oai"``, its clamp (``swiglu_limit``)
    and sharpness (``swiglu_alpha``), as ``ModelSpec`` fields."""
    if family.ffn_glu == "standard":  # clamped by swiglu_limit where the family says so (GLM-5-Next)
        return {"ffn_limit": r.number("swiglu_limit", None)} if family.ffn_limit else {}
    return dict(ffn_glu=family.ffn_glu, ffn_limit=r.number("swiglu_limit", None),
                ffn_alpha=r.number("swiglu_alpha", 1.702))


def ssm_spec(r: "_Reader", family: FamilySpec, hidden: int, config_name: str) -> SSMSpec:
    """The state-space scan of a family with ``recurrent``, read under its ``ssm_*`` keys.

    The short convolution: hidden_size channels and ``ssm_conv_kernel`` taps. Lightning attention:
    the attention's heads (``num_attention_heads``) of ``head_dim`` channels, its read-out norm's
    ``ssm_norm_eps``.
    Mamba: d_inner from ``ssm_inner_size``, else ``ssm_expand`` * hidden; ``ssm_dt_rank`` "auto"
    is ceil(hidden / 16). Mamba-2: d_inner from ``ssm_inner_size``, else ``ssm_expand`` * hidden
    (a family that reads neither: the heads' total); ``ssm_head_dim`` "auto" is d_inner over the
    heads; ``ssm_dt_limit`` [low, high] clamps the step (unstated bounds: none).

    Raises:
        SterError: a missing or invalid size, heads that do not make up the width or split over
            the groups, a convolution activation other than SiLU, a bad step limit.
    """
    from .decoder.ssm import SSMSpec
    where = f"invalid model config {config_name}"
    kind = family.recurrent
    if kind == "shortconv":  # LFM2: hidden_size channels, conv_L_cache taps, no scan
        return SSMSpec("shortconv", hidden, 0, r.positive_int("ssm_conv_kernel", limit=1024))
    if kind == "lightning":  # the attention's heads and head width, a [D, D] state per head
        act = r.get("ssm_act", "silu")
        if act != "silu":
            raise SterError(f"{config_name}: lightning attention's activation {act!r} is not supported; ster runs "
                            "SiLU on its queries, keys and values, as MiniMax-Text-01 does")
        heads = r.positive_int("num_attention_heads", limit=MAX_HEADS)
        d = r.positive_int("head_dim", hidden // heads if hidden % heads == 0 else None, limit=MAX_HEAD_DIM)
        eps = r.get("ssm_norm_eps", 1e-6)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise SterError(f"{where}: lightning attention's norm epsilon must be a number in (0, 1), "
                            f"got {brief_value(eps)}")
        extras = r.config.get("_lightning") or {}  # a family's extras its normalize states (Ling 2.5)
        if not isinstance(extras, Mapping) or extras.get("qkv_layout", "per_head") not in ("per_head", "concat") \
                or extras.get("slopes", "minimax") not in ("minimax", "alibi"):
            raise SterError(f"{where}: lightning attention's extras are not understood: {brief_value(extras)}")
        groups = extras.get("norm_groups", 1)
        if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0 or (heads * d) % groups:
            raise SterError(f"{where}: group_norm_size must be a positive whole number dividing the lightning "
                            f"heads' width ({heads} x {d}), got {brief_value(groups)}")
        return SSMSpec("lightning", heads * d, d, 1, num_heads=heads, norm_eps=float(eps),
                       slope_eps=float(extras.get("slope_eps", 1e-5)), slopes=extras.get("slopes", "minimax"),
                       slope_layer_offset=int(extras.get("slope_layer_offset", 0)),
                       qkv_layout=extras.get("qkv_layout", "per_head"),
                       qkv_silu=bool(extras.get("silu", True)), qk_norm=bool(extras.get("qk_norm", False)),
                       q_scaled=bool(extras.get("q_scaled", False)), norm_groups=groups)
    act = r.get("ssm_act", "silu")
    if act != "silu":
        raise SterError(f"{config_name}: the state-space convolution's activation {act!r} is not supported; ster "
                        "runs SiLU there, as Mamba does")
    n = r.positive_int("ssm_state_size")
    k = r.positive_int("ssm_conv_kernel", limit=1024)
    keys = family.keys.get("ssm_expand", DEFAULT_KEYS["ssm_expand"])
    expand = r.positive_int("ssm_expand", limit=1024) if keys or "ssm_expand" in family.defaults else None
    inner = r.get("ssm_inner_size")
    if kind == "mamba":
        di = r.positive_int("ssm_inner_size", expand * hidden)
        rank = r.get("ssm_dt_rank", "auto")
        rank = math.ceil(hidden / 16) if rank == "auto" else r.positive_int("ssm_dt_rank")
        bcdt_eps = r.get("ssm_bcdt_eps", 1e-6)
        if isinstance(bcdt_eps, bool) or not isinstance(bcdt_eps, (int, float)) or not 0 < bcdt_eps < 1:
            raise SterError(f"{where}: the step/B/C norm epsilon must be a number in (0, 1), got {brief_value(bcdt_eps)}")
        return SSMSpec("mamba", di, n, k, dt_rank=rank, bcdt_norm=family.ssm_bcdt_norm, bcdt_eps=float(bcdt_eps))
    heads = r.positive_int("ssm_num_heads", limit=MAX_HEADS * 64)
    head = r.get("ssm_head_dim")
    if inner is not None or expand is not None:
        di = r.positive_int("ssm_inner_size", expand * hidden if expand is not None else None)
    else:
        di = heads * r.positive_int("ssm_head_dim", limit=MAX_HEAD_DIM)
    if head == "auto" or head is None:
        head = di // heads
    elif isinstance(head, bool) or not isinstance(head, int) or head <= 0:
        raise SterError(f"{where}: the scan's head width must be a positive integer or \"auto\", got {brief_value(head)}")
    if head * heads != di:
        raise SterError(f"{config_name}: a scan width ({di}) other than its heads' total ({heads} heads of {head}) is "
                        "not supported; ster refuses this configuration before reading any weight")
    groups = r.positive_int("ssm_groups", 1, limit=heads)
    if heads % groups or di % groups:
        raise SterError(f"{where}: {heads} scan heads (width {di}) do not split into {groups} groups")
    limit = r.get("ssm_dt_limit")
    lo, hi = -math.inf, math.inf
    if limit is not None:
        if not isinstance(limit, (list, tuple)) or len(limit) != 2 or any(
                x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))) for x in limit):
            raise SterError(f"{where}: time_step_limit must be two numbers [low, high], got {brief_value(limit)}")
        lo = -math.inf if limit[0] is None or not math.isfinite(limit[0]) else float(limit[0])
        hi = math.inf if limit[1] is None or not math.isfinite(limit[1]) else float(limit[1])
        if lo > hi:
            raise SterError(f"{where}: time_step_limit's low bound {lo} is above its high bound {hi}")
    eps = r.get("ssm_norm_eps", r.get("norm_eps", 1e-6))
    return SSMSpec("mamba2", di, n, k, num_heads=heads, n_groups=groups, dt_min=lo, dt_max=hi,
                   gated_norm=family.ssm_gated_norm, norm_eps=float(eps))


def delta_spec(r: "_Reader", family: FamilySpec, config_name: str) -> DeltaSpec:
    """The delta-rule layers of a family whose ``recurrent`` is ``"gated_delta"`` or ``"kda"``, read
    under its ``delta_*`` keys: key heads and width, value heads (default: the key heads) and width
    (default: the key width), the convolution's taps, the output norm's epsilon (default: the
    model's), OLMo Hybrid's doubled write strength and Kimi's safe gate.

    Raises:
        SterError: a missing or invalid size, value heads that are not a multiple of the key heads,
            Kimi Delta Attention with value heads unlike its key heads, a convolution activation
            other than SiLU, a safe-gate bound that is not a negative number.
    """
    where = f"invalid model config {config_name}"
    kind = family.recurrent
    act = r.get("ssm_act", "silu")
    if act != "silu":
        raise SterError(f"{config_name}: the linear attention's convolution activation {act!r} is not supported; "
                        "ster runs SiLU there, as Transformers does for these families")
    hk = r.positive_int("delta_k_heads", limit=MAX_HEADS)
    dk = r.positive_int("delta_k_dim", limit=MAX_HEAD_DIM)
    hv = r.positive_int("delta_v_heads", hk, limit=MAX_HEADS)
    dv = r.positive_int("delta_v_dim", dk, limit=MAX_HEAD_DIM)
    kernel = r.positive_int("delta_conv_kernel", limit=1024)
    if hv % hk:
        raise SterError(f"{where}: {hv} linear-attention value heads are not a multiple of its {hk} key heads")
    if kind == "kda" and (hv, dv) != (hk, dk):
        raise SterError(f"{where}: Kimi Delta Attention has one head shape for keys and values")
    eps = r.get("delta_norm_eps", r.get("norm_eps", 1e-6))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise SterError(f"{where}: the linear attention's norm epsilon must be a number in (0, 1), got "
                        f"{brief_value(eps)}")
    bound = r.get("delta_lower_bound")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                              or not math.isfinite(bound) or bound >= 0):
        raise SterError(f"{where}: the safe gate's lower bound must be a negative number, got {brief_value(bound)}")
    from .decoder.delta import DeltaSpec
    return DeltaSpec(kind, num_k_heads=hk, head_k_dim=dk, num_v_heads=hv, head_v_dim=dv, conv_kernel=kernel,
                     beta_scale=2.0 if r.get("delta_beta_double") else 1.0, norm_eps=float(eps),
                     gate_act="silu" if kind == "gated_delta" else "sigmoid", safe_gate=bound is not None,
                     lower_bound=-5.0 if bound is None else float(bound))
def sublayer_scales(config: Mapping, family: FamilySpec, mixers: list, config_name: str) -> list | None:
    """Per layer, MiniMax's join (``LayerSpec.residual``): (alpha, beta) of its mixer, then of its
    feed-forward, read under the keys ``family.sublayer_scales`` gives each mixer kind and
    ``"ffn"`` (a key absent from the config: 1); None for families without them.

    Raises:
        SterError: a factor that is not a finite number.
    """
    if not family.sublayer_scales:
        return None

    def pair(kind):
        out = []
        for key in family.sublayer_scales.get(kind, (None, None)):
            v = config.get(key) if key else None
            v = 1.0 if v is None else v
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SterError(f"invalid model config {config_name}: {key} must be a finite number, "
                                f"got {brief_value(v)}")
            out.append(float(v))
        return tuple(out)

    ffn = pair("ffn")
    return [pair(mixer) + ffn for mixer, _ in mixers]


def shared_block_spec(r: "_Reader", hidden: int, intermediate: int) -> SharedBlockSpec:
    """The transformer blocks a family with ``shared_block`` shares between its hybrid layers
    (Zamba2): ``shared_blocks`` of them (``num_mem_blocks``), 2 * hidden wide at their input,
    ``intermediate`` wide inside, each hybrid layer's adapters ``adapter_rank`` wide, on q/k/v
    too under ``shared_attention_adapters``.

    Raises:
        SterError: a missing or invalid count or rank.
    """
    adapters = r.get("shared_attention_adapters", False)
    from .decoder.shared_block import SharedBlockSpec
    return SharedBlockSpec(blocks=r.positive_int("shared_blocks", limit=MAX_LAYERS), width=2 * hidden,
                           intermediate=intermediate, adapter_rank=r.positive_int("adapter_rank"),
                           attention_adapters=bool(adapters))


def mup_scales(config: Mapping, config_name: str) -> MupScales:
    """Falcon-H1's muP multipliers (``MupScales``; each 1 when absent). The lists were checked by
    the family's refusals; a non-finite or zero single multiplier is refused here."""
    def one(key):
        v = config.get(key)
        if v is None:
            return 1.0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v == 0:
            raise SterError(f"invalid model config {config_name}: {key} must be a finite non-zero number, "
                            f"got {brief_value(v)}")
        return float(v)

    ssm = config.get("ssm_multipliers") or [1.0] * 5
    mlp = config.get("mlp_multipliers") or [1.0] * 2
    from .decoder.ssm import MupScales
    return MupScales(attn_in=one("attention_in_multiplier"), attn_out=one("attention_out_multiplier"),
                     key=one("key_multiplier"), ssm_in=one("ssm_in_multiplier"),
                     ssm_parts=tuple(float(x) for x in ssm), ssm_out=one("ssm_out_multiplier"),
                     ffn_gate=float(mlp[0]), ffn_down=float(mlp[1]))


def chunked_layers(config: Mapping, family: FamilySpec, ropes: list, config_name: str) -> list[int | None]:
    """Per layer: its attention chunk (``family.chunk_key``, Llama 4's attention_chunk_size), or None.

    The layers ``layer_types`` calls ``chunked_attention``; without layer_types, the rotating
    ones (as Transformers' Llama4TextConfig fills layer_types in).

    Raises:
        SterError: a chunk that is not a positive integer, or chunked layers without a chunk.
    """
    n = len(ropes)
    chunk = config.get(family.chunk_key) if family.chunk_key else None
    types = config.get("layer_types")
    listed = [t == "chunked_attention" for t in types] if isinstance(types, list) else None
    if chunk is None:
        if listed is not None and any(listed):
            raise SterError(f"invalid model config {config_name}: layer_types lists chunked_attention layers but "
                            f"{family.chunk_key} is null")
        return [None] * n
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise SterError(f"invalid model config {config_name}: {family.chunk_key} must be a positive integer, "
                        f"got {brief_value(chunk)}")
    flags = listed if listed is not None else [rope is not None for rope in ropes]
    return [chunk if f else None for f in flags]


def moe_layer_flags(config: Mapping, n_layers: int, config_name: str) -> list[bool]:
    """Per layer: does it route its feed-forward through experts (else a dense feed-forward).

    Read from whichever of these keys the config states, in this order (each is one
    family's spelling; Transformers' modeling code reads them so):

    - ``mlp_layer_types``: one entry per layer, ``"sparse"`` routes;
    - ``moe_layers``: the routed layers' indices (Llama 4); else ``interleave_moe_layer_step`` s:
      layers s-1, 2s-1, ...;
    - ``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval`` (ERNIE 4.5):
      from start to end (inclusive), every interval-th layer counted from one;
    - ``mlp_only_layers`` / ``decoder_sparse_step`` (Qwen MoE): layers not listed whose
      number (from one) the step divides;
    - ``first_k_dense_replace`` / ``num_dense_layers``: every layer from k on;
    - none of them: every layer routes.

    Raises:
        SterError: a list of the wrong length or with entries that are not layer indices.
    """
    where = f"invalid model config {config_name}"

    def index_list(key):
        v = config.get(key)
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise SterError(f"{where}: {key} must be a list of layer indices, got {brief_value(v)}")
        return set(v)

    def count(key, default):
        v = config.get(key, default)
        v = default if v is None else v
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SterError(f"{where}: {key} must be a whole number, got {brief_value(v)}")
        return v

    types = config.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers or any(t not in ("sparse", "dense") for t in types):
            raise SterError(f"{where}: mlp_layer_types must list 'sparse' or 'dense' for each of the {n_layers} "
                            f"layers, got {brief_value(types)}")
        return [t == "sparse" for t in types]
    if config.get("moe_layers") is not None:
        routed = index_list("moe_layers")
        return [i in routed for i in range(n_layers)]
    if config.get("interleave_moe_layer_step") is not None:
        step = max(count("interleave_moe_layer_step", 1), 1)
        return [(i + 1) % step == 0 for i in range(n_layers)]
    if any(config.get(k) is not None for k in ("moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval")):
        start, end = count("moe_layer_start_index", 0), config.get("moe_layer_end_index")
        end = n_layers - 1 if end is None or end == -1 else count("moe_layer_end_index", 0)
        interval = max(count("moe_layer_interval", 1), 1)
        return [(i + 1) % interval == 0 and start <= i <= end for i in range(n_layers)]
    if config.get("mlp_only_layers") is not None or config.get("decoder_sparse_step") is not None:
        dense = index_list("mlp_only_layers") if config.get("mlp_only_layers") is not None else set()
        step = max(count("decoder_sparse_step", 1), 1)
        return [i not in dense and (i + 1) % step == 0 for i in range(n_layers)]
    for key in ("first_k_dense_replace", "num_dense_layers"):
        if config.get(key) is not None:
            k = count(key, 0)
            return [i >= k for i in range(n_layers)]
    return [True] * n_layers


def moe_spec(r: "_Reader", family: FamilySpec, config_name: str) -> MoESpec:
    """The routed feed-forward of a family with ``moe``, from its config (or GGUF metadata
    renamed to config keys) read under the family's keys.

    Raises:
        SterError: a missing or invalid count (or one stated per layer with differing values),
            an unknown scoring function or selection method, top-k above the expert count,
            experts not divisible into groups.
    """
    from .decoder.moe import SCORINGS, MoESpec, RouterSpec
    where = f"invalid model config {config_name}"
    d = family.moe_defaults

    def get(name):
        return r.get(name, d.get(name))

    experts = r.positive_int("num_experts", d.get("num_experts"), limit=MAX_EXPERTS, per_layer=True)
    identity = r.get("identity_experts") or 0  # experts returning their input, routed beside the others
    if isinstance(identity, bool) or not isinstance(identity, int) or not 0 <= identity <= MAX_EXPERTS:
        raise SterError(f"{where}: the identity experts' count must be a whole number, got {brief_value(identity)}")
    experts += identity
    top_k = r.positive_int("num_experts_per_tok", d.get("num_experts_per_tok"), limit=experts, per_layer=True)
    size = r.positive_int("moe_intermediate_size", d.get("moe_intermediate_size"), per_layer=True)
    scoring = get("scoring_func") or "softmax"
    if scoring not in SCORINGS:
        raise SterError(f"{where}: scoring_func {scoring!r} is not supported; supported: {', '.join(SCORINGS)}")
    method = get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise SterError(f"{where}: topk_method {method!r} is not supported; supported: greedy, "
                        "group_limited_greedy, noaux_tc")
    n_group = r.positive_int("n_group", d.get("n_group", 1), limit=experts) if method != "greedy" else 1
    topk_group = r.positive_int("topk_group", d.get("topk_group", 1), limit=n_group) if n_group > 1 else 1
    if experts % n_group:
        raise SterError(f"{where}: {experts} experts do not split into n_group {n_group} equal groups")
    scale = get("routed_scaling_factor")
    scale = 1.0 if scale is None else scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise SterError(f"{where}: routed_scaling_factor must be a positive number, got {brief_value(scale)}")
    shared = r.get("shared_intermediate_size", d.get("shared_intermediate_size"))
    if shared is None:
        n_shared = get("n_shared_experts") or 0
        shared = n_shared * size if isinstance(n_shared, int) and not isinstance(n_shared, bool) else n_shared
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared <= MAX_DIM:
        raise SterError(f"{where}: the shared experts' width must be a whole number, got {brief_value(shared)}")
    limit = get("swiglu_limit")
    jitter = get("router_jitter_noise") if scoring == "sparsemixer" else 0.0
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not math.isfinite(jitter) or jitter < 0:
        raise SterError(f"{where}: router_jitter_noise must be a number of at least 0, got {brief_value(jitter)}")
    floor = get("renorm_min")
    floor = 0.0 if floor is None else floor
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not math.isfinite(floor) or floor < 0:
        raise SterError(f"{where}: the renormalisation floor (moe_norm_min) must be a number >= 0, "
                        f"got {brief_value(floor)}")
    cap = get("router_logit_softcap") or None
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap)
                            or cap <= 0):
        raise SterError(f"{where}: the router logit soft-cap must be a positive number, got {brief_value(cap)}")
    router = dict(num_experts=experts, top_k=top_k, scoring=scoring, select_bias=method == "noaux_tc",
                  n_group=n_group, topk_group=topk_group, group_rank="top2" if method == "noaux_tc" else "max",
                  renormalize=bool(get("norm_topk_prob")), renorm_min=float(floor), scale=float(scale),
                  jitter_eps=float(jitter), logit_softcap=None if cap is None else float(cap),
                  sink=r.positive_int("router_sink", limit=MAX_EXPERTS) if r.get("router_sink") is not None else 0)
    alpha = get("swiglu_alpha")
    limit = None if limit is None else float(limit)
    latent = r.get("moe_latent_size") or 0
    if isinstance(latent, bool) or not isinstance(latent, int) or not 0 <= latent <= MAX_DIM:
        raise SterError(f"{where}: moe_latent_size must be a positive integer or null, got {brief_value(latent)}")
    moe = dict(expert_size=size, act=r.get("act", family.default_act), limit=limit, latent_size=latent,
               identity_experts=identity,
               alpha=1.702 if alpha is None else float(alpha), shared_size=shared, shared_gated=family.shared_gated,
               shared_limit=limit)
    for k, v in family.moe_fields.items():  # what the family fixes in code wins over its config
        (router if k in RouterSpec.__dataclass_fields__ else moe)[k] = v
    return MoESpec(router=RouterSpec(**router), **moe)


def layer_geometry(config: Mapping, n_layers: int, heads: int, kv_heads: int,
                   config_name: str, head_dim: int | None = None) -> list[dict[str, int]]:
    """Per layer, the head counts and width that differ from the model's: ``num_attention_heads``,
    ``num_key_value_heads`` and ``head_dim`` (keys of ``LayerSpec``), from Laguna's
    ``num_attention_heads_per_layer`` list and Transformers' ``per_layer_config`` (layer index ->
    overrides, Step 3.5; ``FamilySpec.normalize`` writes it for other spellings).

    Raises:
        SterError: a list of the wrong length, a count that is not a positive integer within
            bounds, query heads that do not group over the key/value heads.
    """
    where = f"invalid model config {config_name}"
    out: list[dict[str, int]] = [{} for _ in range(n_layers)]
    per_layer = config.get("num_attention_heads_per_layer")
    if per_layer is not None:
        if not isinstance(per_layer, list) or len(per_layer) != n_layers:
            raise SterError(f"{where}: num_attention_heads_per_layer must list one count per layer ({n_layers}), "
                            f"got {brief_value(per_layer)}")
        for i, h in enumerate(per_layer):
            out[i]["num_attention_heads"] = h
    overrides = config.get("per_layer_config")
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            raise SterError(f"{where}: per_layer_config must map layer indices to objects, "
                            f"got {brief_value(overrides)}")
        for key, entry in overrides.items():
            i = int(key) if isinstance(key, (int, str)) and str(key).isdecimal() else -1   # not "²"
            if not 0 <= i < n_layers or not isinstance(entry, Mapping):
                raise SterError(f"{where}: per_layer_config entry {brief_value(key)} is not a layer index "
                                "with an object of overrides")
            out[i].update((k, entry[k]) for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
                          if entry.get(k) is not None)
    model = {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim}
    for i, own in enumerate(out):
        for k, v in list(own.items()):
            top = MAX_HEAD_DIM if k == "head_dim" else MAX_HEADS
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= top:
                raise SterError(f"{where}: layer {i}'s {k} must be an integer in 1..{top}, got {brief_value(v)}")
            if v == model[k]:
                del own[k]
        h, kv = own.get("num_attention_heads", heads), own.get("num_key_value_heads", kv_heads)
        if h % kv:
            raise SterError(f"{where}: layer {i}'s {h} query heads do not group over its {kv} key/value heads")
    return out


def layer_halves(config: Mapping, n_layers: int, intermediate: int,
                 config_name: str) -> list[tuple[bool, bool, int | None]] | None:
    """Per layer, (has attention, has a feed-forward, that feed-forward's width when not the model's), from
    ``layer_halves`` (a list of objects ``{"attention": bool, "ffn": bool, "intermediate_size": int | null}``
    that ``FamilySpec.normalize`` writes: DeciLM's block_configs); None when the config has none. A layer
    without a half has neither its weights nor its norm; the stream passes through it.

    Raises:
        SterError: a list of the wrong length, an entry that is not such an object, a width that is not a
            positive integer within bounds.
    """
    halves = config.get("layer_halves")
    if halves is None:
        return None
    where = f"invalid model config {config_name}"
    if not isinstance(halves, list) or len(halves) != n_layers:
        raise SterError(f"{where}: layer_halves must list one entry per layer ({n_layers}), got {brief_value(halves)}")
    out = []
    for i, e in enumerate(halves):
        width = e.get("intermediate_size") if isinstance(e, Mapping) else None
        if not isinstance(e, Mapping) or not isinstance(e.get("attention"), bool) \
                or not isinstance(e.get("ffn"), bool) \
                or (e["ffn"] and (isinstance(width, bool) or not isinstance(width, int) or not 0 < width <= MAX_DIM)):
            raise SterError(f"{where}: layer {i}'s block entry must say whether it has attention and a feed-forward, "
                            f"and the feed-forward's width (1..{MAX_DIM}), got {brief_value(e)}")
        out.append((e["attention"], e["ffn"], width if e["ffn"] and width != intermediate else None))
    return out


def kv_sources(config: Mapping, family: FamilySpec, sliding: list[bool], config_name: str) -> list[int | None]:
    """Per layer, the earlier layer whose cached keys and values it attends over, or None: under the
    family's ``kv_shared_key`` (Gemma 4's num_kv_shared_layers, n), each of the last n layers reuses
    those of the last layer before them of its own kind (sliding or full attention), as
    Transformers' ``Gemma4TextConfig.kv_sharing_modes`` assigns them.

    Raises:
        SterError: n not an integer in 0..layers - 1, or a sharing layer with no earlier layer of its kind.
    """
    n_layers = len(sliding)
    n = config.get(family.kv_shared_key) if family.kv_shared_key else None
    if not n:
        return [None] * n_layers
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n < n_layers:
        raise SterError(f"invalid model config {config_name}: {family.kv_shared_key} must be an integer in "
                        f"0..{n_layers - 1} (some earlier layers must compute keys and values), got {brief_value(n)}")
    first = n_layers - n
    out: list[int | None] = [None] * n_layers
    for i in range(first, n_layers):
        same = [j for j in range(first) if sliding[j] == sliding[i]]
        if not same:
            kind = "sliding" if sliding[i] else "full"
            raise SterError(f"invalid model config {config_name}: layer {i} reuses the keys and values of an earlier "
                            f"{kind}-attention layer ({family.kv_shared_key}), but none of layers 0..{first - 1} is one")
        out[i] = same[-1]
    return out


def _layer_limits(config: Mapping, keys: tuple[str, str], moe: MoESpec, n_layers: int,
                  config_name: str) -> list[MoESpec]:
    """Each layer's routed feed-forward with its own SwiGLU clamps: ``keys`` name per-layer lists of
    the routed and the shared experts' bounds (0 or null: unclamped; a list absent: the model's)."""
    lists = []
    for key in keys:
        v = config.get(key)
        if v is not None and (not isinstance(v, list) or len(v) != n_layers or not all(
                x is None or (isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0)
                for x in v)):
            raise SterError(f"invalid model config {config_name}: {key} must list one bound (0 or null: none) per "
                            f"layer ({n_layers}), got {brief_value(v)}")
        lists.append(v)
    routed, shared = lists
    return [replace(moe, limit=float(routed[i]) if routed and routed[i] else (None if routed else moe.limit),
                    shared_limit=float(shared[i]) if shared and shared[i] else (None if shared else moe.shared_limit))
            for i in range(n_layers)]


def ngram_spec(config: Mapping, hidden: int, config_name: str) -> NgramSpec:
    """LongCat-Flash-Lite's n-gram embedding (``decoder/ngram.py``) from emb_neighbor_num (orders 2 to it),
    emb_split_num (tables per order) and ngram_vocab_size_ratio (rows: ratio * vocab_size + 2 * index + 1);
    its runs restart after each eos_token_id.

    Raises:
        SterError: a count that is not a whole number in bounds (emb_neighbor_num at least 2), a ratio that is
            not a positive number, tables too many or too tall, or a hidden_size smaller than the table count.
    """
    where = f"invalid model config {config_name}"
    n, k, ratio, vocab = (config.get(key) for key in ("emb_neighbor_num", "emb_split_num", "ngram_vocab_size_ratio",
                                                       "vocab_size"))
    for key, v, low in (("emb_neighbor_num", n, 2), ("emb_split_num", k, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= 64:
            raise SterError(f"{where}: {key} must be an integer in {low}..64, got {brief_value(v)}")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0:
        raise SterError(f"{where}: ngram_vocab_size_ratio must be a positive number, got {brief_value(ratio)}")
    tables = k * (n - 1)
    rows = tuple(int(ratio * vocab + 2 * i + 1) for i in range(tables))
    if max(rows) > MAX_DIM or hidden < tables:
        raise SterError(f"{where}: {tables} n-gram tables of up to {max(rows)} rows do not fit (at most {MAX_DIM} "
                        f"rows, and at least one of the {hidden} hidden_size columns each)")
    eos = config.get("eos_token_id")
    eos = [e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int) and not isinstance(e, bool)]
    from .decoder.ngram import NgramSpec
    return NgramSpec(neighbors=n, splits=k, rows=rows, width=hidden // tables, vocab_size=vocab, eos=tuple(eos))


def _query_bottleneck(config: Mapping, family: FamilySpec, config_name: str) -> int:
    """The query bottleneck's width (``family.query_bottleneck_key``, Step3's share_q_dim), 0 without one.

    Raises:
        SterError: the key is not a positive integer within bounds.
    """
    if not family.query_bottleneck_key:
        return 0
    v = config.get(family.query_bottleneck_key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_DIM:
        raise SterError(f"invalid model config {config_name}: {family.query_bottleneck_key} must be an integer in "
                        f"1..{MAX_DIM}, got {brief_value(v)}")
    return v


def _layer_moe_shapes(config: Mapping, moe: MoESpec, n_layers: int, config_name: str) -> list[MoESpec | None]:
    """Each layer's routed feed-forward when the config's ``moe_layer_shapes`` (written by a family's
    ``normalize``: layer index -> {"num_experts_per_tok": k, "moe_intermediate_size": f}, Nemotron
    Puzzle's block_configs) gives it its own top-k and expert width; None where the model's applies.

    Raises:
        SterError: not such a mapping, a layer outside the model, a count that is not a positive
            integer within bounds (top-k at most the routed experts).
    """
    where = f"invalid model config {config_name}"
    raw = config.get("moe_layer_shapes")
    if not isinstance(raw, Mapping):
        raise SterError(f"{where}: the per-layer expert shapes must map layer indices to objects, "
                        f"got {brief_value(raw)}")
    out: list[MoESpec | None] = [None] * n_layers
    for i, shape in raw.items():
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n_layers or not isinstance(shape, Mapping):
            raise SterError(f"{where}: a per-layer expert shape for layer {brief_value(i)} of {n_layers} layers "
                            f"({brief_value(shape)})")
        top_k, size = shape.get("num_experts_per_tok"), shape.get("moe_intermediate_size")
        for key, v, limit in (("num_experts_per_tok", top_k, moe.router.num_experts),
                              ("moe_intermediate_size", size, MAX_DIM)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= limit:
                raise SterError(f"{where}: layer {i}'s {key} must be an integer in 1..{limit}, got {brief_value(v)}")
        out[i] = replace(moe, expert_size=size, router=replace(moe.router, top_k=top_k))
    return out


def _mtp_layers(config: Mapping, family: FamilySpec, n_layers: int) -> tuple[str, ...]:
    """Name prefixes of the ``num_nextn_predict_layers`` multi-token-prediction layers a checkpoint
    stores after its last decoder layer (Step 3.5), which a forward never reads."""
    k = config.get("num_nextn_predict_layers")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= MAX_LAYERS or "attn_norm" not in family.names:
        return ()
    stem = family.names["attn_norm"].split("{i}")[0]
    return tuple(f"{stem}{n_layers + j}." for j in range(k))


def _layer_ropes(config: Mapping, family: FamilySpec, sliding: list[bool], full: Rope, local: Rope,
                 make, config_name: str, routed: list[bool]) -> list[Rope | None]:
    """The rotation of each layer, after the family's rules on which layers rotate."""
    window = config.get("sliding_window")
    ropes: list[Rope | None] = [local if s else full for s in sliding]
    if family.positions != "rope":
        return [None] * len(sliding)
    if family.rope_layers in ("sliding", "sliding_or_dense"):  # Cohere 2: only sliding-window layers rotate
        dense = family.rope_layers == "sliding_or_dense"  # Cohere 2 MoE: and its dense layers
        ropes = [rope if (s and window is not None) or (dense and not m) else None
                 for rope, s, m in zip(ropes, sliding, routed)]
    elif family.rope_layers == "sliding_if_windowed" and window is not None:  # EXAONE 4
        ropes = [rope if s else None for rope, s in zip(ropes, sliding)]
    flags = config.get(family.no_rope_key) if family.no_rope_key else None
    interval = config.get("no_rope_layer_interval")
    if family.no_rope_key and not flags and isinstance(interval, int) and not isinstance(interval, bool) \
            and interval > 0:  # Transformers' default: every interval-th layer does not rotate
        flags = [(i + 1) % interval != 0 for i in range(len(ropes))]
    if isinstance(flags, list):
        ropes = [None if i < len(flags) and not flags[i] else rope for i, rope in enumerate(ropes)]
    if family.layer_rope_key and isinstance(config.get(family.layer_rope_key), list):
        thetas = config[family.layer_rope_key]
        if len(thetas) != len(sliding):
            raise SterError(f"invalid model config {config_name}: {family.layer_rope_key} has {len(thetas)} "
                            f"entries for {len(sliding)} layers")
        by_theta: dict[float, Rope] = {}
        ropes = [None if not theta else by_theta.setdefault(float(theta), make(float(theta))) for theta in thetas]
    return ropes


def spec_from_config(config: Mapping, family: FamilySpec, config_name: str = "config.json") -> ModelSpec:
    """Build the ``ModelSpec`` of a Hugging Face config.json.

    Args:
        config: the parsed JSON object (already through ``families.gate``).
        family: the family's spec (its variants for ``config`` are applied here).
        config_name: the file's path, for messages.

    Raises:
        SterError: a missing or invalid dimension, an unsupported activation or rope type.
    """
    config = {**family.config_defaults, **config}  # Transformers' defaults for keys the config leaves out
    if family.normalize is not None:
        config = family.normalize(config)
    family = family.for_config(config)
    r = _Reader(config, family, config_name)
    eps = r.get("norm_eps")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))):
        keys = " / ".join(family.keys.get("norm_eps", DEFAULT_KEYS["norm_eps"]))
        raise SterError(f"invalid model config {config_name}: {keys} must be a number (the normalization "
                        f"epsilon, e.g. 1e-06), got {str(eps)[:40]!r}")
    hidden = r.positive_int("hidden_size")
    heads = r.positive_int("num_attention_heads", limit=MAX_HEADS)
    latent = latent_spec(r, config_name, family, hidden) if family.latent else None
    if latent is not None:  # expanded, every head has its own key and value: one key/value head per head
        kv_heads, head_dim = heads, latent.qk_head_dim
    else:
        kv_heads = r.positive_int("num_key_value_heads", heads, limit=MAX_HEADS)
        head_dim = r.positive_int("head_dim", hidden // heads if hidden % heads == 0 else None, limit=MAX_HEAD_DIM)
    n_layers = r.positive_int("num_hidden_layers", limit=MAX_LAYERS)
    if heads % kv_heads:
        raise SterError(f"invalid model config {config_name}: num_attention_heads ({heads}) is not a "
                        f"multiple of num_key_value_heads ({kv_heads})")
    mult = config.get(family.ffn_mult_key) if family.ffn_mult_key else None
    mult = mult if mult is not None else family.ffn_mult
    intermediate = r.positive_int("intermediate_size", mult * hidden if isinstance(mult, int) else None)
    act = r.get("act", family.default_act)
    if act not in ACTIVATIONS:
        raise SterError(f"invalid model config {config_name}: activation {act!r} is not supported; "
                        f"supported: {', '.join(ACTIVATIONS)}")
    max_pos = r.positive_int("max_position_embeddings", 2048)
    # The rotated width sizes the frequency tables: bounded by head_dim before any is built.
    where = f"invalid model config {config_name}"
    rotary_dim = r.get("rotary_dim")
    if rotary_dim is not None:
        if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or not 0 < rotary_dim <= head_dim:
            raise SterError(f"{where}: rotary_dim must be an integer in 1..head_dim ({head_dim}), "
                            f"got {brief_value(rotary_dim)}")
        partial, partial_keys = rotary_dim / head_dim, "rotary_dim"
    else:
        partial = r.get("partial_rotary_factor", 1.0)
        partial_keys = " / ".join(family.keys.get("partial_rotary_factor", DEFAULT_KEYS["partial_rotary_factor"]))

    full_params, sliding_params = _rope_params(config, r)
    if family.rope_whole_head:
        full_params, sliding_params = (_whole_head(p, partial, partial_keys, config_name, head_dim)
                                       for p in (full_params, sliding_params))
        partial = 1.0
    if family.local_rope_key and config.get(family.local_rope_key) is not None:
        sliding_params = {"rope_type": "default", "rope_theta": config[family.local_rope_key]}

    rope_width = latent.qk_rope_head_dim if latent is not None else head_dim  # latent: only q_pe / k_pe rotate

    def make(params: dict, width: int = rope_width) -> Rope | None:
        if width == 0:  # a latent that rotates nothing (GLM-5-Next: positions from the causal order alone)
            return None
        return make_rope(_fixed_alpha(params, width), head_dim=width, max_position_embeddings=max_pos,
                         partial_rotary_factor=partial, interleaved=family.rope_interleaved, where=where,
                         partial_keys=partial_keys)

    full_rope = make(full_params)
    if latent is not None and full_rope is not None and full_rope.rotary_dim != rope_width:
        raise SterError(f"{config_name}: a rotary share ({partial_keys}) other than the whole qk_rope_head_dim "
                        f"({rope_width}) is not supported for latent attention (Transformers rotates all of it); "
                        "ster refuses this configuration before reading any weight")
    sliding_rope = full_rope if sliding_params is None else make(sliding_params)
    sliding = sliding_layers(config, family, n_layers, config_name)
    mixers = layer_mixers(config, family, n_layers)
    halves = layer_halves(config, n_layers, intermediate, config_name)
    if halves is not None:  # layers without their attention or feed-forward (DeciLM's no_op halves)
        mixers = [(mixer if att else "none", ffn if has_ffn else "none")
                  for (mixer, ffn), (att, has_ffn, _) in zip(mixers, halves)]
    block_sparse = block_sparse_spec(config, config_name, head_dim, n_layers) if family.block_sparse else None
    relative = relative_spec(config, config_name) if family.relative else None
    if relative is not None:  # every layer attends with the relative bias (Inkling)
        mixers = [("relative" if mixer == "attention" else mixer, ffn) for mixer, ffn in mixers]
    if block_sparse is not None:  # the layers MiniMax Sparse Attention runs (normalize wrote which)
        mixers = [("block_sparse" if on else mixer, ffn)
                  for on, (mixer, ffn) in zip(config["_block_sparse_layers"], mixers)]
    routed = (moe_layer_flags(config, n_layers, config_name) if family.moe and family.ffn_layers == "all"
              else [ffn == "moe" for _, ffn in mixers])
    ffns = [ffn or ("moe" if m else "dense") for (_, ffn), m in zip(mixers, routed)]
    ropes = _layer_ropes(config, family, sliding, full_rope, sliding_rope,
                         lambda theta: make({**full_params, "rope_theta": theta}), config_name, routed)
    ropes = [rope if mixer in ATTENTION_MIXERS else None for rope, (mixer, _) in zip(ropes, mixers)]
    window = config.get("sliding_window")
    chunks = chunked_layers(config, family, ropes, config_name)
    own = layer_geometry(config, n_layers, heads, kv_heads, config_name, head_dim)
    if latent is not None:  # a latent layer's head widths are its latent's (layer_latents), not head_dim's
        own = [{k: v for k, v in o.items() if k != "head_dim"} for o in own]
    v_head_dim = latent.v_head_dim if latent is not None else r.positive_int("v_head_dim", head_dim,
                                                                             limit=MAX_HEAD_DIM)
    if v_head_dim != head_dim:
        own = [dict(o, v_head_dim=v_head_dim) for o in own]
    if any("head_dim" in o for o in own):  # a layer with its own head width rotates over that width
        widened: dict = {}
        ropes = [rope if rope is None or "head_dim" not in o else widened.setdefault(
                     (s, o["head_dim"]), make(sliding_params if s and sliding_params is not None else full_params,
                                              o["head_dim"]))
                 for rope, s, o in zip(ropes, sliding, own)]
    if halves is not None:  # each half's norm goes with it; a feed-forward of its own width
        own = [dict(o, norms=tuple(n for n in family.norms if (att or not n.startswith("attn"))
                                   and (has_ffn or not n.startswith("ffn"))), intermediate_size=width)
               for o, (att, has_ffn, width) in zip(own, halves)]
    if family.k_eq_v_key and config.get(family.k_eq_v_key):  # full-attention values are their keys
        own = [o if s else dict(o, v_from_k=True) for o, s in zip(own, sliding)]
    for i, src in enumerate(kv_sources(config, family, sliding, config_name)):
        if src is not None:
            own[i] = dict(own[i], kv_source=src)
    if family.sinks in ("sliding", "full"):  # sinks on one kind of layer only
        own = [dict(o, sinks=s == (family.sinks == "sliding")) for o, s in zip(own, sliding)]
    moe = moe_spec(r, family, config_name) if family.moe else None
    if moe is not None and family.expert_limit_keys:
        own = [dict(o, moe=m) if m != moe else o
               for o, m in zip(own, _layer_limits(config, family.expert_limit_keys, moe, n_layers, config_name))]
    if moe is not None and config.get("moe_layer_shapes") is not None:  # per-layer expert widths and top-k
        shaped = _layer_moe_shapes(config, moe, n_layers, config_name)
        own = [dict(o, moe=m) if m is not None and m != moe else o for o, m in zip(own, shaped)]
    value_router = value_router_spec(config, family, moe, config_name)
    if value_router is not None:  # the routed layers take their values from value experts (MoVA)
        own = [dict(o, value_experts=True) if m else o for o, m in zip(own, routed)]
    temperature = None
    if family.query_temperature == "rope_parameters" and full_params.get("llama_4_scaling_beta") is not None:
        temperature = (float(full_params["llama_4_scaling_beta"]),
                       int(full_params.get("original_max_position_embeddings") or max_pos), 0)
    elif family.query_temperature == "unrotated_layers" and config.get("attn_temperature_tuning"):
        divisor = config.get("floor_scale")
        if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor <= 0:
            raise SterError(f"{where}: floor_scale must be a positive integer, got {brief_value(divisor)}")
        temperature = (r.number("attn_scale", 0.1), divisor, 1)  # Llama 4 counts positions from one here
    rotated_only = family.query_temperature == "unrotated_layers"
    indexer = None
    if family.indexer is not None:  # DeepSeek Sparse Attention: each layer's indexer kind
        indexer = indexer_spec(r, family, latent, config_name)
        own = [dict(o, indexer=k) for o, k in zip(own, indexer_kinds(config, n_layers, config_name))]
    if family.routed_norms is not None:  # routed layers with their own sublayer norms (A.X-K1)
        own = [dict(o, norms=family.routed_norms) if m else o for o, m in zip(own, routed)]
    if family.shortcut_pairs:  # LongCat-Flash: each pair's first layer opens the shortcut, its second closes it
        own = [dict(o, shortcut="close" if i % 2 else "open") for i, o in enumerate(own)]
    if latent is not None:  # layers whose latent per_layer_config reshapes (Dots3-Note's sliding layers)
        own = [dict(o, latent=m) if m is not None else o
               for o, m in zip(own, layer_latents(config, family, latent, hidden, n_layers, config_name))]
    if family.recurrent_norms is not None:  # linear-attention layers with their own norms (OLMo Hybrid)
        own = [dict(o, norms=family.recurrent_norms) if mixer == family.recurrent else o
               for o, (mixer, _) in zip(own, mixers)]
    if latent is not None:  # the attending layers attend through the latent
        mixers = [("latent" if mixer == "attention" else mixer, ffn) for mixer, ffn in mixers]
    compressed = None
    if family.compressed:  # DeepSeek-V4: compressed attention on every layer, hashed routing on some
        compressed = compressed_spec(r, config, max_pos, config_name)
        mixers = [("compressed", ffn) for _, ffn in mixers]
        own = [dict(o, compress=k) for o, k in zip(own, config["_compress_kinds"])]
        if moe is not None:
            hashed = replace(moe, router=replace(moe.router, hashed=True, select_bias=False))
            own = [dict(o, moe=hashed) if h else o for o, h in zip(own, config["_hash_layers"])]
    scales = sublayer_scales(config, family, mixers, config_name)
    if scales is not None:  # MiniMax's join: residual * alpha + output * beta
        own = [dict(o, residual=sc) for o, sc in zip(own, scales)]
    if family.ffn_sparsity_key:  # Gemma 3n: the feed-forward gates that keep only their top
        own = [dict(o, ffn_sparsity=p) if p else o
               for o, p in zip(own, layer_sparsity(config, family.ffn_sparsity_key, n_layers, config_name))]
    normed = family.residual_normed
    normed = bool(config.get(normed, False)) if isinstance(normed, str) else bool(normed)
    layers = tuple(LayerSpec(sliding_window=window if s else None, rope=rope, mixer=mixer, ffn=ffn,
                             attention_chunk=c, qk_norm=rope is not None or family.qk_norm_layers == "all",
                             query_temperature=rope is None or not rotated_only, **o)
                   for s, rope, (mixer, _), ffn, c, o in zip(sliding, ropes, mixers, ffns, chunks, own))
    layers, loop = looped_layers(layers, r, family, config_name) if family.looped else (layers, None)
    # tensors a checkpoint keeps on its dense layers that nothing reads (A.X-K1's post_mlp_layernorm)
    dense_unread = tuple(p.format(i=i) for i, m in enumerate(routed) if not m for p in family.dense_unread)
    # identity experts' modules a checkpoint may hold (Transformers writes LongCat-Flash's gate/up rows for them)
    gate_name = family.names.get("exp_gate")
    if moe is not None and moe.identity_experts and isinstance(gate_name, str) and "{e}." in gate_name:
        stem, per = gate_name.split("{e}.")[0], 2 if family.shortcut_pairs else 1
        dense_unread += tuple(stem.format(i=j) + f"{e}." for j in range(n_layers // per)
                              for e in range(moe.router.num_experts - moe.identity_experts, moe.router.num_experts))
    eos = config.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    scan = family.recurrent and family.recurrent not in DELTA_MIXERS
    ssm = ssm_spec(r, family, hidden, config_name) if scan else None
    rope_dim = (config.get("_lightning") or {}).get("rope_dim") if ssm is not None and ssm.kind == "lightning" else None
    if rope_dim:  # lightning heads that rotate their leading channels by halves (Ling 2.5), at the model's base
        ssm = replace(ssm, rope=make_rope(_fixed_alpha(full_params, ssm.d_state), head_dim=ssm.d_state,
                                          max_position_embeddings=max_pos, partial_rotary_factor=rope_dim / ssm.d_state,
                                          where=where, partial_keys="partial_rotary_factor"))
    return ModelSpec(
        model_type=config["model_type"],
        vocab_size=r.positive_int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=len(layers),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        norm=family.norm,
        norm_eps=float(r.get("norm_eps", 1e-6)),
        hidden_act=act,
        attn_softcap=config.get(family.attn_softcap_key) if family.attn_softcap_key else None,
        final_softcap=config.get(family.final_softcap_key) if family.final_softcap_key else None,
        tie_word_embeddings=not family.head_untied and bool(config.get("tie_word_embeddings", family.tie_default)),
        head_required=config.get("tie_word_embeddings") is False,
        layers=layers,
        names=family.tensor_names(),
        decoder_prefix=family.decoder_prefix,
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=eos_ids,
        query_temperature=temperature,
        fused_qkv=family.fused_qkv,
        inputs_first=family.inputs_first,
        root=family.root,
        moe=moe,
        expert_inputs_first=family.expert_inputs_first,
        expert_gate_up_interleaved=family.expert_gate_up_interleaved,
        unread=family.unread + _mtp_layers(config, family, n_layers) + dense_unread
        + reused_kv_unread(family.tensor_names(), layers),
        residual_skips=residual_skips(config, n_layers, config_name),
        latent=latent,
        ssm=ssm,
        delta=delta_spec(r, family, config_name) if family.recurrent in DELTA_MIXERS else None,
        mup=mup_scales(config, config_name) if family.mup else None,
        indexer=indexer,
        layers_per_stored=2 if family.shortcut_pairs else 1,
        residual_normed=normed,
        shared_block=shared_block_spec(r, hidden, intermediate) if family.shared_block else None,
        block_sparse=block_sparse,
        relative=relative,
        ffn_out_conv=relative is not None,
        gate_up_interleaved=family.gate_up_interleaved,
        logits_kept=r.positive_int("logits_kept") if r.get("logits_kept") else 0,
        **ffn_unit(r, family),
        per_layer_input=r.positive_int("per_layer_input") if r.get("per_layer_input") else 0,
        per_layer_vocab=r.positive_int("per_layer_vocab") if r.get("per_layer_input") else 0,
        loop=loop,
        prefix_lm=bool(config.get(family.prefix_lm_key, True)) if family.prefix_lm_key else False,
        streams=streams_spec(r, family, config_name) if family.streams is not None else None,
        compressed=compressed,
        per_layer_clamp=family.per_layer_clamp,
        altup=altup_spec(config, config_name) if family.altup else None,
        laurel=family.laurel,
        value_router=value_router,
        **family_fields(config, family, hidden=hidden, heads=heads, head_dim=head_dim, config_name=config_name,
                        attn_scale=None if latent is None else latent_attn_scale(full_params, head_dim, max_pos)),
    )


def looped_layers(layers: tuple[LayerSpec, ...], r: "_Reader", family: FamilySpec,
                  config_name: str, one_range: bool = False) -> tuple[tuple[LayerSpec, ...], LoopSpec]:
    """The executed layers of a family whose stored layers run several times (``family.looped``; the
    pass count is the field ``loops`` under the family's keys), and how its passes join (``loops.LoopSpec``).

    Every pass runs the n stored layers in order as layers j * n .. (j + 1) * n - 1, each reading the
    weights of its stored layer (``LayerSpec.stored``). The final norm closes each pass but the last
    when ``family.loop_norm`` is true and the config key ``family.loop_norm_skip_key`` is not (Nanbeige's
    skip_loop_final_norm). With ``family.loop_stacks`` (low, high), two stacks stored under those
    ``{stack}`` names run in cycles (HRM-Text): ``loops`` cycles (H_cycles) of ``inner_loops`` passes
    (L_cycles) of the low stack, each replacing the low state, then one of the high stack, replacing
    the high state; every pass reads the two states summed and ends in the (weightless) final norm,
    the last through the model's own; the low state starts as the stored ``loop_init``. With
    ``one_range`` the two stacks are stored as one range of layers, the high one after the low one
    (llama.cpp's blocks): the high stack's layer i reads stored layer n + i, and no ``{stack}``. With
    ``family.loop_gated`` (IQuest-LoopCoder; the window is the field
    ``loop_window``, its loop_window_size), the
    layers of every later pass attend both globally, over the first pass's keys and values of their
    stored layer (``LayerSpec.loop_global``), and locally, over their own within that window, mixed
    by their gate.

    Raises:
        SterError: a pass count or window that is not a positive integer, or more executed layers
            than ``MAX_LAYERS``.
    """
    from .decoder.loops import LoopSpec, Pass, repeated
    n = len(layers)
    loops = r.positive_int("loops", 1, limit=MAX_LAYERS)
    inner = r.positive_int("inner_loops", 1, limit=MAX_LAYERS) if family.loop_stacks else 0
    if n * loops * (inner + 1) > MAX_LAYERS:
        raise SterError(f"invalid model config {config_name}: {n} layers run {loops * max(inner + 1, 1)} times are "
                        f"more than {MAX_LAYERS} layers")
    if family.loop_stacks:  # two stacks in cycles: `inner` passes of the low stack, then one of the high
        low, high = family.loop_stacks
        out: list[LayerSpec] = []
        passes = []
        for c in range(loops):
            for stack, state, normed in [(low, 1, True)] * inner + [(high, 0, c < loops - 1)]:
                passes.append(Pass(len(out), len(out) + n, state, normed))
                first = n if one_range and stack == high else 0
                out += [replace(layer, stored=first + i, stack=None if one_range else stack)
                        for i, layer in enumerate(layers)]
        return tuple(out), LoopSpec(tuple(passes), states=2, init="loop_init")
    window = r.positive_int("loop_window", limit=1 << 31) if family.loop_gated else None
    out = list(replace(layer, stored=i) for i, layer in enumerate(layers))
    for j in range(1, loops):
        out += [replace(layer, stored=i, loop_global=i, sliding_window=window) if window is not None
                else replace(layer, stored=i) for i, layer in enumerate(layers)]
    skip = bool(r.value(family.loop_norm_skip_key)) if family.loop_norm_skip_key else False
    return tuple(out), repeated(n, loops, family.loop_norm and not skip)


def looped_from_gguf(spec: ModelSpec, config: Mapping, family: FamilySpec, path: str) -> ModelSpec:
    """A looped GGUF file's spec: ``spec`` was built over its stored blocks (two stacks: the first stack's,
    ``looped_stack``); its executed layers and passes are then ``looped_layers``' over llama.cpp's one range
    of blocks (Nanbeige's block_count is its stored layers, as llama.cpp's nanbeige.cpp reads it)."""
    layers, loop = looped_layers(spec.layers, _Reader(config, family, path), family, path, one_range=True)
    return replace(spec, layers=layers, num_hidden_layers=len(layers), loop=loop, prefix_lm=False)


def looped_stack(config: Mapping, family: FamilySpec, block_count: int, path: str) -> int:
    """The stored stack length of a looped GGUF file (``num_layers_per_stack`` from its metadata), checked
    against its block_count, which llama.cpp's converter writes as every pass's layers.

    Raises:
        SterError: a missing or invalid length, or a block_count other than the passes' layers.
    """
    r = _Reader(config, family, path)
    n = config.get("num_layers_per_stack")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_LAYERS:
        raise SterError(f"invalid GGUF file {path}: its stack length (layers_per_stack) must be an integer in "
                        f"1..{MAX_LAYERS}, got {brief_value(n)}")
    executed = n * r.positive_int("loops", 1, limit=MAX_LAYERS) * (
        r.positive_int("inner_loops", 1, limit=MAX_LAYERS) + 1 if family.loop_stacks else 1)
    if executed != block_count:
        raise SterError(f"{path}: GGUF block_count ({block_count}) is not the {executed} layers its stacks of {n} "
                        "run in their cycles")
    return n
def reused_kv_unread(names: Mapping[str, Any], layers) -> tuple[str, ...]:
    """The key and value tensors (and key norm) a layer that reuses another's cache may still store
    and never reads (``LayerSpec.kv_source``; Gemma 3n's hub checkpoints keep them), as name prefixes."""
    return tuple(names[role].format(i=i) for i, layer in enumerate(layers) if layer.kv_source is not None
                 for role in ("k", "v", "k_norm") if isinstance(names.get(role), str))


#: The most copies of the stream AltUp may carry (Gemma 3n has 4).
MAX_ALTUP_INPUTS = 64


def altup_spec(config: Mapping, config_name: str) -> AltUpSpec:
    """AltUp's settings from ``altup_num_inputs`` (default 4) and ``altup_correct_scale`` (default true),
    Transformers' ``Gemma3nTextConfig`` keys.

    Raises:
        SterError: altup_num_inputs not an integer in 1..64, altup_correct_scale not a boolean.
    """
    n = config.get("altup_num_inputs", 4)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_ALTUP_INPUTS:
        raise SterError(f"invalid model config {config_name}: altup_num_inputs must be an integer in "
                        f"1..{MAX_ALTUP_INPUTS}, got {brief_value(n)}")
    scale = config.get("altup_correct_scale", True)
    if not isinstance(scale, bool):
        raise SterError(f"invalid model config {config_name}: altup_correct_scale must be true or false, "
                        f"got {brief_value(scale)}")
    from .decoder.altup import AltUpSpec
    return AltUpSpec(num_inputs=n, correct_scale=scale)


def layer_sparsity(config: Mapping, key: str, n_layers: int, config_name: str) -> list[float]:
    """Per layer, the activation sparsity ``config[key]`` lists (a number in [0, 1) each; absent: none).

    Raises:
        SterError: not a list of one such number per layer.
    """
    v = config.get(key)
    if v is None:
        return [0.0] * n_layers
    if not isinstance(v, list) or len(v) != n_layers or not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and 0 <= p < 1 for p in v):
        raise SterError(f"invalid model config {config_name}: {key} must list one number in [0, 1) per layer "
                        f"({n_layers}), got {brief_value(v)}")
    return [float(p) for p in v]


def latent_spec(r: "_Reader", config_name: str, family: FamilySpec | None = None,
                hidden: int | None = None) -> LatentSpec:
    """The latent attention of a family with ``latent``: ``kv_lora_rank``, ``q_lora_rank`` (null: one
    q projection), ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim``, under the family's keys;
    what the family fixes in code (``latent_extras``) from ``family``.

    Raises:
        SterError: a width that is not a positive integer within bounds, an odd rotated width.
    """
    q_rank = r.get("q_lora_rank")
    from .decoder.latent import LatentSpec
    latent = LatentSpec(kv_lora_rank=r.positive_int("kv_lora_rank"),
                        q_lora_rank=None if q_rank is None else r.positive_int("q_lora_rank"),
                        qk_nope_head_dim=r.positive_int("qk_nope_head_dim", limit=MAX_HEAD_DIM),
                        # unrotated families may rotate nothing (GLM-5-Next's qk_rope_head_dim 0)
                        qk_rope_head_dim=0 if (family is not None and family.positions == "none"
                                               and r.get("qk_rope_head_dim") == 0)
                        else r.positive_int("qk_rope_head_dim", limit=MAX_HEAD_DIM),
                        v_head_dim=r.positive_int("v_head_dim", limit=MAX_HEAD_DIM))
    if latent.qk_rope_head_dim % 2:
        raise SterError(f"invalid model config {config_name}: qk_rope_head_dim ({latent.qk_rope_head_dim}) must be "
                        "even; rotary pairs need an even width")
    if family is None:
        return latent
    return latent_extras(latent, family, hidden, float(r.get("norm_eps", 1e-6)))


def latent_extras(latent: LatentSpec, family: FamilySpec, hidden: int | None, model_eps: float) -> LatentSpec:
    """``latent`` with what ``family`` fixes in code: its bottleneck norms at the model's epsilon
    (``latent_model_eps``), the normed bottlenecks scaled by sqrt(hidden / rank) (``latent_rescale``),
    the shared rotated key part RMS-normed (``latent_k_rope_norm``)."""
    extra: dict[str, Any] = {}
    if family.latent_model_eps:
        extra["norm_eps"] = model_eps
    if family.latent_rescale:
        extra["kv_scale"] = math.sqrt(hidden / latent.kv_lora_rank)
        if latent.q_lora_rank is not None:
            extra["q_scale"] = math.sqrt(hidden / latent.q_lora_rank)
    if family.latent_k_rope_norm:
        extra["k_rope_norm"] = True
    return replace(latent, **extra) if extra else latent


#: The latent shape keys a ``per_layer_config`` entry may restate for its layer.
LATENT_LAYER_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def layer_latents(config: Mapping, family: FamilySpec, latent: LatentSpec, hidden: int, n_layers: int,
                  config_name: str) -> list[LatentSpec | None]:
    """Per layer, its own latent attention where Transformers' ``per_layer_config`` restates the latent's
    widths for it (Dots3-Note's sliding-window layers; ``FamilySpec.normalize`` writes it from other
    spellings), else None (the model's). A layer of its own latent scores over its own head width,
    (nope + rope) ** -0.5.

    Raises:
        SterError: a width that is not a positive integer within bounds; a rotated width other than the
            model's (its layers would need a rotation table of their own), a layer without a query
            bottleneck in a model with one.
    """
    where = f"invalid model config {config_name}"
    overrides = config.get("per_layer_config")
    out: list[LatentSpec | None] = [None] * n_layers
    if not isinstance(overrides, Mapping):
        return out
    for key, entry in overrides.items():  # keys and entries were checked by layer_geometry
        stated = {k: entry[k] for k in LATENT_LAYER_KEYS if isinstance(entry, Mapping) and entry.get(k) is not None}
        if not stated:
            continue
        for k, v in stated.items():
            if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_HEAD_DIM * 64:
                raise SterError(f"{where}: per_layer_config[{key}].{k} must be a positive integer, got {brief_value(v)}")
        own = replace(latent, **stated, attn_scale=None)
        if own.qk_rope_head_dim != latent.qk_rope_head_dim:
            raise SterError(f"{config_name}: layer {key}'s qk_rope_head_dim ({own.qk_rope_head_dim}) differs from the "
                            f"model's ({latent.qk_rope_head_dim}); layers rotating different widths are not supported "
                            "(ster refuses this configuration before reading any weight)")
        if (own.q_lora_rank is None) != (latent.q_lora_rank is None):
            raise SterError(f"{where}: layer {key} states a q_lora_rank where the model has none, or none where "
                            "it has one")
        own = latent_extras(own, family, hidden, latent.norm_eps)
        if own.qk_head_dim != latent.qk_head_dim:
            own = replace(own, attn_scale=own.qk_head_dim ** -0.5)
        out[int(key)] = own if own != latent else None
    return out


def compressed_spec(r: "_Reader", config: Mapping, max_pos: int, config_name: str) -> CompressedSpec:
    """DeepSeek-V4's compressed attention (``decoder/compressed.py``) from its config (``normalize`` has
    written ``_compress_rope``, the compressed layers' rotation parameters, and ``compress_rates``).

    Raises:
        SterError: a width, rank, rate, window or count that is not a positive integer within bounds, heads
            that do not split into ``o_groups``, a rotated width above the head's or odd, bad rotation parameters.
    """
    where = f"invalid model config {config_name}"
    D = r.positive_int("head_dim", limit=MAX_HEAD_DIM)
    rope_dim = config.get("qk_rope_head_dim")
    if rope_dim is None:
        factor = config.get("partial_rotary_factor", 64 / 512)
        rope_dim = int(D * factor) if isinstance(factor, (int, float)) and not isinstance(factor, bool) else None
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or not 0 < rope_dim <= D or rope_dim % 2:
        raise SterError(f"{where}: qk_rope_head_dim must be an even number in 2..head_dim ({D}), "
                        f"got {brief_value(rope_dim)}")
    heads = r.positive_int("num_attention_heads", limit=MAX_HEADS)
    groups = r.positive_int("o_groups", limit=MAX_HEADS)
    if heads % groups:
        raise SterError(f"{where}: num_attention_heads ({heads}) is not a multiple of o_groups ({groups})")
    rates = config.get("compress_rates")
    rates = rates if isinstance(rates, Mapping) else {}

    def rate(kind: str, default: int) -> int:
        v = rates.get(kind, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 1 << 20:
            raise SterError(f"{where}: compress_rates[{kind!r}] must be a positive integer, got {brief_value(v)}")
        return v

    def rope(params: Mapping) -> Rope:
        params = {k: v for k, v in params.items() if k != "partial_rotary_factor"}
        return make_rope(params, head_dim=rope_dim, max_position_embeddings=max_pos, interleaved=True, where=where)

    from .decoder.compressed import CompressedSpec
    return CompressedSpec(head_dim=D, rope_dim=rope_dim, q_lora_rank=r.positive_int("q_lora_rank"),
                          window=r.positive_int("sliding_window", limit=1 << 31),
                          sparse_rate=rate("compressed_sparse_attention", 4),
                          heavy_rate=rate("heavily_compressed_attention", 128), o_groups=groups,
                          o_lora_rank=r.positive_int("o_lora_rank"),
                          index_heads=r.positive_int("index_n_heads", limit=MAX_HEADS),
                          index_dim=r.positive_int("index_head_dim", limit=MAX_HEAD_DIM),
                          index_topk=r.positive_int("index_topk", limit=1 << 31), norm_eps=float(r.get("norm_eps", 1e-6)),
                          main_rope=rope(config.get("rope_parameters") or {}), compress_rope=rope(config["_compress_rope"]))


def streams_spec(r: "_Reader", family: FamilySpec, config_name: str) -> StreamsSpec:
    """The residual streams of a family with ``streams`` (``decoder/streams.py``): ``hc_mult`` streams,
    ``hc_magnitude``, ``hc_eps`` and ``hc_sinkhorn_iters`` under the family's keys (what the family fixes
    in code from ``family.streams``: ``"model"`` or a number for each), the norm's epsilon the model's.

    Raises:
        SterError: a stream count that is not a positive integer within bounds, an epsilon or magnitude
            that is not a finite number (a negative epsilon), rounds that are not a whole number.
    """
    where = f"invalid model config {config_name}"
    fixed = dict(family.streams)

    def number(key: str, default: float, positive: bool = False) -> float:
        v = fixed.pop(key, "model")
        v = r.get(key, default) if v == "model" else v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (positive and v == 0):
            raise SterError(f"{where}: {key} must be a {'positive' if positive else 'non-negative'} number, "
                            f"got {brief_value(v)}")
        return float(v)

    n = r.positive_int("hc_mult", limit=64)
    eps = number("hc_eps", 1e-6)
    iters = fixed.pop("hc_sinkhorn_iters", 0)
    iters = r.positive_int("hc_sinkhorn_iters", limit=1000) if iters == "model" else int(iters)
    post_eps = fixed.pop("post_eps", 0.0)
    from .decoder.streams import StreamsSpec
    return StreamsSpec(n=n, magnitude=number("hc_magnitude", 2.0, positive=True),
                       post_eps=eps if post_eps == "hc_eps" else float(post_eps), eps=eps,
                       norm_eps=float(r.get("norm_eps", 1e-6)), sinkhorn_iters=iters, **fixed)


def indexer_spec(r: "_Reader", family: FamilySpec, latent: LatentSpec | None, config_name: str) -> IndexerSpec:
    """DeepSeek Sparse Attention's indexer of a family with ``indexer``: ``index_n_heads``,
    ``index_head_dim`` and ``index_topk`` under the family's keys, rotating the latent's
    ``qk_rope_head_dim`` components; what the family fixes in code (pairing, which components rotate,
    the key norm's epsilon: ``"model"`` for the model's) from ``family.indexer``.

    Raises:
        SterError: a count that is not a positive integer within bounds, a rotated width above the
            index head's, a model without a query bottleneck (the indexer reads its latent).
    """
    where = f"invalid model config {config_name}"
    if latent is None or latent.q_lora_rank is None:
        raise SterError(f"{config_name}: DeepSeek Sparse Attention without a query bottleneck (q_lora_rank null) is "
                        "not supported (the indexer reads the query latent); ster refuses this configuration before "
                        "reading any weight")
    fixed = dict(family.indexer)
    if fixed.pop("kpool", None) == "model":  # GLM-5-Next's pooled indexer
        fixed["kpool"] = r.positive_int("index_kpool", limit=1 << 20)
        tail = r.get("index_kpool_always_select_tail", True)
        if not isinstance(tail, bool):
            raise SterError(f"{where}: index_kpool_always_select_tail must be true or false, got {brief_value(tail)}")
        fixed["tail"] = tail
    eps = fixed.pop("norm_eps", 1e-6)
    eps = float(r.get("norm_eps", 1e-6)) if eps == "model" else float(eps)
    from .decoder.indexer import IndexerSpec
    spec = IndexerSpec(n_heads=r.positive_int("index_n_heads", limit=MAX_HEADS),
                       head_dim=r.positive_int("index_head_dim", limit=MAX_HEAD_DIM),
                       topk=r.positive_int("index_topk", limit=1 << 31), rope_dim=latent.qk_rope_head_dim,
                       norm_eps=eps, **fixed)
    if spec.rope_dim > spec.head_dim:
        raise SterError(f"{where}: qk_rope_head_dim ({spec.rope_dim}) must not exceed index_head_dim "
                        f"({spec.head_dim}): the indexer rotates that many of each head's components")
    return spec


#: ``indexer_types`` entries: the layer's own indexer, the last indexed layer's choice, none (dense).
INDEXER_KINDS = {"full": "full", "shared": "shared", "none": None}


def indexer_kinds(config: Mapping, n_layers: int, config_name: str) -> list[str | None]:
    """Per layer: its ``LayerSpec.indexer`` from ``indexer_types`` (a family's ``normalize`` writes it
    from its own spellings), every layer ``"full"`` when the config lists none.

    Raises:
        SterError: a list of the wrong length or with another entry, a ``shared`` layer before any
            ``full`` one (it would have no choice to reuse; Transformers raises there too).
    """
    types = config.get("indexer_types")
    if types is None:
        return ["full"] * n_layers
    if not isinstance(types, list) or len(types) != n_layers or any(t not in INDEXER_KINDS for t in types):
        raise SterError(f"invalid model config {config_name}: indexer_types must list 'full', 'shared' or 'none' "
                        f"for each of the {n_layers} layers, got {brief_value(types)}")
    kinds = [INDEXER_KINDS[t] for t in types]
    first = next((i for i, k in enumerate(kinds) if k == "full"), n_layers)
    if "shared" in kinds[:first]:
        raise SterError(f"invalid model config {config_name}: indexer_types marks layer {kinds.index('shared')} "
                        "shared before any layer has an indexer of its own (full); there is no choice to reuse")
    return kinds


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context stretched ``scale`` times: 0.1 * mscale * ln(scale) + 1
    (1 when scale <= 1). Peng et al. 2023 (arXiv:2309.00071); DeepSeek-V2's ``yarn_get_mscale``."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def latent_attn_scale(params: Mapping, qk_head_dim: int, max_pos: int) -> float:
    """Latent attention's softmax scale: qk_head_dim ** -0.5, times mscale ** 2 for a scaled rotation that
    states ``mscale_all_dim`` (mscale = ``yarn_mscale(factor, mscale_all_dim)``), as Transformers'
    ``yarn_apply_mscale`` computes it for DeepSeek-V2/V3 and MiniCPM3 (DeepSeek-V2, arXiv:2405.04434)."""
    scale = qk_head_dim ** -0.5
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    m_all = params.get("mscale_all_dim")
    if kind != "default" and isinstance(m_all, (int, float)) and not isinstance(m_all, bool) and m_all:
        factor = params.get("factor")
        if factor is None and params.get("original_max_position_embeddings"):
            factor = max_pos / params["original_max_position_embeddings"]
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor):
            scale *= yarn_mscale(float(factor), float(m_all)) ** 2
    return scale


def value_router_spec(config: Mapping, family: FamilySpec, moe: MoESpec | None,
                      config_name: str) -> RouterSpec | None:
    """The value experts' router (K2-Horizon's MoVA, the family's ``value_experts_keys``: the expert count
    and the experts per token): the feed-forward router's scoring, selection bias, renormalisation and
    scale over that many experts; None when the config states no count (or 0).

    Raises:
        SterError: counts that are not positive integers, more per token than experts, value experts
            in a model without routed feed-forwards (whose router they follow).
    """
    if not family.value_experts_keys:
        return None
    n_key, k_key = family.value_experts_keys
    n, k = config.get(n_key), config.get(k_key)
    if not n:
        return None
    where = f"invalid model config {config_name}"
    if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_EXPERTS:
        raise SterError(f"{where}: {n_key} must be an integer in 1..{MAX_EXPERTS}, got {brief_value(n)}")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= n:
        raise SterError(f"{where}: {k_key} must be an integer in 1..{n_key} ({n}), got {brief_value(k)}")
    if moe is None:
        raise SterError(f"{where}: {n_key} needs the routed feed-forward (num_experts) whose router the value "
                        "experts follow")
    return replace(moe.router, num_experts=n, top_k=k, n_group=1, topk_group=1)


def norm_groups(config: Mapping, family: FamilySpec, hidden: int, config_name: str) -> int:
    """How many equal groups of the hidden width the sublayer and final RMS norms normalise apart
    (the family's ``norm_groups_key``: K2-Horizon's layernorm_num_groups); 1 when unstated.

    Raises:
        SterError: a count that is not a positive integer dividing hidden_size.
    """
    g = config.get(family.norm_groups_key) if family.norm_groups_key else None
    if g is None:
        return 1
    if isinstance(g, bool) or not isinstance(g, int) or g <= 0 or hidden % g:
        raise SterError(f"invalid model config {config_name}: {family.norm_groups_key} must be a positive integer "
                        f"dividing hidden_size ({hidden}), got {brief_value(g)}")
    return g


def family_fields(config: Mapping, family: FamilySpec, *, hidden: int, heads: int, head_dim: int,
                  config_name: str, attn_scale: float | None = None) -> dict[str, Any]:
    """The ``ModelSpec`` fields a family's flags and scalar config keys decide, shared with the GGUF path.

    ``config`` is a config.json, or (GGUF) the metadata renamed to config keys by
    ``FamilySpec.gguf_config``; ``attn_scale`` overrides the score scale the keys give.
    """
    r = _Reader(config, family, config_name)
    if attn_scale is None:
        if family.attn_unscaled:
            attn_scale = 1.0
        elif family.attn_multiplier_key:
            attn_scale = r.number(family.attn_multiplier_key, head_dim ** -0.5)
        else:
            # 0 once fell back to head_dim in silence (transformers divides by zero) and a negative
            # value was named as a complex attention scale: the key is checked by name.
            scalar = r.number(family.attn_scale_key, None)
            if scalar is not None and scalar <= 0:
                raise SterError(f"invalid model config {config_name}: {family.attn_scale_key} must be a number "
                                f"above 0 (the scores are scaled by its inverse square root), got {scalar:g}")
            attn_scale = (scalar or head_dim) ** -0.5
    logit_scale = r.number(family.logit_scale_key, 1.0)
    return dict(
        norm_unit_offset=family.norm_unit_offset,
        norms=family.norms,
        qk_norm=family.qk_norm,
        embed_scale=(math.sqrt(hidden) if family.embed_scale_sqrt_hidden else 1.0)
        * r.number(family.embed_multiplier_key, 1.0),
        attn_scale=attn_scale,
        norm_affine=family.norm_affine,
        parallel=family.parallel,
        qk_norm_after_rope=family.qk_norm_after_rope,
        qk_norm_optional=family.qk_norm_optional,
        qk_norm_affine=family.qk_norm_affine,
        embed_norm=family.embed_norm,
        positions=family.positions,
        position_offset=family.position_offset,
        alibi_slopes=alibi_slopes(heads, r.number("alibi_bias_max", 8.0)) if family.positions == "alibi" else None,
        alibi_scale=attn_scale if family.alibi_scaled else 1.0,
        alibi_bf16=family.alibi_bf16,
        alibi_sqrt=family.alibi_sqrt,
        norm_offsets=tuple(family.norm_offsets.items()),
        norm_groups=norm_groups(config, family, hidden, config_name),
        residual_scale=r.number(family.residual_multiplier_key, 1.0),
        # A zero divisor becomes an infinite scale, which validate.check_spec refuses by name.
        logit_scale=(1.0 / logit_scale if logit_scale else math.inf) if family.logit_scale_divides else logit_scale,
        clip_qkv=r.number(family.clip_qkv_key, None),
        sinks=family.sinks is True,
        value_scale=r.number(family.value_scale_key, 1.0),
        attn_gate=family.attn_gate,
        attn_gate_per_head=family.attn_gate_per_head,
        adapters=family.adapters,
        attn_gate_in_q=family.attn_gate_in_q,
        value_norm=family.value_norm,
        layer_scalar=family.layer_scalar,
        embed_norm_affine=family.embed_norm_affine,
        final_norm_unit_offset=family.final_norm_unit_offset,
        post_norm_eps=r.number(family.post_norm_eps_key, None),
        query_bottleneck=_query_bottleneck(config, family, config_name),
        ngram=ngram_spec(config, hidden, config_name) if family.ngram else None,
    )
