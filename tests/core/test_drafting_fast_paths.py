"""The cheaper drafting step computes the same numbers as the formulas it replaced.

A drafting step on a CPU is mostly dispatching small ops, so decoding takes three shortcuts: RMSNorm as one
`torch.rms_norm` call, q and k heads normed and rotated together, and RoPE cos/sin read from a table. Each
must give exactly what the plain formula gives (the drafts, and the published parity, stay as they were),
and the cached weights behind them must still follow every change to the parameters.
"""

from __future__ import annotations

import pytest
import torch
from dflash_core.model import graph
from dflash_core.model.rope import rope_cos_sin, rope_table
from tiny import drafter_config, tiny_drafter


def formula_rms_norm(x, weight, eps):
    """The Qwen3RMSNorm formula graph.rms_norm always computed before: fp32 inside, cast back, then the weight."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


SHAPES = [((2, 16, 384), (384,)),  # a block's hidden states, one weight
          ((1, 16, 8, 64), (8, 64)),  # q and k heads side by side, a weight row per head
          ((3, 5, 4, 2, 32), (5, 1, 1, 32)),  # injected context keys of 5 layers, each layer's k_norm
          ((1, 1, 4096), (4096,))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,weight_shape", SHAPES)
def test_rms_norm_is_the_formula_bit_for_bit(dtype, shape, weight_shape):
    g = torch.Generator().manual_seed(len(shape))
    x = (3 * torch.randn(shape, generator=g)).to(dtype)
    weight = torch.randn(weight_shape, generator=g).to(dtype)
    strided = x.transpose(-2, -3).contiguous().transpose(-2, -3)  # same values, not contiguous
    for tensor in (x, strided):
        assert torch.equal(graph.rms_norm(tensor, weight, 1e-6), formula_rms_norm(tensor, weight, 1e-6))


def test_rms_norm_under_autocast_keeps_the_formula():
    """bf16 activations with fp32 weights (training under autocast): the formula's bf16 rounding is kept."""
    g = torch.Generator().manual_seed(1)
    x, weight = torch.randn(4, 64, generator=g).bfloat16(), torch.randn(64, generator=g)
    out = graph.rms_norm(x, weight, 1e-6)
    assert out.dtype == torch.float32 and torch.equal(out, formula_rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("theta,head_dim", [(1e6, 64), (1e4, 128), (1e6, 16)])
def test_rope_table_rows_are_rope_cos_sin(dtype, theta, head_dim):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos_table, sin_table = rope_table(inv_freq, 1.0, 8192, dtype)
    positions = torch.randint(0, 8192, (3, 17), generator=torch.Generator().manual_seed(0))
    cos, sin = rope_cos_sin(positions, inv_freq, 1.0, dtype)
    assert torch.equal(cos_table[positions], cos) and torch.equal(sin_table[positions], sin)


def test_rope_rows_grow_to_cover_positions_on_cpu_only():
    drafter = tiny_drafter(drafter_config(hidden=32, target_layers=4, layers=1, block_size=4), seed=0)
    first = drafter.rope_rows(torch.tensor([[0, 1, 2, 3]]))
    assert first[0].shape[0] == 4
    assert drafter.rope_rows(torch.tensor([[2, 3]])) is first  # covered: the same table, not rebuilt
    grown = drafter.rope_rows(torch.tensor([[1000, 1001]]))
    assert grown[0].shape[0] == 1024 and grown is not first  # the next power of two past the largest position
    expected = rope_cos_sin(torch.tensor([[1000, 1001]]), drafter._inv_freq, drafter.dims.rope_scaling, torch.float32)
    assert torch.equal(grown[0][1000:1002], expected[0][0])
    assert drafter.rope_rows(torch.zeros(1, 0, dtype=torch.long)) is None  # nothing to rotate
    # sizing a table for positions on another device would sync it: computed from the frequencies there instead
    assert drafter.rope_rows(torch.zeros(1, 4, dtype=torch.long, device="meta")) is None


def test_cached_weights_follow_parameters_after_to_and_in_place_updates():
    """`weights()` keys its cached fusions on the parameters without walking the module tree each call; an
    in-place update (a training step between two evaluations) and a dtype change must still be seen."""
    drafter = tiny_drafter(drafter_config(hidden=32, target_layers=4, layers=2, block_size=4), seed=0)
    with torch.no_grad():
        before = drafter.weights()
        assert drafter.weights() is before  # unchanged parameters: the cached fusions
        drafter.layers[1].self_attn.k_norm.weight.mul_(2.0)
        after = drafter.weights()
        assert after is not before
        assert torch.equal(after.layers[1].qk_norm[-1], drafter.layers[1].self_attn.k_norm.weight)
        assert torch.equal(after.context_k_norm[1], drafter.layers[1].self_attn.k_norm.weight)
        drafter.to(torch.bfloat16)
        assert drafter.weights().fc.dtype == torch.bfloat16
        assert drafter.weights().layers[0].qk_norm.dtype == torch.bfloat16


def test_joint_qk_norm_rows_are_each_heads_own_weight():
    config = drafter_config(hidden=32, target_layers=4, layers=1, block_size=4)
    drafter = tiny_drafter(config, seed=3)
    attn = drafter.layers[0].self_attn
    with torch.no_grad():
        qk_norm = drafter.weights().layers[0].qk_norm
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    assert qk_norm.shape == (heads + kv_heads, config.head_dim)
    assert all(torch.equal(row, attn.q_norm.weight) for row in qk_norm[:heads])
    assert all(torch.equal(row, attn.k_norm.weight) for row in qk_norm[heads:])


def test_training_gradients_reach_q_norm_and_k_norm_through_the_joint_norm():
    config = drafter_config(hidden=32, target_layers=4, layers=1, block_size=4)
    drafter = tiny_drafter(config, seed=5)
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(1, 4, 32, generator=g)
    feats = torch.randn(1, 6, config.fc_in_features, generator=g)
    drafter(noise, feats, torch.arange(10)[None]).square().sum().backward()
    attn = drafter.layers[0].self_attn
    assert attn.q_norm.weight.grad.abs().sum() > 0 and attn.k_norm.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("ragged", [False, True])
def test_block_written_after_the_context_equals_the_concatenation(ragged):
    """A cache with room after its context takes the block's K/V in place: the same drafts as concatenating
    them after a copy of the context (a cache without room), and no valid entry of the cache is touched."""
    config = drafter_config(hidden=32, target_layers=8, layers=2, block_size=8, layer_ids=(2, 5))
    drafter = tiny_drafter(config, seed=2)
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(2, 12, config.fc_in_features, generator=g)
    noise = torch.randn(2, 8, 32, generator=g)
    counts = [12, 9] if ragged else [12, 12]
    block_pos = torch.stack([torch.arange(c, c + 8) for c in counts])
    with torch.inference_mode():
        roomy, tight = drafter.new_cache(2, 12 + 8), drafter.new_cache(2, 12)
        for cache in (roomy, tight):
            drafter.extend_cache(cache, feats, torch.arange(12).expand(2, -1), counts)
        assert roomy.context_with_room(8) is not None and tight.context_with_room(8) is None
        context_before = [t.clone() for t in roomy.context()]
        in_place = drafter.draft_with_cache(roomy, noise, block_pos)
        concatenated = drafter.draft_with_cache(tight, noise, block_pos)
        assert torch.equal(in_place, concatenated)
        assert all(torch.equal(a, b) for a, b in zip(context_before, roomy.context()))
        assert roomy.lengths == counts
        # the next accepted tokens overwrite the block's slots like any free slot
        drafter.extend_cache(roomy, feats[:, :3], torch.arange(12, 15).expand(2, -1), [3, 3])
        drafter.extend_cache(tight_again := drafter.new_cache(2, 15), feats, torch.arange(12).expand(2, -1), counts)
        drafter.extend_cache(tight_again, feats[:, :3], torch.arange(12, 15).expand(2, -1), [3, 3])
        valid = roomy.valid()[None, :, None, :, None]  # slots past a ragged row's length hold leftovers in both
        assert roomy.lengths == tight_again.lengths
        assert all(torch.equal(a * valid, b * valid) for a, b in zip(roomy.context(), tight_again.context()))
