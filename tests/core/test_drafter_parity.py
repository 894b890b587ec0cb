"""Drafter.forward == a plain-torch reference written here from the published formulas.

The reference is deliberately naive (separate q/k/v projections, explicit softmax, RoPE recomputed
per call) and shares no code with dflash_core.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from tiny import drafter_config, tiny_drafter


def ref_rms(x, w, eps):
    x32 = x.double()
    return (w.double() * x32 / torch.sqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def ref_rope(x, pos, theta):
    # x [B, heads, T, d]; pos [B, T]
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None] * inv  # [B, T, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None].to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None].to(x.dtype)
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def reference_forward(sd, cfg, noise, target_hidden, pos, window=None):
    """Published DFlashDraftModel.forward: KV injection in every layer, non-causal block attention."""
    eps, d = cfg.rms_norm_eps, cfg.head_dim
    B, Q, _ = noise.shape
    C = target_hidden.shape[1]
    ctx = ref_rms(target_hidden @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
    h = noise
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        x = ref_rms(h, sd[p + "input_layernorm.weight"], eps)
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(B, Q, -1, d)
        k = torch.cat([ctx @ sd[p + "self_attn.k_proj.weight"].T, x @ sd[p + "self_attn.k_proj.weight"].T], 1)
        v = torch.cat([ctx @ sd[p + "self_attn.v_proj.weight"].T, x @ sd[p + "self_attn.v_proj.weight"].T], 1)
        k = k.view(B, C + Q, -1, d)
        v = v.view(B, C + Q, -1, d).transpose(1, 2)
        q = ref_rms(q, sd[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k = ref_rms(k, sd[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        q = ref_rope(q, pos[:, C:], cfg.rope_theta)
        k = ref_rope(k, pos, cfg.rope_theta)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = (q @ k.transpose(-1, -2)) / d**0.5
        layer_window = cfg.layer_window(i)
        if layer_window is not None:
            too_far = pos[:, C:, None] - pos[:, None, :] >= layer_window
            scores = scores.masked_fill(too_far[:, None], float("-inf"))
        attn = scores.softmax(-1) @ v
        h = h + attn.transpose(1, 2).reshape(B, Q, -1) @ sd[p + "self_attn.o_proj.weight"].T
        x = ref_rms(h, sd[p + "post_attention_layernorm.weight"], eps)
        gate = x @ sd[p + "mlp.gate_proj.weight"].T
        up = x @ sd[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return ref_rms(h, sd["norm.weight"], eps)


def _inputs(cfg, batch, ctx, block, seed):
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(batch, block, cfg.hidden_size, generator=g)
    target_hidden = torch.randn(batch, ctx, cfg.fc_in_features, generator=g)
    offset = torch.randint(1, 200, (batch, 1), generator=g)
    pos = offset + torch.arange(ctx + block)
    return noise, target_hidden, pos


GRID = list(itertools.product([(4, 4), (4, 2)], [1, 2, 3], [4, 16], [1, 3], [1, 17, 64]))


@pytest.mark.parametrize("heads,layers,block,batch,ctx", GRID)
def test_forward_matches_reference(heads, layers, block, batch, ctx):
    n_heads, kv_heads = heads
    cfg = drafter_config(hidden=32, target_layers=8, layers=layers, block_size=block, heads=n_heads,
                         kv_heads=kv_heads, layer_ids=tuple(range(1, 1 + layers)))
    drafter = tiny_drafter(cfg, seed=layers * 7 + block)
    noise, target_hidden, pos = _inputs(cfg, batch, ctx, block, seed=ctx + batch)
    with torch.no_grad():
        got = drafter(noise, target_hidden, pos)
        want = reference_forward(drafter.state_dict(), cfg, noise, target_hidden, pos)
    assert got.shape == (batch, block, cfg.hidden_size)
    assert (got - want).abs().max().item() <= 1e-4


def test_sliding_window_layers_match_reference():
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=8, layer_ids=(2, 5),
                         layer_types=("sliding_attention", "full_attention"), sliding_window=12)
    drafter = tiny_drafter(cfg, seed=3)
    noise, target_hidden, pos = _inputs(cfg, 2, 40, 8, seed=5)
    with torch.no_grad():
        got = drafter(noise, target_hidden, pos)
        want = reference_forward(drafter.state_dict(), cfg, noise, target_hidden, pos)
        unwindowed = reference_forward(drafter.state_dict(), cfg.replace(layer_types=None, sliding_window=None),
                                       noise, target_hidden, pos)
    assert (got - want).abs().max().item() <= 1e-4
    assert (got - unwindowed).abs().max().item() > 1e-3  # the window really hides something


def test_bf16_forward_close_to_fp32():
    cfg = drafter_config(hidden=64, target_layers=8, layers=2, block_size=16, heads=4, kv_heads=2, layer_ids=(2, 5))
    drafter = tiny_drafter(cfg, seed=1)
    noise, target_hidden, pos = _inputs(cfg, 2, 32, 16, seed=2)
    with torch.no_grad():
        want = drafter(noise, target_hidden, pos)
        got = drafter.to(torch.bfloat16)(noise.bfloat16(), target_hidden.bfloat16(), pos).float()
    assert (got - want).abs().max().item() < 0.1
