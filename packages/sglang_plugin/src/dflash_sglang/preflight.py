"""Checks of a draft directory before SGLang starts DFLASH (run by the plugin's hook).

SGLang's own loader ignores unknown weight names and never reports missing ones, and only warns
when `--speculative-num-draft-tokens` differs from the block the drafter was trained with; a
directory written by dflash-convert carries a manifest, so damage is caught here, in one line.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dflash_core.model.config import DFlashConfig
from dflash_core.errors import CheckpointError, ConfigError
from dflash_core.files.manifest import MANIFEST, manifest_problems

logger = logging.getLogger("dflash_sglang")


def check_draft_dir(draft_dir: str | Path, num_draft_tokens: int | None = None) -> list[str]:
    """Raise on a damaged converted directory; return warnings (e.g. a block-size mismatch)."""
    draft_dir = Path(draft_dir)
    warnings: list[str] = []
    if (draft_dir / MANIFEST).is_file():
        problems = manifest_problems(draft_dir)
        if problems:
            raise CheckpointError(f"draft directory {draft_dir} is damaged: {problems[0]}"
                                  + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "") + ".")
    try:
        config = DFlashConfig.from_pretrained(draft_dir)
    except ConfigError as exc:
        raise CheckpointError(f"draft directory {draft_dir}: {exc}") from None
    if num_draft_tokens is not None and num_draft_tokens != config.block_size:
        warnings.append(f"--speculative-num-draft-tokens is {num_draft_tokens} but the drafter was trained with "
                        f"blocks of {config.block_size}; acceptance will suffer.")
    return warnings


def before_handle_dflash(server_args, *args, **kwargs):
    """BEFORE hook on sglang.srt.arg_groups.speculative_hook._handle_dflash (signature: server_args)."""
    path = getattr(server_args, "speculative_draft_model_path", None)
    if path and Path(path).is_dir():
        tokens = getattr(server_args, "speculative_num_draft_tokens", None) or getattr(
            server_args, "speculative_dflash_block_size", None)
        for warning in check_draft_dir(path, tokens):
            logger.warning("dflash-sglang: %s", warning)
    return None  # arguments unchanged
