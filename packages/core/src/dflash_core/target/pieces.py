"""The target's frozen pieces a drafter shares, without its layers: input embedding and LM head.

Training from stored features (`dflash_core.training.features`) never runs the target's decoder layers; a
step still embeds its blocks with the target's embedding and scores them with its LM head. `load_target_pieces`
reads just those two tensors from the target's safetensors (for Qwen2.5-Coder-1.5B 2 x 467 MB in bf16 against
3.6 GB for the whole model) and returns a `TargetPieces`: a `TargetModel` whose forward is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from dflash_core.devices import check_device
from dflash_core.dtypes import resolve_dtype
from dflash_core.errors import CompatibilityError
from dflash_core.model.checkpoint import all_finite, weight_files
from dflash_core.target.adapter import TargetModel
from dflash_core.target.checks import first_line, read_target_config, read_target_headers

EMBEDDING = "model.embed_tokens.weight"
HEAD = "lm_head.weight"


class _Shell(nn.Module):
    """What `TargetModel` reads of a causal LM: model.embed_tokens, model.layers (none here), lm_head, config."""

    def __init__(self, config, embedding: torch.Tensor, head: torch.Tensor | None) -> None:
        super().__init__()
        self.config = config
        self.model = nn.Module()
        self.model.config = config
        self.model.embed_tokens = nn.Embedding(*embedding.shape, _weight=embedding, _freeze=True)
        self.model.layers = nn.ModuleList()
        self.lm_head = nn.Linear(embedding.shape[1], embedding.shape[0], bias=False, device="meta")  # no [V, H] init
        tied = head is None
        self.lm_head.weight = self.model.embed_tokens.weight if tied else nn.Parameter(head, requires_grad=False)


class TargetPieces(TargetModel):
    """A target's embedding and LM head with its config: everything of `TargetModel` but the forward."""

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    def forward(self, *args, **kwargs):
        raise CompatibilityError("this target holds only its embedding and LM head (loaded for training from stored "
                                 "features): its layers cannot run; load the whole target instead.")

    __call__ = forward

    def features(self, *args, **kwargs):
        return self.forward()


def load_target_pieces(path: str | os.PathLike, dtype: str | torch.dtype = "bf16",
                       device: str | torch.device = "cpu") -> TargetPieces:
    """The embedding and LM head of a Hugging Face causal LM directory (safetensors only), in `dtype` on `device`.

    A tied head (`tie_word_embeddings`, or no lm_head tensor) is the embedding itself. Refused with one line: a
    directory without config or weights, a missing embedding, shapes that disagree with the config, NaN or inf.
    """
    path = Path(path)
    device = check_device(device)
    raw = read_target_config(path)
    headers = read_target_headers(path)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception as exc:  # transformers raises many types; one line naming the directory
        raise CompatibilityError(f"cannot read the target's config{first_line(exc, path)}") from None
    if EMBEDDING not in headers:
        raise CompatibilityError(f"target {path} has no tensor '{EMBEDDING}': expected a causal LM's input embedding.")
    tied = raw.get("tie_word_embeddings", False) or HEAD not in headers
    tensors = {}
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in (EMBEDDING, HEAD):
                if name in handle.keys() and not (name == HEAD and tied):
                    tensors[name] = handle.get_tensor(name).to(resolve_dtype(dtype))
    embedding, head = tensors[EMBEDDING], tensors.get(HEAD)
    for name, tensor in tensors.items():
        if tensor.dim() != 2 or tensor.shape != embedding.shape or tensor.shape[1] != config.hidden_size:
            raise CompatibilityError(f"target {path}: tensor '{name}' has shape {list(tensor.shape)}, expected "
                                     f"[vocabulary, {config.hidden_size}] like the embedding {list(embedding.shape)}.")
        if not all_finite(tensor):
            raise CompatibilityError(f"target {path}: tensor '{name}' holds NaN or infinite values, "
                                     "expected finite weights.")
    return TargetPieces(_Shell(config, embedding, head).to(device).eval())
