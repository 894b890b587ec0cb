"""The drafter directory an engine loads: a `dflash-convert --to ENGINE` output, checked or made in a cache.

Inputs are never modified: a drafter that is not already converted for the engine is converted into
a cache directory of its own, keyed by the drafter's content and the served dtype.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

from dflash_core.errors import DFlashError
from dflash_core.files.atomic import sha256_files
from dflash_core.files.manifest import MANIFEST

from .launch import ServeError


def converted_for(directory: Path) -> str | None:
    """The engine a `dflash-convert` output was written for (its manifest's target), else None."""
    try:
        return json.loads((directory / MANIFEST).read_text()).get("target")
    except (OSError, ValueError, AttributeError):
        return None


def prepare_drafter(drafter: str | Path, target: Path, dtype: str, cache: Path, *, to: str, engine: str,
                    check: Callable[[Path], object]) -> Path:
    """A draft directory for the engine: `drafter` itself if already converted (check raises if damaged),
    else a cached `dflash-convert --to {to}` of it (a damaged cache entry of ours is written again)."""
    from dflash_core.dtypes import short_name

    drafter = Path(drafter)
    if not drafter.is_dir():
        state = "does not exist" if not drafter.exists() else "is not a directory"
        raise ServeError(f"--drafter {drafter} {state}; expected a DFlash drafter directory.")
    if converted_for(drafter) == to:
        check(drafter)
        return drafter
    files = sorted(p for p in drafter.iterdir()
                   if p.is_file() and (p.suffix == ".safetensors" or p.name == "config.json"))
    if not any(p.suffix == ".safetensors" for p in files):
        raise ServeError(f"--drafter {drafter} holds no *.safetensors weights; expected a DFlash drafter directory.")
    out = cache / f"{drafter.resolve().name}-{dtype}-{sha256_files(files)[:12]}"
    if converted_for(out) == to:
        try:
            check(out)
            return out
        except DFlashError:
            pass  # our own cache entry, damaged: written again below
    done = subprocess.run([sys.executable, "-m", "dflash_convert", str(drafter), "--to", to, "--out", str(out),
                           "--dtype", short_name(dtype), "--target-model", str(target), "--force"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise ServeError(f"could not convert --drafter {drafter} for {engine}: {last}")
    return out
