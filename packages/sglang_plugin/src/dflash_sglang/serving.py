"""What `dflash serve --engine sglang` launches: the SGLang environment, the draft directory, the command line.

Nothing here imports sglang: the server runs in its own environment (`.venv-sglang`, made by
`make sglang-env`), found next to the repository, through `--sglang-python` or `$DFLASH_SGLANG_PYTHON`.
Inputs are never modified: a drafter that is not already an SGLang draft directory is converted
(`dflash-convert --to sglang`) into a cache directory of its own, keyed by the drafter's content.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dflash_core.model.config import DFlashConfig
from dflash_core.dtypes import config_name, short_name
from dflash_core.errors import DFlashError
from dflash_core.files.atomic import sha256_files
from dflash_core.files.manifest import MANIFEST

from .cpu import STAND_IN_DIR
from .cpu.patches import CPU_ENGINE_ENV
from .layout import launch_command
from .preflight import check_draft_dir

PYTHON_ENV = "DFLASH_SGLANG_PYTHON"
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


class ServeError(DFlashError):
    """The server cannot be started as asked (no SGLang environment, a bad directory, a busy port...)."""


@dataclass(frozen=True)
class Launch:
    """One server launch: the command, its environment additions, and where it will answer."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the caller's environment
    port: int = 30000
    device: str = "cpu"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shell(self) -> str:
        """The launch as one shell line a person can copy."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.command)


def find_sglang_python(explicit: str | None = None) -> Path:
    """The python of the SGLang environment: --sglang-python, $DFLASH_SGLANG_PYTHON, or .venv-sglang of the repo."""
    given = explicit or os.environ.get(PYTHON_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise ServeError(f"SGLang python {path} does not exist; expected the python of an environment with "
                             "sglang==0.5.23 (run `make sglang-env`).")
        return path
    for root in (Path.cwd(), *Path(__file__).resolve().parents):
        candidate = root / ".venv-sglang" / "bin" / "python"
        if candidate.is_file():
            return candidate
    raise ServeError("no SGLang environment found (.venv-sglang next to the repository): run `make sglang-env`, "
                     f"or name its python with --sglang-python or ${PYTHON_ENV}.")


def probe(python: Path) -> dict:
    """{'cuda': bool, 'sgl_kernel_cpu': bool} as seen by the SGLang environment."""
    done = subprocess.run([str(python), "-c", PROBE], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServeError(f"the SGLang environment at {python} cannot import torch: {last} (run `make sglang-env`).")
    return json.loads(done.stdout.strip().splitlines()[-1])


def resolve_device(device: str, facts: dict) -> str:
    if device == "auto":
        return "cuda" if facts["cuda"] else "cpu"
    if device.startswith("cuda") and not facts["cuda"]:
        raise ServeError(f"--device {device} asked for, but the SGLang environment sees no CUDA device; "
                         "expected --device cpu or auto on this machine.")
    return device


def served_dtype(dtype: str, device: str) -> str:
    """auto: float32 on the CPU (exactly the target's greedy output), bfloat16 on a GPU (what SGLang serves)."""
    if dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return config_name(dtype)


def check_target(target: str | Path) -> Path:
    target = Path(target)
    if not (target / "config.json").is_file():
        state = "does not exist" if not target.exists() else "has no config.json"
        raise ServeError(f"--target {target} {state}; expected a Hugging Face model directory (with its tokenizer).")
    return target


def is_sglang_draft_dir(drafter: Path) -> bool:
    """A dflash-convert --to sglang output (its manifest says so)."""
    try:
        return json.loads((drafter / MANIFEST).read_text()).get("target") == "sglang"
    except (OSError, ValueError, AttributeError):
        return False


def prepare_drafter(drafter: str | Path, target: Path, dtype: str, cache: Path) -> Path:
    """An SGLang draft directory for `drafter`: itself if it already is one (checked), else a cached conversion."""
    drafter = Path(drafter)
    if not drafter.is_dir():
        state = "does not exist" if not drafter.exists() else "is not a directory"
        raise ServeError(f"--drafter {drafter} {state}; expected a DFlash drafter directory.")
    if is_sglang_draft_dir(drafter):
        check_draft_dir(drafter)  # raises CheckpointError naming the damaged file
        return drafter
    files = sorted(p for p in drafter.iterdir()
                   if p.is_file() and (p.suffix == ".safetensors" or p.name == "config.json"))
    if not any(p.suffix == ".safetensors" for p in files):
        raise ServeError(f"--drafter {drafter} holds no *.safetensors weights; expected a DFlash drafter directory.")
    out = cache / f"{drafter.resolve().name}-{dtype}-{sha256_files(files)[:12]}"
    if is_sglang_draft_dir(out):
        try:
            check_draft_dir(out)
            return out
        except DFlashError:
            pass  # our own cache entry, damaged: written again below
    done = subprocess.run([sys.executable, "-m", "dflash_convert", str(drafter), "--to", "sglang", "--out", str(out),
                           "--dtype", short_name(dtype), "--target-model", str(target), "--force"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ServeError(f"could not convert --drafter {drafter} for SGLang: {last}")
    return out


def build_launch(target: Path, draft_dir: Path, *, device: str, dtype: str, port: int, facts: dict,
                 extra: list[str] | None = None, python: Path | None = None) -> Launch:
    """The `python -m sglang.launch_server ... --speculative-algorithm DFLASH` launch for this device."""
    config = DFlashConfig.from_pretrained(draft_dir)
    tokenizer = draft_dir / "tokenizer"  # dflash-convert writes one when it had to add the mask token
    command = launch_command(str(target), str(draft_dir), config, dtype=dtype, port=port,
                             tokenizer=str(tokenizer) if tokenizer.is_dir() else None,
                             extra=(CPU_SERVER_ARGS if device == "cpu" else ["--device", device]) + list(extra or []))
    if python is not None:
        command[0] = str(python)
    env: dict[str, str] = {}
    if device == "cpu":
        env[CPU_ENGINE_ENV] = "1"  # SGLang's CPU platform; our plugin registers its CPU patches only then
        if not facts.get("sgl_kernel_cpu"):  # only where sgl_kernel's own CPU build is missing
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STAND_IN_DIR), os.environ.get("PYTHONPATH")]))
    return Launch(command, env, port, device)
