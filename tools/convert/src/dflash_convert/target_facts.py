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

from dflash_core.model.checkpoint import check_weight_values, read_header
from dflash_core.model.config import DFlashConfig
from dflash_core.errors import CompatibilityError
from dflash_core.target.pairing import check_compatibility, ensure_mask_token
from dflash_core.files.text import json_type, read_json_object

EXPECTED_CONFIG = "the target's Hugging Face config"


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
    if not path.is_dir():
        raise CompatibilityError(f"--target-model {path} is not a directory: expected a Hugging Face model directory.")
    if not config_file.is_file():
        raise CompatibilityError(f"--target-model {path} is not a Hugging Face model directory (no config.json).")
    raw = read_config(config_file)
    tie = raw.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise CompatibilityError(f"{config_file}: tie_word_embeddings is {json.dumps(tie)}, expected true or false.")
    facts = TargetFacts(path=path, hidden_size=positive_int(raw, "hidden_size", config_file),
                        num_layers=positive_int(raw, "num_hidden_layers", config_file),
                        vocab_size=positive_int(raw, "vocab_size", config_file),
                        max_positions=positive_int(raw, "max_position_embeddings", config_file, required=False),
                        tie_word_embeddings=tie, tokenizer=None)
    if any(path.glob("tokenizer*")):
        from transformers import AutoTokenizer

        try:
            facts.tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
        except Exception as exc:  # tokenizers and transformers raise many types; name the directory instead
            reason = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise CompatibilityError(f"--target-model {path}: its tokenizer cannot be loaded ({reason}).") from None
    return facts


def read_config(config_file: Path) -> dict:
    """The target's config.json as an object (its text_config for a multimodal model)."""
    raw = read_json_object(config_file, CompatibilityError, EXPECTED_CONFIG)
    if "text_config" not in raw:
        return raw
    if not isinstance(raw["text_config"], dict):
        raise CompatibilityError(f"{config_file}: text_config holds a JSON {json_type(raw['text_config'])}, expected "
                                 f"an object ({EXPECTED_CONFIG}).")
    return raw["text_config"]


def positive_int(raw: dict, key: str, config_file: Path, required: bool = True) -> int | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if key not in raw:
        raise CompatibilityError(f"{config_file} lacks {key}, expected a positive integer.")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CompatibilityError(f"{config_file}: {key} is {json.dumps(value)}, expected a positive integer.")
    return value


def check_target(config: DFlashConfig, facts: TargetFacts) -> str | None:
    """Compatibility checks (one sentence per mismatch); returns a note if the mask token was added."""
    check_compatibility(config, facts)
    if facts.tokenizer is None:
        return None
    return ensure_mask_token(facts.tokenizer, config)


def target_lm_head(facts: TargetFacts) -> torch.Tensor:
    """The target's LM head weight [V, H] (its embedding when the two are tied), read by name."""
    name = "model.embed_tokens.weight" if facts.tie_word_embeddings else "lm_head.weight"
    for file in sorted(facts.path.glob("*.safetensors")):
        if name not in read_header(file):  # checks the header and that every tensor lies inside the file
            continue
        try:
            with safe_open(str(file), framework="pt") as handle:
                head = handle.get_tensor(name)
        except Exception as exc:  # safetensors raises its own types; name the file instead
            raise CompatibilityError(f"{file} cannot be read as safetensors ({exc}).") from None
        expected = [facts.vocab_size, facts.hidden_size]
        if list(head.shape) != expected:
            raise CompatibilityError(f"{file}: tensor '{name}' has shape {list(head.shape)}, expected "
                                     f"[vocab_size, hidden_size] = {expected} from the target's config.json.")
        return check_weight_values({name: head}, str(file))[name]
    raise CompatibilityError(f"{facts.path} has no tensor {name} in its safetensors files (needed for the LM head).")
