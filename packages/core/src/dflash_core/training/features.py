"""Target features computed once and stored, so that training epochs cost only the drafter.

`dflash features` runs the target once over a `dflash data` data set (or several joined, in order) and keeps
the outputs of chosen layers; `dflash train --features DIR` then trains from them without running the target's
layers (what a step still needs of the target, its embedding and LM head, comes from `load_target_pieces`).
This is the offline mode of SpecForge: for a large target on a small machine the forward that `dflash train`
otherwise repeats every epoch costs more than the drafter's step. On disk:

  index.json                 settings (fingerprints of the target and of the data, layer ids, precisions, shard
                             size), the data set's sample count, and per shard: file, samples, tokens, sha256
  features-00000.safetensors features [tokens, layers, H] of samples [k*S, (k+1)*S) of the data set, each
                             sample's tokens in order; offsets [samples + 1] int64

A shard is written atomically, then the index, so an interrupted run resumes at the first shard not written.
A cache made from another target, other data or with other settings is refused in one line. It may keep more
layers than one drafter reads (the reference spacings for 1, 3 and 5 feature layers, say): a run reads the
columns of its own `target_layer_ids`, so feature layers can be compared on one extraction. Features of sample
position p depend on tokens 0..p only (a causal target), so a run that cuts samples to `max_length` reads a
prefix of each. Hard labels only: soft labels need the target's final hidden states, which are not stored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from dflash_core.dtypes import SHORT_NAMES, resolve_dtype
from dflash_core.errors import ConfigError, DataError
from dflash_core.files.atomic import atomic_path, sha256_file, write_json
from dflash_core.target.adapter import TargetModel
from dflash_core.training.data import INDEX_FILE, TokenDataset, data_fingerprint, read_index

FORMAT_VERSION = 1
MAKER = "dflash features"


@dataclass(frozen=True)
class FeatureSettings:
    """What a cache was made from and how; resuming or training from it requires the same."""

    target: str
    """Fingerprint of the target (`target_fingerprint`): features of another target are never mixed in."""
    data: str
    """Fingerprint of the data set (`data_fingerprint`: its shards' sha256 in order)."""
    layer_ids: tuple[int, ...]
    """The target layers kept, ascending (id k: the output of decoder layer k)."""
    compute_dtype: str = "bf16"
    """The precision the target ran in."""
    store_dtype: str = "bf16"
    """The precision the features are stored in."""
    shard_size: int = 64
    """Samples per shard: the unit of resume."""

    def __post_init__(self) -> None:
        ids = tuple(self.layer_ids)
        object.__setattr__(self, "layer_ids", ids)
        if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids) \
                or list(ids) != sorted(set(ids)):
            raise ConfigError(f"feature layer ids are {list(ids)}, expected distinct ascending integers >= 0.")
        for name in ("compute_dtype", "store_dtype"):
            if getattr(self, name) not in SHORT_NAMES:
                raise ConfigError(f"feature setting '{name}' is {getattr(self, name)!r}, expected one of "
                                  f"{', '.join(SHORT_NAMES)}.")
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise ConfigError(f"feature setting 'shard_size' is {self.shard_size!r}, expected an integer >= 1.")

    def to_dict(self) -> dict:
        return asdict(self) | {"layer_ids": list(self.layer_ids)}

    @classmethod
    def from_index(cls, index: dict, path: Path) -> FeatureSettings:
        saved = index.get("settings")
        try:
            if not isinstance(saved, dict):
                raise TypeError("no 'settings' object")
            return cls(**saved)
        except (TypeError, ConfigError) as exc:
            raise DataError(f"{path / INDEX_FILE} holds no valid feature settings ({exc}): expected the index.json "
                            f"`{MAKER}` writes.") from None


def load_or_start_feature_index(out: Path, settings: FeatureSettings, samples: int) -> dict:
    """The index of a cache to resume (same settings, checked), or a fresh one for `samples` samples; creates
    nothing."""
    path = out / INDEX_FILE
    if not path.is_file():
        return {"version": FORMAT_VERSION, "settings": settings.to_dict(), "samples": samples, "shards": []}
    index = read_index(path, MAKER)
    saved = FeatureSettings.from_index(index, out).to_dict()
    differ = [k for k, v in settings.to_dict().items() if saved[k] != v]
    if differ:
        raise DataError(f"{out} already holds features made with other settings ({', '.join(differ)} differ); use "
                        "another --out, or the same target, data and settings to resume.")
    return index


def _padded_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Sample indices grouped by length (longest first) so a group of n rows of at most T tokens has n*T <= batch_tokens
    (a longer sample alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= batch_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def features_of(target: TargetModel, samples: list[np.ndarray], batch_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    """The target's `layer_ids` outputs for every token of `samples`, concatenated: [sum T_i, n_layers, H] in `dtype`.

    Samples run in right-padded groups of at most `batch_tokens` padded tokens; a causal target's features of a
    sample do not depend on the padding after it.
    """
    lengths = [len(s) for s in samples]
    parts: list[torch.Tensor | None] = [None] * len(samples)
    for group in _padded_batches(lengths, batch_tokens):
        width = lengths[group[0]]
        tokens = torch.zeros(len(group), width, dtype=torch.long)
        valid = torch.zeros(len(group), width, dtype=torch.long)
        for row, i in enumerate(group):
            tokens[row, : lengths[i]] = torch.from_numpy(samples[i].astype(np.int64))
            valid[row, : lengths[i]] = 1
        positions = torch.arange(width).expand(len(group), -1)
        out = target.features(tokens.to(target.device), positions.to(target.device), valid.to(target.device))
        out = out.view(len(group), width, len(target.layer_ids), -1).to("cpu", dtype)  # [rows, T, n, H]
        for row, i in enumerate(group):
            parts[i] = out[row, : lengths[i]].clone()
    return torch.cat(parts) if parts else torch.zeros(0)


@torch.inference_mode()
def extract_features(target: TargetModel, data: TokenDataset, out: Path, settings: FeatureSettings, *,
                     batch_tokens: int = 4096, progress: bool = True) -> dict:
    """Store the target's features of every sample of `data` in `out` (resumable shard by shard); the final index.

    `target` must run in `settings.compute_dtype` and be the one `settings.target` names (the caller fingerprints it).
    """
    if settings.data != data_fingerprint(data):
        raise DataError(f"feature settings name data {settings.data}, but the data set given is "
                        f"{data_fingerprint(data)}.")
    target.set_layer_ids(settings.layer_ids)
    index = load_or_start_feature_index(out, settings, len(data))
    size, dtype = settings.shard_size, resolve_dtype(settings.store_dtype)
    start = sum(shard["samples"] for shard in index["shards"])
    bar = tqdm(total=len(data), initial=start, desc="features", unit="sample", dynamic_ncols=True, disable=not progress)
    for first in range(start, len(data), size):
        samples = [s.tokens for s in data.samples[first:first + size]]
        lengths = np.array([len(s) for s in samples])
        arrays = {"features": features_of(target, samples, batch_tokens, dtype),
                  "offsets": torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))}
        name = f"features-{len(index['shards']):05d}.safetensors"
        out.mkdir(parents=True, exist_ok=True)  # only now: a run refused earlier leaves no folder
        with atomic_path(out / name) as tmp:
            save_file(arrays, str(tmp))
        index["shards"].append({"file": name, "samples": len(samples), "tokens": int(lengths.sum()),
                                "sha256": sha256_file(out / name)})
        write_json(out / INDEX_FILE, index)
        bar.update(len(samples))
    bar.close()
    return index


class FeatureCache:
    """A complete feature cache, its shards checked (presence, sha256, shapes); reads one sample's rows at a time
    from the memory-mapped files, so a cache larger than memory trains as well."""

    def __init__(self, path: str | Path, verify: bool = True) -> None:
        self.path = Path(path)
        if not (self.path / INDEX_FILE).is_file():
            raise DataError(f"{self.path} is not a feature cache: {INDEX_FILE} is missing (make one with `{MAKER}`).")
        self.index = read_index(self.path / INDEX_FILE, MAKER)
        self.settings = FeatureSettings.from_index(self.index, self.path)
        done = sum(shard["samples"] for shard in self.index["shards"])
        if done != self.index.get("samples"):
            raise DataError(f"feature cache {self.path} is incomplete ({done} of {self.index.get('samples')} samples): "
                            f"run `{MAKER}` with the same arguments again to finish it.")
        self.handles, self.offsets = [], []
        for shard in self.index["shards"]:
            handle, offsets = self._open_shard(shard, verify)
            self.handles.append(handle)
            self.offsets.append(offsets)

    def _open_shard(self, shard: dict, verify: bool):
        file = self.path / shard["file"]
        if not file.is_file():
            raise DataError(f"feature shard {file} is missing (listed in {INDEX_FILE}).")
        if verify and sha256_file(file) != shard["sha256"]:
            raise DataError(f"feature shard {file} is corrupt (its sha256 differs from the index).")
        try:
            handle = safe_open(str(file), framework="pt")
            offsets = handle.get_tensor("offsets").tolist()
            shape, dtype = handle.get_slice("features").get_shape(), handle.get_slice("features").get_dtype()
        except Exception:
            raise DataError(f"feature shard {file} is corrupt (not a readable safetensors shard).") from None
        want = [shard["tokens"], len(self.settings.layer_ids)]
        if len(offsets) != shard["samples"] + 1 or offsets[0] != 0 or offsets[-1] != shard["tokens"] \
                or list(shape[:2]) != want or len(shape) != 3 or dtype != _header_dtype(self.settings.store_dtype):
            raise DataError(f"feature shard {file} is corrupt (features {list(shape)} {dtype}, expected "
                            f"[{want[0]}, {want[1]}, H] {_header_dtype(self.settings.store_dtype)} with its offsets).")
        return handle, offsets

    def __len__(self) -> int:
        return int(self.index["samples"])

    def check_fits(self, target_fingerprint: str, data: TokenDataset) -> None:
        """Refuse (one line) a cache made from another target or other data than this run's."""
        if self.settings.target != target_fingerprint:
            raise DataError(f"feature cache {self.path} was made from another target (fingerprint "
                            f"{self.settings.target}, this target's {target_fingerprint}): make it again with "
                            f"`{MAKER}` for this target.")
        if self.settings.data != data_fingerprint(data) or len(self) != len(data):
            raise DataError(f"feature cache {self.path} was made from other data (fingerprint {self.settings.data}, "
                            f"the data given {data_fingerprint(data)}): give the --data it was made from, in the same "
                            f"order, or make it again with `{MAKER}`.")

    def columns(self, layer_ids: tuple[int, ...]) -> list[int]:
        """Where each of `layer_ids` sits among the cache's layers; refused in one line if one is not kept."""
        missing = [i for i in layer_ids if i not in self.settings.layer_ids]
        if missing:
            raise ConfigError(f"the drafter reads target layers {list(layer_ids)} but feature cache {self.path} holds "
                              f"layers {list(self.settings.layer_ids)}: make a cache with them (`{MAKER} "
                              f"--target-layer-ids ...`) or choose layers it holds.")
        return [self.settings.layer_ids.index(i) for i in layer_ids]

    def sample(self, i: int, length: int, columns: list[int]) -> torch.Tensor:
        """The first `length` positions of sample i: [length, len(columns) * H]."""
        shard, row = divmod(i, self.settings.shard_size)
        start = self.offsets[shard][row]
        rows = self.handles[shard].get_slice("features")[start:start + length]  # [length, layers, H]
        return rows[:, columns].flatten(1)

    def batch(self, samples: list[int], lengths: list[int], layer_ids: tuple[int, ...]) -> torch.Tensor:
        """Right-padded features of `samples` (each its first `lengths[b]` positions): [B, max(lengths), n*H]."""
        columns = self.columns(layer_ids)
        rows = [self.sample(i, n, columns) for i, n in zip(samples, lengths)]
        out = rows[0].new_zeros(len(rows), max(lengths), rows[0].shape[-1])
        for b, part in enumerate(rows):
            out[b, : len(part)] = part
        return out


def _header_dtype(name: str) -> str:
    """The safetensors header's name of a precision: bf16 -> BF16, fp32 -> F32, fp16 -> F16."""
    return {"bf16": "BF16", "fp32": "F32", "fp16": "F16"}[name]
