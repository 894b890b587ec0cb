"""Fixes for vLLM 0.32's CPU-only paths of speculative sampling (the stand-ins of its Triton kernels, top-k).

Where Triton has no CPU backend, vLLM's CPU platform replaces core Triton kernels by C++ stand-ins
(`CpuPlatform.register_triton_kernel_overrides`, platforms/cpu.py), reading each from
`vllm.utils.cpu_triton_utils` when a worker starts. Our `vllm.general_plugins` entry point runs
earlier in the same process (`WorkerWrapperBase.init_worker`: `load_general_plugins()`, then
`register_triton_kernel_overrides()`), so a fix replaces the stand-in in that module and the
platform registers the fixed one. Where vLLM has Triton (GPU, or triton-cpu) the stand-ins are never
registered and neither is any fix here. The second fix replaces a module function vLLM calls only on
the CPU (`apply_top_k_top_p_pytorch(..., allow_cpu_sync=is_cpu)`), looked up by name at each call.
Each fix names the vLLM line it answers (`evidence`), which tests check is still in the installed vLLM;
`DFLASH_VLLM_SKIP_FIXES=name,...` leaves fixes out (the negative controls of the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import os

import torch

SKIP_ENV = "DFLASH_VLLM_SKIP_FIXES"  # comma-separated fix names left out (to show a bug, e.g. for an upstream report)


@dataclass(frozen=True)
class Fix:
    """One replacement of a CPU-only function of vLLM: where it goes, why, and the vLLM source that needs it."""

    name: str
    module: str  # module holding the function
    attribute: str  # the function replaced
    make: Callable[[Callable], Callable]  # the original -> its replacement
    why: str  # one line: what it replaces, and why
    evidence: tuple[str, str]  # (module, text in its source that makes the fix necessary)


def expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """rejection_sampler.expand_kernel on a CPU: output[cu[i-1]:cu[i]] = input[i] (replace_from -> replace_to).

    output: [num_tokens], written in place, any dtype (float32 temperatures and top-p, int32 top-k,
    int64 ids); input_val: [batch]; cu_num_tokens: [batch] cumulative token counts per request.
    """
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    output[: int(counts.sum())] = torch.repeat_interleave(values.to(output.dtype), counts)


def skip_empty_top_k(original: Callable) -> Callable:
    """apply_top_k_only(logits [n, vocab], k [n]) returning the empty logits when n == 0 (k.max() raises there)."""

    def apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if logits.shape[0] == 0:
            return logits
        return original(logits, k)

    return apply_top_k_only


FIXES = (
    Fix("expand-in-place", "vllm.utils.cpu_triton_utils", "_expand_kernel_impl", lambda original: expand_kernel_impl,
        "the stand-in casts output to int64, so the kernel writes a temporary copy and per-token temperature, "
        "top-p and top-k stay uninitialised (and float inputs are truncated): every T > 0 request samples garbage",
        ("vllm.utils.cpu_triton_utils", "torch.ops._C.expand_kernel_impl(\n        _ensure_int64(output),")),
    Fix("top-k-empty-batch", "vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_only", skip_empty_top_k,
        "the CPU-only top-k path calls k.max() on an empty batch when a step verifies no drafts (a request at its "
        "last token): RuntimeError, and the engine dies; an empty batch is returned unchanged",
        ("vllm.v1.sample.ops.topk_topp_sampler", "    max_top_k = k.max()\n")),
)


def stand_ins_in_use() -> bool:
    """Whether vLLM will register its CPU stand-ins in this process (the condition of register_triton_kernel_overrides)."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def register_cpu_fixes() -> list[str]:
    """Install every fix where vLLM uses its CPU stand-ins; the names installed (none elsewhere)."""
    if not stand_ins_in_use():
        return []
    import importlib

    skipped = set(filter(None, os.environ.get(SKIP_ENV, "").split(",")))
    installed = []
    for fix in FIXES:
        if fix.name in skipped:
            continue
        module = importlib.import_module(fix.module)
        setattr(module, fix.attribute, fix.make(getattr(module, fix.attribute)))
        installed.append(fix.name)
    return installed
