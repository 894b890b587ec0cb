"""--to sglang: a draft directory SGLang 0.5.23's native DFLASH loads as is, and its launch command."""

from __future__ import annotations

from pathlib import Path

from dflash_core.files.atomic import write_json
from dflash_sglang.layout import DEFAULT_DTYPE, SGLANG_VERSION, check_capturable, launch_command, sglang_config

from ..output import write_launcher
from . import Job, Result, mask_token_added, target_path_or_placeholder
from .published import write_published, verify_round_trip

__all__ = ["DEFAULT_DTYPE", "build", "check", "command", "plan"]  # what dflash-convert reads of a target module


def check(job: Job) -> None:
    check_capturable(job.source.config, job.target.num_layers if job.target else None)


def command(job: Job) -> list[str]:
    tokenizer = str(job.out / "tokenizer") if mask_token_added(job) else None
    return launch_command(target_path_or_placeholder(job), str(job.out), job.source.config, tokenizer=tokenizer,
                          dtype=job.dtype)


def plan(job: Job) -> list[str]:
    return [f"write config.json for SGLang {SGLANG_VERSION} DFlashDraftModel (block {job.source.config.block_size}, "
            f"target_layer_ids {list(job.source.config.target_layer_ids)}, mask {job.source.config.mask_token_id})",
            f"write model.safetensors ({len(job.source.tensors)} tensors, {job.dtype})",
            "write launch.sh"]


def build(job: Job, tmp: Path) -> Result:
    lines = write_published(job, tmp, "sglang weights")
    write_json(tmp / "config.json", sglang_config(job.source.config, job.dtype))
    verify_round_trip(job, tmp)
    cmd = command(job)
    write_launcher(tmp / "launch.sh", cmd)
    return Result(lines + ["config.json, launch.sh"], cmd)
