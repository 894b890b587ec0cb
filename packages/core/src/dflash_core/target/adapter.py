"""Target adapter: a Hugging Face causal LM seen through what DFlash needs.

One forward returns the final hidden states (logits are taken only where needed) and the
concatenated outputs of exactly the `target_layer_ids` layers, captured by hooks on those layers
alone. Layer-index convention, pinned by a test: id k is the OUTPUT of decoder layer k, which is
`hidden_states[k + 1]` of Hugging Face's `output_hidden_states` (index 0 is the embedding).

Works for any causal LM with `model.embed_tokens`, `model.layers` and `lm_head` (Qwen3, Qwen2,
Llama, Mistral, ...). The KV cache is a plain `DynamicCache`, kept packed-left per row so that a
batch whose rows accept different numbers of tokens needs no recomputation (see `TargetCache`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from dflash_core.errors import CompatibilityError
from dflash_core.kernels.grouped_attention import cpu_grouped_attention
from dflash_core.kernels.matmul_layout import MatmulLayouts
from dflash_core.kernels.prepacked_linear import is_prepacked


@dataclass
class TargetOutput:
    hidden: torch.Tensor  # [B, T, H] final-normed hidden states (lm_head gives logits)
    features: torch.Tensor  # [B, T, n*H] outputs of the target_layer_ids layers, concatenated


class _EnoughLayers(Exception):
    """Raised by `TargetModel.features`'s hook on its last wanted layer to end the forward there."""


def cache_argument(model) -> str:
    """The name of `model.forward`'s KV-cache argument: `cache` in newer transformers, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class TargetModel:
    """Wraps a causal LM; nothing is left patched or registered on it (the feature hooks and, on the CPU, the
    grouped-query attention switch of `grouped_attention` last one forward)."""

    def __init__(self, model: nn.Module, layer_ids: Sequence[int] = ()) -> None:
        base = getattr(model, "model", None)
        if base is None or not hasattr(base, "layers") or not hasattr(base, "embed_tokens") \
                or not hasattr(model, "lm_head"):
            raise CompatibilityError(
                f"target {type(model).__name__} is not a supported causal LM: expected model.embed_tokens, "
                "model.layers and lm_head (Qwen3, Qwen2, Llama, Mistral and alike)."
            )
        config = model.config
        if getattr(config, "final_logit_softcapping", None):
            raise CompatibilityError(
                f"target {type(model).__name__} post-processes its logits (final_logit_softcapping), "
                "which this adapter does not reproduce."
            )
        self.model = model
        self.base = base
        self.config = config
        self._cache_kwarg = cache_argument(base)
        self.layouts = MatmulLayouts()  # the LM head's matmul layout per row bucket, measured by this adapter
        self.layer_ids: tuple[int, ...] = ()
        self.set_layer_ids(layer_ids)

    def set_layer_ids(self, layer_ids: Sequence[int]) -> None:
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise CompatibilityError(
                f"target_layer_ids {list(layer_ids)} reach layer {bad[0]}, but the target has "
                f"{self.num_layers} layers (expected ids in [0, {self.num_layers}))."
            )
        self.layer_ids = tuple(layer_ids)

    # ---- facts ---------------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.base.layers)

    @property
    def hidden_size(self) -> int:
        return self.base.embed_tokens.weight.shape[1]

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding (may exceed the tokenizer's length, e.g. Qwen3 pads to 151936)."""
        return self.base.embed_tokens.weight.shape[0]

    @property
    def max_positions(self) -> int | None:
        return getattr(self.config, "max_position_embeddings", None)

    @property
    def device(self) -> torch.device:
        return self.base.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.base.embed_tokens.weight.dtype

    # ---- the pieces the drafter shares -----------------------------------------------------------
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[B, T] -> [B, T, H]: the target's own input embedding (frozen, shared with the drafter)."""
        return self.base.embed_tokens(input_ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V]: the target's LM head (frozen, shared with the drafter).

        A plain `nn.Linear` head (no hooks) is applied in the matmul layout measured fastest for this many
        rows on this machine (`matmul_layout`: the same product, on the Zen 3 EPYC 1.6-3.8x faster over
        2-16 rows than `F.linear`), unless its weight is prepacked (`prepacked_linear`: faster than either
        layout at 1-32 rows in bf16 on the Zen 4 EPYC, 68 against 232 us over one row); any other head is
        called as it is."""
        head = self.model.lm_head
        plain = type(head) is nn.Linear and not (head._forward_hooks or head._forward_pre_hooks)
        if plain and not is_prepacked(head):
            return self.layouts(hidden, head.weight, head.bias)
        return head(hidden)

    def plain_head_weight(self) -> torch.Tensor | None:
        """[V, H]: the LM head's weight when the head is a bias-free `nn.Linear` without hooks (what training's
        fused head loss can stand in for), else None."""
        head = self.model.lm_head
        plain = type(head) is nn.Linear and head.bias is None and not (head._forward_hooks or head._forward_pre_hooks)
        return head.weight if plain else None

    # ---- forward ---------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache=None,
                attention_mask=None) -> TargetOutput:
        """Run the decoder; return final hidden states and the selected layers' outputs.

        input_ids, position_ids [B, T]; `cache` a transformers Cache or None; `attention_mask`
        None (plain causal over the cache), a 2D padding mask, or a prepared 4D/dict mask.
        """
        captured: dict[int, torch.Tensor] = {}
        handles = self._capture_layers(captured)
        try:
            kwargs = {self._cache_kwarg: cache, "use_cache": cache is not None}
            with cpu_grouped_attention(self.base.config, self.device):  # no K/V copy per query group
                out = self.base(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        if self.layer_ids:
            features = torch.cat([captured[i] for i in self.layer_ids], dim=-1)
        else:
            features = out.last_hidden_state[..., :0]
        return TargetOutput(hidden=out.last_hidden_state, features=features)

    __call__ = forward

    def features(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask=None) -> torch.Tensor:
        """[B, T, n*H]: the selected layers' outputs alone, as `forward(...).features` (no cache), from a forward
        stopped after the last of them: training with hard labels needs nothing above it (for the demo's
        feature layer 3 of 6 a third of the target's layers, for SmolLM2's layer 15 of 30 about half)."""
        if not self.layer_ids:
            raise ValueError("features: the target has no target_layer_ids to capture")
        captured: dict[int, torch.Tensor] = {}
        last = max(self.layer_ids)
        handles = self._capture_layers(captured, stop_after=last)
        try:
            with cpu_grouped_attention(self.base.config, self.device):
                self.base(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                          **{self._cache_kwarg: None, "use_cache": False})
        except _EnoughLayers:
            pass
        finally:
            for handle in handles:
                handle.remove()
        if last not in captured:
            raise CompatibilityError(f"target {type(self.model).__name__} never ran its layer {last}: expected "
                                     "model.layers to be called in order by its forward.")
        return torch.cat([captured[i] for i in self.layer_ids], dim=-1)

    def _capture_layers(self, captured: dict, stop_after: int | None = None) -> list:
        """Hooks that put each `layer_ids` layer's output into `captured` (the caller removes the returned
        handles); `stop_after`: the layer whose hook then ends the forward by raising `_EnoughLayers`."""
        def hook_for(index: int):
            def hook(module, args, output):
                captured[index] = output[0] if isinstance(output, tuple) else output
                if index == stop_after:
                    raise _EnoughLayers
            return hook

        return [self.base.layers[i].register_forward_hook(hook_for(i)) for i in self.layer_ids]

    # ---- masks for ragged batches ------------------------------------------------------------------
    def ragged_mask(self, key_positions: torch.Tensor, key_valid: torch.Tensor, query_positions: torch.Tensor,
                    among_queries: torch.Tensor | None = None):
        """Attention mask for a cache whose rows hold different numbers of valid slots.

        key_positions/key_valid [B, S]; query_positions [B, T]. A query sees a valid key at a position
        <= its own (and within the sliding window on windowed layers). `among_queries` [B, T, T]: where the
        last T keys are the queries themselves (a token tree), which of them each query may see too (its
        ancestors and itself). Returns what the HF model takes as `attention_mask`: a boolean [B, 1, T, S]
        tensor, or a dict per layer type.
        """
        visible = key_valid[:, None, :] & (key_positions[:, None, :] <= query_positions[:, :, None])
        if among_queries is not None:
            visible[:, :, -among_queries.shape[-1]:] &= among_queries
        window = getattr(self.config, "sliding_window", None)
        types = getattr(self.config, "layer_types", None)
        if window is None or (types is not None and "sliding_attention" not in types):
            return visible[:, None]
        windowed = visible & (query_positions[:, :, None] - key_positions[:, None, :] < window)
        if types is None or all(t == "sliding_attention" for t in types):
            return windowed[:, None]
        return {"full_attention": visible[:, None], "sliding_attention": windowed[:, None]}
