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
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CHECK_ROWS = (1, 16)  # row counts of the exactness check (a one-token step and a verify)


def prepack_supported(model: nn.Module) -> bool:
    """bf16 weights on a CPU, with oneDNN and its packed-linear ops in this torch build."""
    weight = next(model.parameters(), None)
    ops = torch.ops.mkldnn
    return (weight is not None and weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


class _PackedForward:
    """A Linear's forward through its prepacked weight; plain `F.linear` where the packed copy would be wrong."""

    def __init__(self, linear: nn.Linear, *, pack_now: bool = True) -> None:
        self.linear = linear
        self.packed: torch.Tensor | None = None  # an opaque oneDNN tensor
        self.source: tuple | None = None  # (storage, dtype, version) of the weight that was packed
        if pack_now:
            self._pack()

    def _pack(self) -> None:
        weight = self.linear.weight
        self.source = (weight.data_ptr(), weight.dtype, _version(weight))
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)

    def __deepcopy__(self, memo) -> "_PackedForward":
        # the packed weight cannot be copied, and the copied layer has no weight yet while it is being copied:
        # its copy packs at its first call
        return _PackedForward(copy.deepcopy(self.linear, memo), pack_now=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.linear.weight, self.linear.bias
        if self.packed is None and weight.dtype == torch.bfloat16 and weight.device.type == "cpu":
            self._pack()
        current = (weight.data_ptr(), weight.dtype, _version(weight))  # changed in place, cast or moved: plain
        if current != self.source or x.dtype != weight.dtype or (torch.is_grad_enabled() and weight.requires_grad):
            return F.linear(x, weight, bias)
        rows = x.reshape(-1, x.shape[-1])  # [*, K] -> [M, K]
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])


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


def _fastest(run, repeats: int = 5) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


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
    if measure and _fastest(lambda: trial(x)) >= _fastest(lambda: F.linear(x, largest.weight, largest.bias)):
        return 0
    count = 0
    for linear in linears:
        packed = trial if linear is largest else _PackedForward(linear)
        if _same_bits(linear, packed):
            linear.forward = packed  # an instance attribute: `module(x)` (hooks included) now calls it
            count += 1
    return count
