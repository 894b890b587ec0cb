"""Checks of a draft directory and its target before vLLM starts, each failure one line.

vLLM would otherwise start (half a minute and more), load what it can and fail deep inside a worker
(a feature width mismatch, an unknown architecture) or, worse, load silently: its loader drops
names it does not know. A directory written by `dflash-convert --to vllm` carries a manifest, so
damage is caught here too. `dflash serve --engine vllm` runs these checks; `target_facts` comes
from the probe of vLLM's environment (serving.PROBE), so the architecture check is vLLM's own answer.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_core.errors import CheckpointError, CompatibilityError, ConfigError
from dflash_core.files.manifest import MANIFEST, manifest_problems
from dflash_core.model.config import DFlashConfig

from .layout import mixed_attention


def check_draft_dir(draft_dir: str | Path) -> DFlashConfig:
    """The drafter's config; raise CheckpointError on a damaged converted directory or an unreadable config."""
    draft_dir = Path(draft_dir)
    if (draft_dir / MANIFEST).is_file():
        problems = manifest_problems(draft_dir)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CheckpointError(f"draft directory {draft_dir} is damaged: {problems[0]}{more}.")
    try:
        return DFlashConfig.from_pretrained(draft_dir)
    except ConfigError as exc:
        raise CheckpointError(f"draft directory {draft_dir}: {exc}") from None


def pair_problems(config: DFlashConfig, target: dict, *, eagle3_target: bool | None, device: str,
                  triton: bool) -> list[str]:
    """Why vLLM's dflash cannot serve this drafter with this target (config.json as a dict); [] when it can."""
    problems = []
    arch = (target.get("architectures") or ["?"])[0]
    if eagle3_target is False:
        problems.append(f"the target's architecture {arch} does not implement vLLM's EAGLE-3 interface "
                        "(aux hidden states), which DFlash needs for its target features")
    layers, hidden = target.get("num_hidden_layers"), target.get("hidden_size")
    if isinstance(layers, int):
        bad = [i for i in config.target_layer_ids if not 0 <= i < layers]
        if bad:
            problems.append(f"target_layer_ids {list(config.target_layer_ids)} name layers {bad} that a "
                            f"{layers}-layer target does not have")
    if isinstance(hidden, int) and hidden != config.hidden_size:
        problems.append(f"the drafter's hidden_size is {config.hidden_size} but the target's is {hidden}; vLLM "
                        "sizes fc from the drafter's (expected equal)")
    vocab = target.get("vocab_size")
    if isinstance(vocab, int) and not 0 <= config.mask_token_id < vocab:
        problems.append(f"mask_token_id {config.mask_token_id} lies outside the target's vocabulary of {vocab}")
    if mixed_attention(config) and not (device != "cpu" and triton):
        problems.append("the drafter mixes sliding and full attention layers, which vLLM serves only on its V2 "
                        "model runner (it needs Triton, absent here)")
    return problems


def check_pair(draft_dir: Path, target_dir: Path, *, eagle3_target: bool | None, device: str,
               triton: bool) -> DFlashConfig:
    """Raise CompatibilityError (one line, the first problem) when vLLM's dflash will not work for this pair."""
    config = check_draft_dir(draft_dir)
    target = json.loads((Path(target_dir) / "config.json").read_text())
    target = {**target, **(target.get("text_config") or {})}  # a multimodal target's text model holds the sizes
    problems = pair_problems(config, target, eagle3_target=eagle3_target, device=device, triton=triton)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CompatibilityError(f"vLLM's dflash cannot serve {draft_dir} with {target_dir}: {problems[0]}{more}.")
    return config


def ignored_notes(drafter: Path) -> list[str]:
    """What vLLM will ignore in the drafter as given (so acceptance differs from the core's)."""
    notes = []
    if (Path(drafter) / "draft_vocab.json").is_file():
        notes.append("vLLM ignores draft_vocab.json: it drafts over the target's full vocabulary")
    return notes
