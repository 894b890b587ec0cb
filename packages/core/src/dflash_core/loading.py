"""Loading a target and its drafter from directories, ready for `generate` (the library's front door).

Only safetensors and JSON are read: no pickle, no `trust_remote_code`. Every failure is a
one-line `DFlashError` naming the directory and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .drafter import load_drafter
from .drafter_backend import DrafterBackend
from .dtypes import resolve_dtype
from .errors import CompatibilityError, GenerationError
from .pairing import check_compatibility, ensure_mask_token
from .target import TargetModel


def load_target(path: str | os.PathLike, layer_ids=(), dtype: str | torch.dtype = "bf16",
                device: str | torch.device = "cpu") -> TargetModel:
    """A Hugging Face causal LM directory (safetensors, no remote code) as a TargetModel."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CompatibilityError(f"target {path} is not a Hugging Face model directory (no config.json).")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype), trust_remote_code=False,
                                                     use_safetensors=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompatibilityError(f"cannot load target {path}: {first}") from None
    return TargetModel(model.to(device).eval(), layer_ids)


def load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompatibilityError(f"cannot load the tokenizer of {path}: {first}") from None


@dataclass
class Pair:
    """A target and its drafter in one precision on one device, checked against each other."""

    target: TargetModel
    drafter: DrafterBackend
    tokenizer: object
    notes: list[str] = field(default_factory=list)
    """One-line remarks for the user (a mask token added, the dtype chosen and why)."""

    def __iter__(self):  # target, drafter, tokenizer = load_pair(...)
        return iter((self.target, self.drafter, self.tokenizer))


def load_pair(target_dir: str | os.PathLike, drafter_dir: str | os.PathLike, *, dtype: str | torch.dtype = "bf16",
              device: str | torch.device | None = None, backend: str = "torch", threads: int = 0) -> Pair:
    """Drafter and target loaded in one precision, checked against each other before anything runs.

    backend "onnxruntime" runs an exported drafter graph (a .onnx file or a `dflash-convert --to onnx`
    directory) with ONNX Runtime on the CPU; the target stays in torch.
    """
    device = torch.device(device or "cpu")
    if backend == "onnxruntime":
        from .ort_drafter import load_onnx_drafter

        drafter = load_onnx_drafter(drafter_dir, threads=threads)
    else:
        drafter = load_drafter(drafter_dir, device=device, dtype=dtype)
    target = load_target(target_dir, drafter.config.target_layer_ids, dtype, device)
    check_compatibility(drafter.config, target)
    drafter.check_runtime(target)
    tokenizer = load_tokenizer(target_dir)
    note = ensure_mask_token(tokenizer, drafter.config)
    return Pair(target, drafter, tokenizer, [note] if note else [])


def stop_token_ids(target: TargetModel, tokenizer) -> list[int]:
    """The target's end-of-sequence ids (generation config, then tokenizer)."""
    ids = getattr(getattr(target.model, "generation_config", None), "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else list(ids)


def encode_prompt(tokenizer, text: str, device: str | torch.device = "cpu") -> torch.Tensor:
    """[1, T] token ids of `text` (no special tokens added)."""
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        raise GenerationError("the prompt encodes to no tokens: expected at least one.")
    return ids.to(device)
