"""Draft layers initialised from the target's own decoder layers (the `init_from_target` lever).

Draft layer i starts as target layer L-D+i, the last D of the target's L layers: the drafter's output
feeds the target's LM head just as the target's last layers' output does, while the middle of the
target reaches the drafter through the injected features. The drafter's final `norm` starts as the
target's final norm; `fc` and `hidden_norm` have no counterpart and keep their fresh initialisation.
Qwen3 decoder layers carry exactly the drafter's parameter names and shapes (the drafter takes the
target's layer shape). Llama-layout layers (Llama, SmolLM2, Mistral: the same names without the per-head
q_norm / k_norm) are copied too, the drafter's q/k norms set to unit weights: every projection and
both layer norms start as the target's, so the layer is the target's up to normalising each head's
queries and keys, which training then adjusts. Any other layout (q/k/v biases as in Qwen2, other
names or shapes) is refused rather than half-copied.
"""

from __future__ import annotations

import torch

from dflash_core.model.drafter import Drafter
from dflash_core.errors import CompatibilityError, ConfigError
from dflash_core.target.adapter import TargetModel


def source_layers(num_target_layers: int, draft_layers: int) -> list[int]:
    """Target layer of each draft layer: the last `draft_layers` layers, in order."""
    if draft_layers > num_target_layers:
        raise ConfigError(f"cannot initialise {draft_layers} draft layers from a {num_target_layers}-layer target: "
                          f"expected at most {num_target_layers} draft layers.")
    return list(range(num_target_layers - draft_layers, num_target_layers))


# Drafter parameters a target layer may lack (Llama layout): they start at unit weight.
OPTIONAL = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def _mismatch(mine: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> str | None:
    """What keeps `theirs` from mapping 1:1 onto `mine` (same names, same shapes, OPTIONAL aside), or None."""
    absent_optional = [name for name in OPTIONAL if name not in theirs]
    if len(absent_optional) == 1:
        return f"lacks {absent_optional[0]} but has its pair (one per-head norm without the other)"
    for name, param in mine.items():
        if name in absent_optional:
            continue
        if name not in theirs:
            return f"lacks {name}"
        if theirs[name].shape != param.shape:
            return f"has {name} of shape {list(theirs[name].shape)} where the drafter's is {list(param.shape)}"
    extra = sorted(set(theirs) - set(mine))
    return f"has {extra[0]}, which a drafter layer has no place for" if extra else None


@torch.no_grad()
def init_from_target(drafter: Drafter, target: TargetModel) -> list[int]:
    """Copy target layers (and the final norm) into the drafter in place; return the target layers used."""
    ids = source_layers(target.num_layers, len(drafter.layers))
    final_norm = getattr(getattr(target.base, "norm", None), "weight", None)
    for draft_layer, index in zip(drafter.layers, ids):
        layer = target.base.layers[index]
        mine, theirs = dict(draft_layer.named_parameters()), dict(layer.named_parameters())
        problem = _mismatch(mine, theirs)
        if problem is None and (final_norm is None or final_norm.shape != drafter.norm.weight.shape):
            problem = "sits in a model without a final norm of the drafter's width (model.norm.weight)"
        if problem:
            raise CompatibilityError(
                f"cannot initialise the draft layers from the target: target layer {index} "
                f"({type(layer).__name__}) {problem}; expected Qwen3 or Llama-layout decoder layers, whose "
                "parameters map onto the drafter's by name and shape (or train without init_from_target)."
            )
        for name, param in mine.items():
            if name in theirs:
                param.copy_(theirs[name])
            else:  # the q/k norms a Llama layer lacks
                param.fill_(1.0)
    drafter.norm.weight.copy_(final_norm)
    return ids
