"""The denoiser: one DiT over the shared token vocabulary, for every modality at once.

The model never sees the masking schedule. It reads a packed sequence (``ids``, ``segment_ids``,
``positions`` from :mod:`unimodal.tokenizers_mm.layout`), a mask ratio ``t`` per sample and an ``is_target`` flag per
token, and returns per-token logits over the shared vocabulary plus one critic logit per token.

Two choices make the condition cache exact rather than approximate:

* attention: a target sees every real token; a condition sees only conditions;
* adaLN conditioning is per token: conditions are modulated by the embedding of ``t = 0`` (they are clean),
  targets by the embedding of their sample's ``t``.

So a condition token's hidden states depend on the conditions alone, and their keys/values can be computed
once (:meth:`DiT.encode_condition`) and reused at every sampling step (:meth:`DiT.forward_targets`).

Positions are ``(B, L, 2)``: the first half of each head is rotated by ``pos[..., 0]``, the second half by
``pos[..., 1]`` (2-D RoPE for images; plain 1-D RoPE for text/audio, whose positions are ``(i, i)``).

The same two choices let a training step skip work (``forward(..., unpad=True, copies=k)``, :class:`Packing`):
every layer but attention acts on each token alone, so it runs on the real tokens only (about half the slots
of a mixed batch are padding), and the k copies of a sample that complementary masks train share their
condition tokens, which are computed once.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from unimodal.core.errors import InputError

try:  # optional, GPU only: used when importable and the tensors are on CUDA
    from xformers.ops import memory_efficient_attention
except Exception:  # noqa: BLE001 - a broken xformers install must not break the model
    memory_efficient_attention = None

# Size presets. "small" is the default model, trained on a 2-core CPU for a few hours; "mini" is for experiments
# that train several models on that CPU (data efficiency); "base" is for GPUs.
PRESETS = {
    "tiny": dict(hidden_size=64, num_layers=2, num_heads=4, critic_hidden=32),
    "mini": dict(hidden_size=256, num_layers=6, num_heads=4, critic_hidden=64),  # CPU experiments (~1 h runs)
    "small": dict(hidden_size=384, num_layers=8, num_heads=6, critic_hidden=128),
    "base": dict(hidden_size=768, num_layers=12, num_heads=12, critic_hidden=256),
}

T_SCALE = 1000.0  # t in [0, 1] is embedded like a DiT timestep in [0, 1000]
FREQUENCY_EMBEDDING_SIZE = 256
# The layout's MASK id and text segment id (unimodal.tokenizers_mm.layout MASK, SEG_TEXT; the backbone imports
# nothing of the project, and a test holds them equal), read by neighbour_inputs
MASK_ID, TEXT_SEGMENT = 1, 1
NEIGHBOUR_GAPS = 16  # distances a neighbour_inputs slot tells apart: 0..15 slots (farther counts as 15)


# ---- outputs and the condition cache ----------------------------------------------------------------------


@dataclass
class DiTOutput(BaseOutput):
    """``logits`` (B, L, V) float32, ``critic`` (B, L) float32 logits that each token is wrong (the learned critic
    of ``inference/critique.py``), ``hidden`` (B, L, D)."""

    logits: torch.Tensor | None = None  # defaults: accelerate rebuilds outputs from a dict
    critic: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


@dataclass(eq=False)
class ConditionCache:
    """Per layer, the condition tokens' keys and values (after RoPE), each (B, H, L_cond, head_dim), and the
    condition padding mask ``attention_mask`` (B, L_cond), True at real condition tokens."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    attention_mask: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.attention_mask.shape[0]

    @property
    def length(self) -> int:
        return self.attention_mask.shape[1]

    def _map(self, fn) -> "ConditionCache":
        return ConditionCache(tuple(fn(k) for k in self.keys), tuple(fn(v) for v in self.values),
                              fn(self.attention_mask))

    def repeat_interleave(self, repeats: int | torch.Tensor) -> "ConditionCache":
        """Each sample repeated ``repeats`` times along the batch (several targets per condition)."""
        return self._map(lambda x: x.repeat_interleave(repeats, dim=0))

    def index_select(self, index: torch.Tensor) -> "ConditionCache":
        return self._map(lambda x: x.index_select(0, index.to(x.device)))

    def to(self, device: torch.device | str) -> "ConditionCache":
        return self._map(lambda x: x.to(device))

    def padded_to(self, length: int) -> "ConditionCache":
        """The same cache with masked-out slots appended up to ``length`` condition tokens."""
        extra = length - self.length
        if extra < 0:
            raise InputError(f"cannot pad a condition cache of {self.length} tokens to {length}")
        return self._map(lambda x: F.pad(x, (0, 0, 0, extra)) if x.dim() == 4 else F.pad(x, (0, extra)))

    @staticmethod
    def cat(caches: Sequence["ConditionCache"]) -> "ConditionCache":
        """Concatenate along the batch, padding shorter conditions (e.g. a conditional and an empty CFG pass)."""
        if not caches:
            raise InputError("ConditionCache.cat needs at least one cache")
        if len({len(c.keys) for c in caches}) != 1:
            raise InputError("cannot concatenate condition caches from models of different depths")
        longest = max(c.length for c in caches)
        padded = [c.padded_to(longest) for c in caches]
        layers = range(len(caches[0].keys))
        return ConditionCache(tuple(torch.cat([c.keys[i] for c in padded]) for i in layers),
                              tuple(torch.cat([c.values[i] for c in padded]) for i in layers),
                              torch.cat([c.attention_mask for c in padded]))


@dataclass(eq=False)
class Packing:
    """The real tokens of a padded (B, L) batch, so that the per-token layers (projections, MLP, adaLN, RoPE)
    run on them alone; only attention runs on the padded (B, L) layout, where SDPA wants it.

    A training batch pads every sequence to its longest (a caption task beside a speech task: about half of
    the slots of a mixed batch are padding), and a projection of a padding slot is work whose result nothing
    reads. The real tokens' values are the padded forward's (each row of a per-token layer depends on that row
    alone; a matmul over fewer rows may round differently in the last bit), and padding slots come back as
    zeros.

    ``copies`` > 1: the batch is that many stacked copies of the same sequences whose targets differ (a step
    with complementary masks trains every sample twice). A condition token sees only conditions and is
    modulated by t = 0, so it has the same states in every copy: it is computed once, in the first copy, and
    its states are laid out in every copy for attention (its gradient sums over the copies, as it would in the
    padded forward).

    ``index`` (N,): each computed token's place in the flattened (B * L) batch; ``shared`` / ``shared_from``:
    the slots of later copies' conditions and the first copy's slots they show (empty with one copy);
    ``rows`` (N,): each computed token's adaLN row among the flattened (B * 2) modulation rows
    (``2 * sample + is_target``)."""

    index: torch.Tensor
    shared: torch.Tensor
    shared_from: torch.Tensor
    rows: torch.Tensor
    batch: int
    length: int

    @classmethod
    def of(cls, attention_mask: torch.Tensor, is_target: torch.Tensor, copies: int = 1) -> "Packing":
        batch, length = attention_mask.shape
        computed = attention_mask.clone()  # (B, L)
        first = batch // copies
        if copies > 1:
            computed[first:] &= is_target[first:]  # later copies: their targets alone
        index = computed.flatten().nonzero().squeeze(1)  # (N,)
        shared = (attention_mask & ~computed).flatten().nonzero().squeeze(1)  # later copies' conditions
        rows = 2 * torch.div(index, length, rounding_mode="floor") + is_target.flatten()[index].long()
        return cls(index, shared, shared % (first * length), rows, batch, length)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, ...) -> (N, ...): the computed tokens."""
        return x.flatten(0, 1).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, L, ...): every real slot's token (shared conditions in each copy), zeros at padding."""
        padded = x.new_zeros(self.batch * self.length, *x.shape[1:]).index_copy(0, self.index, x)
        if len(self.shared):  # a shared condition's gradient sums over the copies that show it
            padded = padded.index_copy(0, self.shared, padded.index_select(0, self.shared_from))
        return padded.unflatten(0, (self.batch, self.length))

    def modulation(self, modulation: torch.Tensor) -> torch.Tensor:
        """(B, 2, M) rows [for t = 0, for the sample's t] -> (N, M): each computed token's row (what
        :func:`per_token` gives the padded layout)."""
        return modulation.flatten(0, 1).index_select(0, self.rows)


# ---- small functions ----------------------------------------------------------------------------------------


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


def per_token(modulation: torch.Tensor, is_target: torch.Tensor) -> torch.Tensor:
    """(B, 2, M) rows [for t = 0, for the sample's t] -> (B, L, M): the second row at targets, the first elsewhere.

    As a (B, L, 2) one-hot times (B, 2, M) product: exact (each output is one row times 1, plus 0), and its
    backward is one more product. ``torch.where`` (:func:`per_token_where`) gives the same values, but its
    backward materialises and sums a (B, L, M) gradient per row; the product made a ``small`` training step
    1.15x faster on the CPU (``unimodal bench train --compare-where``, docs/results.md)."""
    choose = F.one_hot(is_target.long(), 2).to(modulation.dtype)  # (B, L, 2)
    return torch.bmm(choose, modulation)  # (B, L, M)


def per_token_where(modulation: torch.Tensor, is_target: torch.Tensor) -> torch.Tensor:
    """:func:`per_token` by ``torch.where``: the reference its tests and ``bench train --compare-where`` use."""
    return torch.where(is_target[..., None], modulation[:, 1:], modulation[:, :1])


PER_TOKEN = {"product": per_token, "where": per_token_where}  # the benchmark's names for the two forms


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding (B,) -> (B, dim), as in facebookresearch/DiT."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]  # (B, half)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (B, dim)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L, 2) positions -> cos, sin, each (B, 1, L, head_dim) float32 (packed (N, 2) -> (N, 1, head_dim)).

    Head layout: [row half | col half], each half a rotate-half RoPE of its axis, so the angles read
    [a_row, a_row, a_col, a_col] over the four quarters of the head.
    """
    quarter = head_dim // 4
    freqs = theta ** (-torch.arange(quarter, dtype=torch.float32, device=positions.device) / quarter)
    angles = positions.float()[..., None] * freqs  # (B, L, 2, quarter)
    angles = torch.cat([angles, angles], dim=-1).flatten(-2)  # (B, L, head_dim)
    return angles.cos()[:, None], angles.sin()[:, None]  # (B, 1, L, head_dim) each


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, L, head_dim) queries or keys; computed in float32, returned in x's dtype."""
    first, second = x.float().unflatten(-1, (2, 2, -1)).unbind(-2)  # (B, H, L, 2, quarter) each
    rotated = torch.stack([-second, first], dim=-2).flatten(-3)  # (B, H, L, head_dim)
    return (x.float() * cos + rotated * sin).to(x.dtype)


def attention_visibility(is_target: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool: query i sees key j iff j is real and (i is a target or j is a condition)."""
    length = is_target.shape[1]
    visible = attention_mask[:, None, :] & (is_target[:, :, None] | ~is_target[:, None, :])  # (B, L, L)
    # Every token sees itself: a padding query would otherwise have no key, and SDPA would return NaN.
    visible = visible | torch.eye(length, dtype=torch.bool, device=is_target.device)
    return visible[:, None]  # (B, 1, L, L)


def causal_visibility(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, L, L) bool for a causal (autoregressive) model: query i sees real keys j <= i, and itself."""
    length = attention_mask.shape[1]
    earlier = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()  # (L, L)
    itself = torch.eye(length, dtype=torch.bool, device=attention_mask.device)
    return ((attention_mask[:, None, :] & earlier) | itself)[:, None]  # (B, 1, L, L)


def target_visibility(cond_mask: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, L_t, L_c + L_t) bool: targets see the real conditions, the real targets and themselves."""
    cond_len, target_len = cond_mask.shape[1], target_mask.shape[1]
    keys_real = torch.cat([cond_mask, target_mask], dim=1)  # (B, L_c + L_t)
    itself = torch.eye(target_len, dtype=torch.bool, device=target_mask.device)  # (L_t, L_t)
    itself = torch.cat([itself.new_zeros(target_len, cond_len), itself], dim=1)  # (L_t, L_c + L_t)
    return (keys_real[:, None, :] | itself)[:, None]  # (B, 1, L_t, L_c + L_t)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Attention of (B, H, Lq, hd) queries over (B, H, Lk, hd) keys/values; ``visible`` (B, 1, Lq, Lk) bool."""
    if memory_efficient_attention is not None and q.is_cuda:
        return _xformers_attend(q, k, v, visible)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)


def _xformers_attend(q, k, v, visible):
    batch, heads, query_len, key_len = *q.shape[:3], k.shape[2]
    # xformers wants the bias's last dimension 8-aligned in memory: slice it out of a wider tensor.
    aligned = -(-key_len // 8) * 8
    bias = q.new_zeros(batch, heads, query_len, aligned)[..., :key_len]  # (B, H, Lq, Lk)
    bias.masked_fill_(~visible, float("-inf"))
    out = memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias)
    return out.transpose(1, 2)  # (B, H, Lq, hd)


# ---- parts ----------------------------------------------------------------------------------------------------


class TimestepEmbedder(nn.Module):
    """Mask ratio t in [0, 1] -> (B, D): sinusoidal features of ``t * 1000``, then an MLP."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = FREQUENCY_EMBEDDING_SIZE):
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        features = timestep_embedding(t * T_SCALE, self.frequency_embedding_size)  # (B, 256) float32
        return self.mlp(features.to(self.mlp[0].weight.dtype))  # (B, D); weights may be bf16 for inference


class Attention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x, rope, visible, past=None, packing: Packing | None = None):
        """x (B, L, D) -> (B, L, D) and this call's (keys, values) (B, H, L, hd) after RoPE.

        ``past``: cached (keys, values) of condition tokens, prepended to this call's keys and values.
        ``packing``: x is (N, D), the real tokens (rope (N, 1, hd) x2); they are laid out padded for attention
        alone, and the output is (N, D).
        """
        qkv = self.qkv(x).unflatten(-1, (3, self.num_heads, -1))  # (B, L, 3, H, hd), packed: (N, 3, H, hd)
        if packing is None:
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, H, L, hd) x3
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)  # (B, H, L, hd)
        else:
            q, k = apply_rotary(qkv[:, 0], *rope), apply_rotary(qkv[:, 1], *rope)  # (N, H, hd)
            qkv = packing.unpack(torch.stack([q, k, qkv[:, 2]], dim=1))  # (B, L, 3, H, hd)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, H, L, hd) x3
        keys, values = k, v
        if past is not None:
            keys = torch.cat([past[0].to(k.dtype), k], dim=2)  # (B, H, L_c + L, hd)
            values = torch.cat([past[1].to(v.dtype), v], dim=2)  # (B, H, L_c + L, hd)
        out = attend(q, keys, values, visible).transpose(1, 2).flatten(2)  # (B, L, D)
        return self.proj(out if packing is None else packing.pack(out)), (k, v)  # (B, L, D), packed: (N, D)


class DiTBlock(nn.Module):
    """Pre-norm attention + MLP with adaLN-Zero: shift/scale/gate per branch, zero-initialised gates."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float, dropout: float, norm_eps: float):
        super().__init__()
        mlp_hidden = int(hidden_size * mlp_ratio)
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=norm_eps)
        self.attn = Attention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=norm_eps)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, mlp_hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(mlp_hidden, hidden_size))
        self.dropout = nn.Dropout(dropout)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c_pair, is_target, rope, visible, past=None, packing: Packing | None = None):
        """x (B, L, D), c_pair (B, 2, D) -> x (B, L, D) and (keys, values) of this layer. ``packing``: x is
        (N, D), the real tokens alone (:class:`Packing`), and so is the output."""
        modulation = self.adaLN_modulation(c_pair)  # (B, 2, 6D)
        rows = per_token(modulation, is_target) if packing is None else packing.modulation(modulation)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = rows.chunk(6, dim=-1)  # 6 x (B, L, D)
        attn_out, kv = self.attn(modulate(self.norm1(x), shift_msa, scale_msa), rope, visible, past,
                                 packing)  # (B, L, D)
        x = x + gate_msa * self.dropout(attn_out)  # (B, L, D)
        mlp_out = self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))  # (B, L, D)
        return x + gate_mlp * self.dropout(mlp_out), kv  # (B, L, D)


class FinalLayer(nn.Module):
    """Norm + adaLN shift/scale; the projection to the vocabulary is the tied token embedding."""

    def __init__(self, hidden_size: int, norm_eps: float):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=norm_eps)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x, c_pair, is_target, packing: Packing | None = None):
        modulation = self.adaLN_modulation(c_pair)  # (B, 2, 2D)
        rows = per_token(modulation, is_target) if packing is None else packing.modulation(modulation)
        shift, scale = rows.chunk(2, dim=-1)  # (B, L, D) x2, packed: (N, D) x2
        return modulate(self.norm_final(x), shift, scale)  # (B, L, D)


# ---- the model --------------------------------------------------------------------------------------------------


class DiT(ModelMixin, ConfigMixin):
    """Masked-diffusion transformer over the shared vocabulary; see the module docstring.

    ``forward(ids, t, segment_ids, positions, is_target, attention_mask=None) -> DiTOutput``.
    """

    @register_to_config
    def __init__(self, vocab_size: int, hidden_size: int = 384, num_layers: int = 8, num_heads: int = 6,
                 mlp_ratio: float = 4.0, num_segments: int = 4, rope_theta: float = 10000.0,
                 critic_hidden: int = 128, dropout: float = 0.0, norm_eps: float = 1e-6,
                 use_output_bias: bool = True, causal: bool = False, neighbour_inputs: bool = False):
        super().__init__()
        _check_config(vocab_size, hidden_size, num_layers, num_heads, num_segments, critic_hidden)
        for name, value in (("causal", causal), ("neighbour_inputs", neighbour_inputs)):
            if not isinstance(value, bool):
                raise InputError(f"DiT {name} must be a bool, got {value!r}")
        self.token_embedding = nn.Embedding(vocab_size, hidden_size)
        self.segment_embedding = nn.Embedding(num_segments, hidden_size)
        # neighbour_inputs: a masked caption slot's input also holds the token of the nearest visible slot of its
        # caption on each side and how far away it is (neighbour_embedding), the role the AR twin's input gives a
        # position (the word before it). docs/results.md "A masked slot told its neighbours at its input"
        self.neighbours = nn.ModuleDict({
            "left_token": nn.Embedding(vocab_size, hidden_size), "right_token": nn.Embedding(vocab_size, hidden_size),
            "left_gap": nn.Embedding(NEIGHBOUR_GAPS, hidden_size),
            "right_gap": nn.Embedding(NEIGHBOUR_GAPS, hidden_size)}) if neighbour_inputs else None
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.blocks = nn.ModuleList(DiTBlock(hidden_size, num_heads, mlp_ratio, dropout, norm_eps)
                                    for _ in range(num_layers))
        self.final_layer = FinalLayer(hidden_size, norm_eps)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size)) if use_output_bias else None
        self.critic_head = nn.Sequential(nn.Linear(hidden_size, critic_hidden), nn.GELU(approximate="tanh"),
                                         nn.Linear(critic_hidden, 1))
        self.initialize_weights()

    @classmethod
    def from_preset(cls, name: str, vocab_size: int, **overrides) -> "DiT":
        """A fresh model of a size in :data:`PRESETS`; ``overrides`` replace any config argument."""
        if name not in PRESETS:
            raise InputError(f"unknown DiT preset {name!r}; known presets: {', '.join(PRESETS)}")
        unknown = set(overrides) - set(inspect.signature(cls.__init__).parameters)
        if unknown:
            raise InputError(f"unknown DiT config arguments {sorted(unknown)}; accepted: {_config_names()}")
        return cls(vocab_size=vocab_size, **{**PRESETS[name], **overrides})

    def initialize_weights(self) -> None:
        """DiT's scheme: xavier linears, zero biases, N(0, 0.02) embeddings, zero adaLN (blocks start as identity)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        for embedding in (self.token_embedding, self.segment_embedding, *(self.neighbours or {}).values()):
            nn.init.normal_(embedding.weight, std=0.02)
        for layer in (self.t_embedder.mlp[0], self.t_embedder.mlp[2]):
            nn.init.normal_(layer.weight, std=0.02)
        for block in [*self.blocks, self.final_layer]:
            nn.init.zeros_(block.adaLN_modulation[-1].weight)
            nn.init.zeros_(block.adaLN_modulation[-1].bias)
        nn.init.zeros_(self.critic_head[-1].weight)  # critic starts undecided: logit 0 everywhere

    # ---- shared pieces ----

    @property
    def head_dim(self) -> int:
        return self.config.hidden_size // self.config.num_heads

    def embed(self, ids: torch.Tensor, segment_ids: torch.Tensor, packing: Packing | None = None) -> torch.Tensor:
        """(B, L, D) input embeddings; ``packing``: only its real tokens, (N, D)."""
        x = self.token_embedding(ids) + self.segment_embedding(segment_ids)  # (B, L, D)
        if self.neighbours is not None:
            x = x + self.neighbour_embedding(ids, segment_ids).to(x.dtype)
        return x if packing is None else packing.pack(x)

    def neighbour_embedding(self, ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
        """(B, L, D): at each masked caption slot, the embeddings of the nearest visible token of its caption on
        each side and of its distance to it (clamped at ``NEIGHBOUR_GAPS - 1``); zero elsewhere and on a side
        where the caption shows nothing. Only the ids in the rows given are read, so the sampler's target-only
        forward (the caption whole in it) gives what the full forward gives."""
        length = ids.shape[1]
        at = torch.arange(length, device=ids.device).expand_as(ids)  # (B, L)
        masked = (ids == MASK_ID) & (segment_ids == TEXT_SEGMENT)
        shown = ids != MASK_ID
        left = torch.where(shown, at, -1).cummax(dim=1).values  # nearest shown slot at or before each, -1: none
        from_end = torch.where(shown.flip(1), at, -1).cummax(dim=1).values.flip(1)  # the same from the right
        right = torch.where(from_end >= 0, length - 1 - from_end, -1)
        out = torch.zeros(*ids.shape, self.config.hidden_size, device=ids.device,
                          dtype=self.neighbours["left_token"].weight.dtype)
        for side, index, gap in (("left", left, at - left), ("right", right, right - at)):
            found = index.clamp_min(0)
            use = masked & (index >= 0) & (segment_ids.gather(1, found) == segment_ids)  # in the same caption
            features = self.neighbours[f"{side}_token"](ids.gather(1, found)) + \
                self.neighbours[f"{side}_gap"](gap.clamp(0, NEIGHBOUR_GAPS - 1))
            out = out + features * use[..., None]
        return out

    def condition_pair(self, t: torch.Tensor) -> torch.Tensor:
        """(B,) -> (B, 2, D): the embedding of t = 0 (for condition tokens) and of each sample's t (targets)."""
        both = torch.stack([torch.zeros_like(t), t], dim=1)  # (B, 2)
        return self.t_embedder(both.flatten()).unflatten(0, (t.shape[0], 2))  # (B, 2, D)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_cos_sin(positions, self.head_dim, self.config.rope_theta)  # (B, 1, L, hd) x2

    def output_logits(self, hidden: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Tied head in float32 even under autocast: logits feed a softmax / cross-entropy.

        ``vocab_ids``: only these ids' logits (..., len(vocab_ids)), e.g. one modality's codes: training
        reads logits at masked slots of one modality only, where the full head would cost up to 10x more.
        """
        weight, bias = self.token_embedding.weight, self.output_bias
        if vocab_ids is not None:
            weight = weight.index_select(0, vocab_ids)
            bias = None if bias is None else bias.index_select(0, vocab_ids)
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), weight.float(), None if bias is None else bias.float())  # (..., V)

    def heads(self, x, c_pair, is_target, logits: bool = True, critic: bool = True,
              packing: Packing | None = None) -> DiTOutput:
        """Final layer, then the vocabulary head (unless ``logits`` is False) and the critic head (unless
        ``critic`` is False: a training step whose critic objective is off leaves the head out of the graph).
        ``packing``: x holds the real tokens alone; the outputs are laid out padded, zeros at padding."""
        hidden = self.final_layer(x, c_pair, is_target, packing)  # (B, L, D), packed: (N, D)
        wrong = self.critic_head(hidden).squeeze(-1).float() if critic else None  # (B, L)
        scores = self.output_logits(hidden) if logits else None  # (B, L, V)
        if packing is not None:
            hidden, wrong, scores = (None if y is None else packing.unpack(y) for y in (hidden, wrong, scores))
        return DiTOutput(logits=scores, critic=wrong, hidden=hidden)

    # ---- entry points ----

    def forward(self, ids, t, segment_ids, positions, is_target, attention_mask=None, logits=True,
                critic=True, unpad: bool = False, copies: int = 1) -> DiTOutput:
        """ids/segment_ids (B, L) long, t (B,) mask ratio, positions (B, L, 2), is_target (B, L) bool,
        attention_mask (B, L) bool, True at real tokens (None: all real). ``logits=False`` skips the
        vocabulary head (``logits`` is None): a caller that needs logits at a few slots computes them from
        ``hidden`` with :meth:`output_logits`. ``critic=False`` skips the critic head (``critic`` is None).
        ``unpad``: run the per-token layers on the real tokens alone (:class:`Packing`) when the batch has
        padding; the real tokens' outputs are the same, the padding slots' are zeros (training steps use it).
        ``copies`` (with ``unpad``): the batch is that many stacked copies of the same sequences, their targets
        masked differently (complementary masks); their condition tokens are computed once (refused unless the
        copies agree everywhere but at target ids and t; computed in every copy by a causal model, whose
        conditions may see targets, and under dropout, which draws anew for each copy)."""
        attention_mask = self._check_sequence(ids, segment_ids, positions, attention_mask)
        _check_bool("is_target", is_target, ids.shape)
        _check_t(t, ids.shape[0])
        packing = None
        if unpad:
            copies = self._shared_copies(copies, ids, segment_ids, positions, is_target, attention_mask)
            if copies > 1 or not bool(attention_mask.all()):
                packing = Packing.of(attention_mask, is_target, copies)
        return self.forward_unchecked(ids, t, segment_ids, positions, is_target, attention_mask, logits, critic,
                                      packing)

    def forward_unchecked(self, ids, t, segment_ids, positions, is_target, attention_mask,
                          logits: bool = True, critic: bool = True, packing: Packing | None = None) -> DiTOutput:
        """:meth:`forward` without its input checks (their data-dependent branches break ``torch.compile``
        graphs); ``attention_mask`` is required. ``packing``: the per-token layers run on its real tokens."""
        c_pair = self.condition_pair(t)  # (B, 2, D)
        visible = self._visibility(is_target, attention_mask)  # (B, 1, L, L)
        if packing is None:
            x = self.embed(ids, segment_ids)  # (B, L, D)
            rope = self.rotary(positions)  # (B, 1, L, hd) x2
        else:
            x = self.embed(ids, segment_ids, packing)  # (N, D)
            rope = self.rotary(packing.pack(positions))  # (N, 1, hd) x2
        for block in self.blocks:
            x, _ = block(x, c_pair, is_target, rope, visible, packing=packing)  # (B, L, D), packed: (N, D)
        return self.heads(x, c_pair, is_target, logits, critic, packing)

    def encode_condition(self, ids, segment_ids, positions, attention_mask=None) -> ConditionCache:
        """Run the condition tokens alone (they only see each other) and keep each layer's keys/values."""
        attention_mask = self._check_sequence(ids, segment_ids, positions, attention_mask)
        if ids.shape[1] == 0:
            return self.empty_condition(ids.shape[0], device=ids.device)
        is_target = torch.zeros_like(attention_mask)  # (B, L)
        x = self.embed(ids, segment_ids)  # (B, L, D)
        c_pair = self.condition_pair(torch.zeros(ids.shape[0], device=ids.device))  # (B, 2, D)
        rope = self.rotary(positions)  # (B, 1, L, hd) x2
        visible = self._visibility(is_target, attention_mask)  # (B, 1, L, L)
        keys, values = [], []
        for block in self.blocks:
            x, (k, v) = block(x, c_pair, is_target, rope, visible)  # (B, L, D), (B, H, L, hd) x2
            keys.append(k)
            values.append(v)
        return ConditionCache(tuple(keys), tuple(values), attention_mask)

    def forward_targets(self, ids, t, segment_ids, positions, cache: ConditionCache,
                        attention_mask=None) -> DiTOutput:
        """Run only the target tokens; their queries attend to [cached condition K/V ; their own K/V].

        Equals :meth:`forward` on the conditions followed by these targets (``is_target`` True on them).
        """
        attention_mask = self.check_target_inputs(ids, t, segment_ids, positions, cache, attention_mask)
        return self.forward_targets_unchecked(ids, t, segment_ids, positions, cache, attention_mask)

    def check_target_inputs(self, ids, t, segment_ids, positions, cache, attention_mask=None) -> torch.Tensor:
        """The checks of :meth:`forward_targets`; returns the attention mask (all True when None)."""
        if self.config.causal:
            raise InputError("forward_targets is for masked-diffusion models; a causal (autoregressive) model "
                             "decodes with extend()")
        attention_mask = self._check_sequence(ids, segment_ids, positions, attention_mask)
        _check_t(t, ids.shape[0])
        self._check_cache(cache, ids.shape[0])
        return attention_mask

    def forward_targets_unchecked(self, ids, t, segment_ids, positions, cache: ConditionCache,
                                  attention_mask: torch.Tensor) -> DiTOutput:
        """:meth:`forward_targets` without its input checks (whose data-dependent branches would break a
        ``torch.compile`` graph); for callers that checked the inputs already."""
        is_target = torch.ones_like(attention_mask)  # (B, L_t)
        x = self.embed(ids, segment_ids)  # (B, L_t, D)
        c_pair = self.condition_pair(t)  # (B, 2, D)
        rope = self.rotary(positions)  # (B, 1, L_t, hd) x2
        visible = target_visibility(cache.attention_mask.to(ids.device), attention_mask)  # (B, 1, L_t, L_c+L_t)
        for block, k, v in zip(self.blocks, cache.keys, cache.values):
            x, _ = block(x, c_pair, is_target, rope, visible, past=(k, v))  # (B, L_t, D)
        return self.heads(x, c_pair, is_target)

    def extend(self, ids, segment_ids, positions, cache: ConditionCache,
               attention_mask=None) -> tuple[DiTOutput, ConditionCache]:
        """Causal models: run new tokens over a key/value cache of the tokens before them (a KV-cache step).

        Each new token sees every real cached token and the real new tokens up to itself; returns the
        outputs of the new tokens and the cache grown by their keys/values (their padding stays invisible).
        With an empty cache it is :meth:`forward` of a causal model (t = 0 everywhere).
        """
        if not self.config.causal:
            raise InputError("extend() is the key/value-cache step of a causal (autoregressive) model; a "
                             "masked-diffusion model uses encode_condition() + forward_targets()")
        attention_mask = self._check_sequence(ids, segment_ids, positions, attention_mask)
        self._check_cache(cache, ids.shape[0])
        is_target = torch.zeros_like(attention_mask)  # (B, L_n): t = 0 for every token of a causal model
        x = self.embed(ids, segment_ids)  # (B, L_n, D)
        c_pair = self.condition_pair(torch.zeros(ids.shape[0], device=ids.device))  # (B, 2, D)
        rope = self.rotary(positions)  # (B, 1, L_n, hd) x2
        past_mask = cache.attention_mask.to(ids.device)  # (B, L_p)
        visible = causal_visibility(torch.cat([past_mask, attention_mask], dim=1))[:, :, past_mask.shape[1]:]
        keys, values = [], []
        for block, k, v in zip(self.blocks, cache.keys, cache.values):
            x, (new_k, new_v) = block(x, c_pair, is_target, rope, visible, past=(k, v))  # (B, L_n, D)
            keys.append(torch.cat([k.to(new_k.dtype), new_k], dim=2))
            values.append(torch.cat([v.to(new_v.dtype), new_v], dim=2))
        grown = ConditionCache(tuple(keys), tuple(values), torch.cat([past_mask, attention_mask], dim=1))
        return self.heads(x, c_pair, is_target), grown

    def empty_condition(self, batch_size: int, device=None) -> ConditionCache:
        """A cache of zero condition tokens (an unconditional pass, e.g. for classifier-free guidance)."""
        device = self.device if device is None else device
        shape = (batch_size, self.config.num_heads, 0, self.head_dim)
        empty = tuple(torch.zeros(shape, device=device, dtype=self.dtype) for _ in self.blocks)
        return ConditionCache(empty, empty, torch.zeros(batch_size, 0, dtype=torch.bool, device=device))

    def _visibility(self, is_target: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.config.causal:
            return causal_visibility(attention_mask)
        return attention_visibility(is_target, attention_mask)

    # ---- input checks ----

    def _shared_copies(self, copies, ids, segment_ids, positions, is_target, attention_mask) -> int:
        """How many copies share their conditions: ``copies`` checked; 1 where sharing would not be exact."""
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1 or ids.shape[0] % copies:
            raise InputError(f"copies must be a whole number >= 1 that divides the batch of {ids.shape[0]}, "
                             f"got {copies!r}")
        if copies == 1:
            return 1
        conditions = attention_mask & ~is_target
        for name, x in (("segment_ids", segment_ids), ("positions", positions), ("is_target", is_target),
                        ("attention_mask", attention_mask), ("condition ids", ids.masked_fill(~conditions, 0))):
            chunks = x.chunk(copies)
            if not all(torch.equal(chunks[0], c) for c in chunks[1:]):
                raise InputError(f"copies={copies}: the {copies} stacked copies differ in {name}; copies may "
                                 f"differ only in their target ids and t")
        if self.config.causal or (self.training and self.config.dropout > 0):
            return 1  # a causal condition may see targets; dropout draws anew in each copy
        return copies

    def _check_sequence(self, ids, segment_ids, positions, attention_mask) -> torch.Tensor:
        """Checks shapes, dtypes and ranges; returns the attention mask (all True when None)."""
        _check_integer("ids", ids, None, dim=2)
        _check_integer("segment_ids", segment_ids, ids.shape)
        _check_integer("positions", positions, (*ids.shape, 2))
        if attention_mask is None:
            attention_mask = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
        _check_bool("attention_mask", attention_mask, ids.shape)
        _check_range("ids", ids, 0, self.config.vocab_size)
        _check_range("segment_ids", segment_ids, 0, self.config.num_segments)
        _check_range("positions", positions, 0, None)
        return attention_mask

    def _check_cache(self, cache: ConditionCache, batch_size: int) -> None:
        if not isinstance(cache, ConditionCache):
            raise InputError(f"cache must be a ConditionCache (from encode_condition), got {type(cache).__name__}")
        if len(cache.keys) != self.config.num_layers or cache.batch_size != batch_size:
            raise InputError(f"the condition cache holds {len(cache.keys)} layers for {cache.batch_size} samples; "
                             f"this model has {self.config.num_layers} layers and the targets {batch_size} samples")


# ---- helpers: config, checks, FLOPs ----------------------------------------------------------------------------


def _config_names() -> list[str]:
    return [name for name in inspect.signature(DiT.__init__).parameters if name != "self"]


def _check_config(vocab_size, hidden_size, num_layers, num_heads, num_segments, critic_hidden) -> None:
    for name, value in dict(vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers,
                            num_heads=num_heads, num_segments=num_segments, critic_hidden=critic_hidden).items():
        if not isinstance(value, int) or value < 1:
            raise InputError(f"DiT {name} must be a positive int, got {value!r}")
    if hidden_size % num_heads or (hidden_size // num_heads) % 4:
        raise InputError(f"hidden_size ({hidden_size}) / num_heads ({num_heads}) must be an int divisible by 4 "
                         f"(2-D rotary embedding rotates pairs in each half of a head)")


def _check_integer(name, tensor, shape, dim=None) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.is_floating_point() or tensor.is_complex() \
            or tensor.dtype == torch.bool:
        kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise InputError(f"{name} must be an integer tensor, got {kind}")
    if (dim is not None and tensor.dim() != dim) or (shape is not None and tuple(tensor.shape) != tuple(shape)):
        expected = f"{dim}-D (B, L)" if shape is None else str(tuple(shape))
        raise InputError(f"{name} must have shape {expected}, got {tuple(tensor.shape)}")


def _check_bool(name, tensor, shape) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.bool:
        kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise InputError(f"{name} must be a bool tensor, got {kind}")
    if tuple(tensor.shape) != tuple(shape):
        raise InputError(f"{name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")


def _check_range(name, tensor, low, high) -> None:
    if tensor.numel() == 0:
        return
    if tensor.min() < low or (high is not None and tensor.max() >= high):
        allowed = f"[{low}, {high})" if high is not None else f">= {low}"
        raise InputError(f"{name} must lie in {allowed}, got values from {int(tensor.min())} to {int(tensor.max())}")


def _check_t(t, batch_size) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or tuple(t.shape) != (batch_size,):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise InputError(f"t must be a float tensor of shape ({batch_size},) (one mask ratio per sample), got {got}")
    if t.numel() and not bool(((t >= 0) & (t <= 1)).all()):
        raise InputError(f"t is a mask ratio and must lie in [0, 1], got {t.tolist()[:8]}")


def flops_per_token(config: Mapping | DiT, seq_len: int) -> int:
    """Approximate forward FLOPs per token (x3 for forward + backward), for MFU.

    2 x the weights every token passes through (attention and MLP linears, critic), + attention scores and
    mixing (2 x 2 x seq_len x D per layer) + the tied output head (2 x D x V). The adaLN and t-embedder
    weights are left out: they run on two vectors per sample, not per token.
    """
    config = dict(getattr(config, "config", config))
    defaults = {k: p.default for k, p in inspect.signature(DiT.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    config = {**defaults, **config}
    width, layers, vocab = config["hidden_size"], config["num_layers"], config["vocab_size"]
    mlp_hidden = int(width * config["mlp_ratio"])
    per_layer = 4 * width * width + 2 * width * mlp_hidden  # qkv + proj + MLP weights
    critic = width * config["critic_hidden"] + config["critic_hidden"]
    dense = 2 * (layers * per_layer + critic)
    attention = layers * 2 * 2 * seq_len * width
    return int(dense + attention + 2 * width * vocab)
