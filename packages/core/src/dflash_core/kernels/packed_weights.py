"""fp16-packed or bf16 copies of the drafter's matmul weights, for fp32 decoding on a CPU.

Why: a drafting step is a handful of matmuls over 1-16 rows, so it is bound by how fast the weights
stream in from memory (a verify of the whole block has just pushed them out of the caches), and on
some CPUs fp32 GEMM over few rows is slow outright. On a 2-core AMD EPYC (Zen 3, AVX2 only, torch
2.13.0+cpu, MKL) the demo target's 8,192 x 384 LM head took 0.15x its fp32 time through FBGEMM's
fp16-weight kernel over one row and 0.35x over 16; the drafter's own 16-row projections 0.7-1.07x. The kernel stores the weight in fp16 and multiplies
in fp32, so it halves the bytes a step reads and keeps fp32 arithmetic.

Exactness: only the drafter's side uses these (its block pass, its KV injection, the read-out of
drafts through a copy of the target's LM head). Drafts are proposals the target verifies, and a
sampled draft's q is computed once and used both to draw it and in the rejection test, so any
rounding here changes which drafts are proposed, never what is committed. The target's own forward
and logits are untouched. (A drafter stored in bf16, as the published ones are, has weights fp16
holds exactly, bar values under fp16's normal range.)

On a CPU with bf16 in hardware (AMX, AVX512-BF16) a bf16 copy multiplied natively can be faster still
(`Bf16Linear`): on a 2-core Intel Xeon with AMX (torch 2.13.0+cpu, oneDNN) fp32 `F.linear` over 16 rows took
130 us for the demo drafter's 2,048 x 384 and 384 x 1,024 projections and 119 us for the 1,920-row read-out,
bf16 copies 42, 36 and 40 us (W @ x.T layout, casts included), fp16-packed ones 152, 74 and 144 us; over one row
fp32 won everything (bf16 25-55 us against 6-25). So a bf16 copy is chosen per row count, not per matmul.

Whether it pays is measured, not assumed: each packed matmul times itself against fp32 at a few row
counts when it is made (`measure_row_limit`) and falls back to fp32 above the rows where it lost;
`load_pair(..., drafter_weights="auto")` keeps plain weights where no matmul won at all.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from dflash_core.devices import cpu_facts
from dflash_core.kernels.matmul_layout import row_bucket
from dflash_core.kernels.timing import fastest_alternating
from dflash_core.kernels.prepacked_linear import onednn_bf16_kernels, pack_weight, packed_product, prepacking_available


@functools.lru_cache(maxsize=None)
def fp16_packing_supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """True where FBGEMM's fp16-weight GEMM can run: fp32 activations on a CPU with AVX2 or better.
    Cached: decoding asks on every drafter call, and the answer is the process's."""
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        return False
    if not hasattr(torch, "fbgemm_pack_gemm_matrix_fp16") or "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    return torch.backends.cpu.get_cpu_capability() not in ("DEFAULT", "NO AVX", "")


@functools.lru_cache(maxsize=None)
def bf16_matmuls_supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """True where bf16 copies can pay: an fp32 drafter on a CPU whose flags show bf16 in hardware (AMX-BF16 or
    AVX512-BF16; elsewhere bf16 matmuls are emulated, several times slower than fp32) and whose oneDNN has bf16
    kernels (not so when capped by ONEDNN_MAX_CPU_ISA). Cached per process."""
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        return False
    return bool({"amx_bf16", "avx512_bf16"} & set(cpu_facts()[1])) and onednn_bf16_kernels()


def _check_weight(weight: torch.Tensor) -> None:
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"expected a 2D fp32 CPU weight, got {tuple(weight.shape)} {weight.dtype} on {weight.device}")


# row counts a packed weight is timed at against fp32 (`measure_row_limit`): one row (a KV injection of one
# accepted token, a read-out of one draft), a block's worth, and the multiples a batch of rows drafts
ROW_PROBES = (1, 8, 16, 32, 64, 128, 256)
WIN_MARGIN = 0.95  # the packed kernel must take at most this share of fp32's time to count as a win there


class PackedFp16Linear:
    """y = x @ W.T (+ bias) with W [N, K] held fp16-packed for FBGEMM; x [..., K] fp32 -> [..., N] fp32.

    Inputs of more than `max_rows` rows go through plain fp32 `F.linear` on the original weight (kept by
    reference, no copy): the packed kernel wins while a matmul is bound by reading the weight, and loses
    once it is bound by arithmetic (on the Zen 3 EPYC above: the drafter's 384 x 384 projection over 16
    rows 0.7x the fp32 time, over 32 rows 1.3x, over 256 rows 2.1x; the 8,192-row LM head up to 64 rows).
    max_rows None: measured now (`measure_row_limit`). A frozen copy: made from the weight once, it does
    not follow later changes to it (callers key their caches on the source's data pointer and version).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, max_rows: int | None = None) -> None:
        _check_weight(weight)
        self.out_features, self.in_features = weight.shape
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        # torch 2.13 marks these two functions deprecated (the warning fires once per process, at the
        # first call) but still ships them, and they cost ~5 us a call against ~35 us for the
        # quantized-op route (`quantized::linear_dynamic_fp16`, same kernel); the first calls happen here
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self.packed = torch.fbgemm_pack_gemm_matrix_fp16(self.weight.contiguous())
            self._packed_matmul(torch.zeros(1, self.in_features))
        self.max_rows = measure_row_limit(self) if max_rows is None else max_rows

    @property
    def faster_rows(self) -> list[int]:
        """The probed row counts at which the packed kernel is used (every probe up to `max_rows`)."""
        return [rows for rows in ROW_PROBES if rows <= self.max_rows]

    def _packed_matmul(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.fbgemm_linear_fp16_weight_fp32_activation(flat, self.packed, self.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.max_rows:
            return F.linear(x, self.weight, self.bias)
        out = self._packed_matmul(flat.float().contiguous())
        return out.view(*x.shape[:-1], self.out_features)


def measure_row_limit(linear: PackedFp16Linear, repeats: int = 5) -> int:
    """The most rows (of ROW_PROBES) up to which the packed kernel beat fp32 (by WIN_MARGIN) at every probe;
    0 when it lost at the first. Each side keeps its fastest of `repeats` calls, the two alternating, so
    neither finds its weight hot from its own previous call (in decoding each matmul runs once a step, with
    the target's verify in between). Alternating matters: in a loop of one kernel alone, on the Zen 3 EPYC
    above, the demo drafter's matmuls packed took 0.3-0.6x the fp32 time at 1 row, 0.7-1.07x at 16, 1.0-1.4x
    at 32 and 1.4-2.1x at 256, while alternating they won up to 16-256 rows, and at batch 16 (256 rows a
    draft pass) decoding with those limits measured 1.34x the target alone against 1.27x with plain weights.
    """
    limit = 0
    for rows in ROW_PROBES:
        x = torch.randn(rows, linear.in_features)
        best = fastest_alternating({"packed": lambda: linear._packed_matmul(x),
                                    "plain": lambda: F.linear(x, linear.weight, linear.bias)}, repeats)
        if best["packed"] > WIN_MARGIN * best["plain"]:
            break
        limit = rows
    return limit


# row counts a bf16 copy is timed at (`Bf16Linear`): every power of two, since on the AMX Xeon above fp32 won at
# 1 and 2 rows for some matmuls and lost from 4 on; an input is costed as the next probe up (the last beyond it)
BF16_ROW_PROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BF16_KERNELS = ("fp32", "bf16", "bf16-transposed")


class Bf16Linear:
    """y = x @ W.T (+ bias) for fp32 x [..., K] -> [..., N] fp32, with a bf16 copy of W [N, K] beside the fp32 one.

    Per row bucket (the next of BF16_ROW_PROBES at or above the input's rows) one of three kernels, the fastest
    measured when the copy is made (`measure_kernels`), unless `choices` fixes them: "fp32" (`F.linear` on the
    original weight, kept by reference), "bf16" (x cast to bf16, `F.linear` on the copy, cast back) or
    "bf16-transposed" (the same as (W @ x.T).T, so the GEMM streams W as its left operand: on the AMX Xeon
    above the faster bf16 layout at every row count). Products accumulate in fp32 inside oneDNN; inputs and
    weights are rounded to bf16, which moves drafts, never what the target commits.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 choices: dict[int, str] | None = None) -> None:
        _check_weight(weight)
        self.out_features, self.in_features = weight.shape
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.copy = self.weight.to(torch.bfloat16).contiguous()  # [N, K]
        self.choices = measure_kernels(self) if choices is None else dict(choices)  # probe rows -> kernel

    def kernel_for(self, rows: int) -> str:
        """The kernel chosen for the power of two at or above `rows` (BF16_ROW_PROBES are 1..256; beyond, 256's)."""
        return self.choices.get(min(row_bucket(rows), BF16_ROW_PROBES[-1]), "fp32")

    @property
    def faster_rows(self) -> list[int]:
        """The probed row counts at which a bf16 kernel was chosen over fp32."""
        return [rows for rows, kernel in self.choices.items() if kernel != "fp32"]

    def product(self, kernel: str, flat: torch.Tensor) -> torch.Tensor:
        """flat [rows, K] fp32 -> [rows, N] fp32 through `kernel` (one of BF16_KERNELS)."""
        if kernel == "fp32":
            return F.linear(flat, self.weight, self.bias)
        if kernel == "bf16":
            out = F.linear(flat.to(torch.bfloat16), self.copy).float()
        else:
            out = torch.mm(self.copy, flat.to(torch.bfloat16).t()).t().float()  # [rows, N] from [N, rows]
        return out if self.bias is None else out + self.bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        kernel = self.kernel_for(flat.shape[0])
        if kernel == "fp32":
            return F.linear(x, self.weight, self.bias)
        return self.product(kernel, flat.float()).reshape(*x.shape[:-1], self.out_features)


def measure_kernels(linear: Bf16Linear, repeats: int = 5) -> dict[int, str]:
    """Per probe of BF16_ROW_PROBES, the fastest of BF16_KERNELS: each keeps its fastest of `repeats` calls, the
    three alternating (as in decoding, where each matmul runs once a step with the verify in between); a bf16
    kernel must beat fp32 by WIN_MARGIN to be chosen."""
    choices = {}
    for rows in BF16_ROW_PROBES:
        x = torch.randn(rows, linear.in_features)
        best = fastest_alternating({k: lambda k=k: linear.product(k, x) for k in BF16_KERNELS}, repeats)
        fastest = min(BF16_KERNELS[1:], key=best.__getitem__)
        choices[rows] = fastest if best[fastest] <= WIN_MARGIN * best["fp32"] else "fp32"
    return choices


class PrepackedBf16Linear:
    """y = x @ W.T (+ bias) for a bf16 drafter: bf16 x [..., K] -> [..., N], W [N, K] reordered for oneDNN once.

    In bf16 on a CPU `F.linear` is oneDNN's matmul, which reorders the weight into its blocked layout at every
    call; this calls the same kernel on a weight reordered when the copy is made (`prepacked_linear`), so the
    output is the same bits, faster (the demo drafter's matmuls on the Zen 4 EPYC: see docs/benchmarks.md).
    `faster_rows`: the probed row counts where it measured faster than `F.linear` (empty: no gain here).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        if weight.dim() != 2 or weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
            raise ValueError(f"expected a 2D bf16 CPU weight, got {tuple(weight.shape)} {weight.dtype} on {weight.device}")
        self.out_features, self.in_features = weight.shape
        self.weight = weight.detach()
        self.bias = None if bias is None else bias.detach()
        self.packed = pack_weight(self.weight)
        self.faster_rows = [rows for rows in (1, 16) if self._wins(rows)]

    def _wins(self, rows: int) -> bool:
        x = torch.randn(rows, self.in_features).to(torch.bfloat16)
        best = fastest_alternating({"packed": lambda: self(x), "plain": lambda: F.linear(x, self.weight, self.bias)}, 5)
        return best["packed"] <= WIN_MARGIN * best["plain"]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            return F.linear(x, self.weight, self.bias)
        return packed_product(x, self.packed, self.bias, self.out_features)


# weight format -> its matmul class
DECODE_LINEARS = {"fp16-packed": PackedFp16Linear, "bf16": Bf16Linear, "bf16-prepacked": PrepackedBf16Linear}


def format_supported(weight_format: str, device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether a drafter on `device` in `dtype` can decode with `weight_format`'s copies ("plain": never copies)."""
    if weight_format == "fp16-packed":
        return fp16_packing_supported(device, dtype)
    if weight_format == "bf16-prepacked":
        return bf16_prepacking_supported(device, dtype)
    return weight_format == "bf16" and bf16_matmuls_supported(device, dtype)


@functools.lru_cache(maxsize=None)
def bf16_prepacking_supported(device: torch.device | str, dtype: torch.dtype) -> bool:
    """A bf16 drafter on a CPU whose torch has oneDNN's packed-linear ops (`PrepackedBf16Linear`). Cached per process."""
    return prepacking_available(device, dtype)


Weight = torch.Tensor | PackedFp16Linear | Bf16Linear | PrepackedBf16Linear
COPIES = (PackedFp16Linear, Bf16Linear, PrepackedBf16Linear)


def linear(x: torch.Tensor, weight: Weight) -> torch.Tensor:
    """F.linear(x, weight) for a plain weight tensor, else the copy's own kernel (`PackedFp16Linear`, `Bf16Linear`)."""
    if isinstance(weight, COPIES):
        return weight(x)
    return F.linear(x, weight)


def packed_matmuls(weights) -> list[PackedFp16Linear | Bf16Linear | PrepackedBf16Linear]:
    """The packed (or bf16-copied) matmul weights of a `graph.DrafterWeights` (none when it is plain)."""
    found = [weights.fc, weights.context_kv]
    for layer in weights.layers:
        found += [layer.qkv, layer.o, layer.gate_up, layer.down]
    return [w for w in found if isinstance(w, COPIES)]
