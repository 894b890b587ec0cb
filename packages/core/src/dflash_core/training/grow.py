"""A deeper drafter, or one fed by more target layers, grown from a trained one (`dflash train --grow-from`).

Training a deeper drafter from scratch throws away what a shallow one has learnt (the demo drafter's
hours of continuations). Growing keeps it: the grown drafter starts as *the same function* as the
given one and only then trains its new capacity.

- `fc` [H, n*H]: the given drafter's column block of each of its feature layers goes to that layer's
  block here; the blocks of the new feature layers start at zero, so `fc(features)` is unchanged.
- Draft layers 0..D-1 are the given drafter's layers; each new layer after them keeps its fresh
  initialisation except `o_proj` and `down_proj`, which start at zero: both residual branches add
  nothing, so the layer is the identity until training moves them (their gradients are not zero: the
  attention and MLP outputs they multiply are not).
- `hidden_norm` and the final `norm` are copied.

The given drafter must be a sub-drafter of this one: the same layer shape, block size and mask token,
no more draft layers, and feature layers among this run's; a growth that adds nothing is refused
(`--init-from` continues a drafter of the same shape).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from dflash_core.model.drafter import Drafter, load_drafter
from dflash_core.errors import ConfigError

# what must match between the given drafter and the grown one (depth and feature layers may grow)
_SAME = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
         "vocab_size", "block_size", "num_target_layers", "mask_token_id", "rms_norm_eps", "rope_theta",
         "rope_scaling")


def growth_problem(source, grown) -> str | None:
    """Why the drafter config `source` cannot grow into `grown` (one phrase), or None."""
    for name in _SAME:
        theirs, mine = getattr(source, name), getattr(grown, name)
        if theirs != mine:
            return f"{name} ({theirs!r} there, {mine!r} here)"
    if source.num_hidden_layers > grown.num_hidden_layers:
        return f"num_hidden_layers ({source.num_hidden_layers} there, {grown.num_hidden_layers} here: it can only grow)"
    missing = sorted(set(source.target_layer_ids) - set(grown.target_layer_ids))
    if missing:
        return (f"target_layer_ids ({list(source.target_layer_ids)} there, {list(grown.target_layer_ids)} here: "
                f"{missing} would be dropped)")
    if source.num_hidden_layers == grown.num_hidden_layers and source.target_layer_ids == grown.target_layer_ids:
        return "nothing: the same depth and feature layers (continue it with --init-from)"
    return None


@torch.no_grad()
def grow_from_drafter(drafter: Drafter, path: str | os.PathLike) -> dict:
    """Fill `drafter` in place so it computes what the drafter at `path` computes; returns what grew."""
    source = load_drafter(path, device=drafter.device, dtype=drafter.dtype)
    problem = growth_problem(source.config, drafter.config)
    if problem is not None:
        raise ConfigError(f"--grow-from {Path(path)} cannot grow into the drafter this run builds: it differs in "
                          f"{problem}; expected a drafter with the same layer shape, block size and mask token, at "
                          "most --layers draft layers and feature layers among this run's.")
    hidden = drafter.config.hidden_size
    ids = list(drafter.config.target_layer_ids)
    drafter.fc.weight.zero_()
    for j, layer_id in enumerate(source.config.target_layer_ids):  # fc.weight [H, n*H]: one H-block per layer
        k = ids.index(layer_id)
        drafter.fc.weight[:, k * hidden:(k + 1) * hidden].copy_(source.fc.weight[:, j * hidden:(j + 1) * hidden])
    drafter.hidden_norm.weight.copy_(source.hidden_norm.weight)
    drafter.norm.weight.copy_(source.norm.weight)
    kept = len(source.layers)
    for mine, theirs in zip(drafter.layers, source.layers):
        mine.load_state_dict(theirs.state_dict(), strict=True)
    for layer in drafter.layers[kept:]:  # identity residual blocks until trained
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return {"layers": (kept, len(drafter.layers)),
            "target_layer_ids": (list(source.config.target_layer_ids), ids)}
