"""The drafter's math, written once: KV injection and the block-diffusion forward.

Every input is explicit (weights, positions, masks), so eager torch, the training loop, the ONNX
export and engine adapters all call these same functions. Shapes use
  B batch, C context tokens, Q block (query) tokens, H hidden, L draft layers,
  h query heads, g key/value heads, d head_dim, n target feature layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from dflash_core.kernels.packed_weights import Weight, linear
from dflash_core.model.rope import apply_rope, rope_cos_sin


class LayerWeights(NamedTuple):
    """One draft decoder layer (Qwen3 layout, q/k/v and gate/up fused for the block path)."""

    input_norm: torch.Tensor  # [H]
    post_norm: torch.Tensor  # [H]
    qkv: Weight  # [(h + 2g) * d, H]
    o: Weight  # [H, h * d]
    q_norm: torch.Tensor  # [d]
    k_norm: torch.Tensor  # [d]
    qk_norm: torch.Tensor  # [h + g, d]: q_norm per query head, then k_norm per KV head (both normed in one call)
    gate_up: Weight  # [2 * I, H]
    down: Weight  # [H, I]


class DrafterWeights(NamedTuple):
    """All tensors the drafter's forward needs; views or fusions of the module's parameters (the matmul
    weights, `Weight`, may instead be fp16-packed copies for fp32 CPU decoding: `packed_weights`)."""

    fc: Weight  # [H, n * H]
    hidden_norm: torch.Tensor  # [H]
    norm: torch.Tensor  # [H]
    context_kv: Weight  # [L * 2 * g * d, H]: per layer, k_proj rows then v_proj rows
    context_k_norm: torch.Tensor  # [L, d]: each layer's k_norm, stacked
    inv_freq: torch.Tensor  # [d / 2] fp32 RoPE inverse frequencies
    layers: tuple[LayerWeights, ...]


@dataclass(frozen=True)
class DrafterDims:
    """Static sizes the math needs besides the tensors."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    rope_scaling: float  # attention scaling of cos/sin (1.0 for plain RoPE)
    windows: tuple[int | None, ...]  # per draft layer: sliding window or None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis, computed in fp32 and cast back (as Qwen3RMSNorm does); `weight` [d] or any
    shape that broadcasts over x's trailing axes (a per-head [heads, d] stack of q_norm / k_norm weights).

    Where x and weight share a dtype the normalisation is one `torch.rms_norm` call without a weight (fp32
    inside, cast back: the same operations in the same order, so the same numbers in fp32 and bf16, tested;
    with the weight inside, its bf16 rounding differs) instead of five dispatched ops: a drafting step calls
    this six times over a few rows, where dispatching is what costs. Under bf16 autocast (bf16 x, fp32
    weight) and in ONNX export it is the formula itself.
    """
    if x.dtype == weight.dtype and not torch.onnx.is_in_onnx_export():
        return weight * torch.rms_norm(x, (x.shape[-1],), None, eps)
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


SMALL_BLOCK = 64  # at most this many query rows per KV head: explicit grouped attention beats SDPA on CPU


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Softmax attention, non-causal; `mask` [B, 1, Q, K] boolean (True = visible) or None.

    q [B, h, Q, d], k/v [B, g, K, d] -> [B, h, Q, d]. Query heads are grouped per KV head
    (head i uses KV head i // (h/g)) so K/V are never repeated. Decoding blocks (small Q) and
    exporters use the explicit formula (plain MatMul/Softmax in ONNX, and faster than the fused
    kernel for a few query rows on CPU); long training queries use the fused kernel.
    """
    batch, heads, q_len, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    exporting = torch.onnx.is_in_onnx_export() or torch.compiler.is_compiling()
    if not exporting and q_len * groups > SMALL_BLOCK:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=groups > 1)
    grouped = q.reshape(batch, kv_heads, groups * q_len, dim)  # [B, g, rep*Q, d]
    scores = torch.matmul(grouped, k.transpose(-1, -2)).float() * scale  # [B, g, rep*Q, K]
    if mask is not None:
        mask = mask.expand(batch, 1, q_len, mask.shape[-1])
        mask = mask[:, :, None].expand(batch, 1, groups, q_len, mask.shape[-1]).reshape(batch, 1, groups * q_len, -1)
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)  # [B, g, rep*Q, d]
    return out.reshape(batch, heads, q_len, dim)


def project_features(w: DrafterWeights, dims: DrafterDims, target_hidden: torch.Tensor) -> torch.Tensor:
    """Target features [B, C, n*H] -> drafter width [B, C, H]: fc then hidden_norm.

    The features are usually a slice of the target's output (the accepted part of a verified block),
    so the projection runs as one 2D matmul: on CPU, bf16 `F.linear` over such a 3D slice takes a
    batched path that copies the weight on every call (one accepted token: 78 us against 22 us for
    the 2D matmul, measured on an AVX512-BF16 EPYC; a quarter of a whole KV injection).
    """
    batch, ctx, width = target_hidden.shape
    projected = linear(target_hidden.reshape(batch * ctx, width), w.fc).view(batch, ctx, -1)
    return rms_norm(projected, w.hidden_norm, dims.eps)


def cos_sin(w: DrafterWeights, dims: DrafterDims, positions: torch.Tensor, dtype: torch.dtype,
            table: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cos, sin [B, T, d] of `positions` [B, T]: rows of `table` (cos, sin [P, d] for positions 0..P-1,
    `rope.rope_table`; decoding's two index ops) or computed from the frequencies (training, export)."""
    if table is None:
        return rope_cos_sin(positions, w.inv_freq, dims.rope_scaling, dtype)
    return table[0][positions], table[1][positions]


def inject_context(
    w: DrafterWeights, dims: DrafterDims, target_hidden: torch.Tensor, positions: torch.Tensor,
    rope_table: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV injection: target features -> context K/V of every draft layer in one fused projection.

    target_hidden [B, C, n*H], positions [B, C] -> (k, v), each [L, B, g, C, d]; k is k_norm'ed and
    rotated at the context positions, ready to sit in front of the block's own K/V.
    """
    batch, ctx, _ = target_hidden.shape
    layers = len(w.layers)
    hidden = project_features(w, dims, target_hidden)
    kv = linear(hidden, w.context_kv).view(batch, ctx, layers, 2, dims.num_kv_heads, dims.head_dim)
    kv = kv.permute(3, 2, 0, 4, 1, 5)  # [2, L, B, g, C, d]
    k = rms_norm(kv[0], w.context_k_norm[:, None, None, None, :], dims.eps)
    cos, sin = cos_sin(w, dims, positions, k.dtype, rope_table)
    k = apply_rope(k, cos[None, :, None], sin[None, :, None])
    return k, kv[1]


def draft_layer(
    lw: LayerWeights,
    dims: DrafterDims,
    hidden: torch.Tensor,
    ctx_k: torch.Tensor,
    ctx_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    block_in_place: bool = False,
) -> torch.Tensor:
    """One decoder layer over the block. hidden [B, Q, H]; ctx_k/ctx_v [B, g, C, d]; cos/sin [B, Q, d].

    block_in_place: ctx_k/ctx_v are [B, g, C + Q, d] views whose last Q slots are free (decoding's cache has
    room after its context): the block's own K/V are written there instead of concatenated after a copy of
    the whole context, a copy per layer per step that grows with the context.
    """
    batch, q_len, _ = hidden.shape
    heads, kv_heads, d = dims.num_heads, dims.num_kv_heads, dims.head_dim
    x = rms_norm(hidden, lw.input_norm, dims.eps)
    # q and k heads side by side: normed and rotated in one pass each (per-head ops, so the same numbers)
    qk, v = linear(x, lw.qkv).split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
    qk = rms_norm(qk.view(batch, q_len, heads + kv_heads, d), lw.qk_norm, dims.eps).transpose(1, 2)
    q, k = apply_rope(qk, cos[:, None], sin[:, None]).split([heads, kv_heads], dim=1)  # [B, h|g, Q, d]
    v = v.view(batch, q_len, kv_heads, d).transpose(1, 2)
    # keys/values: [injected target context ; block], queries: block only
    if block_in_place:
        ctx_k[:, :, -q_len:] = k
        ctx_v[:, :, -q_len:] = v
        k, v = ctx_k, ctx_v
    else:
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
    out = attention(q, k, v, mask, d**-0.5)  # [B, h, Q, d]
    hidden = hidden + linear(out.transpose(1, 2).reshape(batch, q_len, heads * d), lw.o)
    x = rms_norm(hidden, lw.post_norm, dims.eps)
    gate, up = linear(x, lw.gate_up).chunk(2, dim=-1)
    return hidden + linear(F.silu(gate) * up, lw.down)


def draft_forward(
    w: DrafterWeights,
    dims: DrafterDims,
    noise_embedding: torch.Tensor,
    block_positions: torch.Tensor,
    ctx_k: torch.Tensor,
    ctx_v: torch.Tensor,
    masks: Sequence[torch.Tensor | None],
    rope_table: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_in_place: bool = False,
) -> torch.Tensor:
    """The block-diffusion pass: every block position at once, non-causal inside the block.

    noise_embedding [B, Q, H] (target embedding of [anchor, MASK, ...]); block_positions [B, Q];
    ctx_k/ctx_v [L, B, g, C, d] from `inject_context`; masks: per layer [B, 1, Q, C+Q] or None;
    rope_table: decoding's precomputed cos/sin rows (`cos_sin`); block_in_place: ctx_k/ctx_v end in Q free slots
    for the block's K/V (`draft_layer`). Returns the final-normed hidden states [B, Q, H].
    """
    cos, sin = cos_sin(w, dims, block_positions, noise_embedding.dtype, rope_table)
    hidden = noise_embedding
    for i, lw in enumerate(w.layers):
        hidden = draft_layer(lw, dims, hidden, ctx_k[i], ctx_v[i], cos, sin, masks[i], block_in_place)
    return rms_norm(hidden, w.norm, dims.eps)
