"""The target's bf16 linear layers on a CPU with their weights reordered for oneDNN once, not at every call.

Why: in bf16 on a CPU `F.linear` runs oneDNN's matmul, which first reorders the [N, K] weight into its
blocked layout, on every call. For a small target that reorder is a large share of a step: the demo
target's 43 projections (LM head included) took 2.05 ms per pass over one row and 3.35 ms over 16 rows
on a 2-core AMD EPYC (Zen 4, AVX512-BF16, torch 2.13.0+cpu), and 1.09 / 1.84 ms with each weight
reordered once (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`, the ops torch's
own CPU compiler emits); whole forwards 0.90x the time at one token and 0.81-0.87x at 16.

Exactness: the same oneDNN kernel on the same numbers, so the same bits (checked on every layer
when it is packed, over 1 and 16 rows; a layer that differs stays as it was). fp32 is left alone:
there `F.linear` is MKL's GEMM, and oneDNN's differs in the last bits.

The packed copy is of the weight as it is when packed: a layer whose weight is then changed in place,
cast or moved (its version counter, dtype or storage differ) or that computes a gradient runs plain
`F.linear` again; a deep copy of the model packs the copied weights anew.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from dflash_core.kernels.timing import fastest_alternating

CHECK_ROWS = (1, 16)  # row counts of the exactness check (a one-token step and a verify)


def prepacking_available(device: torch.device | str, dtype: torch.dtype) -> bool:
    """bf16 on a CPU where oneDNN has bf16 kernels, with the packed-linear ops in this torch build (the drafter's
    `bf16-prepacked` weight format asks the same). Elsewhere (an AVX2-only CPU, or oneDNN capped by
    ONEDNN_MAX_CPU_ISA) `_reorder_linear_weight` refuses bf16 weights with a RuntimeError."""
    ops = torch.ops.mkldnn
    return (torch.device(device).type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")
            and onednn_bf16_kernels())


def onednn_bf16_kernels() -> bool:
    """oneDNN has bf16 kernels for this CPU (AVX-512 or newer, as capped by ONEDNN_MAX_CPU_ISA); on an AVX2-only
    CPU it has none: bf16 weights cannot be reordered for it, and bf16 matmuls fall back to emulation."""
    native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return native is not None and bool(native())


def prepack_supported(model: nn.Module) -> bool:
    """The model's weights are bf16 on a CPU where prepacking is available."""
    weight = next(model.parameters(), None)
    return weight is not None and prepacking_available(weight.device, weight.dtype)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 -> an opaque oneDNN tensor in the layout its matmul reads."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) -> [..., N] through `pack_weight`'s W: the bits of `F.linear(x, W, bias)`."""
    out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out_features)


class _PackedForward:
    """A Linear's forward through its prepacked weight; plain `F.linear` where the packed copy would be wrong."""

    def __init__(self, linear: nn.Linear, *, pack_now: bool = True) -> None:
        self.linear = linear
        self.packed: torch.Tensor | None = None  # an opaque oneDNN tensor
        self.source: tuple | None = None  # (storage, dtype) of the weight that was packed
        self.version: int | None = None  # its in-place version (None: made under inference mode, which keeps none)
        if pack_now:
            self._pack()

    def _pack(self) -> None:
        weight = self.linear.weight
        self.source, self.version = (weight.data_ptr(), weight.dtype), _version(weight)
        self.packed = pack_weight(weight)

    def __deepcopy__(self, memo) -> "_PackedForward":
        # the packed weight cannot be copied, and the copied layer has no weight yet while it is being copied:
        # its copy packs at its first call
        return _PackedForward(copy.deepcopy(self.linear, memo), pack_now=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.linear.weight, self.linear.bias
        if self.packed is None and weight.dtype == torch.bfloat16 and weight.device.type == "cpu":
            self._pack()
        stale = (weight.data_ptr(), weight.dtype) != self.source or (  # cast, moved or changed in place: plain
            self.version is not None and weight._version != self.version)
        if stale or x.dtype != weight.dtype or (torch.is_grad_enabled() and weight.requires_grad):
            return F.linear(x, weight, bias)
        return packed_product(x, self.packed, bias, weight.shape[0])


def _version(weight: torch.Tensor) -> int | None:
    """The weight's in-place version counter (None for a tensor made under inference mode, which keeps none)."""
    try:
        return weight._version
    except RuntimeError:
        return None


def is_prepacked(linear: nn.Module) -> bool:
    """True when `prepack_linears` gave this layer its packed forward."""
    return isinstance(linear.__dict__.get("forward"), _PackedForward)


def _same_bits(linear: nn.Linear, packed: _PackedForward) -> bool:
    generator = torch.Generator().manual_seed(0)
    for rows in CHECK_ROWS:
        x = torch.randn(rows, linear.in_features, generator=generator).to(linear.weight.dtype)
        if not torch.equal(packed(x), F.linear(x, linear.weight, linear.bias)):
            return False
    return True


@torch.inference_mode()
def prepack_linears(model: nn.Module, *, measure: bool = True) -> int:
    """Give every `nn.Linear` of a bf16 CPU model a prepacked forward that computes the same bits.

    Returns how many layers now run packed: 0 where unsupported (`prepack_supported`) or, with `measure`,
    where the largest layer was not faster packed, timed here over 16 rows (the machine decides).
    """
    if not prepack_supported(model):
        return 0
    linears = [m for m in model.modules() if type(m) is nn.Linear and not isinstance(m.forward, _PackedForward)]
    if not linears:
        return 0
    largest = max(linears, key=lambda m: m.weight.numel())
    trial = _PackedForward(largest)
    x = torch.randn(16, largest.in_features).to(largest.weight.dtype)
    if measure:
        best = fastest_alternating({"packed": lambda: trial(x), "plain": lambda: F.linear(x, largest.weight,
                                                                                          largest.bias)}, 5)
        if best["packed"] >= best["plain"]:
            return 0
    count = 0
    for linear in linears:
        packed = trial if linear is largest else _PackedForward(linear)
        if _same_bits(linear, packed):
            linear.forward = packed  # an instance attribute: `module(x)` (hooks included) now calls it
            count += 1
    return count
