"""`dflash serve --engine sglang`: the real `sglang.launch_server` with DFLASH, on a GPU or (patched) on the CPU.

The CLI (`dflash_cli.serve`) is a thin layer over `serve`; everything that knows SGLang lives here.
"""

from __future__ import annotations

from pathlib import Path

from dflash_serving.supervise import serve_launch

from .preflight import check_draft_dir
from .serving import (Launch, build_launch, check_target, find_sglang_python, is_sglang_draft_dir, prepare_drafter,
                      probe, resolve_device, served_dtype)

DEFAULT_CACHE = Path("runs") / "sglang-serve"  # converted drafters and server logs (relative to the caller's cwd)
# SGLang has no CPU kernel for DFLASH's sampling verify (kernels/ops/speculative/verify_sampling.py: None
# off CUDA/MUSA/NPU), so its worker verifies every request greedily there (dflash_worker_v2.py, the else branch)
CPU_SAMPLING_NOTE = ("on the CPU SGLang verifies drafts greedily for every request (it has no CPU sampling "
                     "kernel): temperature 0 is served exactly; temperature > 0 is not a sample of the target.")


def serve(target: str, drafter: str, *, port: int = 30000, device: str = "auto", dtype: str = "auto",
          print_command: bool = False, sglang_python: str | None = None, extra: list[str] | None = None,
          cache: Path = DEFAULT_CACHE, log: Path | None = None, timeout: float = 900) -> int:
    """Serve `target` with `drafter` through SGLang's native DFLASH until Ctrl-C; 0 on a clean stop.

    Bad input raises DFlashError (one line) before SGLang starts; a server that dies raises
    dflash_serving.supervise.ServerDied with SGLang's last error line.
    """
    launch = launch_for(target, drafter, port=port, device=device, dtype=dtype, sglang_python=sglang_python,
                        extra=extra, cache=cache)
    notes = [CPU_SAMPLING_NOTE] if launch.device == "cpu" else []
    return serve_launch(launch, cache, notes=notes, print_command=print_command, log=log, timeout=timeout)


def launch_for(target: str | Path, drafter: str | Path | None, *, port: int = 30000, device: str = "auto",
               dtype: str = "auto", sglang_python: str | None = None, extra: list[str] | None = None,
               cache: Path = DEFAULT_CACHE) -> Launch:
    """The launch `serve` runs, after every check (a converted drafter cached under `cache`/drafters);
    `drafter` None: the same server without speculative decoding (the plain baseline of `dflash bench serve`)."""
    target_dir = check_target(target)
    if drafter is not None and is_sglang_draft_dir(Path(drafter)):
        check_draft_dir(drafter)  # a damaged converted directory: one line, before anything starts
    python = find_sglang_python(sglang_python)
    facts = probe(python)
    device = resolve_device(device, facts)
    dtype = served_dtype(dtype, device)
    draft_dir = None if drafter is None else prepare_drafter(drafter, target_dir, dtype, Path(cache) / "drafters")
    return build_launch(target_dir.resolve(), None if draft_dir is None else draft_dir.resolve(), device=device,
                        dtype=dtype, port=port, facts=facts, extra=extra, python=python)
