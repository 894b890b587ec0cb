"""`dflash serve --engine vllm`: vLLM's own OpenAI server with its native dflash method, on a GPU or on the CPU.

The CLI (`dflash_cli.serve`) is a thin layer over `serve`; everything that knows vLLM lives here.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_serving.supervise import serve_launch

from .preflight import check_draft_dir, ignored_notes
from .serving import (Launch, ServeError, build_launch, check_target, find_vllm_python, is_vllm_draft_dir,
                      prepare_drafter, probe, resolve_device, served_dtype)

DEFAULT_CACHE = Path("runs") / "vllm-serve"  # converted drafters and server logs (relative to the caller's cwd)


def serve(target: str, drafter: str, *, port: int = 8000, device: str = "auto", dtype: str = "auto",
          print_command: bool = False, vllm_python: str | None = None, extra: list[str] | None = None,
          cache: Path = DEFAULT_CACHE, log: Path | None = None, timeout: float = 900,
          draft_length: int | None = None) -> int:
    """Serve `target` with `drafter` through vLLM's native dflash until Ctrl-C; 0 on a clean stop.

    Bad input raises DFlashError (one line) before vLLM starts; a server that dies raises
    dflash_serving.supervise.ServerDied with vLLM's last error line.
    """
    launch = launch_for(target, drafter, port=port, device=device, dtype=dtype, vllm_python=vllm_python, extra=extra,
                        cache=cache, draft_length=draft_length)
    notes = () if print_command else ignored_notes(Path(drafter))
    return serve_launch(launch, cache, notes=notes, print_command=print_command, log=log, timeout=timeout)


def launch_for(target: str | Path, drafter: str | Path | None, *, port: int = 8000, device: str = "auto",
               dtype: str = "auto", vllm_python: str | None = None, extra: list[str] | None = None,
               cache: Path = DEFAULT_CACHE, draft_length: int | None = None) -> Launch:
    """The launch `serve` runs, after every check (a converted drafter cached under `cache`/drafters);
    `drafter` None: the same server without speculative decoding (the plain baseline of `dflash bench serve`);
    `draft_length` k: each step verifies the first k drafts of the block (None: the device's default,
    `serving.build_launch`)."""
    target_dir = check_target(target)
    if drafter is not None and is_vllm_draft_dir(Path(drafter)):
        check_draft_dir(drafter)  # a damaged converted directory: one line, before anything starts
    python = find_vllm_python(vllm_python)
    facts = probe(python, _architecture(target_dir))
    device = resolve_device(device, facts)
    dtype = served_dtype(dtype, device)
    draft_dir = None if drafter is None else prepare_drafter(drafter, target_dir, dtype, Path(cache) / "drafters")
    return build_launch(target_dir.resolve(), None if draft_dir is None else draft_dir.resolve(), device=device,
                        dtype=dtype, port=port, facts=facts, extra=extra, python=python, draft_length=draft_length)


def _architecture(target_dir: Path) -> str:
    try:
        return (json.loads((target_dir / "config.json").read_text()).get("architectures") or ["?"])[0]
    except ValueError:
        raise ServeError(f"--target {target_dir}: config.json is not JSON; expected a Hugging Face model directory.") from None
