"""Drafter weights in safetensors: single file or shards + index, validated before use.

Reading checks the safetensors header by hand first, so a corrupt header or a truncated file gives
one sentence naming the file (not a Rust panic), then checks every tensor name and shape against
the config. Nothing here ever unpickles.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Iterable, Mapping

import torch
from safetensors.torch import load_file, save_file

from dflash_core.model.config import DFlashConfig
from dflash_core.errors import CheckpointError
from dflash_core.files.atomic import atomic_path, write_json

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_HEADER_LIMIT = 100 * 1024 * 1024
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
                "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
# the precisions a drafter's (and an unquantised target's) weights may be stored in
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEADER_WEIGHT_DTYPES = ("F32", "BF16", "F16")


def drafter_tensor_shapes(config: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a published-format drafter holds (no embedding, no lm_head)."""
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, config.fc_in_features),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for n in range(config.num_hidden_layers):
        p = f"layers.{n}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (config.q_size, h),
            p + "self_attn.k_proj.weight": (config.kv_size, h),
            p + "self_attn.v_proj.weight": (config.kv_size, h),
            p + "self_attn.o_proj.weight": (h, config.q_size),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return shapes


def read_header(path: Path) -> dict[str, dict]:
    """Parse and check a safetensors header: every tensor must lie inside the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path} is truncated: {size} bytes, too short for a safetensors header.")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(size - 8, _HEADER_LIMIT):
                raise CheckpointError(
                    f"{path} has a corrupt safetensors header: it declares {length} header bytes but the file "
                    f"holds {size} bytes."
                )
            header = json.loads(handle.read(length))
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror}).") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path} has a corrupt safetensors header (not valid JSON).") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header (expected a JSON object).")
    data_bytes = size - 8 - length
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, info in tensors.items():
        _check_entry(path, name, info, data_bytes)
    return tensors


def _check_entry(path: Path, name: str, info: object, data_bytes: int) -> None:
    try:
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]  # type: ignore[index]
        numel = 1
        for dim in shape:
            numel *= int(dim)
        expected = numel * _DTYPE_BYTES[dtype]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path} has a corrupt safetensors header (bad entry for tensor '{name}').") from None
    if end - begin != expected or begin < 0:
        raise CheckpointError(f"{path} has a corrupt safetensors header (tensor '{name}' has inconsistent offsets).")
    if end > data_bytes:
        raise CheckpointError(
            f"{path} is truncated: tensor '{name}' needs {end} data bytes but the file holds {data_bytes}."
        )


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: a file, a directory's single file, or its index's shards."""
    if path.is_file():
        return [path]
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index} is not a valid index (expected a JSON object with 'weight_map').") from None
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shard '{missing[0]}', which does not exist in {path}.")
        return [path / n for n in names]
    single = path / WEIGHTS_FILE
    if single.is_file():
        return [single]
    if path.is_dir() and (any(path.glob("*.bin")) or any(path.glob("*.pt"))):
        raise CheckpointError(
            f"{path} holds only pickle weights (.bin/.pt); expected {WEIGHTS_FILE} (safetensors, never pickle)."
        )
    if not path.exists():
        raise CheckpointError(f"{path} does not exist: expected a drafter directory or a safetensors file.")
    raise CheckpointError(f"{path} has no {WEIGHTS_FILE} and no {INDEX_FILE}: expected drafter weights.")


def load_tensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint (file, directory, or shards), headers checked first."""
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(Path(path)):
        read_header(file)
        try:
            part = load_file(str(file))
        except Exception as exc:  # safetensors raises its own error types; name the file instead
            raise CheckpointError(f"{file} cannot be loaded as safetensors ({exc}).") from None
        duplicated = set(part) & set(tensors)
        if duplicated:
            raise CheckpointError(f"{file} repeats tensor '{sorted(duplicated)[0]}' found in another shard.")
        tensors.update(part)
    return tensors


def check_drafter_tensors(
    tensors: Mapping[str, torch.Tensor], config: DFlashConfig, source: str
) -> dict[str, torch.Tensor]:
    """Strip an optional `model.` prefix and check names and shapes against the config."""
    named = {(k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}
    expected = drafter_tensor_shapes(config)
    for name, shape in expected.items():
        if name not in named:
            raise CheckpointError(f"{source} is missing tensor '{name}' (expected shape {list(shape)}).")
        if tuple(named[name].shape) != shape:
            hint = ""
            if name == "fc.weight":
                hint = (f" = [hidden_size, len(target_layer_ids) * hidden_size] for "
                        f"{config.num_feature_layers} target layers")
            raise CheckpointError(
                f"{source}: tensor '{name}' has shape {list(named[name].shape)}, expected {list(shape)}{hint}."
            )
    unexpected = sorted(set(named) - set(expected))
    if unexpected:
        raise CheckpointError(
            f"{source} holds unexpected tensor '{unexpected[0]}' (a DFlash drafter has no embedding, lm_head "
            "or other extra weights)."
        )
    return check_weight_values(named, source)


def check_weight_values(tensors: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Weights are fp32, bf16 or fp16 and finite: an int, fp8 or NaN drafter would decode garbage silently."""
    for name, tensor in tensors.items():
        if tensor.dtype not in WEIGHT_DTYPES:
            raise CheckpointError(f"{source}: tensor '{name}' has dtype {str(tensor.dtype).removeprefix('torch.')}, "
                                  "expected float32, bfloat16 or float16.")
        if not all_finite(tensor):
            raise CheckpointError(f"{source}: tensor '{name}' holds NaN or infinite values, expected finite weights.")
    return dict(tensors)


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or inf: NaN propagates through min/max, so one vectorised aminmax pass decides (~25x isfinite on CPU)."""
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor.detach())
    return bool(torch.isfinite(low) & torch.isfinite(high))


def save_tensors(
    directory: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    *,
    max_shard_bytes: int | None = None,
    metadata: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write tensors as one file, or as shards + index when `max_shard_bytes` splits them; atomic per file."""
    directory = Path(directory)
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    shards = _plan_shards(tensors, max_shard_bytes)
    meta = {"format": "pt", **(metadata or {})}
    written = []
    if len(shards) == 1:
        written.append(_save_file(directory / WEIGHTS_FILE, tensors, meta))
        (directory / INDEX_FILE).unlink(missing_ok=True)
        return written
    weight_map = {}
    for n, names in enumerate(shards, start=1):
        file = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        written.append(_save_file(directory / file, {k: tensors[k] for k in names}, meta))
        weight_map |= {k: file for k in names}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    written.append(directory / INDEX_FILE)
    (directory / WEIGHTS_FILE).unlink(missing_ok=True)
    return written


def _plan_shards(tensors: Mapping[str, torch.Tensor], max_bytes: int | None) -> list[list[str]]:
    if not max_bytes:
        return [list(tensors)]
    shards: list[list[str]] = [[]]
    used = 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def _save_file(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Path:
    with atomic_path(path) as tmp:
        save_file(dict(tensors), str(tmp), metadata=dict(metadata))
    return path


def iter_weight_names(path: str | os.PathLike) -> Iterable[str]:
    for file in weight_files(Path(path)):
        yield from read_header(file)
