"""--to trtllm: the drafter directory + the `extra_llm_api_options` YAML TensorRT-LLM's DFlash reads."""

from __future__ import annotations

from pathlib import Path

import yaml
from dflash_core.dtypes import config_name
from dflash_trtllm.options import dflash_options, serve_command

from ..output import write_launcher
from . import Job, Result, mask_token_added, target_path_or_placeholder
from .published import verify_round_trip, write_published

DEFAULT_DTYPE = "bf16"
OPTIONS_FILE = "dflash.yaml"


def check(job: Job) -> None:
    options(job)  # validates the draft length against the block


def options(job: Job) -> dict:
    limit = job.target.max_positions if job.target and job.target.max_positions else job.source.config.max_position_embeddings
    return dflash_options(job.source.config, str(job.out), max_seq_len=min(int(limit), 8192))


def command(job: Job) -> list[str]:
    tokenizer = str(job.out / "tokenizer") if mask_token_added(job) else None
    return serve_command(target_path_or_placeholder(job), str(job.out / OPTIONS_FILE), tokenizer=tokenizer)


def plan(job: Job) -> list[str]:
    spec = options(job)["speculative_config"]
    return [f"write config.json + model.safetensors ({len(job.source.tensors)} tensors, {job.dtype})",
            f"write {OPTIONS_FILE}: decoding_type DFlash, max_draft_len {spec['max_draft_len']}, "
            f"target_layer_ids {spec['target_layer_ids']}, mask_token_id {spec['mask_token_id']}",
            "write launch.sh (trtllm-serve)"]


def build(job: Job, tmp: Path) -> Result:
    lines = write_published(job, tmp, "trtllm weights")
    job.source.config.replace(dtype=config_name(job.dtype)).save_pretrained(tmp)
    verify_round_trip(job, tmp)
    (tmp / OPTIONS_FILE).write_text(yaml.safe_dump(options(job), sort_keys=False))
    cmd = command(job)
    write_launcher(tmp / "launch.sh", cmd)
    return Result(lines + [f"config.json, {OPTIONS_FILE}, launch.sh"], cmd)
