"""Writing outputs: a staged directory renamed into place, a progress bar over tensors, a manifest."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from dflash_core.dtypes import resolve_dtype
from dflash_core.errors import CheckpointError
from dflash_core.files.atomic import write_json
from dflash_core.files.manifest import MANIFEST, build_manifest

from . import __version__

# A declarative tensor table: (source-name regex, destination template, transform or None).
TensorRule = tuple[str, str, Callable[[torch.Tensor], torch.Tensor] | None]


def map_tensors(table: Sequence[TensorRule], tensors: dict[str, torch.Tensor], dtype: str,
                desc: str) -> dict[str, torch.Tensor]:
    """Apply the first matching rule to every tensor (progress bar over tensors); unmatched names are errors."""
    out: dict[str, torch.Tensor] = {}
    torch_dtype = resolve_dtype(dtype)
    for name in tqdm(sorted(tensors), desc=desc, unit="tensor", dynamic_ncols=True, leave=False):
        for pattern, template, transform in table:
            match = re.fullmatch(pattern, name)
            if match:
                tensor = transform(tensors[name]) if transform else tensors[name]
                out[match.expand(template)] = tensor.to(torch_dtype).contiguous()
                break
        else:
            raise CheckpointError(f"no conversion rule for tensor '{name}'")
    return out


def save_weights(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_manifest(directory: Path, *, target: str, source, options: dict) -> dict:
    """manifest.json: tool and version, source and its hash, options, and every file's sha256."""
    manifest = build_manifest(directory, tool="dflash-convert", version=__version__, target=target,
                              source={"path": str(source.path), "kind": source.kind, "sha256": source.sha256},
                              options=options)
    write_json(directory / MANIFEST, manifest)
    return manifest


def shell_line(command: Sequence[str]) -> str:
    """One shell line; a `"$VAR..."` placeholder argument stays expandable."""
    import shlex

    return " ".join(part if part.startswith('"$') else shlex.quote(part) for part in command)


def write_launcher(path: Path, command: Sequence[str]) -> None:
    path.write_text("#!/usr/bin/env bash\n# Written by dflash-convert; extra arguments are passed through.\n"
                    f"set -euo pipefail\nexec {shell_line(command)} \"$@\"\n")
    path.chmod(0o755)
