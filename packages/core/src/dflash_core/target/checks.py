"""Checks of a target directory around Hugging Face's loader: what it would otherwise fill in, skip or decode.

`from_pretrained` initialises missing tensors at random and ignores unexpected ones (it only logs a
report), casts integer weights to the model's precision and loads NaN as it is; a truncated file
surfaces as a Rust error. Each of these is refused here with one sentence naming the file or tensor.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_core.model.checkpoint import HEADER_WEIGHT_DTYPES, INDEX_FILE, WEIGHTS_FILE, all_finite, read_header, weight_files
from dflash_core.errors import CompatibilityError
from dflash_core.files.text import read_json_object

# files a tokenizer's vocabulary lives in (one is needed), and the JSON files a tokenizer reads
VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt", "tekken.json")
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")


def read_target_config(path: Path) -> dict:
    """config.json of a target directory: a JSON object naming its model_type."""
    file = path / "config.json"
    if not file.is_file():
        raise CompatibilityError(f"target {path} is not a Hugging Face model directory (no config.json).")
    raw = read_json_object(file, CompatibilityError, "the target's Hugging Face config")
    if not isinstance(raw.get("model_type"), str):
        raise CompatibilityError(f"{file} has no 'model_type' string, expected the config of a Hugging Face causal LM.")
    return raw


def read_target_headers(path: Path) -> dict[str, dict]:
    """Every tensor entry of the target's safetensors files, each checked to lie inside its file."""
    if not ((path / WEIGHTS_FILE).is_file() or (path / INDEX_FILE).is_file()):
        pickled = any(path.glob("*.bin")) or any(path.glob("*.pt"))
        raise CompatibilityError(f"target {path} has no {WEIGHTS_FILE} and no {INDEX_FILE}"
                                 f"{' (only pickle .bin/.pt files, never loaded)' if pickled else ''}: "
                                 "expected safetensors weights.")
    headers: dict[str, dict] = {}
    for file in weight_files(path):
        headers |= {name: info | {"file": file.name} for name, info in read_header(file).items()}
    return headers


def check_loading_info(path: Path, info: dict) -> None:
    """Refuse what Hugging Face reports as missing (randomly initialised), unexpected or mismatched."""
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        raise CompatibilityError(f"target {path} lacks tensor '{missing[0]}' ({len(missing)} missing in all): "
                                 "Hugging Face would fill it with random values; expected a complete checkpoint.")
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected:
        raise CompatibilityError(f"target {path} holds unexpected tensor '{unexpected[0]}' ({len(unexpected)} in all), "
                                 "not part of the model its config.json describes.")
    mismatched = sorted(info.get("mismatched_keys") or [], key=lambda m: m[0])
    if mismatched:
        name, stored, expected = mismatched[0][:3]
        raise CompatibilityError(f"target {path}: tensor '{name}' has shape {list(stored)}, expected "
                                 f"{list(expected)} from its config.json.")
    errors = info.get("error_msgs") or []
    if errors:
        raise CompatibilityError(f"target {path} cannot be loaded: {' '.join(str(errors[0]).split())[:300]}")


def check_target_weights(path: Path, model: torch.nn.Module, headers: dict[str, dict], quantized: bool) -> None:
    """Stored weights are fp32/bf16/fp16 (unless the config declares a quantization) and loaded ones finite."""
    names = dict(model.named_parameters())
    if not quantized:
        for name, entry in headers.items():
            if name in names and entry.get("dtype") not in HEADER_WEIGHT_DTYPES:
                raise CompatibilityError(f"{path / entry['file']}: tensor '{name}' is stored as {entry.get('dtype')}, "
                                         "expected F32, BF16 or F16 (an unquantised target).")
    for name, param in names.items():
        if param.is_floating_point() and not all_finite(param):
            raise CompatibilityError(f"target {path}: tensor '{name}' holds NaN or infinite values, "
                                     "expected finite weights.")


def check_tokenizer_files(path: Path) -> None:
    """A tokenizer is present beside the target's config, and its JSON files parse."""
    if not any((path / name).is_file() for name in VOCAB_FILES):
        raise CompatibilityError(f"target {path} has no tokenizer (none of {', '.join(VOCAB_FILES[:3])}): expected "
                                 "the target's tokenizer files beside its config.json.")
    for name in TOKENIZER_JSON:
        if (path / name).is_file():
            read_json_object(path / name, CompatibilityError, "the target's tokenizer files")


def first_line(exc: BaseException, path: Path) -> str:
    """The tail of a "cannot load ..." line: the first line of the message, naming `path` once."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, (OSError, ValueError, KeyError)):
        text = f"{type(exc).__name__}: {text}"
    return f": {text}" if str(path) in text else f" {path}: {text}"
