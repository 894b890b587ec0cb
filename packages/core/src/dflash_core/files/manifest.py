"""manifest.json of a converted artefact: what made it, from what, and the sha256 of every file.

Written by dflash-convert; checked by the engine plugins before an engine loads the directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from dflash_core.files.atomic import sha256_file

MANIFEST = "manifest.json"


def build_manifest(directory: Path, **fields) -> dict:
    files = {p.relative_to(directory).as_posix(): sha256_file(p)
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != MANIFEST}
    return {**fields, "files": files}


def manifest_problems(directory: str | Path) -> list[str]:
    """Sentences naming every file that is missing or changed since the manifest was written."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{directory / MANIFEST} is missing or unreadable"]
    problems = []
    for name, digest in files.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif sha256_file(path) != digest:
            problems.append(f"{path} changed since dflash-convert wrote it")
    return problems
