"""Tiny random models for tests: real Hugging Face classes and real DFlash drafters, made on the fly."""

from __future__ import annotations

import torch
from dflash_core import DFlashConfig, Drafter
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHS = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}


def tiny_target(arch: str = "qwen3", *, vocab: int = 64, hidden: int = 32, layers: int = 4, heads: int = 4,
                kv_heads: int = 2, seed: int = 0, max_positions: int = 512, dtype=torch.float32, **extra):
    config_cls, model_cls = ARCHS[arch]
    config = config_cls(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=max_positions, tie_word_embeddings=False, pad_token_id=None,
        bos_token_id=None, eos_token_id=None, **extra,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # larger logits than the default init: fewer near-ties in argmax
        model.lm_head.weight.mul_(4.0)
    return model.to(dtype)


def drafter_config(target=None, *, hidden: int = 32, target_layers: int = 4, layers: int = 1, block_size: int = 4,
                   heads: int = 4, kv_heads: int = 2, vocab: int = 64, layer_ids=None, mask_token_id=None,
                   **extra) -> DFlashConfig:
    if target is not None:
        hidden = target.config.hidden_size
        target_layers = target.config.num_hidden_layers
        vocab = target.config.vocab_size
    if layer_ids is None:
        layer_ids = tuple(sorted({min(target_layers - 1, 1 + i) for i in range(min(layers, target_layers - 1))}))
    return DFlashConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, intermediate_size=2 * hidden, vocab_size=vocab, block_size=block_size,
        num_target_layers=target_layers, target_layer_ids=tuple(layer_ids),
        mask_token_id=vocab - 1 if mask_token_id is None else mask_token_id, dtype="float32", **extra,
    )


def tiny_drafter(config: DFlashConfig, *, seed: int = 0, std: float = 0.2, dtype=torch.float32) -> Drafter:
    drafter = Drafter(config)
    generator = torch.Generator().manual_seed(seed)
    drafter.reset_parameters(std=std, generator=generator)
    with torch.no_grad():
        for name, param in drafter.named_parameters():  # non-trivial norm weights exercise every norm
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
    return drafter.to(dtype).eval()


def tiny_tokenizer(vocab_size: int = 300):
    """A real byte-level BPE (trained here on a little Python source), with end-of-text."""
    from dflash_demo.tokenizer import train_tokenizer

    text = open(__file__, encoding="utf-8").read()
    return train_tokenizer([text] * 4, vocab_size=vocab_size)


def save_tiny_pair(root, *, block_size: int = 4, drafter_layers: int = 1, seed: int = 0, target_layers: int = 4):
    """Write a tiny target (with tokenizer) and a matching drafter to disk; return both directories."""
    tokenizer = tiny_tokenizer()
    model = tiny_target(vocab=len(tokenizer), hidden=32, layers=target_layers, seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    target_dir, drafter_dir = root / "target", root / "drafter"
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    mask = tokenizer.convert_tokens_to_ids("<|MASK|>")
    config = drafter_config(model, layers=drafter_layers, block_size=block_size, mask_token_id=mask)
    tiny_drafter(config, seed=seed).save_pretrained(drafter_dir)
    return target_dir, drafter_dir
