"""--to vllm: a draft directory vLLM 0.32's native dflash loads as is, its --speculative-config JSON and launch.sh."""

from __future__ import annotations

from pathlib import Path

from dflash_core.files.atomic import write_json
from dflash_vllm.layout import DEFAULT_DTYPE, VLLM_VERSION, launch_command, speculative_config, vllm_config

from ..output import write_launcher
from . import Job, Result, mask_token_added, target_path_or_placeholder
from .published import verify_round_trip, write_published

__all__ = ["DEFAULT_DTYPE", "build", "check", "command", "plan"]  # what dflash-convert reads of a target module
SPEC_FILE = "speculative_config.json"  # the value of --speculative-config, for other launchers (LLM(...), k8s)


def check(job: Job) -> None:
    """Nothing beyond dflash-convert's own target checks: vLLM captures every target layer, the last included."""


def command(job: Job) -> list[str]:
    tokenizer = str(job.out / "tokenizer") if mask_token_added(job) else None
    return launch_command(target_path_or_placeholder(job), str(job.out), job.source.config, tokenizer=tokenizer,
                          dtype=job.dtype)


def plan(job: Job) -> list[str]:
    spec = speculative_config(str(job.out), job.source.config)
    return [f"write config.json for vLLM {VLLM_VERSION} DFlashDraftModel (target_layer_ids "
            f"{list(job.source.config.target_layer_ids)}, mask {job.source.config.mask_token_id})",
            f"write model.safetensors ({len(job.source.tensors)} tensors, {job.dtype})",
            f"write {SPEC_FILE} (num_speculative_tokens {spec['num_speculative_tokens']} = block - 1) and launch.sh"]


def build(job: Job, tmp: Path) -> Result:
    lines = write_published(job, tmp, "vllm weights")
    write_json(tmp / "config.json", vllm_config(job.source.config, job.dtype))
    verify_round_trip(job, tmp)
    write_json(tmp / SPEC_FILE, speculative_config(str(job.out), job.source.config))
    cmd = command(job)
    write_launcher(tmp / "launch.sh", cmd)
    return Result(lines + [f"config.json, {SPEC_FILE}, launch.sh"], cmd)
