"""The runtime patches that let SGLang 0.5.23's own DFLASH worker run on a CPU, registered through its HookRegistry.

Registered by the plugin entry point only in a process of SGLang's CPU engine
(`SGLANG_USE_CPU_ENGINE=1`, which `dflash serve --device cpu` sets): on a GPU nothing here is
registered and SGLang runs unchanged. Each patch names the host code it works around (`evidence`:
a line of SGLang's source that tests check is still there) and says in one line what it replaces
and why. Where SGLang offers a public switch it is used instead (`add_draft_attention_backend_choices`).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Callable

CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"  # SGLang's own switch to its CPU platform (srt/platforms/__init__.py)


@dataclass(frozen=True)
class Patch:
    """One hook on SGLang: where it goes, what it replaces and why, and the host code that needs it."""

    name: str
    target: str  # dotted path HookRegistry resolves and wraps
    kind: str  # "around" or "after" (HookRegistry's HookType names)
    hook: Callable
    why: str  # one line: what it replaces, and why
    evidence: tuple[str, str]  # (module, text in its source that makes the patch necessary)


def cpu_engine_requested() -> bool:
    return os.environ.get(CPU_ENGINE_ENV, "0") == "1"


# ---- 1. the DFLASH argument check --------------------------------------------------------------


class _DflashCapableCpu:
    """`current_platform` as `_handle_dflash` sees it on the CPU: DFLASH supported, draft backends from
    SGLang's own list (with torch_native added), torch_native by default. Every other attribute is the
    real platform's."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def is_out_of_tree(self) -> bool:  # routes _handle_dflash to the questions below
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm == "DFLASH"

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

        return algorithm == "DFLASH" and backend in DRAFT_ATTENTION_BACKEND_CHOICES

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "torch_native"


def around_handle_dflash(original, server_args, *args, **kwargs):
    """On device cpu, run SGLang's DFLASH argument check against a platform that answers 'supported'."""
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.arg_groups.overrides import resolving_view

    if resolving_view(server_args).device != "cpu":
        return original(server_args, *args, **kwargs)
    real = speculative_hook.current_platform
    speculative_hook.current_platform = _DflashCapableCpu(real)
    try:
        return original(server_args, *args, **kwargs)
    finally:
        speculative_hook.current_platform = real


# ---- 2. CUDA streams -------------------------------------------------------------------------


def around_record_stream(original, tensor, stream):
    """Tensor.record_stream for CPU tensors: nothing to record (torch raises 'unknown parameter type')."""
    if tensor.device.type == "cpu":
        return None
    return original(tensor, stream)


# ---- 3. the draft model's fused Triton q/k norm + rotary ------------------------------------


def after_dflash_attention_init(result, attention, *args, **kwargs):
    """Select DFlashAttention's eager norm + rotary path: its bf16 fast path is a Triton kernel."""
    attention.use_table_qk_norm_rope = False
    return result


# ---- 4. torch_native attention for TARGET_VERIFY batches ----------------------------------


def around_torch_native_forward_extend(original, backend, q, k, v, layer, forward_batch, *args, **kwargs):
    """Give TARGET_VERIFY batches the extend lengths torch_native's extend path reads.

    SGLang builds TARGET_VERIFY batches (the target's verify and DFLASH's draft block) with
    `seq_lens` = the committed prefix and no `extend_prefix_lens`/`extend_seq_lens`; the GPU
    backends add the block themselves. Here each request extends its prefix by n = queries / batch
    tokens ([bs * n] queries, request-major), so: prefix = seq_lens, extend = n, seq_lens += n.
    """
    if forward_batch.extend_prefix_lens is not None or not forward_batch.forward_mode.is_target_verify():
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    import torch

    bs = forward_batch.batch_size
    n = q.shape[0] // bs
    batch = copy.copy(forward_batch)  # shallow: the batch SGLang holds is left as it was
    batch.extend_prefix_lens = forward_batch.seq_lens
    batch.extend_seq_lens = torch.full_like(forward_batch.seq_lens, n)
    batch.seq_lens = forward_batch.seq_lens + n
    return original(backend, q, k, v, layer, batch, *args, **kwargs)


# ---- 5. input embeddings in the served dtype ------------------------------------------------


def after_extend_forward_kwargs(kwargs, runner, forward_batch, *args, **more):
    """Keep the draft block's input embeddings in the served dtype (SGLang casts them to bf16 always)."""
    embeds = forward_batch.input_embeds
    if (embeds is not None and forward_batch.replace_embeds is None and "input_embeds" in kwargs
            and kwargs["input_embeds"].dtype != embeds.dtype):
        kwargs["input_embeds"] = embeds
    return kwargs


PATCHES = (
    Patch("dflash-on-cpu", "sglang.srt.arg_groups.speculative_hook._handle_dflash", "around", around_handle_dflash,
          "replaces the device check of _handle_dflash (cuda/npu/xpu only): the worker has torch paths for the rest",
          ("sglang.srt.arg_groups.speculative_hook", 'cfg.device.startswith("cuda") or cfg.device == "npu"')),
    Patch("record-stream-cpu", "torch.Tensor.record_stream", "around", around_record_stream,
          "makes record_stream a no-op on CPU tensors, which the DFLASH worker calls unguarded each step",
          ("sglang.srt.speculative.dflash_worker_v2", "batch.seq_lens.record_stream(")),
    Patch("draft-eager-qk-norm-rope", "sglang.srt.models.dflash.DFlashAttention.__init__", "after",
          after_dflash_attention_init,
          "replaces the Triton table_qk_norm_rope_ kernel (bf16 only) by the model's own eager norm + rotary",
          ("sglang.srt.models.dflash", "elif self.use_table_qk_norm_rope and qkv.dtype == torch.bfloat16:")),
    Patch("torch-native-verify",
          "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend", "around",
          around_torch_native_forward_extend,
          "derives extend lengths for TARGET_VERIFY batches, which torch_native reads and SGLang leaves None",
          ("sglang.srt.layers.attention.torch_native_backend", "forward_batch.extend_prefix_lens,")),
    Patch("draft-embeds-dtype", "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs", "after",
          after_extend_forward_kwargs,
          "replaces the unconditional .bfloat16() of input_embeds, which breaks a float32 draft forward",
          ("sglang.srt.model_executor.model_runner", 'kwargs["input_embeds"] = forward_batch.input_embeds.bfloat16()')),
)


def register_cpu_patches() -> list[str]:
    """Register every patch (and torch_native as a DFLASH draft backend) on the CPU engine; names registered."""
    if not cpu_engine_requested():
        return []
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES, add_draft_attention_backend_choices
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if "torch_native" not in DRAFT_ATTENTION_BACKEND_CHOICES:  # SGLang's public extension point
        add_draft_attention_backend_choices(["torch_native"])
    kinds = {"around": HookType.AROUND, "after": HookType.AFTER}
    for patch in PATCHES:
        HookRegistry.register(patch.target, patch.hook, kinds[patch.kind])
    return [patch.name for patch in PATCHES]
