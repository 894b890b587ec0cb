"""Resumable training state in safetensors + JSON (never pickle).

A state directory holds `model.safetensors` (trainable weights), `optimizer.safetensors`
(per-parameter optimizer tensors, keyed `state.{param_index}.{name}`) and `state.json`
(step, optimizer hyper-parameters, run metadata). It is written atomically as a whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from dflash_core.errors import CheckpointError
from dflash_core.files.atomic import atomic_directory
from dflash_core.files.text import read_json_object

STATE_FILE = "state.json"


def _optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state_dict = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entries in state_dict["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{name}"] = value.detach().clone().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _optimizer_from_flat(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for index, entries in meta["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    groups = []
    for group in meta["param_groups"]:
        group = dict(group)
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
        groups.append(group)
    return {"state": state, "param_groups": groups}


def save_training_state(
    path: str | Path,
    model_state: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
) -> None:
    """Write the whole training state to `path`, replacing any older state only once complete."""
    opt_tensors, opt_meta = _optimizer_to_flat(optimizer)
    model_state = {k: v.detach().clone().contiguous() for k, v in model_state.items()}
    with atomic_directory(path, overwrite=True) as tmp:
        save_file(model_state, str(tmp / "model.safetensors"))
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / STATE_FILE).write_text(json.dumps({"meta": meta, "optimizer": opt_meta}, indent=2))


def load_training_state(
    path: str | Path, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a state written by `save_training_state`; restores `optimizer` in place if given.

    Returns (model_state, meta).
    """
    path = Path(path)
    record = read_json_object(path / STATE_FILE, CheckpointError, "the state.json `dflash train` writes")
    meta, opt_meta = record.get("meta"), record.get("optimizer")
    if not isinstance(meta, dict) or not isinstance(opt_meta, dict):
        raise CheckpointError(f"{path / STATE_FILE} has no 'meta' and 'optimizer' objects, expected the state.json "
                              "`dflash train` writes.")
    try:
        model_state = load_file(str(path / "model.safetensors"))
        opt_tensors = load_file(str(path / "optimizer.safetensors"))
    except Exception as exc:  # OSError or safetensors' own error type
        raise CheckpointError(f"training state in {path} is unreadable ({' '.join(str(exc).split())}).") from None
    if optimizer is not None:
        try:
            optimizer.load_state_dict(_optimizer_from_flat(opt_tensors, opt_meta))
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            raise CheckpointError(f"training state in {path} holds an optimizer state this run cannot use "
                                  f"({type(exc).__name__}: {exc}).") from None
    return model_state, meta


def has_training_state(path: str | Path) -> bool:
    return (Path(path) / STATE_FILE).is_file()
