"""The drafter as one ONNX graph, KV injection included, built from the same `graph` functions.

Inputs (B batch, N new context tokens, Q block, P cached context, L layers, g kv heads, d head_dim):
  noise_embedding  [B, Q, H]        target embedding of [last token, MASK, ...]
  target_hidden    [B, N, n*H]      target features of the N newest context tokens
  position_ids     [B, N + Q]       positions of those N tokens, then of the block
  past_key         [L, B, g, P, d]  context K of every draft layer (P may be 0)
  past_value       [L, B, g, P, d]
  context_valid    [B, P + N]       False on unused / padding context slots
Outputs:
  hidden_states    [B, Q, H]        final-normed (or `logits` [B, Q, V] when exported with the LM head)
  present_key      [L, B, g, P + N, d]
  present_value    [L, B, g, P + N, d]
With P = 0 the graph is the published no-cache forward; with P > 0 it is the decode step.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dflash_core.model import graph
from dflash_core.model.drafter import Drafter
from dflash_core.model.masks import block_attention_mask

INPUTS = ("noise_embedding", "target_hidden", "position_ids", "past_key", "past_value", "context_valid")
DYNAMIC_AXES = {
    "noise_embedding": {0: "batch", 1: "block"},
    "target_hidden": {0: "batch", 1: "new_context"},
    "position_ids": {0: "batch", 1: "new_context_plus_block"},
    "past_key": {1: "batch", 3: "past_context"},
    "past_value": {1: "batch", 3: "past_context"},
    "context_valid": {0: "batch", 1: "context"},
    "hidden_states": {0: "batch", 1: "block"},
    "logits": {0: "batch", 1: "block"},
    "present_key": {1: "batch", 3: "context"},
    "present_value": {1: "batch", 3: "context"},
}
METADATA_KEY = "dflash_config"
GRAPH_FILE = "drafter.onnx"  # the graph's name inside a `dflash-convert --to onnx` directory
OPSET = 17


class DrafterGraph(nn.Module):
    """Exportable wrapper: the cached drafter step with every input explicit."""

    def __init__(self, drafter: Drafter, lm_head: torch.Tensor | None = None) -> None:
        super().__init__()
        self.drafter = drafter
        self.lm_head = None if lm_head is None else nn.Parameter(lm_head.detach().clone(), requires_grad=False)

    def forward(self, noise_embedding, target_hidden, position_ids, past_key, past_value, context_valid):
        d = self.drafter
        w = d.weights()
        batch, new = target_hidden.shape[0], target_hidden.shape[1]
        new_key, new_value = graph.inject_context(w, d.dims, target_hidden, position_ids[:, :new])
        key = torch.cat([past_key, new_key], dim=3)
        value = torch.cat([past_value, new_value], dim=3)
        past_positions = torch.arange(past_key.shape[3], device=position_ids.device).expand(batch, -1)
        key_positions = torch.cat([past_positions, position_ids[:, :new]], dim=1)
        block_positions = position_ids[:, new:]
        masks = {window: block_attention_mask(key_positions, context_valid, block_positions[:, :1],
                                              noise_embedding.shape[1], window)
                 for window in set(d.dims.windows)}
        hidden = graph.draft_forward(w, d.dims, noise_embedding, block_positions, key, value,
                                     [masks[window] for window in d.dims.windows])
        if self.lm_head is not None:
            hidden = F.linear(hidden, self.lm_head)
        return hidden, key, value


def example_inputs(drafter: Drafter, dtype: torch.dtype, batch: int = 2, new: int = 5, block: int | None = None,
                   past: int = 3, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs of the graph's signature (also used to check parity after export)."""
    c = drafter.config
    block = block or c.block_size
    g = torch.Generator().manual_seed(seed)
    kv = (c.num_hidden_layers, batch, c.num_key_value_heads, past, c.head_dim)
    return (
        torch.randn(batch, block, c.hidden_size, generator=g).to(dtype),
        torch.randn(batch, new, c.fc_in_features, generator=g).to(dtype),
        past + torch.arange(new + block).expand(batch, -1).clone(),
        torch.randn(kv, generator=g).to(dtype),
        torch.randn(kv, generator=g).to(dtype),
        torch.ones(batch, past + new, dtype=torch.bool),
    )


def export_onnx(drafter: Drafter, path: str | os.PathLike, *, lm_head: torch.Tensor | None = None,
                dtype: torch.dtype = torch.float32, opset: int = OPSET) -> Path:
    """Trace the drafter graph to `path` (weights inline), with dynamic batch, context and block axes."""
    import onnx

    path = Path(path)
    module = DrafterGraph(drafter.to(dtype).eval(), None if lm_head is None else lm_head.to(dtype)).eval()
    outputs = ["hidden_states" if lm_head is None else "logits", "present_key", "present_value"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example_inputs(drafter, dtype), str(path), input_names=list(INPUTS),
                          output_names=outputs, dynamic_axes={k: DYNAMIC_AXES[k] for k in (*INPUTS, *outputs)},
                          opset_version=opset, dynamo=False, do_constant_folding=True)
    model = onnx.load(str(path))
    meta = model.metadata_props.add()
    meta.key, meta.value = METADATA_KEY, json.dumps(drafter.config.to_dict())
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def read_config_metadata(path: str | os.PathLike) -> dict | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return json.loads(prop.value)
    return None
