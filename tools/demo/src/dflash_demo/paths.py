"""Where the bundled demo models are, for an editable install or any other."""

from __future__ import annotations

import os
from pathlib import Path

from dflash_core.errors import DFlashError

ENV_VAR = "DFLASH_DEMO_MODELS"


def default_models_dir() -> Path:
    """$DFLASH_DEMO_MODELS, else the nearest `models/demo` above the working directory, else above this file.

    The last one finds the repository's copy from an editable install; any other install sets the
    variable or passes `--models`.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            candidate = folder / "models" / "demo"
            if (candidate / "target" / "config.json").is_file():
                return candidate
    raise DFlashError(f"no demo models found: set {ENV_VAR} or pass --models DIR (a folder holding target/, "
                      "drafter/ and heldout.jsonl; `make models` builds one).")
