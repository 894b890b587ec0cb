"""Loading what the commands share: a target with its tokenizer, a drafter, prompts, threads."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..compat import check_compatibility, ensure_mask_token
from ..drafter import Drafter, load_drafter, resolve_dtype
from ..errors import CompatibilityError, DFlashError, GenerationError
from ..target import TargetModel

DTYPE_CHOICES = ("bf16", "fp32", "fp16")


def add_runtime_args(parser, *, default_dtype: str = "bf16") -> None:
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default=default_dtype,
                        help=f"precision of target and drafter (default {default_dtype})")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")


def apply_threads(threads: int) -> None:
    if threads < 0:
        raise DFlashError(f"--threads is {threads}, expected 0 (default) or a positive count.")
    if threads:
        torch.set_num_threads(threads)


def load_target(path: str | os.PathLike, layer_ids=(), dtype: str = "bf16", device: str = "cpu") -> TargetModel:
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
    target: TargetModel
    drafter: Drafter
    tokenizer: object
    notes: list[str]


def load_pair(target_dir, drafter_dir, dtype: str, device: str, backend: str = "torch", threads: int = 0) -> Pair:
    """Drafter and target loaded in one precision, checked against each other before anything runs.

    backend "onnxruntime" runs an exported drafter graph (a .onnx file or a `dflash-convert --to onnx`
    directory) with ONNX Runtime on the CPU; the target stays in torch.
    """
    if backend == "onnxruntime":
        from ..ort_drafter import load_onnx_drafter

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


def read_prompt(text: str | None, file: str | None) -> str:
    if file is not None:
        path = Path(file)
        if not path.exists() or path.is_dir():
            raise GenerationError(f"--prompt-file {path} does not exist (expected a text file).")
        text = path.read_text(encoding="utf-8")
    if text is None or not text.strip():
        raise GenerationError("the prompt is empty: give a non-empty --prompt or --prompt-file.")
    return text


def encode(tokenizer, text: str, device: str) -> torch.Tensor:
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if ids.shape[1] == 0:
        raise GenerationError("the prompt encodes to no tokens: expected at least one.")
    return ids.to(device)


def print_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False))
