"""y = x @ W.T in whichever of two exact layouts is faster for this many rows on this machine.

Why: verification reads the target's logits out over k+1 positions per row, and on a 2-core AMD EPYC
(Zen 3, AVX2 only, torch 2.13.0+cpu with MKL) `F.linear` over a few rows is slow for the demo target's
8,192 x 384 LM head: 3.8 ms over 2 rows and 4.1 ms over 16, against 1.7 ms over one. The same product
computed as (W @ x.T).T, so the GEMM streams W as its left operand, took 1.0 ms and 2.5 ms there: the LM
head is a fifth of a 16-token verify. Which layout wins depends on the CPU and its BLAS (from 256 rows on
F.linear won again there), so each is timed on the first product of each row-count bucket and the faster
one kept for that bucket, per weight, by the `MatmulLayouts` object that measured it (the target adapter and a
read-out each hold one: no process-wide state).

Exactness: both are the same fp32 (or bf16) matmul; only the order of the additions inside each dot
product may differ, as it already does between F.linear over 1 row and over 16 (by ~1e-5 on the demo
head's logits, measured), so the logits verification reads are the target's own up to that rounding,
which is what every multi-token verify has always been.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

LAYOUTS = ("linear", "transposed")
MAX_BUCKET = 1024  # rows above this are not timed: F.linear (arithmetic-bound, a BLAS's best shape)


def row_bucket(rows: int) -> int:
    """Rows rounded up to a power of two: the granularity a layout is chosen at."""
    return 1 << max(0, rows - 1).bit_length()


class MatmulLayouts:
    """`layouts(x, weight, bias)`: x @ W.T in the layout measured fastest for x's row count, chosen per weight and
    row bucket and kept in this object (`choices`)."""

    def __init__(self) -> None:
        self.choices: dict[tuple, str] = {}
        """(weight identity, bucket) -> layout: what this object chose so far."""

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """[..., K] @ [N, K].T (+ bias [N]) -> [..., N], in the layout measured fastest for x's row count.

        On a CPU the first product of each row bucket times both layouts (two calls each, alternating) and
        keeps the faster; elsewhere (CUDA) it is F.linear. The result may be a transposed view: contiguous in
        its rows' own order is not promised (argmax, softmax and indexing do not need it).
        """
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if weight.device.type != "cpu" or rows == 0 or rows > MAX_BUCKET:
            return F.linear(x, weight, bias)
        # a copy made under inference_mode (SubsetReadOut's rows) keeps no version counter: it is never changed
        version = 0 if weight.is_inference() else weight._version
        key = (weight.data_ptr(), version, tuple(weight.shape), weight.dtype, row_bucket(rows))
        layout = self.choices.get(key)
        if layout is None:
            layout, out = _time_layouts(flat, weight, bias)
            self.choices[key] = layout
        else:
            out = _product(layout, flat, weight, bias)
        return out.reshape(*x.shape[:-1], weight.shape[0])


def _product(layout: str, flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if layout == "linear":
        return F.linear(flat, weight, bias)
    out = torch.mm(weight, flat.t()).t()  # [rows, N], a view of the [N, rows] product
    return out if bias is None else out + bias


def _time_layouts(flat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[str, torch.Tensor]:
    """(the faster layout over two alternating rounds after a warm-up of each, its product of `flat`)."""
    best = {layout: float("inf") for layout in LAYOUTS}
    outputs = {}
    for round_ in range(3):  # round 0 warms both up
        for layout in LAYOUTS:
            started = time.perf_counter()
            outputs[layout] = _product(layout, flat, weight, bias)
            elapsed = time.perf_counter() - started
            if round_:
                best[layout] = min(best[layout], elapsed)
    layout = min(LAYOUTS, key=best.__getitem__)
    return layout, outputs[layout]
