"""TensorRT-LLM's DFlash options (`speculative_config` with `decoding_type: DFlash`), built and checked.

Fields as TensorRT-LLM's `DFlashDecodingConfig` (tensorrt_llm/llmapi/llm_args.py) reads them: it is a
strict pydantic model (unknown keys are errors), `max_draft_len` must be in [1, block_size - 1],
`speculative_model` (alias `speculative_model_dir`) is the draft directory, and `target_layer_ids`
/ `mask_token_id` fall back to the draft's `dflash_config.*` when omitted. The captured layers are
0-based decoder-layer outputs concatenated in ascending order, as in the published format.
"""

from __future__ import annotations

from typing import Any

from dflash_core.model.config import DFlashConfig
from dflash_core.errors import ConfigError

# field -> accepted Python types (the subset of DecodingBaseConfig + DFlashDecodingConfig we emit or accept)
SPECULATIVE_FIELDS: dict[str, tuple[type, ...]] = {
    "decoding_type": (str,),
    "max_draft_len": (int,),
    "speculative_model": (str,),
    "speculative_model_dir": (str,),
    "target_layer_ids": (list,),
    "mask_token_id": (int,),
    "attention_backend": (str,),
    "max_concurrency": (int,),
    "use_rejection_sampling": (bool,),
    "load_format": (str,),
}
# top-level LLM-API keys the generated file sets
LLM_FIELDS: dict[str, tuple[type, ...]] = {
    "max_seq_len": (int,),
    "max_batch_size": (int,),
    "max_num_tokens": (int,),
    "speculative_config": (dict,),
}


def dflash_options(config: DFlashConfig, draft_dir: str, *, max_seq_len: int, max_batch_size: int = 8,
                   max_draft_len: int | None = None) -> dict[str, Any]:
    """The `extra_llm_api_options` YAML content for serving with this drafter."""
    draft_len = config.block_size - 1 if max_draft_len is None else max_draft_len
    options = {
        "max_seq_len": max_seq_len,
        "max_batch_size": max_batch_size,
        "max_num_tokens": max(8192, max_batch_size * (1 + draft_len)),
        "speculative_config": {
            "decoding_type": "DFlash",
            "max_draft_len": draft_len,
            "speculative_model": draft_dir,
            "target_layer_ids": list(config.target_layer_ids),
            "mask_token_id": config.mask_token_id,
        },
    }
    validate_options(options, config.block_size)
    return options


def validate_options(options: dict[str, Any], block_size: int | None = None) -> None:
    """Reject what TensorRT-LLM would reject: unknown keys, wrong types, a draft length beyond the block."""
    _check_fields(options, LLM_FIELDS, "options")
    spec = options["speculative_config"]
    _check_fields(spec, SPECULATIVE_FIELDS, "speculative_config")
    if spec.get("decoding_type") != "DFlash":
        raise ConfigError(f"speculative_config.decoding_type is {spec.get('decoding_type')!r}, expected 'DFlash'.")
    if "speculative_model" not in spec and "speculative_model_dir" not in spec:
        raise ConfigError("speculative_config has no speculative_model (the DFlash draft directory).")
    draft_len = spec.get("max_draft_len")
    if not isinstance(draft_len, int) or draft_len < 1:
        raise ConfigError(f"speculative_config.max_draft_len is {draft_len!r}, expected an integer >= 1.")
    if block_size is not None and draft_len > block_size - 1:
        raise ConfigError(
            f"speculative_config.max_draft_len is {draft_len}, expected at most block_size - 1 = {block_size - 1}."
        )
    if options.get("max_num_tokens", 0) < options.get("max_batch_size", 1) * (1 + draft_len):
        raise ConfigError("max_num_tokens must be at least max_batch_size * (1 + max_draft_len).")


def _check_fields(values: dict, allowed: dict[str, tuple[type, ...]], where: str) -> None:
    for key, value in values.items():
        if key not in allowed:
            raise ConfigError(f"{where} has unknown key {key!r}; TensorRT-LLM forbids extra keys.")
        if not isinstance(value, allowed[key]) or (isinstance(value, bool) and bool not in allowed[key]):
            raise ConfigError(f"{where}.{key} is {value!r}, expected {allowed[key][0].__name__}.")


def serve_command(target: str, options_file: str, *, port: int = 8000, tokenizer: str | None = None) -> list[str]:
    """`trtllm-serve` with the options file (`--extra_llm_api_options` works on old and new releases)."""
    command = ["trtllm-serve", target, "--backend", "pytorch", "--port", str(port),
               "--extra_llm_api_options", options_file]
    if tokenizer:
        command += ["--tokenizer", tokenizer]
    return command

