"""What the converter needs to know about the target: sizes from its config, its tokenizer, its LM head.

Only config.json, the tokenizer files and (for --with-lm-head) one tensor are read; the target's
weights are never loaded whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dflash_core.pairing import check_compatibility, ensure_mask_token
from dflash_core.config import DFlashConfig
from dflash_core.errors import CompatibilityError


@dataclass
class TargetFacts:
    path: Path
    hidden_size: int
    num_layers: int
    vocab_size: int
    max_positions: int | None
    tie_word_embeddings: bool
    tokenizer: object | None


def read_target(path: str | Path) -> TargetFacts:
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CompatibilityError(f"--target-model {path} is not a Hugging Face model directory (no config.json).")
    raw = json.loads(config_file.read_text())
    raw = raw.get("text_config", raw)
    try:
        facts = TargetFacts(path=path, hidden_size=int(raw["hidden_size"]), num_layers=int(raw["num_hidden_layers"]),
                            vocab_size=int(raw["vocab_size"]), max_positions=raw.get("max_position_embeddings"),
                            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), tokenizer=None)
    except (KeyError, TypeError, ValueError):
        raise CompatibilityError(f"{config_file} lacks hidden_size, num_hidden_layers or vocab_size.") from None
    if any(path.glob("tokenizer*")):
        from transformers import AutoTokenizer

        facts.tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    return facts


def check_target(config: DFlashConfig, facts: TargetFacts) -> str | None:
    """Compatibility checks (one sentence per mismatch); returns a note if the mask token was added."""
    check_compatibility(config, facts)
    if facts.tokenizer is None:
        return None
    return ensure_mask_token(facts.tokenizer, config)


def target_lm_head(facts: TargetFacts) -> torch.Tensor:
    """The target's LM head weight [V, H] (its embedding when the two are tied), read by name."""
    wanted = ["model.embed_tokens.weight"] if facts.tie_word_embeddings else ["lm_head.weight"]
    for file in sorted(facts.path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in wanted:
                if name in handle.keys():
                    return handle.get_tensor(name)
    raise CompatibilityError(f"{facts.path} has no tensor {wanted[0]} in its safetensors files (needed for the LM head).")
