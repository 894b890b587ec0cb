"""Flags the commands share, and turning them into library arguments. No model logic lives here."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_core.dtypes import SHORT_NAMES
from dflash_core.errors import DFlashError, GenerationError


def add_runtime_args(parser, *, default_dtype: str = "bf16") -> None:
    parser.add_argument("--dtype", choices=SHORT_NAMES, default=default_dtype,
                        help=f"precision of target and drafter (default {default_dtype})")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")


def apply_threads(threads: int) -> None:
    if threads < 0:
        raise DFlashError(f"--threads is {threads}, expected 0 (default) or a positive count.")
    if threads:
        torch.set_num_threads(threads)


def read_prompt(text: str | None, file: str | None) -> str:
    if file is not None:
        path = Path(file)
        if not path.exists() or path.is_dir():
            raise GenerationError(f"--prompt-file {path} does not exist (expected a text file).")
        text = path.read_text(encoding="utf-8")
    if text is None or not text.strip():
        raise GenerationError("the prompt is empty: give a non-empty --prompt or --prompt-file.")
    return text


def print_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False))
