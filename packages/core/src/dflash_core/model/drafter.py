"""`Drafter`: the nn.Module that holds a DFlash drafter's weights under their published names.

The math lives in `graph.py`; this module only owns parameters, builds the fused views the math
takes, and reads/writes the published checkpoint format.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from dflash_core.model import graph
from dflash_core.model.checkpoint import check_drafter_tensors, load_tensors, save_tensors
from dflash_core.model.config import DFlashConfig
from dflash_core.model.draft_cache import DraftKVCache
from dflash_core.model.draft_vocab import DRAFT_VOCAB_FILE, ReadOut, read_draft_vocab, save_draft_vocab
from dflash_core.dtypes import config_name, resolve_dtype
from dflash_core.errors import CheckpointError, CompatibilityError
from dflash_core.model.masks import block_attention_mask, window_mask
from dflash_core.kernels import packed_weights
from dflash_core.kernels.matmul_layout import row_bucket
from dflash_core.model.rope import rope_frequencies, rope_table

WEIGHT_FORMATS = ("plain", "fp16-packed", "bf16", "bf16-prepacked")

class _Norm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))


def _linear(in_features: int, out_features: int) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=False)


class _Attention(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.q_proj = _linear(c.hidden_size, c.q_size)
        self.k_proj = _linear(c.hidden_size, c.kv_size)
        self.v_proj = _linear(c.hidden_size, c.kv_size)
        self.o_proj = _linear(c.q_size, c.hidden_size)
        self.q_norm = _Norm(c.head_dim)
        self.k_norm = _Norm(c.head_dim)


class _MLP(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = _linear(c.hidden_size, c.intermediate_size)
        self.up_proj = _linear(c.hidden_size, c.intermediate_size)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size)


class _Layer(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = _Norm(c.hidden_size)
        self.post_attention_layernorm = _Norm(c.hidden_size)
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)


class Drafter(nn.Module):
    """A DFlash drafter: draft layers, `fc` and norms; embedding and LM head come from the target."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = _linear(config.fc_in_features, config.hidden_size)
        self.hidden_norm = _Norm(config.hidden_size)
        self.norm = _Norm(config.hidden_size)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        inv_freq, scaling = rope_frequencies(config)
        # fp32 on purpose and not a buffer: `.to(bfloat16)` must never round the RoPE frequencies
        self._inv_freq = inv_freq
        self.dims = graph.DrafterDims(
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            eps=config.rms_norm_eps,
            rope_scaling=scaling,
            windows=tuple(config.layer_window(i) for i in range(config.num_hidden_layers)),
        )
        self._fused: tuple[tuple, graph.DrafterWeights] | None = None
        self._parameters_seen: list[nn.Parameter] | None = None  # `_parameter_list`
        self.weight_format = "plain"  # how decoding's matmuls read the weights: `use_weight_format`
        # weight format -> (the weights it was copied from, the copy decoding reads): one per format, so switching
        # back and forth (`dflash bench`'s dflash_plain_weights) copies and re-measures nothing
        self._copies: dict[str, tuple[graph.DrafterWeights, graph.DrafterWeights]] = {}
        self.draft_vocab: list[int] | None = None  # ids drafts are read out over (`draft_vocab`); None: all
        self.sample_over_list = False  # sampled drafts too (a drafter trained over its list: `sampling_head_for`)
        self._rope_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # decoding's cos/sin table (`rope_rows`)

    # ---- weights -----------------------------------------------------------------------------
    def reset_parameters(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Normal(0, std) projections and unit norms (a fresh, untrained drafter)."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)

    def weights(self) -> graph.DrafterWeights:
        """The tensors `graph` needs. Fusions are rebuilt while training, cached at inference."""
        key = tuple((p.data_ptr(), p._version) for p in self._parameter_list())
        if not torch.is_grad_enabled() and self._fused is not None and self._fused[0] == key:
            return self._fused[1]
        layers = tuple(
            graph.LayerWeights(
                input_norm=layer.input_layernorm.weight,
                post_norm=layer.post_attention_layernorm.weight,
                qkv=torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
                               layer.self_attn.v_proj.weight]),
                o=layer.self_attn.o_proj.weight,
                q_norm=layer.self_attn.q_norm.weight,
                k_norm=layer.self_attn.k_norm.weight,
                qk_norm=torch.cat([layer.self_attn.q_norm.weight.expand(self.config.num_attention_heads, -1),
                                   layer.self_attn.k_norm.weight.expand(self.config.num_key_value_heads, -1)]),
                gate_up=torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                down=layer.mlp.down_proj.weight,
            )
            for layer in self.layers
        )
        weights = graph.DrafterWeights(
            fc=self.fc.weight,
            hidden_norm=self.hidden_norm.weight,
            norm=self.norm.weight,
            context_kv=torch.cat(
                [w for layer in self.layers for w in (layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight)]
            ),
            context_k_norm=torch.stack([layer.self_attn.k_norm.weight for layer in self.layers]),
            inv_freq=self._inv_freq.to(self.device),
            layers=layers,
        )
        if not torch.is_grad_enabled():
            self._fused = (key, weights)
        return weights

    def _parameter_list(self) -> list[nn.Parameter]:
        """`parameters()` as a list kept until `_apply` (to, to_empty, float...) may replace them: walking the
        module tree took 16 us of a 19 us `weights()` call, which decoding makes twice a step."""
        if self._parameters_seen is None:
            self._parameters_seen = list(self.parameters())
        return self._parameters_seen

    def _apply(self, fn, *args, **kwargs):
        self._parameters_seen = None
        return super()._apply(fn, *args, **kwargs)

    def use_weight_format(self, weight_format: str) -> None:
        """How decoding (`extend_cache`, `draft_with_cache` and the drafts' read-out) reads the matmul
        weights: "plain" (the parameters as they are), "fp16-packed" (fp16 copies multiplied in fp32 by
        FBGEMM; an fp32 drafter on a CPU with AVX2) or "bf16" (bf16 copies multiplied natively where each row
        count measured faster; an fp32 drafter on a CPU with AMX-BF16 or AVX512-BF16) or "bf16-prepacked" (a bf16
        drafter's own weights reordered for oneDNN once, the same bits as plain); `packed_weights`.
        Training and `forward` always use the parameters. `load_pair(..., drafter_weights="auto")` chooses by
        measuring on the machine."""
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight format {weight_format!r} is not one of {', '.join(WEIGHT_FORMATS)}")
        if weight_format == "fp16-packed" and not packed_weights.fp16_packing_supported(self.device, self.dtype):
            raise CompatibilityError(f"fp16-packed weights need an fp32 drafter on a CPU with AVX2 and FBGEMM; this "
                                     f"one is {self.dtype} on {self.device} ({torch.backends.cpu.get_cpu_capability()})")
        if weight_format == "bf16" and not packed_weights.bf16_matmuls_supported(self.device, self.dtype):
            raise CompatibilityError(f"bf16 weight copies need an fp32 drafter on a CPU with AMX-BF16 or "
                                     f"AVX512-BF16 (elsewhere bf16 matmuls are emulated); this one is {self.dtype} "
                                     f"on {self.device}")
        if weight_format == "bf16-prepacked" and not packed_weights.bf16_prepacking_supported(self.device, self.dtype):
            raise CompatibilityError(f"bf16-prepacked weights need a bf16 drafter on a CPU with oneDNN; this one is "
                                     f"{self.dtype} on {self.device}")
        self.weight_format = weight_format  # a copy already made stays: switching back to it costs nothing

    @property
    def decoding_format(self) -> str:
        """The weight format decoding reads now: `weight_format`, or "plain" where it no longer applies (the
        drafter was moved to another device or dtype since it was asked for)."""
        supported = packed_weights.format_supported(self.weight_format, self.device, self.dtype)
        return self.weight_format if supported else "plain"

    @property
    def packs_weights(self) -> bool:
        """Whether decoding reads copies of the weights (fp16-packed or bf16) rather than the parameters."""
        return self.decoding_format != "plain"

    def decode_weights(self) -> graph.DrafterWeights:
        """`weights()` as decoding reads them: in `weight_format`, copied once per version of the parameters
        (the last copy of each format is kept, so switching formats back and forth copies nothing again)."""
        weights = self.weights()
        weight_format = self.decoding_format
        if weight_format == "plain" or torch.is_grad_enabled():
            return weights
        kept = self._copies.get(weight_format)
        if kept is None or kept[0] is not weights:
            copy = _copy_weights(weights, packed_weights.DECODE_LINEARS[weight_format])
            kept = self._copies[weight_format] = (weights, copy)
        return kept[1]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ---- forward -----------------------------------------------------------------------------
    def forward(
        self,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """No-cache forward, as the published model computes it.

        noise_embedding [B, Q, H]: target embedding of [last verified token, MASK, ...]
        target_hidden   [B, C, n*H]: concatenated target features of the C context tokens
        position_ids    [B, C + Q]: context positions, then block positions
        returns         [B, Q, H]: final-normed hidden states (apply the target's lm_head for logits)
        """
        _check_forward_shapes(self.config, noise_embedding, target_hidden, position_ids)
        ctx = target_hidden.shape[1]
        w = self.weights()
        ctx_k, ctx_v = graph.inject_context(w, self.dims, target_hidden, position_ids[:, :ctx])
        block_pos = position_ids[:, ctx:]
        masks = [
            None if window is None else window_mask(block_pos, position_ids, window)
            for window in self.dims.windows
        ]
        return graph.draft_forward(w, self.dims, noise_embedding, block_pos, ctx_k, ctx_v, masks)

    # ---- cached path (decoding) --------------------------------------------------------------
    def new_cache(self, batch: int, capacity: int) -> DraftKVCache:
        c = self.config
        return DraftKVCache(c.num_hidden_layers, batch, c.num_key_value_heads, c.head_dim, capacity,
                            self.device, self.dtype)

    def extend_cache(self, cache: DraftKVCache, target_hidden: torch.Tensor, positions: torch.Tensor,
                     counts: list[int]) -> None:
        """Project the features of newly accepted tokens [B, n, n_feat*H] once and append them."""
        k, v = graph.inject_context(self.decode_weights(), self.dims, target_hidden, positions,
                                    self.rope_rows(positions))
        cache.append(k, v, counts)

    def draft_with_cache(self, cache: DraftKVCache, noise_embedding: torch.Tensor,
                         block_positions: torch.Tensor) -> torch.Tensor:
        """Block forward over the cached context; noise [B, Q, H], positions [B, Q] -> [B, Q, H]. Where the cache
        has room after its context (the decoder allocates a block's worth), the block's K/V are written there
        rather than concatenated after a copy of the context (not while autograd records)."""
        room = None if torch.is_grad_enabled() else cache.context_with_room(noise_embedding.shape[1])
        ctx_k, ctx_v = room or cache.context()
        masks = self._cache_masks(cache, block_positions)
        return graph.draft_forward(self.decode_weights(), self.dims, noise_embedding, block_positions, ctx_k, ctx_v,
                                   masks, self.rope_rows(block_positions), block_in_place=room is not None)

    def propose(self, cache: DraftKVCache, noise_embedding: torch.Tensor, block_positions: torch.Tensor,
                read_out: ReadOut, num_drafts: int | None = None) -> torch.Tensor:
        """Draft tokens [B, k]: `read_out` (the target's LM head, argmax) of block positions 1..k (k =
        num_drafts, default Q-1). The whole block is drafted either way; only the read-out is limited to k."""
        hidden = self.draft_with_cache(cache, noise_embedding, block_positions)
        end = hidden.shape[1] if num_drafts is None else 1 + num_drafts
        return read_out(hidden[:, 1:end])

    def rope_rows(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Decoding's RoPE cos/sin table [P, d] covering `positions`, so a step indexes two tables instead of
        computing eight ops each time (docs/architecture.md, "A drafting step is dispatching"). On a CPU only,
        grown to the next power of two past the largest position (a request rebuilds it a few times at most);
        None elsewhere, since sizing it would sync the device."""
        if positions.device.type != "cpu" or positions.numel() == 0:
            return None
        needed = int(positions.max()) + 1
        rows = self._rope_rows
        if rows is None or rows[0].shape[0] < needed or rows[0].dtype != self.dtype:
            rows = self._rope_rows = rope_table(self._inv_freq, self.dims.rope_scaling, row_bucket(needed), self.dtype)
        return rows

    def check_runtime(self, target) -> None:
        """The target feeds embeddings and features straight in: same precision, same device."""
        if target.dtype != self.dtype or target.device != self.device:
            raise CompatibilityError(
                f"drafter is {self.dtype} on {self.device} but the target is {target.dtype} on {target.device}: "
                "load both in the same precision on the same device."
            )

    def _cache_masks(self, cache: DraftKVCache, block_positions: torch.Tensor) -> list[torch.Tensor | None]:
        needs_window = any(w is not None and w < cache.max_length + block_positions.shape[1]
                           for w in self.dims.windows)
        if not cache.is_ragged() and not needs_window:
            return [None] * len(self.dims.windows)
        ctx_pos = torch.arange(cache.max_length, device=block_positions.device).expand(block_positions.shape[0], -1)
        valid = cache.valid()
        anchors = block_positions[:, :1]
        built: dict[int | None, torch.Tensor] = {}
        for window in set(self.dims.windows):
            built[window] = block_attention_mask(ctx_pos, valid, anchors, block_positions.shape[1], window)
        return [built[w] for w in self.dims.windows]

    # ---- checkpoint I/O ------------------------------------------------------------------------
    def save_pretrained(self, path: str | os.PathLike, *, max_shard_bytes: int | None = None,
                        dtype: torch.dtype | str | None = None) -> None:
        """Write config.json + model.safetensors (or shards + index) in the published format, and the
        read-out list `draft_vocab.json` when the drafter has one (a stale list in `path` is removed)."""
        dtype = resolve_dtype(dtype) or self.dtype
        name = config_name(dtype)
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.to(dtype) for k, v in self.state_dict().items()}
        save_tensors(path, tensors, max_shard_bytes=max_shard_bytes)
        self.config.replace(dtype=name).save_pretrained(path)
        if self.draft_vocab is not None:
            save_draft_vocab(path, self.draft_vocab, coverage=None, source="saved with the drafter",
                             sampled_over_list=self.sample_over_list)
        else:  # a list from another drafter would read this one out over the wrong tokens
            (path / DRAFT_VOCAB_FILE).unlink(missing_ok=True)


def _copy_weights(w: graph.DrafterWeights, kind) -> graph.DrafterWeights:
    """The same weights with every matmul weight wrapped by `kind` (`PackedFp16Linear`, `Bf16Linear` or
    `PrepackedBf16Linear`, each measuring where it pays); norms and RoPE stay as they are."""
    layers = tuple(lw._replace(qkv=kind(lw.qkv), o=kind(lw.o), gate_up=kind(lw.gate_up), down=kind(lw.down))
                   for lw in w.layers)
    return w._replace(fc=kind(w.fc), context_kv=kind(w.context_kv), layers=layers)


def load_drafter(path: str | os.PathLike, device: torch.device | str = "cpu",
                 dtype: torch.dtype | str | None = None) -> Drafter:
    """Load a published-format drafter directory (safetensors + JSON only; no pickle, no remote code).

    `dtype` None keeps the checkpoint's own precision.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory: expected a drafter directory with config.json.")
    config = DFlashConfig.from_pretrained(path)
    tensors = check_drafter_tensors(load_tensors(path), config, str(path))
    dtype = resolve_dtype(dtype) or tensors["fc.weight"].dtype
    with torch.device("meta"):
        drafter = Drafter(config)
    drafter = drafter.to_empty(device=device).to(dtype)
    drafter._inv_freq = rope_frequencies(config)[0]
    drafter.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True)
    drafter.draft_vocab, drafter.sample_over_list = read_draft_vocab(path, config.vocab_size)
    return drafter.eval().requires_grad_(False)


def _check_forward_shapes(c: DFlashConfig, noise: torch.Tensor, target_hidden: torch.Tensor,
                          position_ids: torch.Tensor) -> None:
    if noise.ndim != 3 or noise.shape[-1] != c.hidden_size:
        raise ValueError(f"noise_embedding has shape {list(noise.shape)}, expected [B, Q, {c.hidden_size}]")
    batch, q_len = noise.shape[:2]
    if target_hidden.ndim != 3 or target_hidden.shape[0] != batch or target_hidden.shape[-1] != c.fc_in_features:
        raise ValueError(
            f"target_hidden has shape {list(target_hidden.shape)}, expected [{batch}, C, {c.fc_in_features}] "
            f"({c.num_feature_layers} target layers x hidden {c.hidden_size})"
        )
    expected = [batch, target_hidden.shape[1] + q_len]
    if list(position_ids.shape) != expected:
        raise ValueError(f"position_ids has shape {list(position_ids.shape)}, expected {expected} (context + block)")
