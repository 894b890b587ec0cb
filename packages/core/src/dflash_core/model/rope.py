"""Rotary position embedding: frequencies from the config, cos/sin from explicit positions."""

from __future__ import annotations

import math

import torch

from dflash_core.model.config import DFlashConfig
from dflash_core.errors import ConfigError


def rope_frequencies(config: DFlashConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] (fp32) and the attention scaling applied to cos/sin.

    Plain RoPE is computed here; scaled variants (linear, llama3, yarn) use Hugging Face's own
    initialisers so the numbers match the target family exactly.
    """
    dim = config.head_dim
    if config.rope_scaling is None:
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return inv_freq, 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    try:
        hf_config = Qwen3Config(
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=config.num_key_value_heads,
            head_dim=dim,
            max_position_embeddings=config.max_position_embeddings,
            rope_parameters={**dict(config.rope_scaling), "rope_theta": config.rope_theta},
        )
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[config.rope_scaling["rope_type"]](hf_config, None)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # parameters the config check cannot know
        raise ConfigError(f"field 'rope_scaling' {dict(config.rope_scaling)} cannot build RoPE frequencies "
                          f"({type(exc).__name__}: {exc}).") from None
    if not bool(torch.isfinite(inv_freq).all()) or not math.isfinite(float(scaling)):
        raise ConfigError(f"field 'rope_scaling' {dict(config.rope_scaling)} gives non-finite RoPE frequencies.")
    return inv_freq.float(), float(scaling)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [B, T, head_dim] for integer `positions` [B, T] (computed in fp32)."""
    freqs = positions[..., None].float() * inv_freq.float()  # [B, T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def rope_table(inv_freq: torch.Tensor, scaling: float, length: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, head_dim] of positions 0..length-1, each row what `rope_cos_sin` gives that position."""
    cos, sin = rope_cos_sin(torch.arange(length, device=inv_freq.device)[None], inv_freq, scaling, dtype)
    return cos[0], sin[0]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [..., T, d] by cos/sin already broadcastable to it (NeoX layout, as Qwen3 and Llama)."""
    return x * cos + rotate_half(x) * sin
