"""The cached decode path (context K/V appended incrementally) equals the no-cache forward."""

from __future__ import annotations

import pytest
import torch
from tiny import drafter_config, tiny_drafter


def _setup(layer_types=None, window=None, seed=0):
    cfg = drafter_config(hidden=32, target_layers=8, layers=2, block_size=8, layer_ids=(2, 5),
                         layer_types=layer_types, sliding_window=window)
    g = torch.Generator().manual_seed(seed)
    return cfg, tiny_drafter(cfg, seed=seed), g


@pytest.mark.parametrize("chunks", [[30], [1, 1, 1, 27], [7, 13, 10]])
@pytest.mark.parametrize("windowed", [False, True])
def test_cached_equals_no_cache(chunks, windowed):
    cfg, drafter, g = _setup(("sliding_attention", "full_attention") if windowed else None, 9 if windowed else None)
    ctx = sum(chunks)
    feats = torch.randn(2, ctx, cfg.fc_in_features, generator=g)
    noise = torch.randn(2, 8, 32, generator=g)
    pos = torch.arange(ctx + 8).expand(2, -1)
    with torch.no_grad():
        cache = drafter.new_cache(2, 64)
        start = 0
        for n in chunks:  # context arrives a few accepted tokens at a time
            drafter.extend_cache(cache, feats[:, start:start + n], pos[:, start:start + n], [n, n])
            start += n
        cached = drafter.draft_with_cache(cache, noise, pos[:, ctx:])
        full = drafter(noise, feats, pos)
    assert (cached - full).abs().max().item() <= 1e-5


@pytest.mark.parametrize("windowed", [False, True])
def test_ragged_rows_equal_each_row_alone(windowed):
    """Rows that accepted different numbers of tokens: each equals its own no-cache forward."""
    cfg, drafter, g = _setup(("full_attention", "sliding_attention") if windowed else None, 6 if windowed else None,
                             seed=4)
    lengths = [(5, 3), (8, 1), (2, 7)]  # per row: two appends of different sizes
    feats = torch.randn(3, 20, cfg.fc_in_features, generator=g)
    noise = torch.randn(3, 8, 32, generator=g)
    with torch.no_grad():
        cache = drafter.new_cache(3, 40)
        positions = torch.arange(20).expand(3, -1)
        drafter.extend_cache(cache, feats[:, :8], positions[:, :8], [a for a, _ in lengths])
        # second append: each row's new entries start right after its own first part
        second = torch.stack([feats[r, a:a + 8] for r, (a, _) in enumerate(lengths)])
        second_pos = torch.stack([torch.arange(a, a + 8) for a, _ in lengths])
        drafter.extend_cache(cache, second, second_pos, [b for _, b in lengths])
        totals = [a + b for a, b in lengths]
        assert cache.lengths == totals
        block_pos = torch.stack([torch.arange(t, t + 8) for t in totals])
        cached = drafter.draft_with_cache(cache, noise, block_pos)
        for r, total in enumerate(totals):
            alone = drafter(noise[r:r + 1], feats[r:r + 1, :total], torch.arange(total + 8)[None])
            assert (cached[r] - alone[0]).abs().max().item() <= 1e-5


def test_cache_rows_can_be_dropped():
    cfg, drafter, g = _setup(seed=2)
    feats = torch.randn(3, 10, cfg.fc_in_features, generator=g)
    noise = torch.randn(3, 8, 32, generator=g)
    pos = torch.arange(18).expand(3, -1)
    with torch.no_grad():
        cache = drafter.new_cache(3, 32)
        drafter.extend_cache(cache, feats, pos[:, :10], [10, 4, 10])
        cache.select_rows([0, 2])
        got = drafter.draft_with_cache(cache, noise[[0, 2]], pos[[0, 2], 10:])
        want = drafter(noise[[0, 2]], feats[[0, 2]], pos[[0, 2]])
    assert (got - want).abs().max().item() <= 1e-5


def test_cache_overflow_is_refused():
    cfg, drafter, g = _setup()
    cache = drafter.new_cache(1, 4)
    with torch.no_grad(), pytest.raises(RuntimeError, match="overflow"):
        drafter.extend_cache(cache, torch.randn(1, 5, cfg.fc_in_features), torch.arange(5)[None], [5])
