"""The published drafter layout both engines read: tensor table, weights, optional tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from dflash_core.model.drafter import load_drafter
from dflash_core.errors import CheckpointError
from dflash_core.files.atomic import write_json

from ..errors import VerificationFailed
from ..output import map_tensors, save_weights
from ..source import without_remote_code
from . import Job, mask_token_added

# SGLang and TensorRT-LLM both load the published names (they fuse q/k/v and gate/up themselves);
# an optional `model.` prefix has already been stripped when the source was read.
TENSOR_TABLE = [
    (r"fc\.weight", r"fc.weight", None),
    (r"(hidden_norm|norm)\.weight", r"\1.weight", None),
    (r"layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight", r"layers.\1.\2.weight", None),
    (r"layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)\.weight", r"layers.\1.self_attn.\2.weight",
     None),
    (r"layers\.(\d+)\.mlp\.(gate_proj|up_proj|down_proj)\.weight", r"layers.\1.mlp.\2.weight", None),
]


def write_published(job: Job, tmp: Path, desc: str) -> list[str]:
    """Weights (converted to job.dtype) and the updated tokenizer when the mask token was added."""
    save_weights(tmp / "model.safetensors", map_tensors(TENSOR_TABLE, job.source.tensors, job.dtype, desc))
    lines = [f"model.safetensors: {len(job.source.tensors)} tensors in {job.dtype}"]
    if mask_token_added(job):
        job.target.tokenizer.save_pretrained(tmp / "tokenizer")
        settings = tmp / "tokenizer" / "tokenizer_config.json"  # keeps the target's auto_map otherwise
        if settings.is_file():
            write_json(settings, without_remote_code(json.loads(settings.read_text(encoding="utf-8"))))
        lines.append(f"tokenizer/: the target's tokenizer with <|MASK|> added as id {job.source.config.mask_token_id}")
    return lines


def verify_round_trip(job: Job, tmp: Path) -> None:
    """The written directory loads with dflash_core and holds exactly the converted source weights."""
    try:
        again = load_drafter(tmp)
    except CheckpointError as exc:
        raise VerificationFailed(f"the written drafter does not load back: {exc}") from None
    for name, tensor in again.state_dict().items():
        if not (tensor.cpu() == job.source.tensors[name].to(tensor.dtype)).all():
            raise VerificationFailed(f"tensor '{name}' changed in conversion")
