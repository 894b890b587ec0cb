"""Pairing a drafter with a target: the checks made before any generation, and the mask token.

Each mismatch is one sentence naming both values. The mask token policy lives here alone:
`<|MASK|>` is added to a tokenizer that lacks it, as the published drafters expect, both when a
drafter is trained (`mask_token_for_training`) and when one is used (`ensure_mask_token`).
"""

from __future__ import annotations

from typing import Protocol

from dflash_core.model.config import DFlashConfig
from dflash_core.errors import CompatibilityError

MASK_TOKEN = "<|MASK|>"


class TargetShape(Protocol):
    """The target facts a pairing check reads: a loaded `TargetModel`, or a converter's `TargetFacts`."""

    hidden_size: int
    num_layers: int
    vocab_size: int


def check_compatibility(config: DFlashConfig, target: TargetShape) -> None:
    """Raise CompatibilityError on the first way the drafter and target do not fit."""
    if config.hidden_size != target.hidden_size:
        raise CompatibilityError(
            f"drafter hidden_size is {config.hidden_size} but the target's is {target.hidden_size}: "
            "a DFlash drafter must have the target's width."
        )
    expected_fc = len(config.target_layer_ids) * target.hidden_size
    if config.fc_in_features != expected_fc:
        raise CompatibilityError(
            f"drafter fc takes {config.fc_in_features} features but {len(config.target_layer_ids)} target layers "
            f"of width {target.hidden_size} give {expected_fc}."
        )
    if config.num_target_layers is not None and config.num_target_layers != target.num_layers:
        raise CompatibilityError(
            f"drafter was made for a {config.num_target_layers}-layer target but this target has "
            f"{target.num_layers} layers."
        )
    bad = [i for i in config.target_layer_ids if i >= target.num_layers]
    if bad:
        raise CompatibilityError(
            f"drafter target_layer_ids {list(config.target_layer_ids)} reach layer {bad[0]} but the target has "
            f"{target.num_layers} layers."
        )
    if config.mask_token_id >= target.vocab_size:
        raise CompatibilityError(
            f"drafter mask_token_id is {config.mask_token_id} but the target's embedding has only "
            f"{target.vocab_size} rows."
        )
    positions = getattr(target, "max_positions", None)  # optional: not every target knows it
    if positions is not None and config.block_size > positions:
        raise CompatibilityError(
            f"drafter block_size is {config.block_size} but the target takes at most {positions} positions "
            "(max_position_embeddings): a draft block must fit in the target's context."
        )


def ensure_mask_token(tokenizer, config: DFlashConfig) -> str | None:
    """Make sure the tokenizer agrees with the drafter's mask token; returns a note when it changed.

    Raises when the tokenizer knows `<|MASK|>` under another id.
    """
    vocab = tokenizer.get_vocab()
    mask_id = config.mask_token_id
    if MASK_TOKEN in vocab:
        if vocab[MASK_TOKEN] != mask_id:
            raise CompatibilityError(
                f"the tokenizer has {MASK_TOKEN} as id {vocab[MASK_TOKEN]} but the drafter's mask_token_id is {mask_id}."
            )
        return None
    if mask_id == len(tokenizer):
        _add_mask_token(tokenizer)
        if tokenizer.convert_tokens_to_ids(MASK_TOKEN) != mask_id:
            raise CompatibilityError(f"adding {MASK_TOKEN} to the tokenizer did not give id {mask_id}.")
        return f"the tokenizer had no mask token: added {MASK_TOKEN} as id {mask_id}."
    if mask_id < len(tokenizer):
        token = tokenizer.convert_ids_to_tokens(mask_id)
        return f"the tokenizer has no {MASK_TOKEN}; the drafter's mask_token_id {mask_id} is the existing token {token!r}."
    return (f"the tokenizer has no {MASK_TOKEN} and only {len(tokenizer)} entries; mask_token_id {mask_id} "
            "is used as an embedding row only.")


def mask_token_for_training(tokenizer, target: TargetShape, token: str = MASK_TOKEN) -> int:
    """The id of the drafter's mask token; it must be a row of the target's embedding.

    `<|MASK|>` (the default) is added to the tokenizer when absent. Another `token` must already be in
    the vocabulary: a reserved token the model never writes serves where the embedding has no spare
    row for a new one (SmolLM2: 49,152 tokens, 49,152 rows); the drafter learns its meaning anyway,
    and the target stays exactly as it was.
    """
    token_id = tokenizer.get_vocab().get(token)
    if token_id is None and token != MASK_TOKEN:
        raise CompatibilityError(f"the mask token {token!r} is not in the tokenizer's vocabulary: expected "
                                 f"an existing token (or {MASK_TOKEN}, added when absent).")
    if token_id is None:
        _add_mask_token(tokenizer)
        token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if token_id >= target.vocab_size:
        raise CompatibilityError(
            f"{MASK_TOKEN} would be id {token_id} but the target's embedding has {target.vocab_size} rows: "
            "give an existing reserved token as the mask instead (dflash train --mask-token), resize the target's "
            "embeddings, or give a tokenizer whose vocabulary has a spare row."
        )
    return token_id


def _add_mask_token(tokenizer) -> None:
    tokenizer.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]}, replace_extra_special_tokens=False)
