"""What SGLang 0.5.23's native DFLASH needs in a draft directory, and how to launch it.

Facts from SGLang's source (srt/models/dflash.py, srt/speculative/dflash_utils.py,
srt/arg_groups/speculative_hook.py):
- config.json is parsed by transformers' Qwen3Config (`model_type: qwen3`), so every dimension must
  be written out (Qwen3Config would otherwise default head_dim to 128, ...);
- `architectures` must be ["DFlashDraftModel"];
- block size: `dflash_config.block_size`, then top-level `block_size` (default 16);
- `dflash_config.target_layer_ids` must be present (drafts of 2-3 layers cannot default them), and
  SGLang captures "before layer k+1", so the target's last layer cannot be a feature layer;
- sliding layers need `use_sliding_window: true`, and SGLang makes them causal unless `is_causal`
  says otherwise — DFlash blocks are bidirectional, so `is_causal: false` is written;
- weights: published names (q/k/v and gate/up unfused, with or without `model.`) in top-level
  *.safetensors; no tokenizer (the target's is used, `--tokenizer-path` overrides it);
- `dtype` decides the served precision (float32 is downcast to float16), so bf16 is written.
"""

from __future__ import annotations

from typing import Any

from dflash_core.model.config import DFlashConfig
from dflash_core.dtypes import config_name
from dflash_core.errors import CompatibilityError

SGLANG_VERSION = "0.5.23"
DEFAULT_DTYPE = "bf16"  # SGLang downcasts float32 drafters to float16; bf16 is what it serves DFlash in


def sglang_config(config: DFlashConfig, dtype: str) -> dict[str, Any]:
    """The config.json SGLang's DFlashDraftModel reads, from a DFlashConfig (dtype: 'bf16', 'bfloat16', ...)."""
    dtype = config_name(dtype)
    raw = config.replace(dtype=dtype).to_dict()
    raw["dflash_config"]["block_size"] = config.block_size
    raw["torch_dtype"] = dtype
    if config.layer_types is not None and "sliding_attention" in config.layer_types:
        raw["is_causal"] = False  # SGLang defaults sliding layers to causal; DFlash blocks are not
    return raw


def check_capturable(config: DFlashConfig, target_layers: int | None) -> None:
    """SGLang captures features 'before layer k+1': layer L-1 has no such point."""
    layers = target_layers or config.num_target_layers
    if layers is not None and layers - 1 in config.target_layer_ids:
        raise CompatibilityError(
            f"target_layer_ids {list(config.target_layer_ids)} include the target's last layer ({layers - 1}), "
            "which SGLang cannot capture (it hooks the input of layer k+1)."
        )


def launch_command(target: str, draft_dir: str | None, config: DFlashConfig | None, *, tokenizer: str | None = None,
                   dtype: str = DEFAULT_DTYPE, port: int = 30000, extra: list[str] | None = None) -> list[str]:
    """`python -m sglang.launch_server ...` serving `target` with this drafter through native DFLASH; with no
    drafter (`draft_dir` and `config` None), the same server decoding plainly (a benchmark's baseline)."""
    command = ["python", "-m", "sglang.launch_server", "--model-path", target]
    if draft_dir is not None and config is not None:
        command += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft_dir,
                    "--speculative-num-draft-tokens", str(config.block_size)]
    command += ["--dtype", config_name(dtype), "--port", str(port)]
    if tokenizer:
        command += ["--tokenizer-path", tokenizer]
    return command + list(extra or [])

