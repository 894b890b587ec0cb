"""A drafter that runs the exported ONNX graph with ONNX Runtime, inside the same lossless loop.

It implements `DrafterBackend`. Context features of accepted tokens are held back (in this
backend's own `OrtDraftState`) until the next draft, where the graph projects them (KV injection)
and returns them as `present_*`; the new entries are then appended to an ordinary `DraftKVCache`,
so ragged batches work exactly as with torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from dflash_core.model.config import DFlashConfig
from dflash_core.model.draft_cache import DraftKVCache
from dflash_core.errors import CheckpointError, CompatibilityError
from dflash_core.model.onnx_export import GRAPH_FILE, read_config_metadata
from dflash_core.sampling.tokens import greedy_tokens

_NUMPY_TO_TORCH = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16}


class OrtDraftState:
    """Context K/V of the accepted tokens, plus features not yet projected (the graph does that)."""

    def __init__(self, kv: DraftKVCache) -> None:
        self.kv = kv
        self.pending: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None  # features, positions, counts

    def hold(self, features: torch.Tensor, positions: torch.Tensor, counts: list[int]) -> None:
        """Queue features [B, n, F] at positions [B, n] (row b: its first counts[b]) behind those held."""
        if self.pending is None:
            self.pending = (features, positions, counts)
            return
        held_f, held_p, held_c = self.pending
        total = [a + b for a, b in zip(held_c, counts)]
        merged_f = features.new_zeros(features.shape[0], max(total), features.shape[2])
        merged_p = positions.new_zeros(positions.shape[0], max(total))
        for row, (a, b) in enumerate(zip(held_c, counts)):  # pack each row's valid entries to the left
            merged_f[row, :a], merged_f[row, a:a + b] = held_f[row, :a], features[row, :b]
            merged_p[row, :a], merged_p[row, a:a + b] = held_p[row, :a], positions[row, :b]
        self.pending = (merged_f, merged_p, total)

    def take_pending(self) -> tuple[torch.Tensor, torch.Tensor, list[int]] | None:
        pending, self.pending = self.pending, None
        return pending

    def select_rows(self, rows: list[int]) -> None:
        if self.pending is not None:
            features, positions, counts = self.pending
            self.pending = (features[rows], positions[rows], [counts[r] for r in rows])
        self.kv.select_rows(rows)


def load_onnx_drafter(path: str | os.PathLike, threads: int = 0,
                      providers: list[str] | None = None) -> "OnnxRuntimeDrafter":
    """An exported drafter: a .onnx file (config in its metadata) or a directory holding drafter.onnx."""
    import onnxruntime as ort

    path = Path(path)
    file = path / GRAPH_FILE if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"{file} does not exist: expected an ONNX drafter (dflash-convert --to onnx).")
    try:
        raw = read_config_metadata(file)
    except Exception:  # protobuf's DecodeError and friends: not an ONNX model at all
        raise CheckpointError(f"{file} is not a readable ONNX model.") from None
    if raw is not None:
        config = DFlashConfig.from_dict(raw, source=str(file))
    elif (file.parent / "config.json").is_file():
        config = DFlashConfig.from_pretrained(file.parent)
    else:
        raise CheckpointError(f"{file} carries no DFlash config in its metadata and has no config.json beside it.")
    options = ort.SessionOptions()
    # The target's torch forward runs on the same cores right after every draft call; ORT's workers
    # would otherwise spin-wait for more work and steal them (measured: 2x slower decoding).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(file), options, providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise CheckpointError(f"{file} cannot be loaded by ONNX Runtime ({str(exc).splitlines()[0]}).") from None
    return OnnxRuntimeDrafter(session, config)


class OnnxRuntimeDrafter:
    def __init__(self, session, config: DFlashConfig) -> None:
        self.session, self.config = session, config
        inputs = {i.name: i for i in session.get_inputs()}
        self.dtype = _NUMPY_TO_TORCH.get(inputs["noise_embedding"].type, torch.float32)
        self.has_lm_head = session.get_outputs()[0].name == "logits"
        self.device = torch.device("cpu")

    def check_runtime(self, target) -> None:
        if target.device.type != "cpu":
            raise CompatibilityError(f"the ONNX Runtime drafter runs on the CPU but the target is on {target.device}.")

    def new_cache(self, batch: int, capacity: int) -> OrtDraftState:
        c = self.config
        return OrtDraftState(DraftKVCache(c.num_hidden_layers, batch, c.num_key_value_heads, c.head_dim, capacity,
                                          "cpu", self.dtype))

    def extend_cache(self, cache: OrtDraftState, target_hidden: torch.Tensor, positions: torch.Tensor,
                     counts: list[int]) -> None:
        """Hold the accepted tokens' features; the next `propose` projects them in-graph."""
        cache.hold(target_hidden.to(self.dtype), positions, counts)

    def propose(self, cache: OrtDraftState, noise_embedding: torch.Tensor, block_positions: torch.Tensor,
                read_out, num_drafts: int | None = None) -> torch.Tensor:
        kv = cache.kv
        features, positions, counts = cache.take_pending() or (
            noise_embedding.new_zeros(noise_embedding.shape[0], 0, self.config.fc_in_features).to(self.dtype),
            block_positions[:, :0], [0] * noise_embedding.shape[0])
        past_key, past_value = kv.context()
        new = features.shape[1]
        new_valid = torch.arange(new)[None, :] < torch.tensor(counts)[:, None]
        feeds = {
            "noise_embedding": _np(noise_embedding.to(self.dtype)),
            "target_hidden": _np(features),
            "position_ids": _np(torch.cat([positions, block_positions], dim=1).long()),
            "past_key": _np(past_key),
            "past_value": _np(past_value),
            "context_valid": _np(torch.cat([kv.valid(), new_valid], dim=1)),
        }
        out, present_key, present_value = self.session.run(None, feeds)
        start = past_key.shape[3]
        kv.append(torch.from_numpy(present_key[:, :, :, start:]), torch.from_numpy(present_value[:, :, :, start:]),
                     counts)
        end = out.shape[1] if num_drafts is None else 1 + num_drafts
        out = torch.from_numpy(out[:, 1:end])
        if self.has_lm_head:  # the graph read out over the whole vocabulary itself
            return greedy_tokens(out).to(noise_embedding.device)
        return read_out(out.to(noise_embedding.dtype)).to(noise_embedding.device)


def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().contiguous().cpu().numpy()
