"""The LM head's matmul in the layout measured fastest per row bucket: the same product either way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_target

from dflash_core.kernels import matmul_layout
from dflash_core.kernels.matmul_layout import LAYOUTS, MatmulLayouts, _product, row_bucket
from dflash_core.target.adapter import TargetModel


def test_row_buckets_are_powers_of_two():
    assert [row_bucket(r) for r in (1, 2, 3, 4, 5, 16, 17, 240, 256)] == [1, 2, 4, 4, 8, 16, 32, 256, 256]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_both_layouts_are_the_same_product(layout, with_bias):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(50, 24, generator=gen)
    bias = torch.randn(50, generator=gen) if with_bias else None
    for rows in (1, 3, 16):
        x = torch.randn(rows, 24, generator=gen)
        torch.testing.assert_close(_product(layout, x, weight, bias), F.linear(x, weight, bias), rtol=1e-6, atol=1e-5)


def test_matmul_keeps_shapes_and_chooses_once_per_bucket(monkeypatch):
    matmul = MatmulLayouts()
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(40, 16, generator=gen)
    timed = []
    real = matmul_layout._time_layouts
    monkeypatch.setattr(matmul_layout, "_time_layouts", lambda *a: timed.append(a[0].shape[0]) or real(*a))
    for shape in [(2, 3, 16), (1, 4, 16), (5, 16), (1, 1, 16)]:  # buckets 8, 4, 8, 1
        x = torch.randn(*shape, generator=gen)
        out = matmul(x, weight)
        assert out.shape == (*shape[:-1], 40)
        torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-6, atol=1e-5)
    assert timed == [6, 4, 1]  # 5 rows reuse the choice made for 6 (bucket 8)
    assert sorted(key[-1] for key in matmul.choices) == [1, 4, 8]
    assert set(matmul.choices.values()) <= set(LAYOUTS)
    weight.add_(1.0)  # a changed weight is timed again
    matmul(torch.randn(3, 16, generator=gen), weight)
    assert timed == [6, 4, 1, 3]
    MatmulLayouts()(torch.randn(3, 16, generator=gen), weight)  # another object measures for itself
    assert timed == [6, 4, 1, 3, 3]


def test_target_logits_go_through_it_and_a_hooked_head_is_called_as_it_is(monkeypatch):
    model = tiny_target(vocab=32, layers=2)
    target = TargetModel(model)
    hidden = torch.randn(1, 5, 32)
    calls = []
    monkeypatch.setattr(target, "layouts", lambda h, w, b: calls.append(h.shape) or F.linear(h, w, b))
    torch.testing.assert_close(target.logits(hidden), model.lm_head(hidden))
    assert calls == [(1, 5, 32)]
    seen = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    try:
        target.logits(hidden)  # a hook (an offloading wrapper, say) must see its module run
    finally:
        handle.remove()
    assert seen == [(1, 5, 32)] and calls == [(1, 5, 32)]


def test_a_weight_made_under_inference_mode_works(monkeypatch):
    matmul = MatmulLayouts()
    with torch.inference_mode():
        weight = torch.randn(12, 8) * 2  # an inference tensor: no version counter
        x = torch.randn(3, 8)
        torch.testing.assert_close(matmul(x, weight), F.linear(x, weight), rtol=1e-6, atol=1e-5)
        torch.testing.assert_close(matmul(x, weight), F.linear(x, weight), rtol=1e-6, atol=1e-5)
