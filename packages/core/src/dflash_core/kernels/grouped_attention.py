"""The target's grouped-query attention under a mask on the CPU, without a copy of the cache per group.

Why: a verify forward (k+1 > 1 new tokens after a cached context) needs an attention mask, and Hugging
Face's SDPA path (transformers 5.25) then repeats every key/value head `num_key_value_groups` times
(`repeat_kv`) before calling torch: a copy of the whole K and V cache, per layer, per forward, so a
verify costs more the longer the context. On the demo target (6 layers, 6 query heads over 2 KV heads,
fp32) on the Intel Xeon with AMX, a 15-token verify took 5.5 / 6.2 / 7.7-8.0 ms after 64 / 400 / 1,000
cached tokens that way, and 5.2-5.4 / 5.8-5.9 / 6.7-6.8 ms with torch's SDPA taking the grouped heads as
they are (`enable_gqa=True`), with the same logits to the last bit (docs/benchmarks.md, "A copy of the
cache per verify"). Hugging Face keeps the copy for CUDA's sake (its fused kernels fall back to the math
kernel given both a mask and grouped heads); on the CPU torch's flash kernel takes both.

`cpu_grouped_attention(config, device)` switches a model's "sdpa" attention to this path for the span of
one forward (the model is left as it was: `TargetModel` patches nothing for longer than a call). Any
case it does not cover (another device, one query token, no mask, dropout, a position bias, softcapping,
attention weights asked for) goes to Hugging Face's own SDPA function unchanged.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
import torch.nn.functional as F

ATTENTION_NAME = "cpu_grouped_sdpa"  # no "flash" in it: transformers reads that as FlashAttention asked for


def _grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                  **kwargs):
    """query [B, Hq, T, D], key/value [B, Hkv, S, D]; returns ([B, T, Hq, D], None) as HF's sdpa function does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = (kwargs.get("position_bias") is None and kwargs.get("softcap") is None
             and not kwargs.get("output_attentions", False))
    if query.device.type == "cpu" and grouped and plain and attention_mask is not None and query.shape[2] > 1 \
            and not dropout:
        # with a mask HF passes is_causal=False: the mask carries causality (and the cache's stale slots)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


@functools.cache  # registering is idempotent; transformers' registry is where the state lives
def _register() -> bool:
    """Register the attention function under `ATTENTION_NAME` with transformers; False where it cannot be."""
    try:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:  # an older transformers: its own SDPA path stays
        return False
    AttentionInterface.register(ATTENTION_NAME, _grouped_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)  # the masks SDPA takes, as for "sdpa"
    return True


@contextmanager
def cpu_grouped_attention(config, device: torch.device):
    """Within the block, a CPU model whose config says "sdpa" attends through `_grouped_sdpa`; else nothing changes."""
    switch = (device.type == "cpu" and getattr(config, "_attn_implementation_internal", None) == "sdpa"
              and getattr(config, "num_key_value_heads", None) not in (None, getattr(config, "num_attention_heads", None))
              and _register())
    if not switch:
        yield
        return
    config._attn_implementation_internal = ATTENTION_NAME  # the internal field: sub-configs are left alone
    try:
        yield
    finally:
        config._attn_implementation_internal = "sdpa"
