"""Reading SRC: a published-format drafter (directory, weights file, shards + index) or a `dflash train` output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from dflash_core.model.checkpoint import INDEX_FILE, check_drafter_tensors, load_tensors, weight_files
from dflash_core.model.config import DFlashConfig
from dflash_core.errors import CheckpointError
from dflash_core.files.atomic import sha256_files
from dflash_core.files.text import read_json_object
from dflash_core.training.train_state import STATE_FILE

# Deployable outputs never ask an engine to run code from the checkpoint: the published format needs neither key.
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code")


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
    directory, weights = source_location(path)
    if (directory / STATE_FILE).is_file():  # OUT/train_state of `dflash train`: fp32 master weights
        config = read_state_config(directory / STATE_FILE)
        files = [directory / "model.safetensors", directory / STATE_FILE]
        weights = directory / "model.safetensors"
    else:
        config = DFlashConfig.from_pretrained(directory)
        files = [directory / "config.json", *weight_files(weights)]
        if (directory / INDEX_FILE).is_file() and weights == directory:
            files.append(directory / INDEX_FILE)
    tensors = check_drafter_tensors(load_tensors(weights), config, str(path))  # names, shapes, dtypes, finite
    config = config.replace(extra=without_remote_code(config.extra))
    return Source(path=directory, config=config, tensors=tensors, sha256=sha256_files(files))


def source_location(path: Path) -> tuple[Path, Path]:
    """(the directory SRC's config is read from, what its weights are loaded from)."""
    if path.is_file() and (path.name.endswith(".index.json") or path.suffix == ".safetensors"):
        return path.parent, path.parent if path.name.endswith(".index.json") else path
    return path, path


def read_state_config(file: Path) -> DFlashConfig:
    """The drafter config a `dflash train` state.json keeps under meta.drafter."""
    meta = read_json_object(file, CheckpointError, "the state.json `dflash train` writes").get("meta")
    drafter = meta.get("drafter") if isinstance(meta, dict) else None
    if not isinstance(drafter, dict):
        raise CheckpointError(f"{file} has no meta.drafter object (the drafter config): expected the state.json "
                              "`dflash train` writes.")
    return DFlashConfig.from_dict(drafter, source=f"{file} meta.drafter")


def without_remote_code(value: Any) -> Any:
    """`value` with every auto_map / trust_remote_code key removed, at any depth of nested objects."""
    if isinstance(value, Mapping):
        return {k: without_remote_code(v) for k, v in value.items() if k not in REMOTE_CODE_KEYS}
    return value


def drafter_from_source(source: Source, dtype: torch.dtype = torch.float32):
    """A torch Drafter holding the source weights (the reference every artefact is checked against)."""
    from dflash_core.model.drafter import Drafter

    drafter = Drafter(source.config)
    drafter.load_state_dict({k: v.to(torch.float32) for k, v in source.tensors.items()}, strict=True)
    return drafter.to(dtype).eval().requires_grad_(False)
