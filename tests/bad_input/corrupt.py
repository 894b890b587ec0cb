"""Corrupt files for bad-input tests: each helper breaks one file in place, so a new test row is one line.

Text: `invalid_utf8`, `binary`, `write_text`; JSON: `edit_json` (DROP deletes a key), `write_json` (any
value, e.g. a list where an object belongs); safetensors: `truncate`, `edit_tensors` with `set_tensor`,
`drop_tensors`, `add_tensor`; data sets: `edit_index`, `rewrite_shard` (new tokens, matching sha256).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.numpy import load_file as load_numpy, save_file as save_numpy
from safetensors.torch import load_file, save_file

DROP = object()


# ---- text -------------------------------------------------------------------------------------------


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def invalid_utf8(path: Path) -> None:
    """A JSONL file whose second line is not UTF-8 (a Latin-1 'é' and a stray continuation byte)."""
    write_bytes(path, b'{"prompt": "def f("}\n{"prompt": "caf\xe9 \xbf"}\n')


def binary(path: Path) -> None:
    """Bytes of a program or an image: NUL bytes, valid UTF-8 by chance."""
    write_bytes(path, b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(1, 100)))


def jsonl(path: Path, *records: Any) -> None:
    write_text(path, "".join(json.dumps(r) + "\n" for r in records))


# ---- JSON -------------------------------------------------------------------------------------------


def write_json(path: Path, value: Any) -> None:
    write_text(path, json.dumps(value))


def edit_json(path: Path, **changes: Any) -> None:
    """Set top-level keys of a JSON object (a value of DROP deletes the key)."""
    raw = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DROP:
            raw.pop(key, None)
        else:
            raw[key] = value
    write_json(path, raw)


# ---- safetensors ------------------------------------------------------------------------------------


def truncate(path: Path, drop_bytes: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:-drop_bytes])


def edit_tensors(path: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def set_tensor(name: str, value: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[dict], None]:
    return lambda tensors: tensors.__setitem__(name, value(tensors[name]))


def drop_tensors(prefix: str) -> Callable[[dict], None]:
    def edit(tensors: dict) -> None:
        for name in [n for n in tensors if n.startswith(prefix)]:
            del tensors[name]

    return edit


def add_tensor(name: str, tensor: torch.Tensor) -> Callable[[dict], None]:
    return lambda tensors: tensors.__setitem__(name, tensor)


# ---- data sets (`dflash data` output) ------------------------------------------------------------------


def edit_index(data: Path, edit: Callable[[dict], Any]) -> None:
    """Apply `edit` to index.json's object in place (what it returns is ignored)."""
    index = json.loads((data / "index.json").read_text())
    edit(index)
    write_json(data / "index.json", index)


def rewrite_shard(data: Path, number: int, tokens: Callable[[np.ndarray], np.ndarray]) -> None:
    """Replace shard `number`'s tokens and record the new sha256, so only its content is wrong."""
    file = data / f"shard-{number:05d}.safetensors"
    arrays = load_numpy(str(file))
    arrays["tokens"] = tokens(arrays["tokens"].copy()).astype(np.int32)
    save_numpy(arrays, str(file))
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    edit_index(data, lambda index: index["shards"][number].__setitem__("sha256", digest))


# ---- what must not change -------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` (links not followed): a file's sha256, a folder's or link's kind."""
    state = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            state[name] = f"link to {path.readlink()}"
        elif path.is_dir():
            state[name] = "folder"
        else:
            state[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state
