from __future__ import annotations

import os
from pathlib import Path

from dflash_core.model.config import DFlashConfig
from dflash_serving import launch as common
from dflash_serving.drafters import converted_for
from dflash_serving.drafters import prepare_drafter as prepare_converted
from dflash_serving.launch import EngineEnv, Launch, ServeError, check_target, served_dtype

from .cpu import STAND_IN_DIR
from .cpu.patches import CPU_ENGINE_ENV
from .layout import launch_command
from .preflight import check_draft_dir

__all__ = ["Launch", "ServeError", "build_launch", "check_target", "find_sglang_python", "is_sglang_draft_dir",
           "prepare_drafter", "probe", "resolve_device", "served_dtype"]

PYTHON_ENV = "DFLASH_SGLANG_PYTHON"
ENGINE = EngineEnv("SGLang", ".venv-sglang", PYTHON_ENV, "--sglang-python", "sglang-env", "sglang==0.5.23")
CPU_MAX_TOTAL_TOKENS = 65536  # SGLang would size a 2M-token KV pool from free RAM (22 s, GBs) without it
CPU_SERVER_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                   "--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)]
# run in the SGLang environment before launching: what it can do, so the choices below are facts
PROBE = """
import json, torch
try:
    from sgl_kernel import assign_req_to_token_pool_cpu
    cpu_kernels = True
except Exception:
    cpu_kernels = False
print(json.dumps({"cuda": torch.cuda.is_available(), "sgl_kernel_cpu": cpu_kernels}))
"""


def find_sglang_python(explicit: str | None = None) -> Path:
    """The python of the SGLang environment: --sglang-python, $DFLASH_SGLANG_PYTHON, or .venv-sglang of the repo."""
    return common.find_engine_python(ENGINE, explicit, near=Path(__file__))


def probe(python: Path) -> dict:
    """{'cuda': bool, 'sgl_kernel_cpu': bool} as seen by the SGLang environment."""
    return common.probe(python, PROBE, ENGINE)


def resolve_device(device: str, facts: dict) -> str:
    return common.resolve_device(device, facts, ENGINE.engine)


def is_sglang_draft_dir(drafter: Path) -> bool:
    """A dflash-convert --to sglang output (its manifest says so)."""
    return converted_for(drafter) == "sglang"


def prepare_drafter(drafter: str | Path, target: Path, dtype: str, cache: Path) -> Path:
    """An SGLang draft directory for `drafter`: itself if it already is one (checked), else a cached conversion."""
    return prepare_converted(drafter, target, dtype, cache, to="sglang", engine=ENGINE.engine, check=check_draft_dir)


def build_launch(target: Path, draft_dir: Path | None, *, device: str, dtype: str, port: int, facts: dict,
                 extra: list[str] | None = None, python: Path | None = None) -> Launch:
    """The `python -m sglang.launch_server ... --speculative-algorithm DFLASH` launch for this device;
    `draft_dir` None: the same server without speculative decoding (the plain baseline of `dflash bench serve`)."""
    config = tokenizer = None
    if draft_dir is not None:
        config = DFlashConfig.from_pretrained(draft_dir)
        tokenizer = draft_dir / "tokenizer"  # dflash-convert writes one when it had to add the mask token
    command = launch_command(str(target), None if draft_dir is None else str(draft_dir), config, dtype=dtype,
                             port=port, tokenizer=str(tokenizer) if tokenizer and tokenizer.is_dir() else None,
                             extra=(CPU_SERVER_ARGS if device == "cpu" else ["--device", device]) + list(extra or []))
    if python is not None:
        command[0] = str(python)
    env: dict[str, str] = {}
    if device == "cpu":
        env[CPU_ENGINE_ENV] = "1"  # SGLang's CPU platform; our plugin registers its CPU patches only then
        if not facts.get("sgl_kernel_cpu"):  # only where sgl_kernel's own CPU build is missing
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STAND_IN_DIR), os.environ.get("PYTHONPATH")]))
    method = "DFLASH" if config is not None else "no drafts"
    return Launch(command, env, port, device, engine=ENGINE.engine, method=method)
