"""A server launch and the facts it is built from: the engine's environment, its device, the served dtype."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from dflash_core.dtypes import config_name
from dflash_core.errors import DFlashError


class ServeError(DFlashError):
    """The server cannot be started as asked (no engine environment, a bad directory, a busy port...)."""


@dataclass(frozen=True)
class Launch:
    """One server launch: the command, its environment additions, and where it will answer."""

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the caller's environment
    port: int = 30000
    device: str = "cpu"
    engine: str = "the engine"  # its name in messages ("SGLang exited with status 1: ...")
    method: str = "DFlash"  # the engine's name of the speculative method, for the start line

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shell(self) -> str:
        """The launch as one shell line a person can copy."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.command)


@dataclass(frozen=True)
class EngineEnv:
    """Where an engine's own environment is found, and what to tell a person who has none."""

    engine: str  # "SGLang", "vLLM"
    venv: str  # folder name next to the repository: ".venv-sglang"
    env_var: str  # environment variable naming its python: "DFLASH_SGLANG_PYTHON"
    flag: str  # the CLI flag naming it: "--sglang-python"
    make_target: str  # "sglang-env"
    requirement: str  # what the environment must hold: "sglang==0.5.23"


def find_engine_python(env: EngineEnv, explicit: str | None = None, *, near: Path | None = None) -> Path:
    """The python of the engine's environment: the flag, $env_var, or the venv folder next to the repository."""
    given = explicit or os.environ.get(env.env_var)
    if given:
        path = Path(given)
        if not path.is_file():
            raise ServeError(f"{env.engine} python {path} does not exist; expected the python of an environment "
                             f"with {env.requirement} (run `make {env.make_target}`).")
        return path
    for root in (Path.cwd(), *Path(near or __file__).resolve().parents):
        candidate = root / env.venv / "bin" / "python"
        if candidate.is_file():
            return candidate
    raise ServeError(f"no {env.engine} environment found ({env.venv} next to the repository): run "
                     f"`make {env.make_target}`, or name its python with {env.flag} or ${env.env_var}.")


def probe(python: Path, script: str, env: EngineEnv) -> dict:
    """Run `script` (it prints one JSON object last) in the engine's environment: what it can do, as facts."""
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ServeError(f"the {env.engine} environment at {python} does not start: {last} "
                         f"(run `make {env.make_target}`).")
    return json.loads(done.stdout.strip().splitlines()[-1])


def resolve_device(device: str, facts: dict, engine: str) -> str:
    """auto: cuda where the engine's environment sees a GPU (facts['cuda']), else cpu."""
    if device == "auto":
        return "cuda" if facts["cuda"] else "cpu"
    if device.startswith("cuda") and not facts["cuda"]:
        raise ServeError(f"--device {device} asked for, but the {engine} environment sees no CUDA device; "
                         "expected --device cpu or auto on this machine.")
    return device


def served_dtype(dtype: str, device: str) -> str:
    """auto: float32 on the CPU (exactly the target's greedy output), bfloat16 on a GPU."""
    if dtype == "auto":
        return "float32" if device == "cpu" else "bfloat16"
    return config_name(dtype)


def check_target(target: str | Path) -> Path:
    target = Path(target)
    if not (target / "config.json").is_file():
        state = "does not exist" if not target.exists() else "has no config.json"
        raise ServeError(f"--target {target} {state}; expected a Hugging Face model directory (with its tokenizer).")
    return target
