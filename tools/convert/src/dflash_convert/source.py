"""Reading SRC: a published-format drafter (directory, weights file, shards + index) or a `dflash train` output."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_core.checkpoint import INDEX_FILE, check_drafter_tensors, load_tensors, weight_files
from dflash_core.config import DFlashConfig
from dflash_core.errors import CheckpointError
from dflash_core.fileio import sha256_files
from dflash_core.training.train_state import STATE_FILE


@dataclass
class Source:
    path: Path
    config: DFlashConfig
    tensors: dict[str, torch.Tensor]  # published names, checked against the config
    sha256: str  # of the config and weight files, in name order

    @property
    def kind(self) -> str:
        return "training state" if (self.path / STATE_FILE).is_file() else "published drafter"


def read_source(path: str | Path) -> Source:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist: expected a drafter directory, weights file or index.")
    if path.is_file() and (path.name.endswith(".index.json") or path.suffix == ".safetensors"):
        directory, weights = path.parent, path.parent if path.name.endswith(".index.json") else path
    else:
        directory, weights = path, path
    if (directory / STATE_FILE).is_file():  # OUT/train_state of `dflash train`: fp32 master weights
        record = json.loads((directory / STATE_FILE).read_text())
        config = DFlashConfig.from_dict(record["meta"]["drafter"], source=str(directory / STATE_FILE))
        files = [directory / "model.safetensors", directory / STATE_FILE]
        weights = directory / "model.safetensors"
    else:
        config = DFlashConfig.from_pretrained(directory)
        files = [directory / "config.json", *weight_files(weights)]
        if (directory / INDEX_FILE).is_file() and weights == directory:
            files.append(directory / INDEX_FILE)
    tensors = check_drafter_tensors(load_tensors(weights), config, str(path))
    return Source(path=directory, config=config, tensors=tensors, sha256=sha256_files(files))


def drafter_from_source(source: Source, dtype: torch.dtype = torch.float32):
    """A torch Drafter holding the source weights (the reference every artefact is checked against)."""
    from dflash_core.drafter import Drafter

    drafter = Drafter(source.config)
    drafter.load_state_dict({k: v.to(torch.float32) for k, v in source.tensors.items()}, strict=True)
    return drafter.to(dtype).eval().requires_grad_(False)
