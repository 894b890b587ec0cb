"""Precision names, defined once: the short names users type, the names configs store, torch dtypes.

    short  config      torch           mantissa bits
    fp32   float32     torch.float32   23
    bf16   bfloat16    torch.bfloat16  7
    fp16   float16     torch.float16   10

`auto` (a CLI and `load_pair` choice) is not a dtype: `auto_dtype` resolves it on the machine.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Precision(NamedTuple):
    short: str
    config: str
    torch: torch.dtype
    mantissa_bits: int


PRECISIONS = (
    Precision("fp32", "float32", torch.float32, 23),
    Precision("bf16", "bfloat16", torch.bfloat16, 7),
    Precision("fp16", "float16", torch.float16, 10),
)
SHORT_NAMES = tuple(p.short for p in PRECISIONS)
CONFIG_NAMES = tuple(p.config for p in PRECISIONS)
_ALIASES = {"half": "fp16", "float": "fp32"}


def precision(dtype: torch.dtype | str) -> Precision:
    """The row for a torch dtype, a short name ('bf16'), a config name ('bfloat16') or an alias."""
    key = _ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    for row in PRECISIONS:
        if key in (row.short, row.config, row.torch):
            return row
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(SHORT_NAMES)}")


def resolve_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """torch dtype from a torch dtype, a config name or a short name; None stays None."""
    return None if dtype is None else precision(dtype).torch


def config_name(dtype: torch.dtype | str) -> str:
    """'bfloat16' for bf16 / torch.bfloat16 / 'bfloat16' (the name config.json files store)."""
    return precision(dtype).config


def short_name(dtype: torch.dtype | str) -> str:
    """'bf16' for torch.bfloat16 / 'bfloat16' / 'bf16' (the name users type)."""
    return precision(dtype).short
