"""What vLLM 0.32's native DFlash reads from a draft directory, and how to launch it.

Facts from vLLM's source (model_executor/models/qwen3_dflash.py, config/speculative.py,
v1/worker/gpu/spec_decode/eagle/eagle3_utils.py, model_executor/models/qwen2.py):
- the method must be named: `--speculative-config '{"method": "dflash", "model": DIR, ...}'` (vLLM
  guesses "dflash" only from a path containing the word);
- `architectures: ["DFlashDraftModel"]` maps to DFlashQwen3ForCausalLM, config parsed as Qwen3Config;
- `dflash_config.target_layer_ids`: vLLM adds 1 itself and the target captures "after layer idx"
  (aux index idx + 1, in layer order), so id k is the output of layer k, the last layer included,
  and the features are concatenated in layer order (ids must ascend, which DFlashConfig checks);
- `dflash_config.mask_token_id` (or top-level `mask_token_id`);
- `fc` input = (target_hidden_size or hidden_size) * len(target_layer_ids): the drafter's hidden
  size must be the target's;
- `block_size` is ignored: the draft length is `num_speculative_tokens`, given block - 1 here (a
  shorter one changes the block the drafter sees, bidirectional within it; the plugin's `drafting` fix
  keeps the block whole when a step schedules fewer drafts);
- drafts are the drafter's argmax unless `draft_sample_method` is "probabilistic": then a sampled
  request's drafts are drawn from the drafter's distribution at the request's temperature and
  accepted with min(1, p / q), a greedy request still takes the argmax (config/speculative.py,
  v1/spec_decode/llm_base_proposer.py `_sample_from_logits`);
- `draft_vocab.json` is ignored (a reduced draft vocabulary would need a `d2t` tensor and
  `draft_vocab_size`): vLLM drafts over the full vocabulary with the target's LM head;
- embedding and LM head are shared from the target (the checkpoint has neither);
- sliding layers are causal unless `is_causal` says otherwise: DFlash blocks are not, so
  `is_causal: false` is written; mixed sliding/full layers need the V2 model runner (Triton only);
- the target must implement vLLM's EAGLE-3 interface (aux hidden states): Llama, Qwen2/3 and most
  dense decoders do.
"""

from __future__ import annotations

import json
from typing import Any

from dflash_core.dtypes import config_name
from dflash_core.model.config import DFlashConfig

VLLM_VERSION = "0.32.0"
DEFAULT_DTYPE = "bf16"  # what vLLM serves DFlash in on a GPU; `dflash serve` picks fp32 on the CPU
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` needs the distribution named vllm
# the KV cache of a CPU launch, at least (else vLLM's CPU worker reserves 92% of RAM and refuses to start if it
# is not free); more where one request of the model's full length needs more (cpu_server_args)
CPU_KV_CACHE_BYTES = 1 << 30
KV_CACHE_MARGIN = 1.05  # over the exact need: vLLM rounds to whole blocks
# The end of the one batch-size range of a fixed draft length (vLLM caps it at its max_num_seqs)
MAX_BATCH = 1 << 16
# Drafts verified a step on a CPU unless told (`dflash serve --draft-length`): measured on a 2-core Zen 4, fp32,
# against the whole block of 15 (docs/benchmarks.md, "Served concurrency"): demo pair greedy 1.70-1.77x plain
# at 1-2 users and 0.90x at 16 (whole block 1.71x / 1.56x / 0.64x), T=1 one user 0.97x (0.75x); SmolLM2 1.55x
# / 1.12x at 1 / 4 users (1.22x / 0.53x). A verify of 16 tokens a request costs a CPU several tokens' time,
# 4 about one. On a GPU vLLM verifies the whole block, its own default.
CPU_DRAFT_LENGTH = 3
# Below this many cores the model gets all of them (cpu_threads_env)
SMALL_CPU_CORES = 4


def cpu_threads_env(cores: list[int], environ: dict[str, str]) -> dict[str, str]:
    """The environment vLLM's CPU server gets for DFlash on a machine of few cores (`cores`: usable core ids).

    vLLM's CPU worker binds its OpenMP threads to every core but one and leaves that one to its scheduler
    and API server (VLLM_CPU_OMP_THREADS_BIND=auto, utils/ompmultiprocessing.py). On two cores that halves
    the compute of every forward, and a DFlash verify of 16 tokens per request is compute once a few users
    share a step. With fewer than SMALL_CPU_CORES cores the model gets every core, and OpenMP threads sleep
    when idle rather than spin, so the scheduler and the server still get time. Measured on a 2-core Zen 4,
    demo pair (docs/benchmarks.md): vLLM DFlash 1.16-1.50x at 4-16 users, the same at 1-2; plain vLLM gains
    at 16 users but loses up to 20% at 2, so the plain server keeps vLLM's binding. A variable the caller
    set is kept; more cores keep vLLM's own binding.
    """
    if len(cores) >= SMALL_CPU_CORES:
        return {}
    wanted = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(core) for core in sorted(cores)),
              "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_WAIT_POLICY": "PASSIVE"}
    return {name: value for name, value in wanted.items() if name not in environ}


def kv_bytes_per_token(target_config: dict[str, Any], draft_layers: int, dtype: str) -> int:
    """K and V of one token in every target layer and every draft layer (the drafter's layers are shaped like
    the target's attention in vLLM's DFlash: the same KV heads and head size)."""
    heads = target_config.get("num_key_value_heads") or target_config["num_attention_heads"]
    head_dim = target_config.get("head_dim") or target_config["hidden_size"] // target_config["num_attention_heads"]
    width = 2 if config_name(dtype) in ("bfloat16", "float16") else 4
    return 2 * (target_config["num_hidden_layers"] + draft_layers) * heads * head_dim * width


def cpu_server_args(target_config: dict[str, Any], draft_layers: int, dtype: str) -> list[str]:
    """The arguments every CPU launch gets: eager mode, and a KV cache of CPU_KV_CACHE_BYTES, or enough for one
    request of the model's full length where that is more (vLLM refuses to start otherwise: Qwen2.5-Coder-1.5B
    with one draft layer needs 1.81 GiB in fp32 for its 32,768 positions)."""
    positions = int(target_config.get("max_position_embeddings") or 0)
    need = int(KV_CACHE_MARGIN * positions * kv_bytes_per_token(target_config, draft_layers, dtype))
    size = max(CPU_KV_CACHE_BYTES, -(-need // (1 << 20)) * (1 << 20))  # whole MiB
    return ["--enforce-eager", "--kv-cache-memory-bytes", str(size)]


def num_speculative_tokens(config: DFlashConfig) -> int:
    """Drafts per step: the block's masks (vLLM ignores block_size)."""
    return config.block_size - 1


def speculative_config(draft_dir: str, config: DFlashConfig, draft_length: int | None = None) -> dict[str, Any]:
    """The --speculative-config vLLM's DFlash proposer reads.

    Drafts are sampled from the drafter at T > 0 (`draft_sample_method: probabilistic`; vLLM's default
    drafts the argmax and accepts it with the target's p alone): a drafter trained to match the target's
    law keeps more of its drafts that way. Demo pair, T = 1, one user, 16 dev prompts, 2-core Zen 4:
    accepted length 1.36 -> 1.97, 83 -> 96 tok/s (docs/benchmarks.md). Greedy requests are unchanged.

    `draft_length` k (1 .. block - 1; None: the whole block): every step verifies the first k of the block's
    drafts. vLLM still reserves and drafts the whole block (`num_speculative_tokens` stays block - 1, the
    plugin's `drafting` fix keeps the drafter's block whole) and schedules k for every batch size through its
    dynamic speculative decoding (`num_speculative_tokens_per_batch_size`). Where drafts are accepted rarely
    (sampling) a short verify costs less than the drafts it drops.
    """
    spec = {"method": "dflash", "model": draft_dir, "num_speculative_tokens": num_speculative_tokens(config),
            "draft_sample_method": "probabilistic"}
    if draft_length is not None and draft_length != spec["num_speculative_tokens"]:
        if not 1 <= draft_length < spec["num_speculative_tokens"]:
            raise ValueError(f"draft length {draft_length}: expected 1..{spec['num_speculative_tokens']} "
                             f"(the drafter's block of {config.block_size} less its first token)")
        spec["num_speculative_tokens_per_batch_size"] = [[1, MAX_BATCH, draft_length]]
    return spec


def vllm_config(config: DFlashConfig, dtype: str) -> dict[str, Any]:
    """The config.json vLLM's DFlashQwen3ForCausalLM reads, from a DFlashConfig (dtype: 'bf16', 'bfloat16', ...)."""
    dtype = config_name(dtype)
    raw = config.replace(dtype=dtype).to_dict()
    raw["torch_dtype"] = dtype
    if config.layer_types is not None and "sliding_attention" in config.layer_types:
        raw["is_causal"] = False  # vLLM makes sliding layers causal unless told; DFlash blocks are not
    return raw


def mixed_attention(config: DFlashConfig) -> bool:
    """Sliding and full layers together: vLLM serves that on its V2 model runner only (Triton)."""
    kinds = set(config.layer_types or ())
    return {"sliding_attention", "full_attention"} <= kinds


def launch_command(target: str, draft_dir: str | None, config: DFlashConfig | None, *, dtype: str = DEFAULT_DTYPE,
                   port: int = 8000, tokenizer: str | None = None, extra: list[str] | None = None,
                   draft_length: int | None = None) -> list[str]:
    """`python -m vllm.entrypoints.openai.api_server ...` serving `target` with this drafter through native dflash;
    with no drafter (`draft_dir` and `config` None), the same server decoding plainly (a benchmark's baseline)."""
    command = ["python", "-m", SERVER_MODULE, "--model", target]
    if draft_dir is not None and config is not None:
        command += ["--speculative-config", json.dumps(speculative_config(draft_dir, config, draft_length))]
    command += ["--dtype", config_name(dtype), "--port", str(port)]
    if tokenizer:
        command += ["--tokenizer", tokenizer]
    return command + list(extra or [])
