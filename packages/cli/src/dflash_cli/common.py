"""Flags the commands share, and turning them into library arguments. No model logic lives here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dflash_core.dtypes import SHORT_NAMES, resolve_dtype
from dflash_core.errors import DFlashError, GenerationError
from dflash_core.files.text import read_text_file
from dflash_core.decode.loop import MAX_TREE_NODES
from dflash_core.loading import load_target, load_target_auto
from dflash_core.tuning.plan import Tuning

from dflash_cli import flags


def add_runtime_args(parser, *, default_dtype: str = "bf16", allow_auto: bool = False) -> None:
    choices = (("auto",) if allow_auto else ()) + SHORT_NAMES
    extra = "; auto: bf16 only where a measured probe finds it faster on this machine" if allow_auto else ""
    parser.add_argument("--dtype", choices=choices, default=default_dtype,
                        help=f"precision of target and drafter (default {default_dtype}{extra})")
    parser.add_argument("--device", type=flags.device, default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--threads", type=flags.integer(0), default=0,
                        help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--no-cache", action="store_true",
                        help="measure this machine (dtype probe, verify cost table) without reading or writing the "
                             "cache directory ($DFLASH_CACHE_DIR, else $XDG_CACHE_HOME/dflash, else ~/.cache/dflash)")


def tuning_for(args) -> Tuning:
    """The `Tuning` a command measures through: cached in the user's cache directory unless --no-cache."""
    return Tuning() if args.no_cache else Tuning.cached()


def load_target_in(target_dir: str, dtype: str, device: str, block_size: int = 16, *, workload: str = "decode",
                   tuning: Tuning | None = None):
    """(target, torch dtype) for --dtype; 'auto' is resolved by the measured probe of `workload` ("decode",
    "train") and its reason printed (stderr)."""
    if dtype != "auto":
        return load_target(target_dir, (), dtype, device), resolve_dtype(dtype)
    target, dtype, reason = load_target_auto(target_dir, (), block_size, device, workload=workload, tuning=tuning)
    print(f"dtype {reason}", file=sys.stderr)
    return target, dtype


def apply_threads(threads: int) -> None:
    if threads < 0:
        raise DFlashError(f"--threads is {threads}, expected 0 (default) or a positive count.")
    if threads:
        torch.set_num_threads(threads)


def read_prompt(text: str | None, file: str | None) -> str:
    if file is not None:
        path = Path(file)
        if not path.is_file():
            state = "is a directory" if path.is_dir() else "does not exist"
            raise GenerationError(f"--prompt-file {path} {state}, expected a text file.")
        text = read_text_file(path, "--prompt-file", GenerationError)
    if text is None or not text.strip():
        raise GenerationError("the prompt is empty: give a non-empty --prompt or --prompt-file.")
    return text


def chat_message(text: str) -> list[dict]:
    """--chat TEXT as a one-message chat (the user's turn)."""
    if not text.strip():
        raise GenerationError("the --chat message is empty: give the user's message as text.")
    return [{"role": "user", "content": text}]


def print_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False))


def add_draft_length_arg(parser) -> None:
    parser.add_argument("--draft-length", type=_draft_length, default="auto", metavar="auto|N",
                        help="drafts verified per step: auto (default) chooses each step from this machine's "
                             "verify costs and the acceptance so far; N fixes it (0 = the target alone)")
    parser.add_argument("--no-context-lookup", dest="context_lookup", action="store_false",
                        help="with --draft-length auto, draft with the drafter only (by default a step may instead "
                             "copy what followed the latest n-gram earlier in the prompt or output, when that "
                             "promises more tokens per second)")
    parser.add_argument("--tree", type=_tree, default=None, metavar="auto|off|N",
                        help="verify a token tree of the drafter's top candidates instead of its argmax chain: auto "
                             "sizes it each step from this machine's verify costs and the acceptance so far, N fixes "
                             "its nodes (1-64), off verifies the chain; default: auto for greedy decoding of one "
                             "prompt with --draft-length auto, off otherwise (where trees measured faster)")


def _tree(text: str):
    import argparse

    if text in ("auto", "off"):
        return text
    try:
        return flags.integer(1, MAX_TREE_NODES)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected auto, off or a node count in [1, {MAX_TREE_NODES}]") \
            from None


def _draft_length(text: str):
    import argparse

    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--draft-length is {text!r}, expected auto or an integer >= 0")
    return value
