"""The cost model's ceiling of `dflash bench e2e`: acceptance per block position and the best k, by hand."""

from __future__ import annotations

import pytest

from dflash_bench.ceiling import acceptance_by_position, ceiling_speedup, expected_tokens
from dflash_core.tuning.cost_table import VerifyCostTable


def test_acceptance_by_position_counts_reached_and_accepted_and_drops_each_rows_last_step():
    # block 4 (drafts 1..3); steps commit a tokens = a-1 accepted drafts; the last step of a row is cut
    lengths = [[1, 2, 4, 1], [3, 1, 2]]
    # row 0: 0 accepted (pos 1 rejected), 1 (pos 1 ok, 2 rejected), 3 (1..3 ok); row 1: 2 (1, 2 ok, 3 rejected), 0
    assert acceptance_by_position(lengths, 4) == pytest.approx((3 / 5, 2 / 3, 1 / 2))
    assert acceptance_by_position([[1, 1], [5]], 6) == (0.0, 0.0, 0.0, 0.0, 0.0)  # position 1 reached once, 2+ never


def test_expected_tokens_chains_the_acceptances():
    assert expected_tokens([0.5, 0.5, 0.5]) == [1.0, 1.5, 1.75, 1.875]


def test_ceiling_is_the_best_k_of_the_cost_model():
    costs = VerifyCostTable(seconds=(1.0, 1.5, 2.0, 2.5), draft_s=0.5, head_s=0.0)
    # a perfect drafter: E(k) = k + 1 over T(k) = 0.5 + verify(k + 1): 1, 1.0, 1.2, 1.333
    assert ceiling_speedup(costs, [1.0, 1.0, 1.0]) == (pytest.approx(4 / 3.0), 3)
    # a poor one: 1, 0.75, 0.7, 0.625: plain steps are best, the ceiling is the target alone
    assert ceiling_speedup(costs, [0.5, 0.5, 0.5]) == (1.0, 0)
    # two rows: T(0, 2) = verify(2) = 1.5; T(1, 2) = 0.5 * verify(8)/verify(4) + verify(4) = 0.5 * 2 + 2.5 = 3.5
    speedup, k = ceiling_speedup(costs, [1.0, 0.0, 0.0], rows=2)
    assert (speedup, k) == (pytest.approx(max(1.0, 2 * 1.5 / 3.5)), 0)
    with pytest.raises(ValueError, match="rows"):
        ceiling_speedup(costs, [1.0], rows=0)
